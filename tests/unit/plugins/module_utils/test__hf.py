# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A Hugging Face download's result and failure messages: cause, fix, and never the token."""

from __future__ import annotations

import json

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._hf import (
    crash_outcome,
    download_result,
    ended,
    failure_message,
)

TOKEN = "hf_PlantedTokenOfTheTest0123456789abcd"
REQUEST = {"repo_id": "meta-llama/Llama-3.1-8B", "revision": "", "cache_dir": "/var/lib/multinode-vllm/hf-cache",
           "endpoint": "", "python": "/opt/multinode-vllm/venv/bin/python", "token": True}


@pytest.mark.parametrize("outcome, token, parts", [
    ({"kind": "gated", "status": 403}, True, [
        "spark1: meta-llama/Llama-3.1-8B is a gated repo and the account of the token in model_hf_token has not been "
        "granted access (HTTP 403); accept its conditions on https://huggingface.co/meta-llama/Llama-3.1-8B"]),
    ({"kind": "gated", "status": 401}, False, ["no token was given (model_hf_token is empty)"]),
    ({"kind": "repo", "status": 401}, False, [
        "spark1: the Hub has no public repo meta-llama/Llama-3.1-8B (HTTP 401: it does not exist, or it is private "
        "or gated and no token was given); check model_hf_repo_id, or set model_hf_token"]),
    ({"kind": "repo", "status": 404}, True, ["that the token in model_hf_token can read (HTTP 404"]),
    ({"kind": "revision", "status": 404}, True, [
        "spark1: meta-llama/Llama-3.1-8B has no revision main (HTTP 404); set model_hf_revision"]),
    ({"kind": "auth", "status": 401}, True, [
        "spark1: the Hub refused the token in model_hf_token (HTTP 401: invalid, expired or revoked); set "
        "model_hf_token to a valid read token (https://huggingface.co/settings/tokens)"]),
    ({"kind": "auth", "status": 401}, False, ["the Hub wants a token for meta-llama/Llama-3.1-8B (HTTP 401)"]),
    ({"kind": "forbidden", "status": 403}, True, ["the token in model_hf_token may not read"]),
    ({"kind": "rate_limit", "status": 429}, True, ["rate-limited", "(HTTP 429); wait a few minutes and run again"]),
    ({"kind": "hub_error", "status": 503}, True, ["answered HTTP 503", "run again later"]),
    ({"kind": "offline", "status": None}, True, [
        "is not fully in the Hugging Face cache (/var/lib/multinode-vllm/hf-cache) and model_hf_offline is true "
        "(HF_HUB_OFFLINE=1)", "set model_hf_offline to false"]),
    ({"kind": "network", "status": None}, True, ["cannot reach the Hugging Face Hub at https://huggingface.co",
                                                 "HTTPS_PROXY/NO_PROXY", "set model_hf_offline to true"]),
    ({"kind": "proxy", "status": None}, True, ["through the proxy in its environment (HTTPS_PROXY)"]),
    ({"kind": "disk", "needed": 128 * 1024 ** 3, "free": 20 * 1024 ** 3, "where": "/var/lib"}, True, [
        "spark1: not enough disk space for meta-llama/Llama-3.1-8B in the Hugging Face cache on /var/lib: needs "
        "128.0 GiB (137438953472 bytes), 20.0 GiB (21474836480 bytes) free; free space there or set model_hf_cache_dir"]),
    ({"kind": "disk", "error": "OSError: [Errno 28] No space left on device"}, True, [
        "not enough disk space", "huggingface_hub said: OSError: [Errno 28] No space left on device"]),
    ({"kind": "permission"}, True, ["permission denied writing the Hugging Face cache"]),
    ({"kind": "no_hub"}, True, ["/opt/multinode-vllm/venv/bin/python cannot import huggingface_hub; set model_python"]),
    ({"kind": "no_python", "ended": "exit status 127"}, True, ["does not exist or cannot run (exit status 127)"]),
    ({"kind": "crashed", "ended": "killed by signal 9 (SIGKILL: out of memory?)"}, True,
     ["ended without a result (killed by signal 9 (SIGKILL: out of memory?)); run again"]),
    ({"kind": "error", "error": "ValueError: odd"}, True, [
        "downloading meta-llama/Llama-3.1-8B (revision the default branch) failed; huggingface_hub said: ValueError: odd"]),
])
def test_every_cause_is_named_with_its_fix(outcome, token, parts):
    message = failure_message("spark1", dict(REQUEST, token=token), outcome)
    for part in parts:
        assert part in message, message


def test_a_mirror_endpoint_is_named_and_a_long_error_is_cut():
    message = failure_message("spark1", dict(REQUEST, endpoint="http://mirror:8080/"),
                              {"kind": "network", "error": "ConnectError: " + "x" * 1000})
    assert "at http://mirror:8080," in message and message.endswith("x...")
    assert len(message) < 900


@pytest.mark.parametrize("kind", ["auth", "repo", "gated", "network", "error", "crashed", "disk"])
def test_a_planted_token_never_reaches_the_failure_output(kind):
    """The token in every field huggingface_hub or the process could have put it in: none of it comes out."""
    outcome = {"ok": False, "kind": kind, "status": 401, "ended": "exit status 1 " + TOKEN, "where": TOKEN,
               "error": "HfHubHTTPError: 401 Client Error (request's Authorization: Bearer %s) token=%s" % (TOKEN, TOKEN)}
    result = download_result("spark1", REQUEST, outcome, secrets=[TOKEN])
    text = json.dumps(result)
    assert result["failed"] is True and TOKEN not in text and "<redacted>" in text
    # A token of another account (one huggingface_hub found in its own login file) is not known here: its shape is.
    other = "hf_" + "Z" * 34
    result = download_result("spark1", REQUEST, dict(outcome, error="token %s refused" % other), secrets=[TOKEN])
    assert other not in json.dumps(result)


def test_a_crashed_process_with_the_token_in_its_output_does_not_leak_it():
    printed = "Traceback (most recent call last):\n  ...\nRuntimeError: header Authorization: Bearer %s\n" % TOKEN
    result = download_result("spark1", REQUEST, None, returncode=-9, stderr=printed, secrets=[TOKEN])
    assert result["failed"] and result["kind"] == "crashed" and TOKEN not in json.dumps(result)
    assert "killed by signal 9 (SIGKILL: out of memory?)" in result["msg"]


def test_a_success_reports_the_snapshot_and_whether_a_token_was_used_never_the_token():
    result = download_result("spark1", REQUEST, {"ok": True, "cached": False, "token": True, "path": "/c/snap",
                                                 "commit": "a" * 40, "bytes": 10, "files": 2, "seconds": 1.5})
    assert result == {"changed": True, "cached": False, "token": True, "snapshot": "/c/snap", "commit": "a" * 40,
                      "bytes": 10, "files": 2, "seconds": 1.5}
    cached = download_result("spark1", REQUEST, {"ok": True, "cached": True, "token": False, "path": "/c/snap"})
    assert cached == {"changed": False, "cached": True, "token": False, "snapshot": "/c/snap"}


@pytest.mark.parametrize("returncode, stderr, kind", [
    (1, "Traceback...\nModuleNotFoundError: No module named 'huggingface_hub'\n", "no_hub"),
    (127, "sh: 1: exec: /opt/venv/bin/python: not found\n", "no_python"),
    (126, "permission denied\n", "no_python"),
    (-9, "", "crashed"),
    (1, "Segmentation fault\n", "crashed"),
])
def test_crash_outcome(returncode, stderr, kind):
    outcome = crash_outcome(returncode, stderr)
    assert outcome["kind"] == kind and outcome["ok"] is False
    assert outcome["error"] == (stderr.strip().splitlines()[-1] if stderr else "")


def test_ended():
    assert ended(0) == "exit status 0" and ended(None) == "no exit status"
    assert ended(-15) == "killed by signal 15 (SIGTERM)"
