# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Serve benchmark on the 2-node lab: the collection vs the same commands by hand (docs/benchmarks.md, ## Serve).

Root, from the repo root: ``make bench`` (or ``.venv/bin/python tests/bench/bench_serve.py``).

1. lab up 2, teardown (clean start), then a warm-up deploy through the collection (untimed): it fills the
   per-node compile cache and renders the exact commands (supervisor.d/ray.conf and vllm.conf on each node).
2. teardown; HAND: over ssh, the same ``ray start`` (head, then worker; without --block, as a shell script
   would) and the same ``vllm serve`` with the same env files (the launcher's), then poll until a completion returns text.
3. teardown; COLLECTION: ``ansible-playbook playbooks/deploy.yml -e serve_burst_requests=0`` until it exits
   (its readiness ends with the first completion). 2 and 3 alternate PAIRS times (medians reported).
4. on the last collection cluster, tokens/s alternately from the collection's server and the same command hand-launched
   (C H C H ... C; supervisorctl stop/start for the collection's, setsid/pkill for the hand one): at least ROUNDS rounds,
   then more, up to MAX_ROUNDS, until the paired ratio's 95% interval is within +-TARGET_HALF (0.03) of it.
After each 2 and 3: the same client burst (BURST requests of 64 tokens, ignore_eos) for tokens/s, and the peak PSS of
every process in the two nodes' network namespaces, sampled each second from start to the end of the burst.
Leaves the lab down. Prints the markdown section and writes it into docs/benchmarks.md.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".cache" / "collections"))
from ansible_collections.multinode.vllm.plugins.module_utils._bench import paired_ratio_interval  # noqa: E402
from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import MORE as LAUNCHER_MORE  # noqa: E402
LABCTL = str(ROOT / "lab" / "labctl")
SSH_CONFIG = "/var/lib/multinode-vllm-lab/run/ssh/ssh_config"
API = "http://198.19.1.10:8000"
MODEL = "tiny"
BURST = int(os.environ.get("BURST", "12"))
SETTLE = float(os.environ.get("SETTLE", "10"))
# Hand/collection alternations for (b): at least ROUNDS, more (up to MAX_ROUNDS) until the paired ratio's 95% interval
# is within +-TARGET_HALF of it (issue 24: tell 5% apart).
ROUNDS = int(os.environ.get("ROUNDS", "4"))
MAX_ROUNDS = int(os.environ.get("MAX_ROUNDS", "16"))
TARGET_HALF = float(os.environ.get("TARGET_HALF", "0.03"))
PAIRS = int(os.environ.get("PAIRS", "2"))  # hand/collection deploy pairs for (a) (H C H C ...)
ENV = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PYTHONPATH=str(ROOT / ".cache" / "collections"),
           ANSIBLE_NOCOLOR="1")
PLAYBOOK = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(ROOT / "inventories" / "lab")]
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def run(cmd, check=True, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=str(ROOT), check=False, **kw)
    if check and result.returncode != 0:
        raise SystemExit("failed (%d): %s\n%s%s" % (
            result.returncode, " ".join(cmd), result.stdout[-3000:], result.stderr[-3000:]))
    return result


def ssh(node, script, check=True):
    return run(["ssh", "-F", SSH_CONFIG, node, script], check=check)


def playbook(name, *args, check=True):
    # The hand-launched Ray and vllm serve are not the collection's: teardown stops them only with the opt-in.
    extra = ["-e", "multinode_stop_foreign=true"] if name == "teardown.yml" else []
    return run(PLAYBOOK + [str(ROOT / "playbooks" / name)] + extra + list(args), check=check)


def api_key():
    """The key the serve role generated on the controller (both runs use it: the hand run replays the command)."""
    with open(os.path.expanduser("~/.config/multinode-vllm/spark1-vllm-api-key")) as handle:
        return handle.read().strip()


def completion(max_tokens, ignore_eos=False, timeout=300):
    body = {"model": MODEL, "prompt": "Hello, world", "max_tokens": max_tokens, "temperature": 0}
    if ignore_eos:
        body["ignore_eos"] = True
    req = urllib.request.Request(API + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + api_key()})
    with OPENER.open(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def burst():
    tokens, start = 0, time.monotonic()
    for _request in range(BURST):
        tokens += completion(64, ignore_eos=True)["usage"]["completion_tokens"]
    return tokens / (time.monotonic() - start)


def netns_pids(namespaces):
    """The pids of every process in the named network namespaces (``ip netns pids``)."""
    found = []
    for ns in namespaces:
        found += subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout.split()
    return found


class PeakMemory(threading.Thread):
    """Peak of the summed PSS (and RSS) of every process in the given network namespaces (spark1's and spark2's by
    default), or of the processes ``pids()`` names."""

    def __init__(self, namespaces=("spark1", "spark2"), pids=None):
        super().__init__(daemon=True)
        self.peak_pss = self.peak_rss = 0
        self.stop = threading.Event()
        self.pids = pids or (lambda: netns_pids(namespaces))

    def sample(self):
        pss = rss = 0
        for pid in self.pids():
            try:
                text = Path("/proc/%s/smaps_rollup" % pid).read_text()
            except OSError:
                continue
            for key, value in re.findall(r"^(Pss|Rss):\s+(\d+) kB", text, re.M):
                if key == "Pss":
                    pss += int(value)
                else:
                    rss += int(value)
        return pss, rss

    def run(self):
        while not self.stop.is_set():
            pss, rss = self.sample()
            self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
            self.stop.wait(1.0)


def launcher_argv(argv):
    """The env files and the program argv of a launcher command (PYTHON LAUNCHER ENV_FILE [--env-file F]... PROGRAM
    ARGS, ``_runtime.launcher_command``): the hand launch loads the same files, then runs the same program."""
    files, rest = [argv[2]], argv[3:]
    while len(rest) >= 2 and rest[0] == LAUNCHER_MORE:
        files.append(rest[1])
        rest = rest[2:]
    return files, rest


def rendered_commands():
    """(env files, program argv) of ray.conf / vllm.conf on each node, without the launcher."""
    out = {}
    for node in ("spark1", "spark2"):
        for prog in ("ray", "vllm"):
            text = ssh(node, "cat /etc/multinode-vllm/supervisor.d/%s.conf 2>/dev/null || true" % prog).stdout
            match = re.search(r"^command=(.*)$", text, re.M)
            if match:
                files, argv = launcher_argv(shlex.split(match.group(1).replace("%%", "%")))
                out[(node, prog)] = (files, [a for a in argv if a != "--block"])
    return out


def env_words(files):
    """Shell words that load the env files into the array E (no quoting or expansion in them: the launcher's rules)."""
    return "mapfile -t E < <(cat %s | grep -v '^[[:space:]]*#' | grep .); " % " ".join(shlex.quote(f) for f in files)


def hand_command(cmds, node, prog, log):
    files, argv = cmds[(node, prog)]
    return env_words(files) + 'env "${E[@]}" ' + shlex.join(argv) + " >%s 2>&1" % log


def hand_vllm(cmds):
    ssh("spark1", "setsid nohup bash -c %s </dev/null >/dev/null 2>&1 &"
        % shlex.quote(hand_command(cmds, "spark1", "vllm", "/tmp/hand-vllm.log")))


def wait_ready(what, timeout=900):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if completion(16, timeout=60)["choices"][0]["text"]:
                return
        except Exception:  # noqa: BLE001 (not up yet)
            pass
        time.sleep(2)
    raise SystemExit("%s was not ready after %d s" % (what, timeout))


def wait_no_serve():
    for _attempt in range(120):
        if ssh("spark1", "pgrep -f '[b]in/vllm serve' >/dev/null", check=False).returncode != 0:
            return
        time.sleep(1)
    raise SystemExit("vllm serve did not stop on spark1")


def alternate(cmds, rounds, max_rounds, target_half):
    """tokens/s of the collection's server and of the same command hand-launched, alternately on the collection's
    Ray cluster (C H C H ... C): the machine's drift falls on both sides alike. At least ``rounds`` rounds, then more
    until the paired ratio's 95% interval is within +-target_half, or ``max_rounds``."""
    ctl = "/var/lib/multinode-vllm-lab/cache/node-venv/bin/supervisorctl -c /etc/multinode-vllm/supervisord.conf "
    time.sleep(SETTLE)
    coll, hand = [burst()], []
    while len(hand) < max_rounds:
        ssh("spark1", ctl + "stop vllm")
        wait_no_serve()
        hand_vllm(cmds)
        wait_ready("hand-launched vLLM")
        time.sleep(SETTLE)
        hand.append(burst())
        ssh("spark1", "pkill -f '[b]in/vllm serve'", check=False)
        wait_no_serve()
        ssh("spark1", ctl + "start vllm")
        wait_ready("the collection's vLLM")
        time.sleep(SETTLE)
        coll.append(burst())
        if len(hand) >= max(rounds, 2):
            interval = paired_ratio_interval(coll, hand)
            print("round %d: ratio %.3f, 95%% interval %.3f-%.3f (+-%.1f%%)" % (
                len(hand), interval["ratio"], interval["low"], interval["high"], 100 * interval["half"]),
                file=sys.stderr)
            if interval["half"] <= target_half:
                break
    return coll, hand


def hand_launch(cmds):
    for node in ("spark1", "spark2"):
        ssh(node, hand_command(cmds, node, "ray", "/tmp/hand-ray.log"))
    hand_vllm(cmds)
    wait_ready("hand-launched vLLM (see /tmp/hand-vllm.log in spark1)")


def measure(label, start_fn):
    mem = PeakMemory()
    mem.start()
    t0 = time.monotonic()
    start_fn()
    first = time.monotonic() - t0
    # Both servers get the same quiet moment before the burst (the playbook's last SSH sessions and Ray's
    # start-up churn are not the server's speed).
    time.sleep(SETTLE)
    tps = burst()
    mem.stop.set()
    mem.join()
    print("%s: first completion after %.1f s, %.2f tokens/s, peak PSS %.2f GiB (RSS %.2f GiB)"
          % (label, first, tps, mem.peak_pss / 2**20, mem.peak_rss / 2**20), file=sys.stderr)
    return {"first": first, "tps": tps, "pss": mem.peak_pss / 2**20, "rss": mem.peak_rss / 2**20}


def stamp():
    """(UTC time to the minute, the short commit): when and at what a benchmark section was measured."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return now, run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()


def cpu_model():
    """The CPU's model name, as the benchmark sections state it."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def replace_section(text, heading, before=None):
    """Put ``text`` (a section starting ``## heading``) into docs/benchmarks.md in place of that section; a new one
    goes before the section ``before`` where it exists, else at the end (every bench script writes through this)."""
    path = ROOT / "docs" / "benchmarks.md"
    doc = path.read_text()
    start = doc.find("\n## %s\n" % heading)
    if start < 0:
        anchor = doc.find("\n## %s\n" % before) if before else -1
        doc = doc[:anchor + 1] + text + "\n" + doc[anchor + 1:] if anchor >= 0 else doc.rstrip("\n") + "\n\n" + text
    else:
        nxt = doc.find("\n## ", start + 1)
        doc = doc[:start + 1] + text + (doc[nxt:] if nxt >= 0 else "")
    path.write_text(doc)


def write_section(text):
    replace_section(text, "Serve")


def main():
    load = Path("/proc/loadavg").read_text().split()[:3]
    run([LABCTL, "up", "2"])
    playbook("teardown.yml")
    t0 = time.monotonic()
    playbook("deploy.yml", "-e", "serve_burst_requests=0")
    warm = time.monotonic() - t0
    cmds = rendered_commands()
    hands, colls = [], []
    for _pair in range(PAIRS):
        playbook("teardown.yml")
        hands.append(measure("hand", lambda: hand_launch(cmds)))
        playbook("teardown.yml")
        colls.append(measure("collection", lambda: playbook("deploy.yml", "-e", "serve_burst_requests=0")))
    alt_coll, alt_hand = alternate(cmds, ROUNDS, MAX_ROUNDS, TARGET_HALF)
    print("alternating tokens/s: collection %s, hand %s" % (alt_coll, alt_hand), file=sys.stderr)
    playbook("teardown.yml")
    run([LABCTL, "down"])

    def median(values):
        ordered = sorted(values)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    def summary(runs):
        return {key: median([run[key] for run in runs]) for key in ("first", "tps")} | {
            key: max(run[key] for run in runs) for key in ("pss", "rss")}

    coll, hand = summary(colls), summary(hands)
    ratio_a = coll["first"] / hand["first"]
    tps_c, tps_h = median(alt_coll), median(alt_hand)
    ratio_b = tps_c / tps_h
    paired = paired_ratio_interval(alt_coll, alt_hand)
    peak = max(coll["pss"], hand["pss"])

    def each(runs, key, unit=""):
        return ", ".join("%.1f%s" % (run[key], unit) for run in runs)

    def verdict(ok):
        return "met" if ok else "**missed**"

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M UTC")
    lines = [
        "## Serve",
        "",
        "Command (root, from the repo root; leaves the lab down): `make bench` (= `tests/bench/bench_serve.sh`).",
        "",
        "One run, back to back on the 2-node lab (backend ray, TP=2 across spark1 and spark2, the tiny model, "
        "bf16, max model len 512): a warm-up deploy through the collection (untimed; fills each node's compile "
        "cache and renders the commands), then HAND: a plain script over ssh runs the rendered `ray start` "
        "(head, then worker; without `--block`) and `vllm serve` with the same env file and arguments, "
        "then COLLECTION: `ansible-playbook playbooks/deploy.yml -e serve_burst_requests=0` (fabric preflight, "
        "firewall, Ray, verify, serve, readiness; the distributed preflight reuses the warm-up's pass, which "
        "teardown keeps). Teardown before each run; HAND and COLLECTION alternate, %d pairs (H C H C ...), medians "
        "reported, each run in brackets." % PAIRS,
        "",
        "- (a) deploy-to-first-completion: wall time from the first command to the first completion that "
        "returns text (hand: polling every 2 s; collection: the playbook's exit, right after its readiness "
        "completion).",
        "- (b) tokens/s: bursts of %d sequential requests of 64 tokens (`ignore_eos`, temperature 0) from the "
        "control node to the API on 198.19.1.10:8000, each %g s after its server answered, total generated tokens / "
        "wall time; same client for both. After (a), on the collection's Ray cluster, the collection's server "
        "(its supervisord program) and the same command hand-launched take turns (C H C H ... C), at least %d "
        "rounds and up to %d, until the paired ratio's 95%% interval is within +-%.0f%%; the ratio is of the "
        "medians. (b, paired): each hand burst against the mean of the two collection bursts around it; the geometric "
        "mean of those ratios with Student's t interval on their logs (`_bench.paired_ratio_interval`)."
        % (BURST, SETTLE, ROUNDS, MAX_ROUNDS, 100 * TARGET_HALF),
        "- (c) peak memory: the largest sum of PSS (RSS in brackets) over every process in the spark1 and spark2 "
        "network namespaces, sampled each second from the first command to the end of the burst.",
        "",
        "Measured %s (%d cores, load average before %s; other engineers' jobs may share the CPU); warm-up "
        "deploy %.0f s:" % (stamp, os.cpu_count() or 0, " ".join(load), warm),
        "",
        "| figure | collection | hand-launched | ratio | target |",
        "|---|---|---|---|---|",
        "| (a) deploy to first completion, median | %.1f s (%s) | %.1f s (%s) | %.2f | <= 1.25: %s |"
        % (coll["first"], each(colls, "first", " s"), hand["first"], each(hands, "first", " s"), ratio_a,
           verdict(ratio_a <= 1.25)),
        "| (b) tokens/s, median of the alternating bursts | %.2f (%s) | %.2f (%s) | %.2f | >= 0.95: %s |"
        % (tps_c, ", ".join("%.2f" % v for v in alt_coll), tps_h, ", ".join("%.2f" % v for v in alt_hand),
           ratio_b, verdict(ratio_b >= 0.95)),
        "| (b, paired) tokens/s ratio, %d rounds, 95%% interval | | | %.3f (%.3f-%.3f, +-%.1f%%) | interval "
        "within +-%.0f%%: %s |" % (paired["rounds"], paired["ratio"], paired["low"], paired["high"],
                                   100 * paired["half"], 100 * TARGET_HALF, verdict(paired["half"] <= TARGET_HALF)),
        "| (b') tokens/s, one burst right after each deploy of (a), median | %.2f (%s) | %.2f (%s) | %.2f | |"
        % (coll["tps"], each(colls, "tps"), hand["tps"], each(hands, "tps"), coll["tps"] / hand["tps"]),
        "| (c) peak memory, whole 2-node lab | %.2f GiB (RSS %.2f) | %.2f GiB (RSS %.2f) | | < 12 GiB: %s |"
        % (coll["pss"], coll["rss"], hand["pss"], hand["rss"], verdict(peak < 12)),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if os.environ.get("BENCH_WRITE", "1") == "1":
        write_section(text)


if __name__ == "__main__":
    main()
