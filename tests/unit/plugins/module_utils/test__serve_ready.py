# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm serve readiness: the HTTP answers, and whether each rank reached the head (_serve_ready.py)."""

from __future__ import annotations

import json

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._serve import ServeError
from ansible_collections.multinode.vllm.plugins.module_utils._serve_ready import (
    completion_result,
    health_ok,
    models_list,
    rendezvous_check,
    tokens_per_second,
)

HEAD = "198.18.200.12"


# --- readiness parsing ------------------------------------------------------------


@pytest.mark.parametrize("status, ok", [(200, True), (503, False), (None, False), (404, False)])
def test_health(status, ok):
    assert health_ok(status) is ok


@pytest.mark.parametrize(
    "body, ids",
    [
        ('{"object":"list","data":[{"id":"tiny","object":"model"}]}', ["tiny"]),
        ({"data": [{"id": "a"}, {"id": "b"}]}, ["a", "b"]),
        ('{"data": []}', []),
        ("not json", []),
        ('{"error": "x"}', []),
        (b'{"data":[{"id":"tiny"}]}', ["tiny"]),
    ],
)
def test_models_list(body, ids):
    assert models_list(body) == ids


COMPLETION = json.dumps({
    "choices": [{"index": 0, "text": " world world", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19},
})


def test_completion_result():
    assert completion_result(COMPLETION) == {"text": " world world", "finish_reason": "length",
                                             "completion_tokens": 16, "prompt_tokens": 3}


@pytest.mark.parametrize(
    "body, message",
    [
        ("<html>", "not JSON"),
        ('{"error": {"message": "model not found"}}', "the completion failed: .*model not found"),
        ('{"choices": []}', "no choices\\[0\\].text"),
    ],
)
def test_completion_result_errors(body, message):
    with pytest.raises(ServeError, match=message):
        completion_result(body)


@pytest.mark.parametrize("tokens, seconds, tps", [(192, 6.88, 27.91), (0, 1.0, 0.0), (10, 0, 0.0)])
def test_tokens_per_second(tokens, seconds, tps):
    assert tokens_per_second(tokens, seconds) == tps


# --- native rendezvous over the fabric ------------------------------------------------

def _c(local, remote, rport=29500, state="ESTABLISHED"):
    return {"local": local, "local_port": 40000, "remote": remote, "remote_port": rport, "state": state, "inode": "1"}


@pytest.mark.parametrize(
    "rank, conns, master_port, error",
    [
        (1, [_c("198.18.200.13", HEAD)], 29500, None),
        (1, [_c("198.18.200.13", HEAD, 40111)], None, None),
        (1, [], None, "spark2 \\(rank 1\\): no established connection to the head's fabric address 198.18.200.12"),
        (1, [_c("198.18.200.13", HEAD, state="SYN_SENT")], None, "no established connection"),
        (1, [_c("198.19.2.10", "198.19.1.10")], None, "connected to the head's management address 198.19.1.10"),
        (1, [_c("10.0.0.5", HEAD)], None, "from 10.0.0.5, not from its fabric address 198.18.200.13"),
        (1, [_c("198.18.200.13", HEAD, 40111)], 29500, "not to the rendezvous port 29500"),
        (0, [_c(HEAD, "198.18.200.13")], None, None),
        (0, [], None, "rank 0\\): no other rank is connected"),
    ],
)
def test_rendezvous_check(rank, conns, master_port, error):
    own = HEAD if rank == 0 else "198.18.200.13"
    host = "spark1" if rank == 0 else "spark2"
    result = rendezvous_check(host, rank, conns, own, HEAD, "198.19.1.10", master_port)
    if error is None:
        assert result is None
    else:
        assert result is not None
        import re
        assert re.search(error, result), result
