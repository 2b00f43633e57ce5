# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a Hugging Face download's outcome means for the user: the result, or the cause and the fix.

``_node_hf_download`` (run by the node runtime's python) reports facts: ``kind`` (``gated``, ``repo``,
``revision``, ``auth``, ``offline``, ``network``, ``disk``...), the HTTP status, the exception's class and
text. Here they become a message that names the host, the repo, the variable to change and how, and carries no
secret: every string of the result goes through ``_secrets.redact`` with the token's value (and anything
shaped like a token), whatever huggingface_hub put into its exception texts.

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import signal
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._progress import format_bytes
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import redact

DEFAULT_ENDPOINT = "https://huggingface.co"
# Appended to a message for its context: what huggingface_hub said, cut.
_SAID = 400


def _said(outcome: Mapping[str, Any]) -> str:
    error = str(outcome.get("error") or "")
    if not error:
        return ""
    return "; huggingface_hub said: %s" % (error if len(error) <= _SAID else error[:_SAID] + "...")


def _http(outcome: Mapping[str, Any], default: str) -> str:
    return "HTTP %s" % outcome["status"] if outcome.get("status") else default


def failure_message(host: str, request: Mapping[str, Any], outcome: Mapping[str, Any]) -> str:
    """The cause of a failed download and what to do, for ``outcome["kind"]`` (not yet redacted)."""
    repo = request.get("repo_id", "")
    revision = request.get("revision") or "the default branch"
    endpoint = (request.get("endpoint") or DEFAULT_ENDPOINT).rstrip("/")
    cache = request.get("cache_dir") or "huggingface_hub's default cache (HF_HUB_CACHE)"
    token = bool(request.get("token"))
    kind = outcome.get("kind")
    said = _said(outcome)
    if kind == "disk":
        measured = "" if outcome.get("needed") is not None else said
        return ("%s: not enough disk space for %s in the Hugging Face cache on %s: needs %s (%s bytes), %s (%s bytes) "
                "free; free space there or set model_hf_cache_dir to a larger filesystem%s"
                % (host, repo, outcome.get("where") or cache, format_bytes(outcome.get("needed") or 0),
                   outcome.get("needed", "?"), format_bytes(outcome.get("free") or 0), outcome.get("free", "?"),
                   measured))
    if kind == "gated":
        who = ("the account of the token in model_hf_token has not been granted access" if token else
               "no token was given (model_hf_token is empty)")
        return ("%s: %s is a gated repo and %s (%s); accept its conditions on %s/%s with the account whose read token "
                "is in model_hf_token (access may need the authors' approval), then run again%s"
                % (host, repo, who, _http(outcome, "gated"), endpoint, repo, said))
    if kind == "revision":
        return ("%s: %s has no revision %s (%s); set model_hf_revision to one of its branches, tags or commits, or "
                "empty for its default branch%s" % (host, repo, request.get("revision") or "main",
                                                    _http(outcome, "not found"), said))
    if kind == "repo":
        if token:
            return ("%s: the Hub has no repo %s that the token in model_hf_token can read (%s: it does not exist, or it "
                    "is private or gated for that token's account); check model_hf_repo_id, and that the account can "
                    "read the repo%s" % (host, repo, _http(outcome, "not found"), said))
        return ("%s: the Hub has no public repo %s (%s: it does not exist, or it is private or gated and no token was "
                "given); check model_hf_repo_id, or set model_hf_token for a private or gated repo%s"
                % (host, repo, _http(outcome, "not found"), said))
    if kind == "disabled":
        return "%s: %s is disabled on the Hub; choose another model_hf_repo_id%s" % (host, repo, said)
    if kind == "auth":
        if token:
            return ("%s: the Hub refused the token in model_hf_token (%s: invalid, expired or revoked); set "
                    "model_hf_token to a valid read token (%s/settings/tokens)%s"
                    % (host, _http(outcome, "unauthorized"), endpoint, said))
        return ("%s: the Hub wants a token for %s (%s); set model_hf_token to a read token (%s/settings/tokens)%s"
                % (host, repo, _http(outcome, "unauthorized"), endpoint, said))
    if kind == "forbidden":
        return ("%s: the token in model_hf_token may not read %s (%s); give it read access to the repo (a fine-grained "
                "token needs the repo or its organisation listed) or use another token%s"
                % (host, repo, _http(outcome, "forbidden"), said))
    if kind == "rate_limit":
        return ("%s: the Hub rate-limited the download of %s (%s); wait a few minutes and run again (files already in "
                "the cache are not downloaded again); a token (model_hf_token) has higher limits%s"
                % (host, repo, _http(outcome, "HTTP 429"), said))
    if kind == "hub_error":
        return ("%s: the Hub at %s answered %s for %s: it is down or overloaded; run again later (files already in the "
                "cache are kept)%s" % (host, endpoint, _http(outcome, "an error"), repo, said))
    if kind == "offline":
        return ("%s: %s (revision %s) is not fully in the Hugging Face cache (%s) and model_hf_offline is true "
                "(HF_HUB_OFFLINE=1), so nothing may be downloaded; set model_hf_offline to false, or fill the cache "
                "first%s" % (host, repo, revision, cache, said))
    if kind in ("network", "proxy", "not_cached"):
        via = " through the proxy in its environment (HTTPS_PROXY)" if kind == "proxy" else ""
        return ("%s: cannot reach the Hugging Face Hub at %s%s, and %s is not fully in the cache (%s); check the head's "
                "DNS, route, firewall and HTTPS_PROXY/NO_PROXY towards it, or set model_hf_offline to true with the "
                "model already in model_hf_cache_dir%s" % (host, endpoint, via, repo, cache, said))
    if kind == "permission":
        return ("%s: permission denied writing the Hugging Face cache (%s); make it writable by the user the play "
                "becomes, or set model_hf_cache_dir%s" % (host, cache, said))
    if kind == "no_hub":
        return ("%s: %s cannot import huggingface_hub; set model_python to the node runtime's python (the one with "
                "vLLM, multinode_venv/bin/python)%s" % (host, request.get("python"), said))
    if kind == "no_python":
        return ("%s: %s does not exist or cannot run (%s); set model_python to the node runtime's python "
                "(multinode_venv/bin/python)%s" % (host, request.get("python"), outcome.get("ended"), said))
    if kind == "crashed":
        return ("%s: the download of %s ended without a result (%s); run again (files already in the cache are kept)%s"
                % (host, repo, outcome.get("ended"), said))
    return "%s: downloading %s (revision %s) failed%s" % (host, repo, revision, said or ": no reason given")


def ended(returncode: Optional[int]) -> str:
    """``exit status 1``, ``killed by signal 9 (SIGKILL: out of memory?)``."""
    if returncode is None:
        return "no exit status"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "signal"
        return "killed by signal %d (%s%s)" % (-returncode, name, ": out of memory?" if -returncode == 9 else "")
    return "exit status %d" % returncode


def crash_outcome(returncode: Optional[int], stderr: str) -> dict[str, Any]:
    """The outcome of a download process that wrote none: its exit and the last line of what it printed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if "No module named 'huggingface_hub'" in stderr or "No module named huggingface_hub" in stderr:
        kind = "no_hub"
    elif returncode in (126, 127):
        kind = "no_python"
    else:
        kind = "crashed"
    return {"ok": False, "kind": kind, "status": None, "ended": ended(returncode), "error": last[-_SAID:]}


def redact_all(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {k: redact_all(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_all(v, secrets) for v in value]
    return value


def download_result(host: str, request: Mapping[str, Any], outcome: Optional[Mapping[str, Any]],
                    returncode: Optional[int] = 0, stderr: str = "", secrets: Sequence[str] = ()) -> dict[str, Any]:
    """The module's result for a finished download process: its snapshot, or ``failed`` and the message.

    ``outcome`` is what the process wrote (None when it wrote nothing: it crashed, or its python could not
    run); every string of the result is redacted of ``secrets`` and of anything shaped like a token.
    """
    if outcome is None or not isinstance(outcome, Mapping):
        outcome = crash_outcome(returncode, stderr)
    if outcome.get("ok"):
        result: dict[str, Any] = {"changed": not outcome.get("cached"), "cached": bool(outcome.get("cached")),
                                  "token": bool(outcome.get("token"))}
        if outcome.get("path") is not None:
            # Not ``path``: Ansible would add that path's file attributes to the result (and a ``state``).
            result["snapshot"] = outcome["path"]
        for key in ("commit", "bytes", "files", "seconds", "would_download"):
            if outcome.get(key) is not None:
                result[key] = outcome[key]
    else:
        result = {"failed": True, "msg": failure_message(host, request, outcome), "kind": outcome.get("kind"),
                  "status": outcome.get("status")}
    return redact_all(result, secrets)
