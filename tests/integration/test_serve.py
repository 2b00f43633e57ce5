# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Serving over the lab, from the native molecule scenario's cluster (deploy, idempotence and a completion, run
here): a serve that crashes at start fails the deploy at once with every node's logs, switching backends
leaves nothing of the other one running, the bind audit judges vLLM's own processes under both, and bench.yml
(vLLM's own serving benchmark) measures each backend into one results directory, side by side."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (BIN, LABCTL, ROOT, ansible_env, labctl, molecule_destroyed, molecule_scenario_kept, netns_processes,
                      ray_pids, recap, require_root, run_playbook, serve_pids)

VENV = Path("/var/lib/multinode-vllm-lab/cache/node-venv")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (network namespaces, sshd)"),
    pytest.mark.skipif(not (VENV / "bin" / "vllm").exists(),
                       reason="node venv with vLLM missing; build it with `make lab-venv`"),
]


def _vllm_listeners(node: str, fabric_ip: str) -> list[dict]:
    """The node's listeners owned by vLLM's renamed processes (VLLM::*), judged by the audit's default patterns."""
    code = ("import json; from ansible_collections.multinode.vllm.plugins.module_utils._bind_audit import audit; "
            "print(json.dumps(audit(%r)['listeners']))" % fabric_ip)
    out = subprocess.run(["ip", "netns", "exec", node, str(BIN / "python"), "-c", code], env=ansible_env(),
                         capture_output=True, text=True, check=True).stdout
    return [item for item in json.loads(out) if any(p["name"].startswith("VLLM::") for p in item["processes"])]


def _audit_sees_vllm(node: str, fabric_ip: str, wildcard_owner: str) -> None:
    # Seen in the lab: under ray VLLM::EngineCore (a Ray driver) on a wildcard port of Ray's worker range, under
    # native VLLM::Worker_TP0's TCPStore on *:29500. Both were "not a cluster process" before VLLM:: joined the
    # audit's patterns, so a wildcard of theirs passed unjudged.
    owned = _vllm_listeners(node, fabric_ip)
    assert owned, "no VLLM:: listener on %s" % node
    assert [item for item in owned if item["verdict"] == "ignored"] == [], owned
    assert any(item["address"] in ("0.0.0.0", "::") and item["verdict"] == "violation"
               and item["processes"][0]["name"].startswith(wildcard_owner) for item in owned), owned


def _env_file(node: str) -> dict[str, str]:
    """The node's env file as the collection rendered it (KEY=VALUE lines)."""
    text = subprocess.run([str(LABCTL), "exec", node, "--", "cat", "/etc/multinode-vllm/node.env"],
                          capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def _completion_ok(run) -> None:
    assert run.rc == 0, run.why
    assert "completion:" in run.output and "tokens/s" in run.output


BENCH = ("-e", '{"bench_concurrencies": [1, 2], "bench_shapes": [{"input_len": 32, "output_len": 16}], '
         '"bench_prompts_per_concurrency": 2, "bench_min_prompts": 4, "bench_tcp_mib": 64}')


def _bench(label: str, results: Path) -> str:
    """bench.yml into ``results`` under ``label``: two cases, each with every prompt completed and its figures."""
    run = run_playbook("playbooks/bench.yml", *BENCH, "-e", "bench_label=%s" % label, "-e",
                       "bench_results_dir=%s" % results)
    assert run.rc == 0, run.why
    api_key = (Path.home() / ".config" / "multinode-vllm" / "spark1-vllm-api-key").read_text().strip()
    assert api_key not in run.output
    rows = [r for r in json.loads((results / "results.json").read_text())["rows"] if r["label"] == label]
    got = [(r["concurrency"], r["num_prompts"], r["completed"], r["failed"]) for r in rows]
    assert got == [(1, 4, 4, 0), (2, 4, 4, 0)], rows
    assert all(r["output_tokens_per_s"] > 0 and r["p99_ttft_ms"] > 0 and r["p50_itl_ms"] > 0 for r in rows), rows
    raw = json.loads((results / "raw" / ("%s-c2-i32-o16.json" % label)).read_text())
    assert raw["completed"] == 4 and raw["total_output_tokens"] == 4 * 16 and "generated_texts" not in raw
    table = (results / "results.md").read_text()
    assert "- raw TCP 198.18.200.12 -> 198.18.200.13 over the fabric: " in table, table
    assert "- the last distributed preflight: all-reduce of " in table, table
    return table


@pytest.fixture(scope="module")
def lab():
    """extensions/molecule/native, all of it but its last destroy: lab down, syntax, lab up, deploy.yml -e
    vllm_backend=native, the same again with nothing changed (molecule's idempotence), verify.yml (every rank on the
    head's fabric address, no Ray) and a completion. make test runs that scenario here, once, instead of deploying
    the same cluster twice (TEST_LAB_PARTS in the Makefile); the backend switch below starts from it."""
    require_root()
    try:
        yield molecule_scenario_kept("native")
        inventory = labctl("inventory").strip().splitlines()[-1]
        result = run_playbook("playbooks/teardown.yml", inventory=inventory)
        assert result.rc == 0, result.why
    finally:
        molecule_destroyed("native")


def test_switching_backends_leaves_nothing_of_the_other_running(lab, tmp_path):
    # From the native scenario's cluster (a vllm serve rank on each node, no Ray) to backend ray, and back.
    assert serve_pids("spark1") and serve_pids("spark2") and ray_pids("spark1") == {} and ray_pids("spark2") == {}
    ray = run_playbook("playbooks/deploy.yml")
    _completion_ok(ray)
    # Backend ray serves from the head only: spark2's native rank was stopped.
    assert serve_pids("spark2") == []
    assert recap(ray.output)["spark2"]["failed"] == 0
    # make demo's summary (lab/demo-summary.sh) finds the node table and the completion in a real deploy's output.
    log = tmp_path / "deploy.log"
    log.write_text(ray.output)
    summary = subprocess.run([str(ROOT / "lab" / "demo-summary.sh"), str(log)], capture_output=True, text=True,
                             check=False)
    assert summary.returncode == 0 and "spark2" in summary.stdout and "tokens/s" in summary.stdout, \
        (summary.returncode, summary.stdout, summary.stderr)
    _bench("ray", tmp_path / "bench")
    assert ray_pids("spark1").get("raylet") and ray_pids("spark2").get("raylet")
    assert serve_pids("spark1") and not serve_pids("spark2")
    _audit_sees_vllm("spark1", "198.18.200.12", "VLLM::EngineCor")
    env = _env_file("spark2")
    assert env.get("RAY_AUTH_MODE") == "token" and "MASTER_ADDR" not in env, env

    native = run_playbook("playbooks/deploy.yml", "-e", "vllm_backend=native")
    _completion_ok(native)
    # The same cases against the native backend, into the same directory: the table puts both side by side.
    table = _bench("native", tmp_path / "bench")
    assert "| concurrency | input/output | ray tok/s | native tok/s |" in table, table
    # Backend native runs no Ray: the Ray programs the ray deploy left are gone from both nodes.
    deadline = time.monotonic() + 30
    while (ray_pids("spark1") or ray_pids("spark2")) and time.monotonic() < deadline:
        time.sleep(1)
    assert ray_pids("spark1") == {} and ray_pids("spark2") == {}
    assert serve_pids("spark1") and serve_pids("spark2")
    # The node-process layer dropped the Ray program from each node's supervisord (section removed, update ray).
    for host in ("spark1", "spark2"):
        assert "changed: [%s] => (item=ray)" % host in native.output, native.output[-3000:]
    _audit_sees_vllm("spark1", "198.18.200.12", "VLLM::Worker_TP")
    # One backend variable: -e vllm_backend=native alone puts the env file on the native branch on every node.
    for node in ("spark1", "spark2"):
        env = _env_file(node)
        assert env.get("MASTER_ADDR") == "198.18.200.12" and env.get("MASTER_PORT") == "29500", (node, env)
        assert "RAY_AUTH_MODE" not in env and "RAY_AUTH_TOKEN_PATH" not in env, (node, env)


def test_a_serve_that_crashes_at_start_fails_the_deploy_at_once_with_every_nodes_logs(lab):
    # A max_model_len beyond the tiny model's 2048 positions: vLLM refuses it after its imports, before loading.
    run = run_playbook("playbooks/deploy.yml", "-e", '{"vllm_max_model_len": 1000000}')
    assert run.rc != 0
    out = run.output
    # Seen as a crash at a node read (the fatal log line, or the process gone), not by waiting out the timeout.
    assert ("vllm serve on spark1 failed while starting" in out or "the serve process on spark1 exited" in out), out[-4000:]
    assert "was not ready after" not in out
    assert "most likely cause: vLLM rejected a setting while building its configuration" in out
    for name in ("spark1:/var/log/multinode-vllm/vllm.log", "spark1:/var/log/multinode-vllm/ray.log",
                 "spark2:/var/log/multinode-vllm/ray.log"):
        assert "--- %s (last" % name in out, name
    assert "max_model_len" in out
    # Nothing was restarted in a loop afterwards by the failure report itself; Ray stays up for the next try.
    assert ray_pids("spark1").get("raylet") and ray_pids("spark2").get("raylet")


def _files_holding(node: str, needle: str) -> list[str]:
    """Files of the node's product dirs, /run and /tmp (Ray's session logs) that contain ``needle``, with their mode."""
    code = ("import os,stat,sys;n=sys.argv[1].encode();out=[]\n"
            "for top in ('/etc/multinode-vllm','/var/lib/multinode-vllm','/var/log/multinode-vllm','/run','/tmp'):\n"
            "  for d,_,fs in os.walk(top):\n"
            "    for f in fs:\n"
            "      p=os.path.join(d,f)\n"
            "      try:\n"
            "        st=os.lstat(p)\n"
            "        if stat.S_ISREG(st.st_mode) and st.st_size<64<<20 and n in open(p,'rb').read(): "
            "out.append('%s %o'%(p,st.st_mode&0o777))\n"
            "      except OSError: pass\n"
            "print('\\n'.join(out))")
    return subprocess.run([str(LABCTL), "exec", node, "--", "python3", "-c", code, needle], capture_output=True,
                          text=True, check=True).stdout.split()


def _environ_holds(pid: int, needle: str) -> bool:
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            return needle.encode() in handle.read()
    except OSError:
        return False


def test_a_secret_reaches_vllm_serve_and_nothing_else(lab):
    """issue 17: vllm_secret_env is in the serve process's environment and in its 0600 file, and nowhere else:
    no command line, no other file (units, supervisor sections, env file, logs, Ray's session files), not the
    -v or --diff output, not the Ray workers (vLLM's non-carry-over list)."""
    token = "s3cret-%s" % os.urandom(8).hex()
    run = run_playbook("playbooks/deploy.yml", "-v", "--diff", "-e",
                       json.dumps({"vllm_secret_env": {"MULTINODE_TEST_SECRET": token}}))
    _completion_ok(run)
    assert token not in run.output
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as handle:
                    assert token.encode() not in handle.read(), pid
            except OSError:
                pass
    assert _files_holding("spark1", token) == ["/etc/multinode-vllm/vllm-api.env", "600"]
    assert _files_holding("spark2", token) == []
    assert any(_environ_holds(pid, token) for pid in serve_pids("spark1"))  # it did reach vllm serve
    workers = [pid for pid, name, _text in netns_processes("spark2") if name.startswith(("ray::", "VLLM::"))]
    assert workers and not any(_environ_holds(pid, token) for pid in workers)
    # Nor the API key: vLLM 0.32 copies VLLM_API_KEY (a registered vLLM variable) into Ray workers unless listed.
    assert not any(_environ_holds(pid, "\0VLLM_API_KEY=") for pid in workers)
