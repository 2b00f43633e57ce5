# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""make test has no molecule part: every scenario runs inside the integration part, started by one integration
module through conftest.molecule_scenario_kept (Makefile, TEST_LAB_PARTS). A scenario added under
extensions/molecule that no module starts would never run in CI; this test names it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEPT = re.compile(r'molecule_scenario_kept\("([a-z0-9_-]+)"\)')

# The built collection ships tests/unit but not the scenarios, the integration tests or the Makefile (galaxy.yml,
# build_ignore): there this is a check of nothing, so it says so instead of failing.
pytestmark = pytest.mark.skipif(not (ROOT / "extensions" / "molecule").is_dir() or not (ROOT / "Makefile").is_file(),
                                reason="a source checkout's check: the built collection has no molecule scenarios")


def scenarios() -> set[str]:
    return {p.parent.name for p in (ROOT / "extensions" / "molecule").glob("*/molecule.yml")}


def started_by() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for module in sorted((ROOT / "tests" / "integration").glob("test_*.py")):
        for name in KEPT.findall(module.read_text()):
            found.setdefault(name, []).append(module.name)
    return found


def test_every_scenario_is_started_by_exactly_one_integration_module():
    started = started_by()
    assert scenarios() >= {"default", "native", "docker", "systemd"}, scenarios()
    missing = sorted(scenarios() - set(started))
    assert missing == [], "molecule scenarios no integration module runs (make test would skip them): %s" % missing
    twice = {name: modules for name, modules in started.items() if len(modules) > 1}
    assert twice == {}, "scenarios started by more than one module (deployed twice): %s" % twice
    unknown = sorted(set(started) - scenarios())
    assert unknown == [], "molecule_scenario_kept names scenarios that do not exist: %s" % unknown


def test_make_test_runs_no_molecule_part():
    makefile = (ROOT / "Makefile").read_text()
    lab_parts = re.search(r"^TEST_LAB_PARTS := (.*)$", makefile, re.M)
    assert lab_parts and lab_parts.group(1).split() == ["integration"], lab_parts and lab_parts.group(0)
