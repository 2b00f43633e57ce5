# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Growth fits of a gate's time against the node count (synthetic points; the lab's come from bench_growth.py)."""

from __future__ import annotations

import math

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._growth import GrowthError, fit, predict

NS = [2, 4, 8, 16, 32]


def test_a_linear_gate_is_read_as_linear_with_its_cost_per_node():
    result = fit(NS, [3.0 + 0.5 * n for n in NS])
    assert result["best"] == "N"
    assert result["per_node"] == pytest.approx(0.5)
    assert predict(result, 256) == pytest.approx(3.0 + 0.5 * 256)


def test_a_quadratic_gate_is_read_as_quadratic():
    result = fit(NS, [1.0 + 0.01 * n * n for n in NS])
    assert result["best"] == "N^2"
    assert predict(result, 64) == pytest.approx(1.0 + 0.01 * 64 * 64)


def test_an_n_log_n_gate_is_read_as_such():
    result = fit(NS, [2.0 + 0.2 * n * math.log2(n) for n in NS])
    assert result["best"] == "N log N"


def test_noise_on_a_flat_gate_does_not_read_as_steeper():
    # A constant gate with a few percent of noise: the steeper models barely cut the residual, so N stays.
    result = fit(NS, [10.0, 10.3, 9.8, 10.2, 10.1])
    assert result["best"] == "N"
    assert abs(result["per_node"]) < 0.05


def test_a_named_model_can_be_asked_for():
    result = fit(NS, [3.0 + 0.5 * n for n in NS])
    quadratic = next(f for f in result["fits"] if f["model"] == "N^2")
    assert predict(result, 10, "N^2") == pytest.approx(quadratic["a"] + quadratic["b"] * 100)


@pytest.mark.parametrize("ns, seconds, words", [
    ([2, 4], [1.0, 2.0], "at least 3 different node counts"),
    ([2, 2, 2], [1.0, 2.0, 3.0], "at least 3 different node counts"),
    ([2, 4, 8], [1.0, 2.0], "3 node counts but 2 times"),
    ([0, 4, 8], [1.0, 2.0, 3.0], "node counts must be >= 1"),
])
def test_points_a_fit_cannot_use_are_refused(ns, seconds, words):
    with pytest.raises(GrowthError) as caught:
        fit(ns, seconds)
    assert words in str(caught.value)
