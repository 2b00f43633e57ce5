# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""stack_facts as Ansible runs it: the node script under a real interpreter (this one), and ones that cannot start."""

from __future__ import annotations

import sys

from ansible_collections.multinode.vllm.plugins.modules import stack_facts


def test_facts_from_this_interpreter(run_main):
    code, result = run_main(stack_facts.main, {"interpreter": [sys.executable, "-I"], "host": "spark1",
                                               "_ansible_check_mode": True})
    assert code == 0 and result["changed"] is False
    stack = result["ansible_facts"]["multinode_stack"]
    assert sorted(stack) == sorted(stack_facts.KEYS)
    assert stack["python"] == "%d.%d.%d" % sys.version_info[:3]


def test_missing_interpreter_names_host_and_interpreter(run_main, tmp_path):
    missing = str(tmp_path / "venv" / "bin" / "python")
    _code, result = run_main(stack_facts.main, {"interpreter": [missing], "host": "spark2"})
    assert result["failed"] is True
    assert result["msg"].startswith("spark2: the runtime interpreter %s cannot start (" % missing)
    assert "set the interpreter to the runtime's python" in result["msg"]


def test_failing_interpreter_names_rc_and_output(run_main):
    _code, result = run_main(stack_facts.main, {"interpreter": [sys.executable, "-c", "import sys; sys.exit('no')",
                                                                "--"], "host": "spark2"})
    assert result["failed"] is True
    assert result["msg"].startswith("spark2: the runtime interpreter %s -c" % sys.executable)
    assert "(rc 1): no" in result["msg"]


def test_unexpected_output_is_named(run_main, tmp_path):
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho not json\n")
    fake.chmod(0o755)
    _code, result = run_main(stack_facts.main, {"interpreter": [str(fake)], "host": "spark3"})
    assert result["failed"] is True
    assert result["msg"].startswith("spark3: unexpected output from %s: 'not json\\n'" % fake)
