# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How a gate's time grows with the node count (docs/benchmarks.md, "Growth with the node count").

Pure logic for ``tests/bench/bench_growth.py``: least-squares fits of t = a + b * f(N) for f = N, N log2 N and N^2 over
the measured (N, seconds) points, the model that fits best (a steeper model must cut the residual by a clear margin to
win, so noise on a flat curve does not read as N^2), the cost per added node, and the extrapolation to a larger N.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

MODELS: tuple[tuple[str, Callable[[float], float]], ...] = (
    ("N", lambda n: n),
    ("N log N", lambda n: n * math.log2(n)),
    ("N^2", lambda n: n * n),
)
# A steeper model wins only if its residual sum of squares is below this share of the simpler winner's.
STEEPER_WINS_BELOW = 0.5


class GrowthError(MultinodeError):
    """Points a growth fit cannot use; the message says which and why."""


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    rss = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys))
    return a, b, rss


def fit(ns: Sequence[int], seconds: Sequence[float]) -> dict[str, Any]:
    """Each model's a, b and residual, the best model, and the linear fit's seconds per added node."""
    if len(ns) != len(seconds):
        raise GrowthError("%d node counts but %d times" % (len(ns), len(seconds)))
    if len(set(ns)) < 3:
        raise GrowthError("a growth fit needs at least 3 different node counts; got %s" % sorted(set(ns)))
    if min(ns) < 1 or min(seconds) < 0:
        raise GrowthError("node counts must be >= 1 and times >= 0; got %s and %s" % (list(ns), list(seconds)))
    fits = []
    for name, f in MODELS:
        a, b, rss = _least_squares([f(n) for n in ns], list(seconds))
        fits.append({"model": name, "a": a, "b": b, "rss": rss})
    best = fits[0]
    for candidate in fits[1:]:
        # A steeper model that bends the wrong way (b < 0) explains nothing about growth.
        if candidate["b"] > 0 and candidate["rss"] < STEEPER_WINS_BELOW * best["rss"]:
            best = candidate
    return {"fits": fits, "best": best["model"], "per_node": fits[0]["b"]}


def predict(result: dict[str, Any], n: int, model: str = "") -> float:
    """Seconds at ``n`` nodes by the best model (or the one named)."""
    name = model or result["best"]
    chosen = next(f for f in result["fits"] if f["model"] == name)
    f = dict(MODELS)[name]
    return chosen["a"] + chosen["b"] * f(n)
