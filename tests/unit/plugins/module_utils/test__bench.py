# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bench.yml's pure logic: the cases refused before any request, the vllm bench serve argument list, the summary of
a result, the tables (side by side across labels), the results directory's merge, and raw TCP over loopback."""

from __future__ import annotations

import threading

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._bench import (
    BenchError,
    allreduce_line,
    api_key_from,
    bench_argv,
    case_name,
    cases,
    check_label,
    load_rows,
    markdown,
    merge_rows,
    paired_ratio_interval,
    raw_result,
    side_by_side,
    summarize,
    tcp_receive,
    tcp_send,
)

# The keys vLLM 0.32.0's `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py, read in the node venv),
# with made-up figures and the per-request lists cut to two requests.
RESULT = {
    "date": "20261206-040000", "backend": "vllm", "num_prompts": 8, "max_concurrency": 4, "duration": 4.2,
    "completed": 8, "failed": 0, "total_input_tokens": 1024, "total_output_tokens": 512,
    "request_throughput": 1.905, "output_throughput": 121.9, "total_token_throughput": 365.7,
    "mean_ttft_ms": 80.0, "median_ttft_ms": 75.0, "std_ttft_ms": 9.0, "p50_ttft_ms": 75.0, "p99_ttft_ms": 140.0,
    "mean_tpot_ms": 30.0, "median_tpot_ms": 29.0, "std_tpot_ms": 1.0, "p50_tpot_ms": 29.0, "p99_tpot_ms": 35.0,
    "mean_itl_ms": 30.0, "median_itl_ms": 28.0, "std_itl_ms": 2.0, "p50_itl_ms": 28.0, "p99_itl_ms": 60.0,
    "input_lens": [128, 128], "output_lens": [64, 64], "ttfts": [0.07, 0.08], "itls": [[0.03], [0.03]],
    "generated_texts": ["a secret-free text", "another"], "errors": ["", ""],
}
CASE = {"concurrency": 4, "input_len": 128, "output_len": 64, "num_prompts": 16}


def test_cases_cross_every_concurrency_with_every_shape_and_size_the_prompts():
    got = cases([1, 4], [{"input_len": 128, "output_len": 64}, {"input_len": 256, "output_len": 32}], 4, 8)
    assert [(c["concurrency"], c["input_len"], c["output_len"], c["num_prompts"]) for c in got] == [
        (1, 128, 64, 8), (4, 128, 64, 16), (1, 256, 32, 8), (4, 256, 32, 16)]


@pytest.mark.parametrize("concurrencies, shapes, words", [
    ([], [{"input_len": 1, "output_len": 1}], "bench_concurrencies is [], expected a non-empty list"),
    ([0], [{"input_len": 1, "output_len": 1}], "bench_concurrencies[0] is 0, expected a whole number >= 1"),
    (["x"], [{"input_len": 1, "output_len": 1}], "bench_concurrencies[0] is 'x'"),
    ([True], [{"input_len": 1, "output_len": 1}], "bench_concurrencies[0] is True"),
    ([1], [{"input_len": 1}], "bench_shapes[0].output_len is None"),
    ([1], [{"input_len": 1, "output_len": 1, "rate": 2}], "bench_shapes[0] is {"),
    ([1], "128/64", "bench_shapes is '128/64', expected a non-empty list"),
    ([2, 2], [{"input_len": 1, "output_len": 1}], "concurrency 2, input 1, output 1 is listed twice"),
])
def test_bad_cases_are_refused_naming_the_value_and_the_fix(concurrencies, shapes, words):
    with pytest.raises(BenchError) as err:
        cases(concurrencies, shapes)
    assert words in str(err.value) and "docs/bench.md" in str(err.value)


def test_a_label_must_name_files_safely():
    assert check_label("tp2-ray") == "tp2-ray"
    for bad in ("", "../x", "a b", "x" * 65):
        with pytest.raises(BenchError, match="bench_label is"):
            check_label(bad)


def test_the_argument_list_pins_the_dataset_and_never_carries_the_key():
    argv = bench_argv(["/opt/venv/bin/vllm"], "http://10.0.0.1:8000", "tiny", "/models/tiny", CASE, "/tmp/b",
                      "x.json", seed=3)
    assert argv[:3] == ["/opt/venv/bin/vllm", "bench", "serve"]
    pairs = dict(zip(argv[3::1], argv[4::1]))
    assert pairs["--base-url"] == "http://10.0.0.1:8000" and pairs["--model"] == "tiny"
    assert pairs["--tokenizer"] == "/models/tiny" and pairs["--dataset-name"] == "random"
    assert (pairs["--random-input-len"], pairs["--random-output-len"]) == ("128", "64")
    assert (pairs["--num-prompts"], pairs["--max-concurrency"], pairs["--seed"]) == ("16", "4", "3")
    assert pairs["--metric-percentiles"] == "50,99" and pairs["--percentile-metrics"] == "ttft,tpot,itl"
    assert "--ignore-eos" in argv and "--save-result" in argv
    assert not any("key" in a.lower() for a in argv)


def test_summary_of_a_result():
    row = summarize(RESULT, CASE, "tp2")
    assert row["output_tokens_per_s"] == 121.9 and row["requests_per_s"] == 1.905
    assert (row["p50_ttft_ms"], row["p99_ttft_ms"], row["p99_itl_ms"]) == (75.0, 140.0, 60.0)
    assert (row["completed"], row["failed"], row["label"]) == (8, 0, "tp2")


def test_a_run_with_no_completed_request_names_its_first_error():
    failed = dict(RESULT, completed=0, failed=8, errors=["Traceback...\naiohttp.ClientResponseError: 401, Unauthorized"])
    with pytest.raises(BenchError) as err:
        summarize(failed, CASE, "tp2")
    assert "tp2-c4-i128-o64" in str(err.value) and "401, Unauthorized" in str(err.value)


def test_the_raw_result_drops_only_the_generated_texts():
    raw = raw_result(RESULT)
    assert "generated_texts" not in raw and raw["ttfts"] == RESULT["ttfts"]


def test_the_table_and_the_fabric_lines():
    row = summarize(RESULT, CASE, "tp2")
    text = markdown([row], {"allreduce": "all-reduce of 16.0 MiB float32 over 2 ranks: 5.0 ms per op, algbw 3.355 "
                                         "GB/s, busbw 3.355 GB/s",
                            "tcp": [{"src": "10.0.0.1", "dst": "10.0.0.2", "mib": 256, "gbytes_per_s": 2.5,
                                     "gbits_per_s": 20.0}, {"src": "10.0.0.1", "dst": "10.0.0.3", "error": "refused"}]})
    assert "| tp2 | 4 | 128/64 | 16 (8/0) | 75.0 / 140.0 | 29.0 / 35.0 | 28.0 / 60.0 | 121.90 | 1.905 |" in text
    assert "- the last distributed preflight: all-reduce of 16.0 MiB" in text
    assert "- raw TCP 10.0.0.1 -> 10.0.0.2 over the fabric: 2.50 GB/s (20.0 Gbit/s, 256 MiB, one stream)" in text
    assert "- raw TCP 10.0.0.1 -> 10.0.0.3: failed (refused)" in text
    assert side_by_side([row]) == ""
    assert "no all-reduce measured" in markdown([row], {"allreduce": None})


def test_two_labels_side_by_side_with_the_ratio_to_the_first():
    a = summarize(RESULT, CASE, "tp2")
    b = summarize(dict(RESULT, output_throughput=243.8, p50_ttft_ms=50.0), CASE, "replicas")
    table = side_by_side([a, b])
    assert "| concurrency | input/output | tp2 tok/s | replicas tok/s | tp2 TTFT p50 ms | replicas TTFT p50 ms | " \
           "replicas / tp2 |" in table
    assert "| 4 | 128/64 | 121.90 | 243.80 | 75.0 | 50.0 | 2.00 |" in table


def test_merge_replaces_the_same_label_and_case_and_keeps_the_others():
    old = [summarize(RESULT, CASE, "tp2"), summarize(RESULT, CASE, "replicas")]
    new = [summarize(dict(RESULT, output_throughput=1.0), CASE, "tp2")]
    merged = merge_rows(old, new)
    assert [(r["label"], r["output_tokens_per_s"]) for r in merged] == [("replicas", 121.9), ("tp2", 1.0)]


def test_a_results_file_that_is_not_ours_is_refused():
    with pytest.raises(BenchError, match="is not JSON"):
        load_rows("{", "/r/results.json")
    with pytest.raises(BenchError, match="holds no bench rows"):
        load_rows('{"rows": [1]}', "/r/results.json")
    assert load_rows('{"rows": [{"label": "a"}]}', "/r/results.json") == [{"label": "a"}]


def test_the_api_key_from_the_serve_env_file_or_a_bare_file():
    assert api_key_from("# vllm\nVLLM_API_KEY='abc123'\n") == "abc123"
    assert api_key_from("abc123\n") == "abc123"
    assert api_key_from("OTHER=1\n") == ""


def test_allreduce_line_of_a_proof():
    proof = {"summary": ["spark1 rank 0 ok", "all-reduce of 16.0 MiB float32 over 2 ranks: 1 ms per op"]}
    assert allreduce_line(proof).startswith("all-reduce of 16.0 MiB")
    assert allreduce_line({"summary": ["no all-reduce bandwidth measured"]}) is None
    assert allreduce_line(None) is None


def test_case_name():
    assert case_name("tp2", CASE) == "tp2-c4-i128-o64"


def test_raw_tcp_over_loopback_counts_every_byte():
    got = {}
    receiver = threading.Thread(target=lambda: got.update(tcp_receive("127.0.0.1", 29661, "127.0.0.1", 20)))
    receiver.start()
    sent = tcp_send("127.0.0.1", "127.0.0.1", 29661, 8)
    receiver.join(20)
    assert sent["bytes"] == got["bytes"] == 8 * 1048576
    assert sent["gbytes_per_s"] > 0 and got["mib"] == 8


# The paired ratio of two servers measured in turns (A B A B ... A) and its 95% interval (issue 24's tokens/s).


def test_paired_ratio_interval_by_hand():
    # Rounds 100/95, 100/105, 100/100: log ratios 0.051293, -0.048790, 0; mean 0.000834, sd 0.050047, t(2) 4.303.
    got = paired_ratio_interval([100, 100, 100, 100], [95, 105, 100])
    assert got["rounds"] == 3
    assert got["ratio"] == pytest.approx(1.000834, abs=1e-5)
    assert (got["low"], got["high"]) == (pytest.approx(0.88382, abs=1e-4), pytest.approx(1.13333, abs=1e-4))
    assert got["half"] == pytest.approx(0.13238, abs=1e-4)
    assert got["ratios"] == pytest.approx([100 / 95, 100 / 105, 1.0])


def test_paired_ratio_brackets_each_second_value_by_its_neighbours():
    # A drifts from 100 to 80 over the run and B is always 10% below the A around it: every round says 1/0.9.
    first = [100.0, 95.0, 90.0, 85.0, 80.0]
    second = [(first[i] + first[i + 1]) / 2 * 0.9 for i in range(4)]
    got = paired_ratio_interval(first, second)
    assert got["ratio"] == pytest.approx(1 / 0.9)
    assert got["half"] == pytest.approx(0.0, abs=1e-9)


def test_paired_ratio_interval_narrows_with_more_rounds():
    noise = [1.02, 0.98, 1.01, 0.99]
    few = paired_ratio_interval([100.0] * 5, [100.0 / x for x in noise])
    many = paired_ratio_interval([100.0] * 17, [100.0 / x for x in noise * 4])
    assert many["half"] < few["half"] / 2, (few["half"], many["half"])


@pytest.mark.parametrize("first, second, words", [
    ([1.0, 2.0], [1.0, 2.0], "A B A B ... A: 2 values of the first, 2 of the second"),
    ([1.0, 2.0], [1.0], "at least 2 rounds; got 1"),
    ([1.0, 2.0, 0.0], [1.0, 2.0], "above 0"),
])
def test_paired_ratio_interval_refuses_what_it_cannot_compute(first, second, words):
    with pytest.raises(BenchError) as caught:
        paired_ratio_interval(first, second)
    assert words in str(caught.value)
