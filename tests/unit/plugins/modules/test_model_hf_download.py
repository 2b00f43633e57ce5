# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_hf_download: the token only through its 0600 file, progress while the download runs, and a failure that
names its cause and never the token.

The download tests run the real huggingface_hub (2.4, from the lab's node venv, read only: no bytecode is written
there) through the module's main(), as Ansible runs it. What stands in for what: ``hf_fake_hub.FakeHub``, a local
HTTP server answering as the Hugging Face Hub does, stands in for the Hub (no network here); it serves the bytes
at a bounded rate, so that a status run sees the download midway. They skip where that venv is missing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._secrets import SOURCE_ARGV, secret_env_file
from ansible_collections.multinode.vllm.plugins.modules import model_hf_download
from ansible_collections.multinode.vllm.tests.unit.plugins.modules.hf_fake_hub import COMMIT, FakeHub

NODE_PYTHON = "/var/lib/multinode-vllm-lab/cache/node-venv/bin/python"
TOKEN = "hf_PlantedTokenOfTheTest0123456789abcd"
MIB = 1024 * 1024


def _has_hub() -> bool:
    if not os.access(NODE_PYTHON, os.X_OK):
        return False
    probe = subprocess.run([NODE_PYTHON, "-B", "-c", "import huggingface_hub"], capture_output=True, check=False,
                           env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    return probe.returncode == 0


needs_hub = pytest.mark.skipif(not _has_hub(), reason="huggingface_hub is not importable from %s (make lab-venv)"
                               % NODE_PYTHON)


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "hf-token.env"
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret_env_file({"HF_TOKEN": TOKEN}))
    return str(path)


@pytest.fixture
def node_env(monkeypatch, tmp_path):
    """The head's environment as the module sees it: no proxy for the local Hub, nothing written to the node venv."""
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "HF_TOKEN",
                "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def _args(tmp_path, hub_url, token_file=None, **extra):
    args = {"host": "spark1", "repo_id": "org/tiny", "cache_dir": str(tmp_path / "hf-cache"), "endpoint": hub_url,
            "python": NODE_PYTHON, "state_dir": str(tmp_path / "state")}
    if token_file:
        args["token_file"] = token_file
    args.update(extra)
    return args


FILES = {"config.json": b'{"architectures": ["Tiny"]}', "model.safetensors": os.urandom(24 * MIB),
         "tokenizer/vocab.json": b"{}"}
TOTAL = sum(len(d) for d in FILES.values())


# ---------------------------------------------------------------------------
# No secret in what the task carries
# ---------------------------------------------------------------------------


def test_the_command_and_environment_carry_the_token_file_never_the_token(token_file, tmp_path):
    params = dict(_args(tmp_path, "http://127.0.0.1:9", token_file), revision="", allow_patterns=[], offline=False,
                  job="run", progress_interval=5)
    argv = model_hf_download._command(params, str(tmp_path / "job"))
    assert argv[:3] == list(SOURCE_ARGV) and argv[3] == token_file and argv[4] == NODE_PYTHON and argv[5] == "-c"
    assert TOKEN not in json.dumps(argv) and TOKEN not in json.dumps(model_hf_download._environment(params))
    assert model_hf_download._secrets(params) == [TOKEN]  # read back, only to redact
    assert model_hf_download._command(dict(params, token_file=None), "/j")[:2] == [NODE_PYTHON, "-c"]


def test_a_missing_token_file_fails_naming_it(run_main, tmp_path):
    code, result = run_main(model_hf_download.main, _args(tmp_path, "", str(tmp_path / "gone.env"), job="start"))
    assert code == 1 and result["msg"] == ("spark1: the token file %s is missing; the role writes it from "
                                           "model_hf_token before the download" % (tmp_path / "gone.env"))


def test_status_without_a_started_download_says_so(run_main, tmp_path):
    code, result = run_main(model_hf_download.main, _args(tmp_path, "", job="status"))
    assert code == 1 and result["job_state"] == "none" and "no Hugging Face download was started in" in result["msg"]


# ---------------------------------------------------------------------------
# The real huggingface_hub against a local fake Hub
# ---------------------------------------------------------------------------


@needs_hub
def test_a_download_shows_its_progress_then_its_snapshot_and_is_cached_after(run_main, node_env, token_file, tmp_path):
    def run(args):
        return run_main(model_hf_download.main, args)

    with FakeHub(FILES, lfs=("model.safetensors",), token=TOKEN, rate=12 * MIB) as hub:
        code, started = run(_args(tmp_path, hub.url, token_file, job="start"))
        assert code == 0 and started["job_state"] == "started" and started["adopted"] is False, started
        samples, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:
            code, status = run(_args(tmp_path, hub.url, token_file, job="status"))
            if status.get("job_state") != "running":
                break
            samples.append(status["progress"])
            time.sleep(0.05)
        outputs = [started, status] + samples
        assert code == 0 and status["job_state"] == "done", status
        # Midway: huggingface_hub writes 10 MiB chunks; a sample saw part of the model in the cache.
        measured = [s for s in samples if "bytes_total" in s]
        assert measured and all(s["bytes_total"] == TOTAL and s["files_total"] == 3 for s in measured)
        assert any(10 * MIB <= s["bytes_done"] < TOTAL and s["files_done"] < 3 for s in measured), measured
        assert [s["bytes_done"] for s in measured] == sorted(s["bytes_done"] for s in measured)
        assert status["changed"] is True and status["cached"] is False and status["token"] is True
        assert (status["bytes"], status["files"], status["commit"]) == (TOTAL, 3, COMMIT)
        assert status["snapshot"] == str(tmp_path / "hf-cache" / "models--org--tiny" / "snapshots" / COMMIT)
        for name, data in FILES.items():
            assert (tmp_path / "hf-cache" / "models--org--tiny" / "snapshots" / COMMIT / name).read_bytes() == data
        # The token reached the Hub (from the 0600 file the download sourced) and nothing else.
        assert "Bearer " + TOKEN in hub.authorizations
        assert TOKEN not in json.dumps(outputs)
        job_dir = tmp_path / "state" / "hf-download"
        assert not (job_dir / "output.log").exists() and not (job_dir / "outcome.json").exists()
        assert all(TOKEN not in (job_dir / name).read_text() for name in os.listdir(job_dir))
        # Again: complete in the cache, nothing downloaded, the Hub not asked for a byte.
        hub.requests.clear()
        code, again = run(_args(tmp_path, hub.url, token_file, job="run"))
        assert code == 0 and again["changed"] is False and again["cached"] is True and again["snapshot"] == status["snapshot"]
        assert not [r for r in hub.requests if "/resolve/" in r[1]]


@needs_hub
def test_check_mode_says_what_would_be_downloaded_and_downloads_nothing(run_main, node_env, token_file, tmp_path):
    with FakeHub(FILES, lfs=("model.safetensors",), token=TOKEN) as hub:
        code, result = run_main(model_hf_download.main, dict(_args(tmp_path, hub.url, token_file, job="start"),
                                                             _ansible_check_mode=True))
    assert code == 0 and result["changed"] is True and result["would_download"] == {"files": 3, "bytes": TOTAL}
    assert not (tmp_path / "state").exists()  # no job, no state
    assert not (tmp_path / "hf-cache" / "models--org--tiny" / "blobs").exists() or \
        not os.listdir(tmp_path / "hf-cache" / "models--org--tiny" / "blobs")


def _closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@needs_hub
@pytest.mark.parametrize("case, hub_args, args, kind, expected", [
    ("a wrong token", {"token": "hf_TheHubExpectsAnotherToken0123456789"}, {}, "auth",
     "spark1: the Hub refused the token in model_hf_token (HTTP 401: invalid, expired or revoked); set model_hf_token "
     "to a valid read token"),
    ("a private repo and no token", {"token": TOKEN}, {"token_file": None}, "repo",
     "spark1: the Hub has no public repo org/tiny (HTTP 401: it does not exist, or it is private or gated and no token "
     "was given); check model_hf_repo_id, or set model_hf_token"),
    ("a gated repo", {"token": TOKEN, "gated": True}, {}, "gated",
     "spark1: org/tiny is a gated repo and the account of the token in model_hf_token has not been granted access "
     "(HTTP 403)"),
    ("an unknown repo", {"token": TOKEN}, {"repo_id": "org/nope"}, "repo",
     "spark1: the Hub has no repo org/nope that the token in model_hf_token can read (HTTP 404"),
    ("an unknown revision", {"token": TOKEN}, {"revision": "v9"}, "revision",
     "spark1: org/tiny has no revision v9 (HTTP 404); set model_hf_revision"),
    ("offline and not cached", {"token": TOKEN}, {"offline": True}, "offline",
     "and model_hf_offline is true (HF_HUB_OFFLINE=1), so nothing may be downloaded; set model_hf_offline to false"),
    ("no network", {"token": TOKEN}, {"endpoint": "closed"}, "network",
     "spark1: cannot reach the Hugging Face Hub at http://127.0.0.1:"),
    ("not enough disk", {"token": TOKEN, "sizes": {"model.safetensors": 10 * 1024 ** 5}}, {}, "disk",
     "spark1: not enough disk space for org/tiny in the Hugging Face cache on "),
])
def test_a_failure_names_its_cause_and_never_the_token(run_main, node_env, token_file, tmp_path, case, hub_args,
                                                       args, kind, expected):
    # echo: the Hub's error bodies repeat the Authorization header, so the token is in huggingface_hub's exception.
    with FakeHub(FILES, lfs=("model.safetensors",), echo=True, **hub_args) as hub:
        call = _args(tmp_path, hub.url, token_file, job="run")
        call.update(args)
        if call.get("endpoint") == "closed":
            call["endpoint"] = "http://127.0.0.1:%d" % _closed_port()
        if call.get("token_file") is None:
            call.pop("token_file")
        code, result = run_main(model_hf_download.main, call)
    assert code == 1 and result["failed"] and result["kind"] == kind, (case, result)
    assert expected in result["msg"], (case, result["msg"])
    assert TOKEN not in json.dumps(result), case
    if kind in ("auth", "gated"):
        assert "Bearer " + TOKEN in hub.authorizations  # the token was in play: sent, and in the Hub's answer
        assert "<redacted>" in result["msg"]
    assert not os.listdir(tmp_path / "hf-cache" / "models--org--tiny" / "snapshots") if \
        (tmp_path / "hf-cache" / "models--org--tiny" / "snapshots").exists() else True
