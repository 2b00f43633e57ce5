# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm_ready's node side (which processes are vllm serve) and the serve filters."""

from __future__ import annotations

import os

import pytest

from ansible_collections.multinode.vllm.plugins.filter._vllm_failure_report import vllm_failure_report
from ansible_collections.multinode.vllm.plugins.filter._vllm_rendezvous_errors import vllm_rendezvous_errors
from ansible_collections.multinode.vllm.plugins.module_utils._procs import is_serve
from ansible_collections.multinode.vllm.plugins.modules.vllm_ready import first_error, tail

V = "/var/lib/multinode-vllm-lab/cache/node-venv/bin"


@pytest.mark.parametrize(
    "cmdline, serve",
    [
        ((V + "/vllm", "serve", "/m", "--port", "8000"), True),
        (("/usr/bin/python3", V + "/vllm", "serve", "/m"), True),
        (("vllm", "serve", "/m"), True),
        ((V + "/python", "/var/lib/multinode-vllm/bin/multinode-env-exec", "/etc/node.env", "/usr/bin/env", "A=1",
          V + "/vllm", "serve"), False),  # the launcher before its exec
        ((V + "/vllm", "--version"), False),
        ((V + "/ray", "start", "--head"), False),
        ((), False),
    ],
)
def test_is_serve(cmdline, serve):
    assert is_serve(cmdline) is serve


def test_tail_reads_the_last_lines_and_reports_a_missing_file(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("".join("line %d\n" % i for i in range(100)))
    assert tail(str(log), 3) == ["line 97", "line 98", "line 99"]
    assert tail(str(tmp_path / "nope.log"), 3)[0].startswith("(cannot read ")


def test_a_units_journal_is_read_with_journalctl(tmp_path, monkeypatch):
    # A stand-in journalctl on PATH: this machine has no systemd as PID 1 (no journal to read). It records its
    # arguments and prints a traceback then filler; test_systemd.py reads the real journal in the lab.
    fake = tmp_path / "journalctl"
    fake.write_text("#!/bin/sh\necho \"$@\" > %s/args\n[ \"$2\" = gone.service ] && { echo 'No journal files'; exit 1; }\n"
                    "printf 'Traceback (most recent call last):\\nValueError: bad\\n'\n"
                    "i=0; while [ $i -lt 50 ]; do echo filler $i; i=$((i+1)); done\n" % tmp_path)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    assert tail("journal:multinode-vllm.service", 2) == ["filler 48", "filler 49"]
    assert (tmp_path / "args").read_text().split() == [
        "--unit", "multinode-vllm.service", "--boot", "--lines", "2", "--output", "cat", "--no-pager", "--quiet"]
    assert first_error("journal:multinode-vllm.service") == {"who": "", "line": "ValueError: bad"}
    assert tail("journal:gone.service", 2) == ["(cannot read the log of unit gone.service: No journal files)"]
    assert first_error("journal:gone.service") is None


def test_first_error_reads_the_whole_log_not_the_tail(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("Traceback (most recent call last):\n  File \"w.py\", line 3, in init\n"
                   "RuntimeError: open shm in SHMManager failed. errno: 2\n" + "INFO filler\n" * 500)
    assert first_error(str(log)) == {"who": "", "line": "RuntimeError: open shm in SHMManager failed. errno: 2"}
    assert first_error(str(tmp_path / "nope.log")) is None


def test_failure_report_and_rendezvous_filters():
    text = vllm_failure_report({"spark2:ray.log": ["RuntimeError: current platform cpu does not support ray."]},
                               reason="vLLM was not ready after 600 s")
    assert text.splitlines()[0] == "vLLM was not ready after 600 s"
    assert "has no Ray support" in text.splitlines()[1]
    ranks = {"spark1": {"rank": 0, "fabric_ip": "198.18.200.12", "connections": []},
             "spark2": {"rank": 1, "fabric_ip": "198.18.200.13", "connections": []}}
    errors = vllm_rendezvous_errors(ranks, head_fabric_ip="198.18.200.12", head_mgmt_ip="198.19.1.10")
    assert [e.split(":")[0] for e in errors] == ["spark1 (rank 0)", "spark2 (rank 1)"]


def test_failure_report_takes_a_loops_results_labelled_by_node():
    """What ready.yml passes: the results of vllm_ready looped over the nodes (no dict is built in Jinja)."""
    results = [{"item": "spark1", "tails": {"/var/log/multinode-vllm/vllm.log": ["Traceback (most recent call last):"],
                                            "/var/log/multinode-vllm/ray.log": []}},
               {"item": "spark2", "tails": {"/var/log/multinode-vllm/ray.log": ["Every node should have a unique IP address"]}}]
    text = vllm_failure_report(results, reason="the serve process on spark1 exited (pid 7)")
    assert "--- spark1:/var/log/multinode-vllm/vllm.log (last 1 lines) ---" in text
    assert "--- spark1:/var/log/multinode-vllm/ray.log (last 0 lines) ---" in text
    assert "--- spark2:/var/log/multinode-vllm/ray.log (last 1 lines) ---" in text
    assert "VLLM_HOST_IP missing or equal" in text.splitlines()[1]


def test_failure_report_searches_each_logs_first_error():
    """ready.yml's rescue reads each log's first exception (first_errors) beside its tail."""
    results = [{"item": "spark1",
                "tails": {"/var/log/multinode-vllm/vllm.log": ["RuntimeError: Engine core initialization failed."]},
                "first_errors": {"/var/log/multinode-vllm/vllm.log": {
                    "who": "ray::RayWorkerProc.initialize_worker() on pid=7, ip=198.18.200.13",
                    "line": "RuntimeError: open shm in SHMManager failed. errno: 2"},
                    "/var/log/multinode-vllm/ray.log": None}}]
    text = vllm_failure_report(results, reason="vllm serve on spark1 failed while starting")
    assert "shared-memory communicator" in text.splitlines()[1] and "ip=198.18.200.13" in text.splitlines()[1]


def test_rendezvous_errors_name_a_rank_never_read():
    """An empty or partial input fails: the check cannot pass for want of information."""
    assert vllm_rendezvous_errors({}, head_fabric_ip="198.18.200.12", expected_hosts=["spark1", "spark2"]) == [
        "spark1: no rank information (its connections were not read), so the rendezvous is not proven",
        "spark2: no rank information (its connections were not read), so the rendezvous is not proven"]
