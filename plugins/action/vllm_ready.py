# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of vllm_ready: poll the API, print progress, judge failures.

HTTP requests go from the controller straight to the API (proxy variables are
ignored). At every poll the module of the same name runs on the task's host
(the head) and returns the serve process and the tail of its log, so progress
lines show the latest meaningful log line and a crash is seen at once.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.multinode.vllm.plugins.module_utils._serve import ServeError
from ansible_collections.multinode.vllm.plugins.module_utils._serve_failure import (
    failure_message,
    fatal_line,
    likely_cause,
    this_start,
)
from ansible_collections.multinode.vllm.plugins.module_utils._serve_ready import (
    completion_result,
    health_ok,
    models_list,
    tokens_per_second,
)

display = Display()

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http(method: str, url: str, body=None, timeout: float = 10.0, api_key: str = ""):
    """(status, text); status None when the connection itself failed (text says why)."""
    data = json.dumps(body).encode("utf-8") if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset((
        "url", "served_model_name", "timeout", "interval", "api_interval", "progress_every", "prompt", "max_tokens",
        "burst_requests", "burst_tokens", "logs", "lines", "connections", "expect_pid", "api_key",
        "first_errors",
    ))

    def _node(self, task_vars, args):
        module_args = {k: args[k] for k in ("logs", "lines", "connections", "first_errors") if k in args}
        return self._execute_module(module_name="multinode.vllm.vllm_ready", module_args=module_args,
                                    task_vars=task_vars)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        self._failure_vars = task_vars
        args = self._task.args
        url = str(args.get("url") or "").rstrip("/")
        if not url:
            # Only read the node.
            result.update(self._node(task_vars, args))
            return result
        host = task_vars.get("inventory_hostname", "head")
        name = str(args.get("served_model_name") or "")
        timeout = float(args.get("timeout", 600))
        interval = float(args.get("interval", 5))
        # The API is cheap to ask from here; the node (a module run over SSH) only every `interval`.
        api_interval = min(interval, float(args.get("api_interval", 1)))
        every = float(args.get("progress_every", 15))
        prompt = str(args.get("prompt", "Hello, world"))
        max_tokens = int(args.get("max_tokens", 16))
        burst_requests = int(args.get("burst_requests", 3))
        burst_tokens = int(args.get("burst_tokens", 64))
        key = str(args.get("api_key") or "")
        result["changed"] = False
        if self._task.check_mode:
            result.update(skipped=True, msg="check mode: nothing was started, nothing to wait for")
            return result

        start = time.monotonic()
        stage = "health"
        last_said = ("", "")
        last_time = -every
        node = {}
        first_pid = args.get("expect_pid")
        detail = ""
        completion = None
        next_node_read = start
        while True:
            elapsed = time.monotonic() - start
            node_read = time.monotonic() >= next_node_read
            if node_read:
                next_node_read = time.monotonic() + interval
                node = self._node(task_vars, args)
                pid = node.get("pid")
                if node.get("failed"):
                    detail = "could not read the node: %s" % node.get("msg")
                elif first_pid is None and pid is not None:
                    first_pid = pid
                if first_pid is not None and pid != first_pid:
                    why = ("the serve process on %s exited (pid %s)" % (host, first_pid) if pid is None else
                           "the serve process on %s exited and was restarted (pid %s, now %s)"
                           % (host, first_pid, pid))
                    return self._fail(result, host, why, stage, node, elapsed)
                # Only the latest start of each log: a supervisor's restart appends to the same file, and a start
                # that failed earlier (the port was taken then) says nothing of this one.
                fatal = "" if stage == "ready" else fatal_line(
                    [line for lines in (node.get("tails") or {}).values() for line in this_start(lines)])
                if fatal:
                    return self._fail(result, host, "vllm serve on %s failed while starting: %s" % (host, fatal),
                                      stage, node, elapsed)
                if first_pid is None and elapsed > 30:
                    return self._fail(result, host, "no vllm serve process runs on %s" % host, stage, node, elapsed)

            if stage == "health":
                status, text = http("GET", url + "/health", timeout=5)
                if health_ok(status):
                    stage = "models"
                else:
                    detail = "GET /health: %s" % (status if status is not None else text)
            if stage == "models":
                status, text = http("GET", url + "/v1/models", timeout=10, api_key=key)
                listed = models_list(text) if status == 200 else []
                if name in listed or (not name and listed):
                    name = name or listed[0]
                    stage = "completion"
                else:
                    detail = "GET /v1/models: %s lists %s" % (status, listed)
            if stage == "completion":
                t0 = time.monotonic()
                status, text = http("POST", url + "/v1/completions", timeout=120, api_key=key, body={
                    "model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
                try:
                    if status != 200:
                        raise ServeError("POST /v1/completions: %s %s" % (status, text[:200]))
                    completion = completion_result(text)
                    completion["seconds"] = round(time.monotonic() - t0, 3)
                    if completion["text"].strip() == "" and completion["completion_tokens"] == 0:
                        raise ServeError("the completion returned no text")
                    stage = "ready"
                except ServeError as exc:
                    detail = str(exc)

            latest = node.get("latest") or ""
            said = (stage, latest)
            if stage == "ready" or said != last_said or (node_read and elapsed - last_time >= every):
                display.display("%s: %5.0f s  stage %-10s %s" % (
                    host, elapsed, stage, ("log: " + latest) if latest else detail))
                last_said, last_time = said, elapsed
            if stage == "ready":
                break
            if elapsed >= timeout:
                return self._fail(result, host, "vLLM on %s was not ready after %.0f s (stage %s: %s)" % (
                    host, elapsed, stage, detail), stage, node, elapsed)
            time.sleep(api_interval)

        ready_seconds = round(time.monotonic() - start, 1)
        if key:
            # The key must be required, not merely accepted: a request without it is refused.
            status, text = http("GET", url + "/v1/models", timeout=10)
            if status != 401:
                return self._fail(result, host, "the API on %s answered GET /v1/models without the API key with %s "
                                  "(expected 401): it is not protected; check that VLLM_API_KEY reaches vllm serve"
                                  % (url, status), "auth", node, time.monotonic() - start)
            display.display("%s: GET /v1/models without the API key: 401 (refused, as it must be)" % host)
        tokens = 0
        t0 = time.monotonic()
        for _request in range(max(0, burst_requests)):
            status, text = http("POST", url + "/v1/completions", timeout=300, api_key=key, body={
                "model": name, "prompt": prompt, "max_tokens": burst_tokens, "temperature": 0, "ignore_eos": True})
            if status == 200:
                try:
                    tokens += completion_result(text)["completion_tokens"]
                except ServeError:
                    pass
        burst_seconds = time.monotonic() - t0
        tps = tokens_per_second(tokens, burst_seconds) if burst_requests > 0 else None
        display.display("%s: ready after %.1f s; completion %r; %s" % (
            host, ready_seconds, completion["text"],
            "%s tokens/s (%d tokens in %.2f s, %d requests of %d)" % (
                tps, tokens, burst_seconds, burst_requests, burst_tokens) if tps is not None else "no burst"))
        result.update(
            stage="ready", seconds=ready_seconds, text=completion["text"], completion=completion,
            served_model_name=name, tokens_per_second=tps, burst_tokens=tokens,
            burst_seconds=round(burst_seconds, 3), pid=node.get("pid"), latest=node.get("latest"),
            msg="%s: ready after %.1f s; completion %r; %s tokens/s" % (host, ready_seconds, completion["text"], tps),
        )
        return result

    def _fail(self, result, host, reason, stage, node, elapsed):
        # One more read of the node for each log's first exception: the root cause is often far above the tail.
        again = self._node(self._failure_vars, dict(self._task.args, first_errors=True))
        if not again.get("failed"):
            node = again
        tails, firsts = {}, {}
        for path, lines in (node.get("tails") or {}).items():
            tails["%s:%s" % (host, path)] = lines
        for path, error in (node.get("first_errors") or {}).items():
            firsts["%s:%s" % (host, path)] = error
        cause = likely_cause(tails, firsts)
        result.update(
            failed=True, stage=stage, seconds=round(elapsed, 1), cause=cause, tails=node.get("tails") or {},
            reason=reason, msg=failure_message(reason, tails, cause),
        )
        return result
