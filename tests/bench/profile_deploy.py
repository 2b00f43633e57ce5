# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a deploy's time goes, per task and host, on the 2-node lab (docs/benchmarks.md, ## Deploy profile).

Root, from the repo root: ``make profile`` (``.venv/bin/python tests/bench/profile_deploy.py``). The playbooks run
through ``ansible_runner.run`` (the pinned ansible-runner): the timings are its job events' per-host start and end
(``plugins/module_utils/_play_profile.py``), not parsed from stdout.

1. lab up 2 (process runtime), teardown (clean start);
2. a cold ``deploy.yml`` (to the first completion), then the same deploy again (idempotent: nothing changes), then
   ``verify.yml``; each profiled.
Leaves the lab down. Prints the section and writes it into docs/benchmarks.md (BENCH_WRITE=0: print only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ansible_runner
import bench_serve  # same folder: the one writer of docs/benchmarks.md sections

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".cache" / "collections"))
from ansible_collections.multinode.vllm.plugins.module_utils._play_profile import markdown, profile  # noqa: E402

LABCTL = str(ROOT / "lab" / "labctl")
INVENTORY = str(ROOT / "inventories" / "lab")
ENVVARS = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PYTHONPATH": str(ROOT / ".cache" / "collections"),
           "PATH": str(ROOT / ".venv" / "bin") + os.pathsep + os.environ.get("PATH", "")}


def play(name, extravars=None, inventory=INVENTORY):
    """(seconds, profile) of one playbook run through ansible-runner; exits naming the play if it failed."""
    data_dir = tempfile.mkdtemp(prefix="profile-deploy-")
    try:
        t0 = time.monotonic()
        runner = ansible_runner.run(private_data_dir=data_dir, project_dir=str(ROOT),
                                    playbook=str(ROOT / "playbooks" / name), inventory=str(inventory),
                                    envvars=ENVVARS, extravars=extravars or {}, quiet=True)
        seconds = time.monotonic() - t0
        events = list(runner.events)
        if runner.rc != 0:
            failed = [e["event_data"].get("task") for e in events if e.get("event") == "runner_on_failed"]
            raise SystemExit("%s failed (rc %s): %s\n%s" % (name, runner.rc, failed, runner.stdout.read()[-3000:]))
        return seconds, profile(events)
    finally:
        # The artefacts hold every task's result (no_log ones censored); only the timings are kept.
        shutil.rmtree(data_dir, ignore_errors=True)


def section(runs, load):
    now, commit = bench_serve.stamp()
    out = ["## Deploy profile", "",
           "Command: `make profile` (`tests/bench/profile_deploy.py`), %s at %s, %s, %d cores, load before %s. "
           "Each playbook runs through `ansible_runner.run`; a task's wall time is its first host's start to its "
           "last host's end from the job events, and what lies between tasks is the controller's."
           % (now, commit, bench_serve.cpu_model(), os.cpu_count(), " ".join(load)), ""]
    for title, (seconds, result) in runs:
        out += ["### %s: %.1f s" % (title, seconds), "", markdown(result)]
    return "\n".join(out).rstrip("\n") + "\n"


def main():
    load = Path("/proc/loadavg").read_text().split()[:3]
    subprocess.run([LABCTL, "up", "2"], check=True)
    try:
        play("teardown.yml")
        runs = [("cold deploy.yml (to the first completion)", play("deploy.yml", {"serve_burst_requests": 0})),
                ("deploy.yml again (idempotent)", play("deploy.yml", {"serve_burst_requests": 0})),
                ("verify.yml", play("verify.yml"))]
        play("teardown.yml")
    finally:
        subprocess.run([LABCTL, "down"], check=False)
    text = section(runs, load)
    print(text)
    if os.environ.get("BENCH_WRITE", "1") == "1":
        bench_serve.replace_section(text, "Deploy profile")


if __name__ == "__main__":
    main()
