# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One tagged problem, shared by the checks of verify, preflight and readiness and by doctor's diagnosis.

A check that finds something wrong can say it two ways: the one-line message its role prints (what it always
returned, unchanged), and a ``Problem``: the rule that found it (a stable id), the host (None for the cluster),
the symptom (what is seen), the cause (why) and the fix, with the message beside them. The checks' tagged
functions (``_fabric.cluster_problems``, ``_ray_state.evaluate_problems``, ``_stack.stack_problems``,
``_bind_audit.listener_problems``, ``_serve_failure.cause_problem``) return Problems; their old functions return
``messages(...)`` of them, so roles and modules see the same strings as before. Doctor
(``_diagnosis.diagnose``) orders Problems by ``weight``, its likelihood of being the root cause.

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional, Sequence

ARROW = " -> "


@dataclass(frozen=True)
class Problem:
    """What a check found: ``rule`` (stable id), ``host`` (None: the cluster), ``symptom``, ``cause``, ``fix``;
    ``message`` the check's own one-line message (its old return value); ``weight`` how likely this is the root
    cause (higher first, set by the diagnosis; 0 from a check)."""

    rule: str
    symptom: str
    cause: str
    fix: str
    host: Optional[str] = None
    message: str = ""
    weight: int = 0

    @property
    def text(self) -> str:
        """The check's message, or ``symptom; cause; fix`` when it has none."""
        return self.message or "%s%s; %s; %s" % (self.host + ": " if self.host else "", self.symptom, self.cause,
                                                 self.fix)

    def line(self) -> str:
        """``host: symptom -> cause -> fix`` (no host prefix for the cluster)."""
        return "%s%s%s%s%s%s" % (self.host + ": " if self.host else "", self.symptom, ARROW, self.cause, ARROW,
                                 self.fix)

    def weighted(self, weight: int) -> "Problem":
        return replace(self, weight=weight)

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "host": self.host, "symptom": self.symptom, "cause": self.cause,
                "fix": self.fix, "message": self.message, "weight": self.weight}


def messages(problems: Iterable[Problem]) -> list[str]:
    """The checks' old return value: one message per problem, in order."""
    return [p.text for p in problems]


def ordered(problems: Iterable[Problem]) -> list[Problem]:
    """Most likely first (weight, highest first), then by host (the cluster first) and rule; duplicates (same
    rule, host, symptom) dropped, the first kept."""
    seen: set[tuple[str, Optional[str], str]] = set()
    out = []
    for problem in sorted(problems, key=lambda p: (-p.weight, p.host or "", p.rule)):
        key = (problem.rule, problem.host, problem.symptom)
        if key in seen:
            continue
        seen.add(key)
        out.append(problem)
    return out


def lines(problems: Sequence[Problem]) -> list[str]:
    """``symptom -> cause -> fix`` lines, in the order given."""
    return [p.line() for p in problems]
