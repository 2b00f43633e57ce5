# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Deploy to first completion under each runtime, against a hand-launched baseline of the same runtime
(docs/benchmarks.md, ## Runtimes). Root, from the repo root: ``make bench-runtimes``.

For each of RUNTIMES (process docker systemd):

1. ``labctl up 2 --kind K`` (timed), teardown (clean start), then the node image's cached build check (docker and
   systemd; timed), then a warm-up deploy through the collection (untimed: it fills the per-node compile cache and
   renders the exact commands).
2. Read what the warm-up rendered, the hand-launched baseline's input: process, the supervisord programs' commands
   (as ``make bench`` does); docker, each container's parameters from ``docker inspect`` (image ID, entrypoint and
   command, host network and IPC, ``/dev/shm``, binds, tmpfs, ulimits, environment); systemd, each unit's
   ``EnvironmentFile=`` and ``ExecStart=`` lines.
3. Teardown; HAND: the same programs started by hand, as a user would without the collection: process, a shell over
   ssh (``ray start`` head, then worker, then ``vllm serve``, with the node env file); docker, a plain ``docker run``
   per container; systemd, a unit written by hand per program (``EnvironmentFile=`` and ``ExecStart=`` as
   rendered, nothing else: no restart policy, limits or ordering), then ``systemctl start``; then a completion is
   polled every 2 s.
4. Teardown; COLLECTION: ``ansible-playbook playbooks/deploy.yml -e multinode_runtime=K -e serve_burst_requests=0``
   until it exits (its readiness ends with the first completion).

3 and 4 alternate PAIRS times (H C H C ...). The section is printed and written into docs/benchmarks.md. Leaves a
fresh process lab up (what the integration tests expect).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_serve as serve  # noqa: E402  (the process runtime's hand launch and the completion client)

ROOT = serve.ROOT
RUNTIMES = os.environ.get("RUNTIMES", "process docker systemd").split()
PAIRS = int(os.environ.get("PAIRS", "1"))
LAB_ROOT = "/var/lib/multinode-vllm-lab"
PROGRAMS = (("spark1", "ray"), ("spark2", "ray"), ("spark1", "vllm"))


def node(host, *argv, check=True, stdin=None):
    """A command in the node (its namespaces; under docker the node's own daemon), as labctl exec runs it."""
    return serve.run([serve.LABCTL, "exec", host, "--", *argv], check=check, input=stdin)


def playbook(runtime, name, *args):
    return serve.playbook(name, "-e", "multinode_runtime=" + runtime, *args)


def teardown(runtime):
    playbook(runtime, "teardown.yml")
    # What HAND started is not the collection's: remove it by its own names.
    if runtime == "docker":
        for host in ("spark1", "spark2"):
            node(host, "docker", "rm", "-f", "hand-ray", "hand-vllm", check=False)
    elif runtime == "systemd":
        for host in ("spark1", "spark2"):
            node(host, "sh", "-c", "systemctl stop hand-ray.service hand-vllm.service 2>/dev/null; "
                 "rm -f /etc/systemd/system/hand-*.service; systemctl daemon-reload; systemctl reset-failed", check=False)
    elif runtime == "process":
        for host in ("spark1", "spark2"):
            serve.ssh(host, "pkill -f '[b]in/vllm serve'; %s/cache/node-venv/bin/ray stop --force >/dev/null 2>&1; true"
                      % LAB_ROOT, check=False)


def docker_run_argv(inspected, name, pid_container=""):
    """``docker run`` arguments that start a container like ``inspected`` (``docker inspect``'s object) by hand;
    one that shares another container's process namespace shares ``pid_container``'s (the hand-started one)."""
    config, host = inspected["Config"], inspected["HostConfig"]
    argv = ["run", "-d", "--name", name, "--network", host["NetworkMode"], "--ipc", host["IpcMode"] or "private"]
    if (host.get("PidMode") or "").startswith("container:"):
        if not pid_container:
            raise SystemExit("%s shares a process namespace (%s): name the hand container to share"
                             % (inspected["Name"], host["PidMode"]))
        argv += ["--pid", "container:" + pid_container]
    if host.get("ShmSize"):
        argv += ["--shm-size", str(host["ShmSize"])]
    for bind in host.get("Binds") or []:
        argv += ["-v", bind]
    # The collection's container binds with mounts (the launcher's env files, the model, /tmp), not -v.
    for mount in host.get("Mounts") or []:
        argv += ["--mount", "type=%s,source=%s,target=%s%s" % (mount["Type"], mount["Source"], mount["Target"],
                                                               ",readonly" if mount.get("ReadOnly") else "")]
    for path, options in (host.get("Tmpfs") or {}).items():
        argv += ["--tmpfs", path + (":" + options if options else "")]
    for limit in host.get("Ulimits") or []:
        argv += ["--ulimit", "%s=%s:%s" % (limit["Name"], limit["Soft"], limit["Hard"])]
    for item in config.get("Env") or []:
        argv += ["-e", item]
    if config.get("WorkingDir"):
        argv += ["-w", config["WorkingDir"]]
    if config.get("User"):
        argv += ["-u", config["User"]]
    entry = config.get("Entrypoint") or []
    if entry:
        argv += ["--entrypoint", entry[0]]
    return argv + [inspected["Image"]] + entry[1:] + (config.get("Cmd") or [])


def rendered(runtime):
    """What the warm-up deploy rendered, per (host, program): the hand baseline's input."""
    if runtime == "process":
        return serve.rendered_commands()
    out = {}
    for host, prog in PROGRAMS:
        if runtime == "docker":
            inspected = json.loads(node(host, "docker", "inspect", "multinode-" + prog).stdout)[0]
            out[(host, prog)] = docker_run_argv(inspected, "hand-" + prog, "hand-ray" if prog == "vllm" else "")
        else:
            text = node(host, "systemctl", "cat", "multinode-%s.service" % prog).stdout
            lines = text.splitlines()
            starts = [line for line in lines if line.startswith("ExecStart=")]
            if len(starts) != 1:
                raise SystemExit("%s: multinode-%s.service has %d ExecStart= lines" % (host, prog, len(starts)))
            # Ray's unit reads the node env file through systemd (EnvironmentFile=): a hand-written unit names it too.
            out[(host, prog)] = "\n".join([line for line in lines if line.startswith("EnvironmentFile=")] + starts)
    return out


def hand_launch(runtime, cmds):
    if runtime == "process":
        serve.hand_launch(cmds)
        return
    for host, prog in PROGRAMS:
        if runtime == "docker":
            node(host, "docker", *cmds[(host, prog)])
        else:
            unit = "[Service]\n%s\n" % cmds[(host, prog)]
            node(host, "sh", "-c", "cat > /etc/systemd/system/hand-%s.service" % prog, stdin=unit)
            node(host, "systemctl", "daemon-reload")
            node(host, "systemctl", "start", "hand-%s.service" % prog)
        if prog == "ray" and host == "spark1":
            # A user's script waits for the head's GCS port before starting a worker (ray start --address retries,
            # but only for a while).
            for _attempt in range(120):
                if node("spark1", "sh", "-c", "ss -ltn | grep -q ':6379 '", check=False).returncode == 0:
                    break
                time.sleep(0.5)
    serve.wait_ready("hand-launched vLLM under " + runtime)


def first_completion(start_fn):
    t0 = time.monotonic()
    start_fn()
    return time.monotonic() - t0


def image_check():
    t0 = time.monotonic()
    serve.run([str(ROOT / "lab" / "build-node-image.py")], check=True)
    return time.monotonic() - t0


def bench(runtime):
    result = {"runtime": runtime}
    t0 = time.monotonic()
    serve.run([serve.LABCTL, "down"])
    serve.run([serve.LABCTL, "up", "2", "--kind", runtime])
    result["lab_up"] = time.monotonic() - t0
    if runtime != "process":
        result["image_cached"] = image_check()
    teardown(runtime)
    t0 = time.monotonic()
    playbook(runtime, "deploy.yml", "-e", "serve_burst_requests=0")
    result["warm"] = time.monotonic() - t0
    cmds = rendered(runtime)
    result["hand"], result["collection"] = [], []
    for _pair in range(PAIRS):
        teardown(runtime)
        result["hand"].append(first_completion(lambda: hand_launch(runtime, cmds)))
        teardown(runtime)
        result["collection"].append(first_completion(
            lambda: playbook(runtime, "deploy.yml", "-e", "serve_burst_requests=0")))
    teardown(runtime)
    print("%s: %s" % (runtime, json.dumps(result)), file=sys.stderr)
    return result


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def section(results, load, commit):
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M UTC")
    lines = [
        "## Runtimes: deploy to first completion",
        "",
        "Command (root, from the repo root; leaves a fresh process lab up): `make bench-runtimes` "
        "(= `tests/bench/bench_runtimes.py`; `RUNTIMES=\"process docker systemd\"`, `PAIRS=%d`)." % PAIRS,
        "",
        "Per runtime, one after the other in one run on the 2-node lab (backend ray, TP=2 across spark1 and spark2, "
        "the tiny model): `labctl up 2 --kind K`, a warm-up deploy through the collection (untimed: compile cache, "
        "and it renders the commands), then HAND and COLLECTION alternate (teardown before each). HAND starts the "
        "same programs as a user would by hand in that runtime: process, a shell over ssh (`ray start` head, "
        "worker, `vllm serve`, with the node env file); docker, a plain `docker run` per container with the "
        "parameters the collection's container has (`docker inspect`: image ID, entrypoint and command, host network "
        "and IPC, `/dev/shm`, binds, ulimits, environment); systemd, a unit written by hand per program holding only "
        "the rendered `EnvironmentFile=` and `ExecStart=` lines. The worker's Ray starts once the head's GCS port "
        "listens. HAND's time ends at the first completion that returns text (polled every 2 s); COLLECTION's at the exit of "
        "`ansible-playbook playbooks/deploy.yml -e multinode_runtime=K -e serve_burst_requests=0` (its readiness "
        "ends with a completion).",
        "",
        "Measured %s at %s (%d cores, %s; load average before %s; other jobs may share the CPU):" % (
            stamp, commit, os.cpu_count() or 0, serve.cpu_model(), " ".join(load)),
        "",
        "| runtime | lab up | image check (cached) | warm-up deploy | hand-launched | collection | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for res in results:
        hand, coll = median(res["hand"]), median(res["collection"])
        lines.append("| %s | %.1f s | %s | %.0f s | %.1f s (%s) | %.1f s (%s) | %.2f |" % (
            res["runtime"], res["lab_up"], "%.1f s" % res["image_cached"] if "image_cached" in res else "n/a",
            res["warm"], hand, ", ".join("%.1f" % v for v in res["hand"]), coll,
            ", ".join("%.1f" % v for v in res["collection"]), coll / hand))
    lines += [
        "",
        "The ratio is the collection's median over the hand-launched median of the same runtime: what the gates "
        "(fabric probe, firewall, stack check, Ray verify, the reused distributed preflight, readiness) and the SSH "
        "round trips cost over starting the same programs by hand. The image's cold build is in \"Docker lab nodes\" "
        "above (its cache key is the hash of its inputs; the cached check is the column here).",
        "",
    ]
    return "\n".join(lines)


def write_section(text):
    serve.replace_section(text, text.splitlines()[0][3:], before="Serve")


def main():
    load = Path("/proc/loadavg").read_text().split()[:3]
    commit = serve.run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
    results = []
    try:
        for runtime in RUNTIMES:
            results.append(bench(runtime))
    finally:
        serve.run([serve.LABCTL, "down"], check=False)
        serve.run([serve.LABCTL, "up", "2", "--kind", "process"], check=False)
    text = section(results, load, commit)
    print(text)
    if os.environ.get("BENCH_WRITE", "1") == "1":
        write_section(text)


if __name__ == "__main__":
    sys.exit(main())
