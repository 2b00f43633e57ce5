# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Shared helpers for integration tests over the network-namespace lab (docs/lab.md)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LABCTL = ROOT / "lab" / "labctl"
LAB_INVENTORY = ROOT / "inventories" / "lab"
BIN = ROOT / ".venv" / "bin"
FABRIC = {"spark1": "198.18.200.12", "spark2": "198.18.200.13"}
API = "http://198.19.1.10:8000/v1/completions"
API_KEY = Path.home() / ".config" / "multinode-vllm" / "spark1-vllm-api-key"
TIMINGS = ROOT / ".cache" / "lab-timings.json"


@dataclass
class PlaybookRun:
    rc: int
    output: str
    seconds: float

    @property
    def why(self) -> str:
        """An assertion message that survives truncation: the failed tasks and the recap first, then the tail."""
        lines = self.output.splitlines()
        failed = [line for i, line in enumerate(lines)
                  if line.startswith(("fatal:", "failed:", "ERROR!", "[ERROR]")) or "FAILED!" in line
                  or (i + 1 < len(lines) and lines[i + 1].startswith(("fatal:", "failed:")) and line.startswith("TASK"))]
        return "rc=%d after %.0f s\n%s\n--- tail ---\n%s" % (
            self.rc, self.seconds, "\n".join(line[:2000] for line in failed[:20]), "\n".join(lines[-60:]))


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, sshd)")


def lab_var(name: str):
    """A variable of the lab inventory's group_vars/all.yml, as written there."""
    return yaml.safe_load((LAB_INVENTORY / "group_vars" / "all.yml").read_text())[name]


def node_python() -> str:
    """The lab nodes' Python (torch, Ray, vLLM): the inventory's multinode_venv."""
    return lab_var("multinode_venv") + "/bin/python"


def labctl(*args: str, check: bool = True) -> str:
    result = subprocess.run([str(LABCTL), *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError("labctl %s failed (%d): %s%s" % (" ".join(args), result.returncode, result.stdout, result.stderr))
    return result.stdout + result.stderr


def ansible_env() -> dict:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        PYTHONPATH=str(ROOT / ".cache" / "collections"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        PATH="%s:%s" % (BIN, env.get("PATH", "")),
    )
    return env


def _run_ansible_tool(cmd: list[str], timeout: int) -> PlaybookRun:
    """Run an ansible tool of the venv from the repo root with the environment make gives it; never raises on failure."""
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, env=ansible_env(), cwd=str(ROOT),
                            timeout=timeout, check=False)
    return PlaybookRun(result.returncode, result.stdout + result.stderr, time.monotonic() - start)


def run_playbook(playbook: str, *args: str, inventory: Path | str = LAB_INVENTORY, timeout: int = 600) -> PlaybookRun:
    """Run a playbook of this repo against the lab; never raises on failure."""
    return _run_ansible_tool([str(BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / playbook), *args], timeout)


def molecule(*args: str, timeout: int = 1800) -> PlaybookRun:
    """Run molecule from the repo root; never raises on failure."""
    return _run_ansible_tool([str(BIN / "molecule"), *args], timeout)


def molecule_scenario_kept(scenario: str) -> PlaybookRun:
    """A molecule scenario's whole test sequence but its last destroy: the cluster it converged, proved idempotent
    and verified (a completion included) stays up for the calling module's tests.

    test_doctor.py (default), test_serve.py (native), test_docker.py and test_systemd.py start from their scenario
    this way, so make test runs every scenario once, inside its integration part (it has no molecule part:
    TEST_LAB_PARTS in the Makefile), instead of deploying the same cluster twice. The caller ends with
    molecule_destroyed(scenario)."""
    run = molecule("test", "-s", scenario, "--destroy", "never")
    assert run.rc == 0, "molecule test -s %s failed: %s" % (scenario, run.why)
    # Every step of the scenario ran and passed (molecule logs "[<scenario> > <step>] Executed: Successful").
    for step in ("create", "converge", "idempotence", "verify"):
        assert "[%s > %s] Executed: Successful" % (scenario, step) in run.output, (step, run.output[-3000:])
    return run


def molecule_destroyed(scenario: str) -> None:
    run = molecule("destroy", "-s", scenario)
    assert run.rc == 0, "molecule destroy -s %s failed: %s" % (scenario, run.why)


@pytest.fixture(scope="session")
def lab2():
    """A 2-node lab, brought up if needed (idempotent) and left in place for later tests."""
    require_root()
    labctl("up", "2", "--kind", "process")
    yield LAB_INVENTORY


def netns_processes(node: str) -> list[tuple[int, str, str]]:
    """(pid, name, the first three words of the command line) of every process in the node's network namespace."""
    wanted = "net:[%d]" % os.stat("/run/netns/%s" % node).st_ino
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/ns/net" % entry) != wanted:
                continue
            with open("/proc/%s/stat" % entry) as handle:
                name = handle.read().split("(", 1)[1].rsplit(")", 1)[0]
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                cmdline = handle.read().split(b"\0")
        except OSError:
            continue
        found.append((int(entry), name, b" ".join(cmdline[:3]).decode("utf-8", "replace")))
    return found


def ray_pids(node: str) -> dict[str, list[int]]:
    """Ray processes whose network namespace is the node's: {name: [pid, ...]}."""
    found: dict[str, list[int]] = {}
    for pid, name, text in netns_processes(node):
        if name in ("raylet", "gcs_server") or name.startswith("ray::") or "site-packages/ray/" in text \
                or (text.endswith("bin/ray start") or "/bin/ray start" in text):
            found.setdefault(name, []).append(pid)
    return found


def serve_pids(node: str) -> list[int]:
    """vllm serve processes (and vLLM's engine processes) in the node's network namespace."""
    return sorted(pid for pid, name, text in netns_processes(node)
                  if "/vllm serve" in text or name.startswith("VLLM::"))


def recap(output: str) -> dict[str, dict[str, int]]:
    out = {}
    for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output, re.M):
        out[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
    return out


def torn_down_lab():
    """A module's 2-node lab with nothing deployed; afterwards torn down (with the inventory labctl holds then,
    which a test may have grown) and the lab brought down. Use as ``yield from torn_down_lab()`` in a fixture."""
    require_root()
    labctl("up", "2", "--kind", "process")
    run_playbook("playbooks/teardown.yml")
    yield LAB_INVENTORY
    inventory = labctl("inventory").strip().splitlines()[-1]
    result = run_playbook("playbooks/teardown.yml", inventory=inventory)
    labctl("down")
    assert result.rc == 0, result.output[-3000:]


def completion(timeout: float = 30.0) -> str:
    """One completion through the API on the head's management address, with the key; raises when none."""
    body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(API, data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + API_KEY.read_text().strip()})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout) as answer:
        return json.loads(answer.read())["choices"][0]["text"]


def wait_for(condition: Callable[[], bool], seconds: float, every: float = 1.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``seconds`` passed (False, after one last look)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return condition()


def first_completion_after(start: float, limit: float) -> float:
    """Seconds from ``start`` (monotonic) to the first completion answered, polling; fails after ``limit``."""
    last = None
    while time.monotonic() - start < limit:
        try:
            completion(timeout=20)
            return time.monotonic() - start
        except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
            last = exc
            time.sleep(2)
    raise AssertionError("no completion within %.0f s of the reboot; last error: %s" % (limit, last))


def raylet_node_ip(node: str) -> str:
    pids = ray_pids(node).get("raylet") or []
    assert len(pids) == 1, "%s: expected one raylet, found %s" % (node, pids)
    with open("/proc/%d/cmdline" % pids[0], "rb") as handle:
        words = handle.read().decode().split("\0")
    return next(w.split("=", 1)[1] for w in words if w.startswith("--node_ip_address="))


def record_timing(name: str, seconds: float) -> None:
    """Keep a measured time in .cache/lab-timings.json (docs/benchmarks.md quotes them; tests assert no bound)."""
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    timings = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    timings[name] = round(seconds, 1)
    TIMINGS.write_text(json.dumps(timings, indent=2) + "\n")


def assert_verify_names_the_incident(*args: str) -> None:
    """Once both nodes' raylets run (the incident started by hand: the head without --node-ip-address), verify.yml
    fails naming the head's management address. ``args``: more ansible-playbook arguments (the runtime)."""
    deadline = time.monotonic() + 90
    while not (ray_pids("spark1").get("raylet") and ray_pids("spark2").get("raylet")) and time.monotonic() < deadline:
        time.sleep(2)
    assert raylet_node_ip("spark1") == "198.19.1.10"
    verify = run_playbook("playbooks/verify.yml", *args)
    assert verify.rc != 0
    assert "spark1: Ray registered this node as 198.19.1.10, outside the fabric 198.18.200.0/24" in verify.output, \
        verify.output[-3000:]


# The head's watchdog (docs/watchdog.md), as its lab tests turn it on: interval 5 s, two failed checks, a 10 s
# completion timeout (acted on within 25 s, inside issue 21's 30 s); a budget of 10 within the hour, as a module's
# faults follow one another on one cluster.
WATCHDOG_STATE = "/var/lib/multinode-vllm/watchdog/state.json"
WATCHDOG_POLICY = {"interval_s": 5, "completion_timeout_s": 10, "failure_threshold": 2, "grace_s": 60,
                   "max_recoveries": 10}
WATCHDOG_ON = ("-e", json.dumps({"serve_watchdog_enabled": True, "serve_watchdog_policy": WATCHDOG_POLICY}))


def watchdog_state() -> dict:
    return json.loads(labctl("exec", "spark1", "--", "cat", WATCHDOG_STATE))


def watchdog_recoveries() -> list[dict]:
    return watchdog_state().get("recoveries") or []


def pids_named(node: str, prefix: str) -> list[int]:
    """The pids of the node's processes whose name starts with ``prefix`` (``ray::RayWorker``, ``raylet``)."""
    return [pid for pid, name, _text in netns_processes(node) if name.startswith(prefix)]


# The three kills measured before the watchdog (issue 21): vLLM fails fast, the node's supervisor (supervisord,
# systemd, docker's restart policy) restarts what died, Ray places the rank again.
KILLS = [("spark1", "VLLM::EngineCor"), ("spark2", "ray::RayWorker"), ("spark2", "raylet")]
KILL_IDS = ["engine-core", "worker-rank", "worker-raylet"]


def kill_and_come_back(node: str, prefix: str, label: str = "") -> float:
    """SIGKILL the node's processes named ``prefix``; return the seconds to the first completion after. What was
    killed must be back as a new process and stay up (a completion 30 s later), and the watchdog (on, as its tests
    deploy it) must have restarted the group at most once for it (no storm)."""
    victims = pids_named(node, prefix)
    assert victims, netns_processes(node)
    completion()
    before = len(watchdog_recoveries())
    killed = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    back = first_completion_after(killed, 600)
    record_timing("%swatchdog_kill_%s_to_completion" % (label, prefix.strip(":").lower()), back)
    # A raylet's death does not stop serving at once: its node's rank answers until Ray notices, and the node's
    # supervisor starts Ray again.
    assert wait_for(lambda: set(pids_named(node, prefix)) - set(victims), 300), (node, prefix, netns_processes(node))
    time.sleep(30)
    completion()
    assert len(watchdog_recoveries()) - before <= 1, watchdog_recoveries()[before:]
    return back


def _node_watchdog():
    """The watchdog's own node script (stdlib only), loaded by path: the settle wait below uses its policy rules."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("lab_node_watchdog", ROOT / "plugins/module_utils/_node_watchdog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_until_the_watchdog_acts_at_once(limit: float = 240) -> None:
    """Wait until the head's watchdog would act on a new fault without delay: no recovery open, its grace period
    over, and no backoff left from the recoveries earlier tests caused (the longest the policy allows, no jitter).
    A fault timed from before then measures the policy's deliberate waits, not the detection (a recovery by the
    previous test leaves 60 s of grace)."""
    nw = _node_watchdog()
    policy = nw.policy_from_dict(WATCHDOG_POLICY)

    def ready() -> bool:
        state = watchdog_state()
        now = time.time()
        if any(r.get("finished") is None for r in state.get("recoveries") or []):
            return False
        if state.get("grace_until") is not None and now < float(state["grace_until"]):
            return False
        recent = nw._in_budget(state, now, policy)
        if recent:
            last = max(float(r["finished"]) for r in recent)
            if now < last + nw.backoff_delay(policy, len(recent), lambda: 0.0):
                return False
        return True

    assert wait_for(ready, limit, every=2), ("the watchdog did not settle within %d s" % limit, watchdog_state())


def hang_a_rank(node: str = "spark2") -> dict:
    """SIGSTOP the node's Ray worker rank (it hangs without dying); wait for the watchdog to act and for a completion.
    Returns the seconds to detection (the recovery recorded) and to the first completion, the rank's pid, and the
    recovery's record once it ended."""
    ranks = pids_named(node, "ray::RayWorker")
    assert len(ranks) == 1, netns_processes(node)
    wait_until_the_watchdog_acts_at_once()
    completion()
    before = len(watchdog_recoveries())
    hung = time.monotonic()
    os.kill(ranks[0], signal.SIGSTOP)
    try:
        assert wait_for(lambda: len(watchdog_recoveries()) > before, 60), watchdog_state()
        detected = time.monotonic() - hung
        back = first_completion_after(hung, 600)
        assert wait_for(lambda: watchdog_recoveries()[before].get("outcome") is not None, 120), watchdog_state()
    finally:
        # Ray ends a stopped rank with SIGKILL once its driver is gone; one still here is let go.
        if os.path.exists("/proc/%d" % ranks[0]):
            os.kill(ranks[0], signal.SIGCONT)
    return {"detected": detected, "back": back, "rank": ranks[0], "recovery": watchdog_recoveries()[before]}
