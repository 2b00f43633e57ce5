# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How every gate grows with the node count (docs/benchmarks.md, ## Growth with the node count; issue 24).

Root, from the repo root: ``make bench-growth`` (``.venv/bin/python tests/bench/bench_growth.py``; NODES="2 4 8 16 32"
by default). For each N, a fresh process lab of N nodes (``labctl down``, ``labctl up N``) and, through
``ansible_runner.run`` (profile_deploy.play: times from the job events, per play = per gate):

1. a cold ``deploy.yml -e serve_enabled=false`` (every gate up to the distributed preflight and the bind audit; Ray
   started on all N nodes, joined in batches);
2. the same deploy again (idempotent: nothing restarts);
3. ``verify.yml``.

Beside each run, the controller's memory (summed PSS of the ansible and ssh processes in the root network namespace,
peak); after the cold deploy, what the gates leave running per node (summed PSS of each node's namespace, mean over
the nodes). Then per gate a least-squares fit against N (``_growth.fit``: N, N log N, N^2), its cost per added node, the
256-node extrapolation, and the issue's targets. Writes the section and docs/benchmarks-growth.svg (BENCH_WRITE=0:
print only). Leaves the lab down.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import bench_serve  # same folder: the section writer, cpu_model, PeakMemory
import profile_deploy  # same folder: play() through ansible-runner

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".cache" / "collections"))
from ansible_collections.multinode.vllm.plugins.module_utils._growth import GrowthError, fit, predict  # noqa: E402

LABCTL = str(ROOT / "lab" / "labctl")
NODES = [int(n) for n in os.environ.get("NODES", "2 4 8 16 32").split()]
NO_SERVE = {"serve_enabled": False}
SVG = ROOT / "docs" / "benchmarks-growth.svg"


def gate(play_name):
    """A play's name without its parenthesis: the gate's short name."""
    return play_name.split(" (")[0].strip()


def controller_pids():
    """ansible and ssh processes in the root network namespace: the controller's side of a run."""
    root_ns = os.readlink("/proc/1/ns/net")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/ns/net" % entry) != root_ns:
                continue
            cmdline = Path("/proc/%s/cmdline" % entry).read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if "ansible" in cmdline or cmdline.startswith("ssh "):
            found.append(entry)
    return found


def measured(name, n, inventory, extravars=None):
    memory = bench_serve.PeakMemory(pids=controller_pids)
    memory.start()
    try:
        seconds, result = profile_deploy.play(name, extravars, inventory=inventory)
    finally:
        memory.stop.set()
        memory.join()
    plays = {}
    for row in result["plays"]:
        plays[gate(row["play"])] = plays.get(gate(row["play"]), 0.0) + row["wall"]
    print("N=%d %s: %.1f s, controller peak PSS %.0f MiB" % (n, name, seconds, memory.peak_pss / 1024),
          file=sys.stderr)
    return {"seconds": seconds, "plays": plays, "controller_mib": memory.peak_pss / 1024}


def node_memory_mib(n):
    per_node = [bench_serve.PeakMemory(namespaces=("spark%d" % i,)).sample()[0] / 1024 for i in range(1, n + 1)]
    return sum(per_node) / len(per_node)


def one_size(n):
    subprocess.run([LABCTL, "down"], check=True, capture_output=True)
    out = subprocess.run([LABCTL, "up", str(n)], check=True, capture_output=True, text=True)
    found = re.search(r"inventory: (\S+)", out.stdout + out.stderr)
    inventory = found.group(1) if found else str(ROOT / "inventories" / "lab")
    cold = measured("deploy.yml", n, inventory, NO_SERVE)
    node_mib = node_memory_mib(n)
    again = measured("deploy.yml", n, inventory, NO_SERVE)
    verify = measured("verify.yml", n, inventory, NO_SERVE)
    return {"n": n, "cold": cold, "again": again, "verify": verify, "node_mib": node_mib}


def curves(sizes):
    """(run, gate) -> [seconds per N] for every gate present at every N, in play order of the largest run."""
    out = {}
    for run in ("cold", "again", "verify"):
        names = list(sizes[-1][run]["plays"])
        for name in names:
            if all(name in size[run]["plays"] for size in sizes):
                out[(run, name)] = [size[run]["plays"][name] for size in sizes]
        out[(run, "whole playbook")] = [size[run]["seconds"] for size in sizes]
    return out


RUN_TITLES = {"cold": "cold deploy", "again": "idempotent deploy", "verify": "verify.yml"}


def svg(ns, lines):
    """A plain SVG of seconds against N (N on a log2 axis), one polyline per (label, values)."""
    width, height, left, bottom, top, right = 760, 420, 60, 40, 20, 230
    top_s = max(max(values) for _label, values in lines) * 1.1 or 1.0
    xs = {n: left + (width - left - right) * (math.log2(n) - math.log2(ns[0])) / max(1e-9, math.log2(ns[-1] / ns[0]))
          for n in ns}

    def y(value):
        return height - bottom - (height - bottom - top) * value / top_s

    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
             % (width, height),
             '<rect width="100%" height="100%" fill="white"/>',
             '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, height - bottom, width - right,
                                                                         height - bottom),
             '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, top, left, height - bottom)]
    for n in ns:
        parts.append('<text x="%.0f" y="%d" text-anchor="middle">%d</text>' % (xs[n], height - bottom + 15, n))
    parts.append('<text x="%d" y="%d" text-anchor="middle">nodes (log scale)</text>'
                 % ((left + width - right) // 2, height - 5))
    for i in range(5):
        value = top_s * i / 4
        parts.append('<text x="%d" y="%.0f" text-anchor="end">%.0f s</text>' % (left - 5, y(value) + 4, value))
    for index, (label, values) in enumerate(lines):
        colour = colours[index % len(colours)]
        points = " ".join("%.1f,%.1f" % (xs[n], y(v)) for n, v in zip(ns, values))
        parts.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (colour, points))
        parts.append('<text x="%d" y="%d" fill="%s">%s</text>' % (width - right + 10, top + 14 * index + 10, colour,
                                                                  label.replace("&", "&amp;").replace("<", "&lt;")))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def section(sizes, load, failed=None):
    ns = [size["n"] for size in sizes]
    now, commit = bench_serve.stamp()
    out = ["## Growth with the node count", "",
           "Command: `make bench-growth` (`tests/bench/bench_growth.py`, NODES=\"%s\"), %s at %s, %s, %d cores, load "
           "before %s. Per N: a fresh process lab of N nodes, then through `ansible_runner.run` a cold "
           "`deploy.yml -e serve_enabled=false`, the same deploy again (idempotent) and `verify.yml`; a gate's time "
           "is its play's first task start to last task end from the job events. Fits: least squares of "
           "t = a + b f(N) for f = N, N log N, N^2 (`_growth.fit`; a steeper model must halve the residual to win). "
           "Single runs per N." % (" ".join(map(str, ns)), now, commit, bench_serve.cpu_model(), os.cpu_count(),
                                   " ".join(load)), ""]
    header = "| run | gate | " + " | ".join("N=%d" % n for n in ns) + " | fit | s per added node | 256 nodes |"
    out += [header, "|" + "---|" * (len(ns) + 5)]
    table = curves(sizes)
    for (run, name), values in table.items():
        try:
            result = fit(ns, values)
            fitted = "%s" % result["best"]
            per_node = "%.2f" % result["per_node"]
            at_256 = "%.0f s" % predict(result, 256)
        except GrowthError as error:  # fewer than 3 sizes: the table still shows the points
            fitted, per_node, at_256 = "(%s)" % error, "", ""
        cells = (RUN_TITLES[run], name.replace("|", "/"), " | ".join("%.1f" % v for v in values), fitted, per_node,
                 at_256)
        out.append("| %s | %s | %s | %s | %s | %s |" % cells)
    out += ["", "| N | controller peak PSS, cold deploy | controller, idempotent | controller, verify | "
            "left running per node (PSS, mean) |", "|---|---|---|---|---|"]
    for size in sizes:
        out.append("| %d | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB |" % (
            size["n"], size["cold"]["controller_mib"], size["again"]["controller_mib"],
            size["verify"]["controller_mib"], size["node_mib"]))
    out += ["", "Targets (issue 24):", ""]
    by_n = {size["n"]: size for size in sizes}
    if 16 in by_n:
        out.append("- at 16 nodes, verify.yml %.1f s (target <= 30 s: %s); idempotent deploy %.1f s (target <= 45 s: "
                   "%s)" % (by_n[16]["verify"]["seconds"], "met" if by_n[16]["verify"]["seconds"] <= 30 else
                            "**missed**", by_n[16]["again"]["seconds"],
                            "met" if by_n[16]["again"]["seconds"] <= 45 else "**missed**"))
    if 16 in by_n and 32 in by_n:
        worst = []
        for (run, name), values in table.items():
            low, high = values[ns.index(16)], values[ns.index(32)]
            if low > 0.5:  # a gate under half a second at 16 nodes is noise at either size
                worst.append((high / low, RUN_TITLES[run], name))
        worst.sort(reverse=True)
        over = [w for w in worst if w[0] > 2.2]
        out.append("- at 32 nodes every gate at most 2.2x its 16-node time: %s; the largest ratios: %s" % (
            "met" if not over else "**missed** by %d" % len(over),
            "; ".join("%s / %s %.2fx" % (r, n, x) for x, r, n in worst[:4])))
    if failed:
        out += ["", "**N=%d failed** (the sizes above it were measured): %s" % failed]
    out += ["", "![gate time against node count](benchmarks-growth.svg)", ""]
    return "\n".join(out), svg(ns, [("%s: %s" % (RUN_TITLES[run], name), values)
                                    for (run, name), values in sorted(
                                        table.items(), key=lambda item: -item[1][-1])[:8]])


def main():
    load = Path("/proc/loadavg").read_text().split()[:3]
    sizes, failed = [], None
    try:
        for n in NODES:
            try:
                sizes.append(one_size(n))
            except SystemExit as failure:  # profile_deploy.play names the failed playbook
                failed = (n, str(failure)[-1500:].replace("\n", " "))
                print("N=%d failed: %s" % failed, file=sys.stderr)
                break
    finally:
        subprocess.run([LABCTL, "down"], check=False, capture_output=True)
    if not sizes:
        raise SystemExit("nothing measured: %s" % (failed,))
    text, picture = section(sizes, load, failed)
    print(text)
    if os.environ.get("BENCH_WRITE", "1") == "1":
        bench_serve.replace_section(text, "Growth with the node count")
        SVG.write_text(picture)


if __name__ == "__main__":
    main()
