# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    # Shared attribute declarations; each module states its own support level.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    description: Running the module twice with the same arguments gives the same result and changes nothing the second time.
"""

    # For modules that only read (facts, probes, verification).
    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: The module changes nothing, so it runs the same in check mode.
  diff_mode:
    support: none
  idempotent:
    support: full
"""
