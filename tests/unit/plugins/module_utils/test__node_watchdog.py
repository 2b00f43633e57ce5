# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The watchdog node script against real things: an HTTP server thread as the API (it answers, hangs, fails with
500, or nothing listens), a real node-table command, real lock, state and marker files, and recovery steps that are
real ``sh -c`` commands writing marker files (the start_vllm step "restarts" the API by switching its mode)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _node_watchdog as wd

KEY = "sk-watchdog-7f3a9c1e5b2d4f6a8c0e"
NODES = ["198.18.200.11", "198.18.200.12"]


class Api:
    """The API: its mode is read from a file on each request, so a recovery step (a real command) can change it."""

    def __init__(self, folder):
        self.mode_file = folder / "api-mode"
        self.mode_file.write_text("ok")
        self.requests = []
        self.release = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                mode = api.mode_file.read_text().strip()
                if mode == "hang":
                    api.release.wait(30)
                    return
                if mode == "500":
                    # A server that echoes the request's header in its error: the key must not reach the log.
                    data = json.dumps({"error": "engine dead", "auth": self.headers.get("Authorization")}).encode()
                    self.send_response(500)
                else:
                    data = json.dumps({"choices": [{"text": " world", "finish_reason": "length"}],
                                       "usage": {"completion_tokens": 2}}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def mode(self, mode):
        self.mode_file.write_text(mode)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(tmp_path):
    server = Api(tmp_path)
    yield server
    server.close()


def free_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def step(marker, name, code=0):
    return ["sh", "-c", 'echo %s >> "$0"; exit %d' % (name, code), str(marker)]


@pytest.fixture
def setup(tmp_path, api):
    key_file = tmp_path / "vllm.secret"
    key_file.write_text("VLLM_API_KEY=%s\n" % KEY)
    key_file.chmod(0o600)
    table = tmp_path / "ray-table.json"
    marker = tmp_path / "steps.log"

    def nodes(addresses):
        table.write_text(json.dumps({"ray_version": "2.49.0", "nodes": [
            {"node_manager_address": a, "alive": True, "is_head": a == NODES[0]} for a in addresses]}))

    nodes(NODES)
    config = {
        "api_url": api.url, "api_key_file": str(key_file), "model": "tiny", "expected_nodes": NODES,
        "ray_nodes_command": ["sh", "-c", 'cat "$0"', str(table)],
        "steps": {
            "stop": [step(marker, "stop")],
            "check": [step(marker, "check")],
            "start_head": [step(marker, "start_head")],
            "start_workers": [step(marker, "start_worker_spark2")],
            # vLLM starts again: the API answers again.
            "start_vllm": [["sh", "-c", 'echo start_vllm >> "$0"; echo ok > "$1"', str(marker), str(api.mode_file)]],
        },
        "state_file": str(tmp_path / "state" / "watchdog.json"),
        "lock_file": str(tmp_path / "run" / "deploy.lock"),
        "operator_stop_file": str(tmp_path / "operator-stop"),
        "generation": "deploy-1",
        "policy": {"interval_s": 0.2, "completion_timeout_s": 0.5, "ray_timeout_s": 2, "failure_threshold": 2,
                   "grace_s": 0, "settle_timeout_s": 3, "step_timeout_s": 5, "max_recoveries": 2,
                   "backoff_base_s": 0.2, "backoff_cap_s": 0.4},
    }
    return {"config": config, "marker": marker, "nodes": nodes, "tmp": tmp_path, "api": api}


def checked(setup, **changes):
    values = dict(setup["config"])
    values.update(changes)
    return wd.config_from_dict(values)


def run(config, out=None):
    out = out if out is not None else io.StringIO()
    decision = wd.run_once(config, wd.Logger(stream=out))
    return decision, out


def state_of(config):
    with open(config["state_file"]) as handle:
        return json.load(handle)


def steps_run(setup):
    marker = setup["marker"]
    return marker.read_text().split() if marker.exists() else []


def hold_lock(path, content=""):
    """Another process (a deploy, say) holding an fcntl lock on path until killed."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    proc = subprocess.Popen(["flock", path, "sh", "-c", 'printf %s "$0" > "$1"; echo locked; exec sleep 60',
                             content, path], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def release(proc, path=None):
    """End the holder and its child (the sleep holds the locked file too): its own session, started above.

    With ``path``, return only once the lock is free: the sleep's SIGKILL is delivered asynchronously, and waiting
    for flock alone raced it (the next check still found the lock held: CI failed on it once under xdist)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if path is None:
        return
    deadline = time.monotonic() + 10
    with open(path, "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
                return
            except OSError:
                assert time.monotonic() < deadline, "the killed holder still locks %s" % path
                time.sleep(0.05)


# --- one check ------------------------------------------------------------------------------------------------------


def test_a_healthy_group_is_a_real_completion_with_the_key_and_a_state_file(setup):
    config = checked(setup)
    decision, out = run(config)
    assert decision.action == "ok"
    request = setup["api"].requests[-1]
    assert request["path"] == "/v1/completions" and request["auth"] == "Bearer " + KEY
    assert request["body"]["model"] == "tiny" and request["body"]["max_tokens"] == 4
    state = state_of(config)
    assert state["last_check"]["ok"] is True and state["generation"] == "deploy-1"
    assert oct(os.stat(config["state_file"]).st_mode & 0o777) == "0o644"
    assert " check action=ok " in out.getvalue()
    assert [n for n in os.listdir(os.path.dirname(config["state_file"])) if n.startswith(".watchdog-state")] == []


@pytest.mark.parametrize("mode, cause, words", [
    ("hang", "completion_hung", "no completion within 0.5 s"),
    ("500", "api_error", "HTTP 500"),
])
def test_a_hung_or_failing_api_is_its_own_cause(setup, mode, cause, words):
    setup["api"].mode(mode)
    decision, _out = run(checked(setup))
    assert (decision.action, decision.cause) == ("wait", cause)
    assert words in decision.reason


def test_an_api_that_refuses_is_api_refused(setup):
    decision, _out = run(checked(setup, api_url="http://127.0.0.1:%d" % free_port()))
    assert decision.cause == "api_refused"


def test_a_node_that_left_ray_is_node_left(setup):
    setup["nodes"](NODES[:1])
    decision, _out = run(checked(setup))
    assert decision.cause == "node_left" and "198.18.200.12 is not alive" in decision.reason


def test_a_node_table_command_that_fails_is_ray_unreachable(setup):
    decision, _out = run(checked(setup, ray_nodes_command=["sh", "-c", "echo GCS gone >&2; exit 1"]))
    assert decision.cause == "ray_unreachable" and "GCS gone" in decision.reason


# --- recovery -------------------------------------------------------------------------------------------------------


def test_a_hung_api_is_detected_within_the_bound_and_the_group_restarted_in_order(setup):
    config = checked(setup)
    out = io.StringIO()
    setup["api"].mode("hang")
    hung_at = time.time()
    decision = wd.run_loop(config, wd.Logger(stream=out), stop=lambda d: d.action != "wait")
    assert decision.action == "recover" and decision.cause == "completion_hung"
    rec = decision.state["recoveries"][-1]
    # Detected within the bound (the scaled policy's here; the default's is at most 30 s: test__watchdog.py).
    assert rec["started"] - hung_at <= wd.detection_bound_s(config["policy"])
    assert steps_run(setup) == ["stop", "check", "start_head", "start_worker_spark2", "start_vllm"]
    assert rec["outcome"] == "recovered" and rec["cause"] == "completion_hung" and rec["duration_s"] >= 0
    state = state_of(config)
    assert state["recoveries"][-1]["outcome"] == "recovered" and state["consecutive_failures"] == 0
    assert wd.status_line(state).startswith("healthy") and "for completion_hung: recovered in" in wd.status_line(state)
    lines = out.getvalue().splitlines()
    assert sum(" recovery-step " in line for line in lines) == 5
    assert all("cause=completion_hung" in line for line in lines if " recovery-step " in line)
    assert any(" recovery-end " in line and "outcome=recovered" in line for line in lines)
    assert run(config)[0].action == "ok"


def test_the_watchdog_holds_the_deploy_lock_while_it_recovers(setup):
    lock = setup["config"]["lock_file"]
    probe = [sys.executable, "-c", "import fcntl,sys; f=open(sys.argv[1]); "
             "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)", lock]
    seen = setup["tmp"] / "lock-seen"
    steps = dict(setup["config"]["steps"])
    steps["check"] = [["sh", "-c", '"$@" 2>/dev/null && echo free > "$0" || echo held > "$0"', str(seen)] + probe]
    config = checked(setup, steps=steps, policy=dict(setup["config"]["policy"], failure_threshold=1))
    setup["api"].mode("500")
    decision, _out = run(config)
    assert decision.action == "recover"
    assert seen.read_text().strip() == "held"


def test_a_failed_step_ends_the_recovery_and_says_which(setup):
    steps = dict(setup["config"]["steps"])
    steps["check"] = [["sh", "-c", "echo fabric: spark2 unreachable on 198.18.200.12; exit 3"]]
    config = checked(setup, steps=steps, policy=dict(setup["config"]["policy"], failure_threshold=1))
    setup["nodes"](NODES[:1])
    decision, _out = run(config)
    rec = decision.state["recoveries"][-1]
    assert rec["outcome"] == "failed" and rec["cause"] == "node_left"
    assert rec["outcome_detail"] == "step check (sh) exited 3: fabric: spark2 unreachable on 198.18.200.12"
    assert steps_run(setup) == ["stop"]


def test_a_watchdog_that_cannot_recover_stops_after_its_budget_and_says_why(setup):
    steps = dict(setup["config"]["steps"])
    steps["start_vllm"] = [step(setup["marker"], "start_vllm", 1)]
    config = checked(setup, steps=steps, policy=dict(setup["config"]["policy"], failure_threshold=1))
    setup["api"].mode("500")
    out = io.StringIO()
    actions = []
    while len(actions) < 20 and "gave_up" not in actions:
        decision, _out = run(config, out)
        actions.append(decision.action)
        time.sleep(0.1)
    assert actions.count("recover") == 2 and actions[-1] == "gave_up"
    assert steps_run(setup).count("stop") == 2
    state = state_of(config)
    assert "2 recoveries within 3600 s" in state["gave_up"]["reason"]
    assert "step start_vllm (sh) exited 1" in state["gave_up"]["reason"]
    assert wd.status_line(state).startswith("GAVE UP at ")
    # A new deploy (its generation in the config) lets it try again.
    assert run(checked(setup, steps=steps, generation="deploy-2", policy=config["policy"]._asdict()))[0].action \
        == "recover"


# --- pause, locks -------------------------------------------------------------------------------------------------


def test_a_deploy_holding_the_lock_pauses_the_watchdog(setup):
    config = checked(setup, policy=dict(setup["config"]["policy"], failure_threshold=1))
    setup["api"].mode("500")
    holder = hold_lock(config["lock_file"], "deploy by ansible-playbook pid 4242")
    try:
        decision, _out = run(config)
    finally:
        release(holder, config["lock_file"])
    assert decision.action == "paused" and "deploy by ansible-playbook pid 4242" in decision.reason
    assert steps_run(setup) == [] and state_of(config)["paused"]["by"] == "deploy"
    assert setup["api"].requests == []          # paused: no probe at all
    assert run(config)[0].action == "recover"   # the lock released: the budget starts over, it acts


def test_a_lease_in_the_lock_file_pauses_until_it_expires(setup):
    config = checked(setup)
    os.makedirs(os.path.dirname(config["lock_file"]))
    with open(config["lock_file"], "w") as handle:
        json.dump({"holder": "teardown from ctl1", "until": time.time() + 600}, handle)
    decision, _out = run(config)
    assert decision.action == "paused" and "lease of teardown from ctl1" in decision.reason
    with open(config["lock_file"], "w") as handle:
        json.dump({"holder": "teardown from ctl1", "until": time.time() - 1}, handle)
    assert run(config)[0].action == "ok"


def test_a_deploy_pauses_the_watchdog_with_the_program_and_clears_the_lease_at_its_end(setup):
    config_file = setup["tmp"] / "watchdog.json"
    config_file.write_text(json.dumps(setup["config"]))
    config = checked(setup)
    os.makedirs(os.path.dirname(config["lock_file"]))

    def lease(seconds):
        return subprocess.run([sys.executable, "-I", wd.__file__, "--config", str(config_file), "--lease", seconds,
                               "--holder", "deploy.yml from ctl1"], capture_output=True, text=True, timeout=60,
                              check=False)

    assert lease("600").returncode == 0
    decision, _out = run(config)
    assert decision.action == "paused" and "lease of deploy.yml from ctl1" in decision.reason
    assert setup["api"].requests == []                 # paused: the API is not even asked
    assert lease("0").returncode == 0
    with open(config["lock_file"]) as handle:
        assert handle.read() == ""
    assert run(config)[0].action == "ok"


def test_a_lease_waits_for_a_recovery_holding_the_lock_and_says_so_when_it_stays_held(setup):
    config = checked(setup)
    holder = hold_lock(config["lock_file"], "recovery")
    try:
        started = time.monotonic()
        problem = wd.write_lease(config["lock_file"], 600, "deploy.yml", wait_s=1.0)
    finally:
        release(holder, config["lock_file"])
    assert problem is not None and "stayed held for 1.0 s" in problem and time.monotonic() - started >= 1.0
    assert wd.write_lease(config["lock_file"], 600, "deploy.yml", wait_s=1.0) is None


def test_an_operator_stop_marker_pauses_the_watchdog(setup):
    config = checked(setup, policy=dict(setup["config"]["policy"], failure_threshold=1))
    with open(config["operator_stop_file"], "w") as handle:
        handle.write("stopped by alice for a driver update")
    setup["api"].mode("refused-by-no-server")
    decision, _out = run(checked(setup, api_url="http://127.0.0.1:%d" % free_port(),
                                 policy=config["policy"]._asdict()))
    assert decision.action == "paused" and "stopped by alice for a driver update" in decision.reason
    assert steps_run(setup) == []
    assert "paused since" in wd.status_line(state_of(config))


def test_two_watchdog_runs_never_overlap(setup):
    config = checked(setup)
    holder = hold_lock(config["state_file"] + ".lock")
    try:
        decision, out = run(config)
    finally:
        release(holder)
    assert decision.action == "wait" and "another watchdog run" in decision.reason
    assert setup["api"].requests == [] and " skipped " in out.getvalue()


# --- secrets, files, the program -------------------------------------------------------------------------------------


def test_the_api_key_never_reaches_the_log_or_the_state(setup):
    config = checked(setup, policy=dict(setup["config"]["policy"], failure_threshold=1))
    setup["api"].mode("500")                    # its body echoes the Authorization header
    decision, out = run(config)
    assert decision.action == "recover"
    assert setup["api"].requests[0]["auth"] == "Bearer " + KEY
    with open(config["state_file"]) as handle:
        saved = handle.read()
    text = out.getvalue() + saved
    assert KEY not in text and "<redacted>" in text
    assert "Bearer <redacted>" in json.loads(saved)["recoveries"][-1]["detail"]     # redacted, and still JSON


def test_the_key_file_must_be_private_and_its_error_has_no_key(setup):
    key_file = setup["config"]["api_key_file"]
    os.chmod(key_file, 0o644)
    with pytest.raises(wd.PolicyError) as info:
        wd.read_api_key(key_file)
    assert "chmod 600" in str(info.value) and KEY not in str(info.value)


@pytest.mark.parametrize("text", [
    KEY + "\n", "VLLM_API_KEY='%s'\n" % KEY, "# key\nHF_TOKEN=x\nVLLM_API_KEY=%s\n" % KEY,
])
def test_the_key_file_is_one_line_or_vllms_secret_file(tmp_path, text):
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(0o600)
    assert wd.read_api_key(str(path)) == KEY


def test_the_state_file_round_trips_and_a_broken_one_starts_fresh(tmp_path):
    path = str(tmp_path / "deep" / "state.json")
    state = wd.finish_recovery(wd.decide(wd.new_state(), {"completion": {"result": "refused"}}, 10.0,
                                         wd.Policy(failure_threshold=1), lambda: 0.0).state, "recovered", 70.0)
    wd.write_state(path, state)
    assert wd.load_state(path) == state
    with open(path, "w") as handle:
        handle.write("{not json")
    assert wd.load_state(path) == wd.new_state()


def test_the_program_runs_once_from_its_own_file(setup):
    config_file = setup["tmp"] / "watchdog.json"
    config_file.write_text(json.dumps(setup["config"]))
    proc = subprocess.run([sys.executable, "-I", wd.__file__, "--config", str(config_file), "--once"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert " check action=ok " in proc.stdout and KEY not in proc.stdout
    assert state_of(setup["config"])["last_check"]["ok"] is True


def test_the_program_refuses_a_bad_config_and_says_why(tmp_path):
    config_file = tmp_path / "watchdog.json"
    config_file.write_text(json.dumps({"api_url": "nowhere"}))
    proc = subprocess.run([sys.executable, "-I", wd.__file__, "--config", str(config_file), "--once"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "missing" in proc.stdout


@pytest.mark.parametrize("node_table", ["complete", "spark2 gone"])
def test_the_check_step_waits_for_every_node_in_ray_and_names_a_missing_one(setup, node_table):
    # The recovery's check step: the program itself with --check-ray, against the real node-table command.
    if node_table != "complete":
        setup["nodes"](NODES[:1])
    config_file = setup["tmp"] / "watchdog.json"
    config_file.write_text(json.dumps(setup["config"]))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-I", wd.__file__, "--config", str(config_file), "--check-ray", "1.5"],
                          capture_output=True, text=True, timeout=60, check=False)
    if node_table == "complete":
        assert proc.returncode == 0 and " check-ray result=ok" in proc.stdout, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "node_left: %s is not alive in Ray's node table (waited 1.5 s)" % NODES[1] in proc.stdout
        assert time.monotonic() - started >= 1.5


def test_a_node_that_comes_back_within_the_wait_passes_the_check(setup):
    setup["nodes"](NODES[:1])
    config = checked(setup)
    seen = []

    def sleep(seconds):
        seen.append(seconds)
        setup["nodes"](NODES)           # the worker's raylet rejoined while the check waited

    assert wd.wait_for_nodes(config, 30, sleep=sleep) is None and len(seen) == 1


def test_without_ray_the_watchdog_judges_the_completion_alone(setup):
    # Backend native runs no Ray: no node table command and no expected nodes; the check step has nothing to wait for.
    config = checked(setup, expected_nodes=None, ray_nodes_command=None)
    assert config["ray_nodes_command"] is None and config["expected_nodes"] == []
    decision, _out = run(config)
    assert decision.action == "ok" and wd.wait_for_nodes(config, 5) is None
    setup["api"].mode("500")
    assert run(config)[0].cause == "api_error"


def test_expected_nodes_without_a_node_table_command_is_refused(setup):
    with pytest.raises(wd.PolicyError, match="ray_nodes_command must be a command"):
        checked(setup, ray_nodes_command=None)
    with pytest.raises(wd.PolicyError, match="expected_nodes must be the list of every node's fabric address"):
        checked(setup, expected_nodes=[])


def test_redact_removes_the_key_and_bearer_values():
    assert wd.redact("Authorization: Bearer abc123, key %s" % KEY, [KEY]) == \
        "Authorization: Bearer <redacted>, key <redacted>"


def test_the_probe_for_status_reports_health_the_table_and_the_state_and_acts_on_nothing(setup):
    config_file = setup["tmp"] / "watchdog.json"
    config_file.write_text(json.dumps(setup["config"]))
    setup["nodes"](NODES[:1])
    proc = subprocess.run([sys.executable, "-I", wd.__file__, "--config", str(config_file), "--probe"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["healthy"], report["cause"]) == (False, "node_left"), report
    assert report["ray"]["missing"] == [NODES[1]] and report["completion"]["result"] == "ok"
    assert report["status"] == "no check yet; no recovery yet" and KEY not in proc.stdout
    assert not os.path.exists(setup["config"]["state_file"]) and steps_run(setup) == []
