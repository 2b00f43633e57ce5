# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM's own serving benchmark over the deployed cluster (``playbooks/bench.yml``, docs/bench.md).

Pure logic: the cases (concurrency x prompt/output length) checked before anything runs, the ``vllm bench serve``
argument list, the summary of one result JSON (TTFT, TPOT, ITL p50/p99, output tokens/s, request throughput), the
markdown tables (one row per case; side by side when a results directory holds several labels), and the raw TCP
throughput over the fabric (a plain socket receiver and sender, the baseline the all-reduce bandwidth sits under).
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from typing import Any, Iterable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

# What vllm bench serve reports per request (lists as long as the prompts); dropped from what is returned and
# summarized, kept in the raw JSON on the controller except the generated texts.
PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times", "errors")
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"))
PERCENTILES = ("50", "99")
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
FIX = "set bench_concurrencies to a list of whole numbers >= 1 and bench_shapes to a list of " \
      "{input_len: N, output_len: N} (docs/bench.md)"


class BenchError(MultinodeError):
    """A bench setting or result that cannot be used; the message names the value and the fix."""


def _positive(value: Any, what: str) -> int:
    whole = not isinstance(value, bool) and isinstance(value, (int, str)) and str(value).strip().isdigit()
    if not whole or int(value) < 1:
        raise BenchError("%s is %r, expected a whole number >= 1; %s" % (what, value, FIX))
    return int(value)


def cases(concurrencies: Any, shapes: Any, prompts_per_concurrency: Any = 4, min_prompts: Any = 8) -> list[dict]:
    """Every (concurrency, input_len, output_len) to run, with its prompt count (``prompts_per_concurrency`` x the
    concurrency, at least ``min_prompts``), in the order given; duplicates refused."""
    if not isinstance(concurrencies, (list, tuple)) or not concurrencies:
        raise BenchError("bench_concurrencies is %r, expected a non-empty list; %s" % (concurrencies, FIX))
    if not isinstance(shapes, (list, tuple)) or not shapes:
        raise BenchError("bench_shapes is %r, expected a non-empty list; %s" % (shapes, FIX))
    per = _positive(prompts_per_concurrency, "bench_prompts_per_concurrency")
    floor = _positive(min_prompts, "bench_min_prompts")
    out: list[dict] = []
    seen: set[tuple[int, int, int]] = set()
    for i, shape in enumerate(shapes):
        if not isinstance(shape, Mapping) or set(shape) - {"input_len", "output_len"}:
            raise BenchError("bench_shapes[%d] is %r, expected {input_len: N, output_len: N}; %s" % (i, shape, FIX))
        length_in = _positive(shape.get("input_len"), "bench_shapes[%d].input_len" % i)
        length_out = _positive(shape.get("output_len"), "bench_shapes[%d].output_len" % i)
        for j, raw in enumerate(concurrencies):
            concurrency = _positive(raw, "bench_concurrencies[%d]" % j)
            key = (concurrency, length_in, length_out)
            if key in seen:
                raise BenchError("bench case concurrency %d, input %d, output %d is listed twice; %s"
                                 % (concurrency, length_in, length_out, FIX))
            seen.add(key)
            out.append({"concurrency": concurrency, "input_len": length_in, "output_len": length_out,
                        "num_prompts": max(floor, per * concurrency)})
    return out


def api_key_from(text: str) -> str:
    """The API key in the serve role's env file (its ``VLLM_API_KEY=`` line, quotes removed) or in a file holding
    only the key."""
    for line in text.splitlines():
        if line.strip().startswith("VLLM_API_KEY="):
            return line.split("=", 1)[1].strip().strip("'\"")
    stripped = text.strip()
    return "" if "\n" in stripped or "=" in stripped else stripped


def check_label(label: Any) -> str:
    text = str(label or "")
    if not LABEL.match(text):
        raise BenchError("bench_label is %r, expected 1-64 letters, digits, '.', '_' or '-' (it names the result "
                         "files); for example bench_label=tp2" % (label,))
    return text


def case_name(label: str, case: Mapping[str, Any]) -> str:
    return "%s-c%d-i%d-o%d" % (label, case["concurrency"], case["input_len"], case["output_len"])


def bench_argv(command: Sequence[str], base_url: str, model: str, tokenizer: str, case: Mapping[str, Any],
               result_dir: str, result_filename: str, seed: int = 0, extra: Sequence[str] = ()) -> list[str]:
    """``vllm bench serve`` against the deployed API: the random dataset at the case's lengths (``--ignore-eos``, so
    every request generates exactly output_len tokens and runs compare), p50 and p99 of TTFT, TPOT and ITL, the
    result saved as JSON. The API key travels in OPENAI_API_KEY (vLLM's bench reads it there), never in argv."""
    return [*command, "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(case["input_len"]), "--random-output-len", str(case["output_len"]),
            "--num-prompts", str(case["num_prompts"]), "--max-concurrency", str(case["concurrency"]),
            "--ignore-eos", "--percentile-metrics", ",".join(metric for metric, _name in METRICS),
            "--metric-percentiles", ",".join(PERCENTILES), "--seed", str(seed), "--disable-tqdm",
            "--save-result", "--result-dir", result_dir, "--result-filename", result_filename, *extra]


def _number(result: Mapping[str, Any], key: str) -> Optional[float]:
    value = result.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summarize(result: Mapping[str, Any], case: Mapping[str, Any], label: str) -> dict[str, Any]:
    """One result JSON of vllm bench serve -> the row of the tables; a run where no request completed is an error
    naming the first request error it recorded."""
    completed = int(result.get("completed") or 0)
    errors = [e for e in result.get("errors") or [] if e]
    if completed == 0:
        raise BenchError("vllm bench serve completed no request (%s, %d prompts): %s" % (
            case_name(label, case), case["num_prompts"],
            (str(errors[0]).strip().splitlines() or ["no error recorded"])[-1] if errors else "no error recorded"))
    row: dict[str, Any] = {"label": label, "concurrency": case["concurrency"], "input_len": case["input_len"],
                           "output_len": case["output_len"], "num_prompts": case["num_prompts"],
                           "completed": completed, "failed": int(result.get("failed") or 0),
                           "duration_s": _number(result, "duration"),
                           "output_tokens_per_s": _number(result, "output_throughput"),
                           "requests_per_s": _number(result, "request_throughput"),
                           "total_tokens_per_s": _number(result, "total_token_throughput")}
    for metric, _name in METRICS:
        for p in PERCENTILES:
            key = "p%s_%s_ms" % (p, metric)
            row[key] = _number(result, key)
            if row[key] is None and p == "50":
                row[key] = _number(result, "median_%s_ms" % metric)
    return row


def raw_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """The result as kept on the controller: everything vllm bench serve wrote except the generated texts."""
    return {k: v for k, v in result.items() if k != "generated_texts"}


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else ("%.*f" % (digits, value))


def markdown(rows: Sequence[Mapping[str, Any]], extras: Mapping[str, Any] = ()) -> str:
    """The table of every case run (one row each), then the fabric figures (``extras``: the last distributed
    preflight's all-reduce busbw, the raw TCP throughput per link), then, when several labels are present, the
    side-by-side table."""
    head = ["label", "concurrency", "input/output", "prompts (ok/failed)", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
            "ITL p50/p99 ms", "output tok/s", "req/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["label"]), str(r["concurrency"]), "%d/%d" % (r["input_len"], r["output_len"]),
            "%d (%d/%d)" % (r["num_prompts"], r["completed"], r["failed"]),
            *("%s / %s" % (_fmt(r.get("p50_%s_ms" % m)), _fmt(r.get("p99_%s_ms" % m))) for m, _name in METRICS),
            _fmt(r.get("output_tokens_per_s"), 2), _fmt(r.get("requests_per_s"), 3)]) + " |")
    out = "\n".join(lines) + "\n"
    fabric = _fabric_lines(extras or {})
    if fabric:
        out += "\n" + fabric
    side = side_by_side(rows)
    if side:
        out += "\n" + side
    return out


def _fabric_lines(extras: Mapping[str, Any]) -> str:
    lines = []
    if "allreduce" in extras:
        lines.append("- the last distributed preflight: %s" % (
            extras.get("allreduce") or "no all-reduce measured (run playbooks/distributed_preflight.yml first)"))
    for link in extras.get("tcp") or []:
        if link.get("error"):
            lines.append("- raw TCP %s -> %s: failed (%s)" % (link.get("src"), link.get("dst"), link["error"]))
        else:
            lines.append("- raw TCP %s -> %s over the fabric: %s GB/s (%s Gbit/s, %d MiB, one stream)" % (
                link.get("src"), link.get("dst"), _fmt(link.get("gbytes_per_s"), 2), _fmt(link.get("gbits_per_s"), 1),
                int(link.get("mib") or 0)))
    return "\n".join(lines) + "\n" if lines else ""


def side_by_side(rows: Sequence[Mapping[str, Any]]) -> str:
    """With two labels or more: one row per case, output tokens/s and TTFT p50 of each label, and each label's
    tokens/s as a ratio to the first label's; '' with one label."""
    labels: list[str] = []
    for r in rows:
        if r["label"] not in labels:
            labels.append(r["label"])
    if len(labels) < 2:
        return ""
    by_case: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        by_case.setdefault((r["concurrency"], r["input_len"], r["output_len"]), {})[r["label"]] = r
    head = ["concurrency", "input/output"] + ["%s tok/s" % lb for lb in labels] + \
        ["%s TTFT p50 ms" % lb for lb in labels] + ["%s / %s" % (lb, labels[0]) for lb in labels[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (concurrency, length_in, length_out), got in sorted(by_case.items()):
        tps = [got[lb].get("output_tokens_per_s") if lb in got else None for lb in labels]
        ttft = [got[lb].get("p50_ttft_ms") if lb in got else None for lb in labels]
        ratios = [_fmt(t / tps[0], 2) if t is not None and tps[0] else "-" for t in tps[1:]]
        cells = [str(concurrency), "%d/%d" % (length_in, length_out)]
        cells += [_fmt(t, 2) for t in tps] + [_fmt(t) for t in ttft] + ratios
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def allreduce_line(proof: Any) -> Optional[str]:
    """The all-reduce line of the distributed preflight's proof file (the last line of its ``summary``:
    ``all-reduce of 16.0 MiB float32 over 2 ranks: ... busbw 1.234 GB/s``), or None when none was measured."""
    summary = proof.get("summary") if isinstance(proof, Mapping) else None
    lines = [str(x) for x in summary if str(x).startswith("all-reduce of ")] if isinstance(summary, list) else []
    return lines[-1] if lines else None


def merge_rows(earlier: Iterable[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The results directory's rows after this run: an earlier row of the same label and case is replaced."""
    keys = {(r["label"], r["concurrency"], r["input_len"], r["output_len"]) for r in new}
    kept = [dict(r) for r in earlier
            if (r.get("label"), r.get("concurrency"), r.get("input_len"), r.get("output_len")) not in keys]
    return kept + [dict(r) for r in new]


def load_rows(text: str, path: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BenchError("%s is not JSON (%s); move it away, or pick another bench_results_dir" % (path, exc))
    rows = data.get("rows") if isinstance(data, Mapping) else None
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) and "label" in r for r in rows):
        raise BenchError("%s holds no bench rows (expected {\"rows\": [...]}); move it away, or pick another "
                         "bench_results_dir" % path)
    return [dict(r) for r in rows]


# ---------------------------------------------------------------------------
# Raw TCP over the fabric: one stream, receiver on the peer, sender here.
# ---------------------------------------------------------------------------

CHUNK = 1 << 20


def tcp_receive(bind_ip: str, port: int, peer_ip: str, timeout: float = 60.0) -> dict[str, Any]:
    """Accept one connection from ``peer_ip`` (another is refused and closed) and read until EOF; bytes and the
    seconds from the first byte to EOF."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((bind_ip, port))
        srv.listen(4)
        deadline = time.monotonic() + timeout
        while True:
            srv.settimeout(max(0.1, deadline - time.monotonic()))
            conn, addr = srv.accept()
            if addr[0] == peer_ip:
                break
            conn.close()
        with conn:
            conn.settimeout(timeout)
            view = memoryview(bytearray(CHUNK))
            total, first = 0, None
            while True:
                n = conn.recv_into(view)
                if not n:
                    break
                if first is None:
                    first = time.monotonic()
                total += n
            seconds = time.monotonic() - (first or time.monotonic())
    return throughput(total, seconds)


def tcp_send(bind_ip: str, dst_ip: str, port: int, mib: int, connect_wait: float = 15.0,
             timeout: float = 60.0) -> dict[str, Any]:
    """Send ``mib`` MiB from the fabric address to ``dst_ip``; a refusal (the receiver starts in the same task) is
    retried for ``connect_wait`` seconds."""
    deadline = time.monotonic() + connect_wait
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.bind((bind_ip, 0))
            sock.connect((dst_ip, port))
            break
        except ConnectionRefusedError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        except OSError:
            sock.close()
            raise
    with sock:
        buf = memoryview(bytearray(CHUNK))
        start = time.monotonic()
        for _chunk in range(mib):
            sock.sendall(buf)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the receiver closes once it read everything
        seconds = time.monotonic() - start
    return throughput(mib * CHUNK, seconds)


def throughput(total: int, seconds: float) -> dict[str, Any]:
    rate = total / seconds if seconds > 0 else 0.0
    return {"bytes": total, "mib": total // CHUNK, "seconds": round(seconds, 4),
            "gbytes_per_s": round(rate / 1e9, 3), "gbits_per_s": round(rate * 8 / 1e9, 2)}


# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom; 1.96 (the normal's) past the table.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def paired_ratio_interval(first: Sequence[float], second: Sequence[float]) -> dict[str, Any]:
    """The ratio first/second of two servers measured in turns (A B A B ... A), with its 95% confidence interval.

    ``first`` holds one more value than ``second``: each second[i] is bracketed by first[i] and first[i + 1], so each
    round's ratio is their mean over second[i], and the machine's drift falls on both sides of it alike. The
    interval is Student's t on the log ratios (a ratio's spread is multiplicative), exponentiated back; ``half`` is
    its larger half-width relative to the ratio (0.03 means +-3%). It needs at least two rounds.
    """
    if len(first) != len(second) + 1:
        raise BenchError("paired rounds need A B A B ... A: %d values of the first, %d of the second"
                         % (len(first), len(second)))
    if len(second) < 2:
        raise BenchError("a confidence interval needs at least 2 rounds; got %d" % len(second))
    values = [float(v) for v in (*first, *second)]
    if min(values) <= 0:
        raise BenchError("every measured value must be above 0; got %s" % values)
    logs = [math.log((first[i] + first[i + 1]) / 2.0 / second[i]) for i in range(len(second))]
    n = len(logs)
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    t = T_975[n - 2] if n - 2 < len(T_975) else 1.96
    ratio, low, high = math.exp(mean), math.exp(mean - t * sd / math.sqrt(n)), math.exp(mean + t * sd / math.sqrt(n))
    return {"ratio": ratio, "low": low, "high": high, "rounds": n,
            "half": max(high - ratio, ratio - low) / ratio, "ratios": [math.exp(x) for x in logs]}
