# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A local stand-in for the Hugging Face Hub's HTTP API, for huggingface_hub itself to download from.

There is no Hub here (no network but PyPI). This server answers the four requests that
``snapshot_download`` (huggingface_hub 2.4) makes, the way the Hub answers them (``HF_ENDPOINT`` points
huggingface_hub at it):

* ``GET /api/models/<repo>[/revision/<rev>]``: the repo's info, ``sha`` the commit;
* ``GET /api/models/<repo>/tree/<rev>?recursive=True``: every file with ``size``, ``oid`` (the git blob id)
  and, for an LFS file, ``lfs`` (``oid`` the sha256, ``size``);
* ``HEAD /<repo>/resolve/<rev>/<path>``: ``X-Repo-Commit``, ``ETag`` (and ``X-Linked-Etag``/``X-Linked-Size`` for
  an LFS file), which huggingface_hub names the cache's blob after;
* ``GET`` of the same: the bytes, ``rate`` bytes per second at most (so that a test sees a download midway).

Errors as the Hub sends them (``X-Error-Code`` / ``X-Error-Message`` headers, huggingface_hub's
``utils/_http.hf_raise_for_status`` turns them into its exceptions): a private repo without a token, a wrong
token, a gated repo, an unknown repo or revision. With ``echo``, an error's JSON body repeats the request's
Authorization header (the real Hub does not; huggingface_hub puts the body's ``error`` into its exception
text, so a test can see that a token in an exception never reaches the task's output). ``sizes`` overrides the
sizes the tree listing announces (a repo too large for the disk). No Xet headers: the files come over plain HTTP.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from typing import Optional
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # nosec - git's object id, not a password


class FakeHub:
    def __init__(self, files: dict, lfs: tuple = (), repo: str = "org/tiny", token: Optional[str] = None,
                 gated: bool = False, rate: Optional[float] = None, echo: bool = False,
                 sizes: Optional[dict] = None) -> None:
        self.files, self.lfs, self.repo, self.token, self.gated, self.rate = files, set(lfs), repo, token, gated, rate
        self.echo, self.sizes = echo, sizes or {}
        self.authorizations: list = []  # the Authorization headers received
        self.requests: list = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub.handle(self, head=True)

            def do_GET(self):
                hub.handle(self, head=False)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- answers --------------------------------------------------------------------

    @staticmethod
    def _send(handler, status: int, body: bytes = b"", headers: Optional[dict] = None, head: bool = False) -> None:
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if not head:
            handler.wfile.write(body)

    def _error(self, handler, status: int, code: str = "", message: str = "", head: bool = False) -> None:
        headers = {"Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        if message:
            headers["X-Error-Message"] = message
        error = message or code
        if self.echo:
            error += " (request's Authorization: %s)" % handler.headers.get("Authorization")
        self._send(handler, status, json.dumps({"error": error}).encode(), headers, head)

    def handle(self, handler, head: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        auth = handler.headers.get("Authorization")
        self.authorizations.append(auth)
        self.requests.append((handler.command, path))
        if self.token is not None and auth is None:
            # A private repo and no token: the Hub answers 401 "Repository Not Found".
            return self._error(handler, 401, "RepoNotFound", "Repository not found", head)
        if auth is not None and self.token is not None and auth != "Bearer " + self.token:
            return self._error(handler, 401, "", "Invalid credentials in Authorization header", head)
        if self.gated:
            return self._error(handler, 403, "GatedRepo", "Access to model %s is restricted" % self.repo, head)
        api = "/api/models/%s" % self.repo
        resolve = "/%s/resolve/" % self.repo
        if path.startswith(api + "/tree/"):
            revision = path[len(api + "/tree/"):].split("/", 1)[0]
            if revision not in ("main", COMMIT):
                return self._error(handler, 404, "RevisionNotFound", "Invalid rev id: %s" % revision, head)
            tree = []
            for name, data in sorted(self.files.items()):
                size = self.sizes.get(name, len(data))
                item = {"type": "file", "path": name, "size": size, "oid": git_blob_id(data)}
                if name in self.lfs:
                    item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
                tree.append(item)
            return self._send(handler, 200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
        if path == api or path.startswith(api + "/revision/"):
            revision = path[len(api + "/revision/"):] if path.startswith(api + "/revision/") else "main"
            if revision not in ("main", COMMIT):
                return self._error(handler, 404, "RevisionNotFound", "Invalid rev id: %s" % revision, head)
            info = {"id": self.repo, "sha": COMMIT, "private": self.token is not None,
                    "siblings": [{"rfilename": name} for name in sorted(self.files)]}
            return self._send(handler, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
        if path.startswith(resolve):
            revision, _sep, name = path[len(resolve):].partition("/")
            if revision not in ("main", COMMIT):
                return self._error(handler, 404, "RevisionNotFound", "Invalid rev id: %s" % revision, head)
            if name not in self.files:
                return self._error(handler, 404, "EntryNotFound", "Entry not found", head)
            data = self.files[name]
            headers = {"X-Repo-Commit": COMMIT, "ETag": '"%s"' % git_blob_id(data),
                       "Content-Type": "application/octet-stream"}
            if name in self.lfs:
                headers["X-Linked-Etag"] = '"%s"' % hashlib.sha256(data).hexdigest()
                headers["X-Linked-Size"] = str(len(data))
            if head or not self.rate:
                return self._send(handler, 200, data, headers, head)
            handler.send_response(200)
            for key, value in headers.items():
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            chunk = max(1, int(self.rate / 20))
            for start in range(0, len(data), chunk):
                try:
                    handler.wfile.write(data[start:start + chunk])
                    handler.wfile.flush()
                except OSError:
                    return None
                time.sleep(chunk / self.rate)
            return None
        return self._error(handler, 404, "RepoNotFound", "Repository not found", head)
