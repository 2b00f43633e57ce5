# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Secret env files (_secrets.py): what sh reads back is exactly what was written; errors never show the value."""
from __future__ import annotations

import json
import subprocess

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import parse_env_file
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import (
    ALWAYS_SECRET_KEYS,
    REDACTED,
    SOURCE_ARGV,
    SecretError,
    is_secret_key,
    non_carry_over_with_secrets,
    parse_secret_env,
    redact,
    redact_data,
    redact_text,
    secret_env_file,
)

HOSTILE = [
    "plain", "", "with space", "it's", 'double "quoted"', "$HOME and $(id) and `id`", "back\\slash", "semi;colon",
    "new\nline", "tab\there", "trailing newline\n", "-e", "--split-string=x", "=x=y", "'; rm -rf / #", "\u00e9t\u00e9 \u2713",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_sourced_by_sh_the_value_comes_back_unchanged(tmp_path, value):
    path = tmp_path / "secret.env"
    path.write_text(secret_env_file({"MY_SECRET": value, "OTHER": "x"}))
    # The real reader: the same sh prefix the roles put before the program.
    out = subprocess.run(list(SOURCE_ARGV) + [str(path), "/usr/bin/env", "-0"], capture_output=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    env = dict(item.split(b"=", 1) for item in out.split(b"\0") if b"=" in item)
    assert env[b"MY_SECRET"].decode() == value and env[b"OTHER"] == b"x"


@pytest.mark.parametrize("values, message", [
    ({"BAD-KEY": "x"}, "key 'BAD-KEY' is not an environment variable name"),
    ({"1X": "x"}, "key '1X'"),
    ({"K": "a\0b"}, "vllm_secret_env.K: the value contains a NUL byte"),
    ({"K": {"a": 1}}, "vllm_secret_env.K: the value must be a string"),
])
def test_bad_secrets_are_refused_without_showing_the_value(values, message):
    with pytest.raises(SecretError) as info:
        secret_env_file(values)
    assert message in str(info.value)
    assert "a\0b" not in str(info.value)


def test_secret_keys_are_never_carried_to_ray_workers():
    assert non_carry_over_with_secrets(["VLLM_HOST_IP"], ["MY_SECRET"]) == sorted(
        {"VLLM_HOST_IP", "MY_SECRET", *ALWAYS_SECRET_KEYS})
    assert "VLLM_API_KEY" in ALWAYS_SECRET_KEYS and "HF_TOKEN" in ALWAYS_SECRET_KEYS


TOKEN_VALUE = "hf_PlantedTokenOfTheTest0123456789abcd"


def test_the_secret_env_file_round_trips_and_redact_covers_token_shapes():
    text = secret_env_file({"HF_TOKEN": TOKEN_VALUE, "OTHER": "it's $x"})
    assert parse_secret_env(text) == {"HF_TOKEN": TOKEN_VALUE, "OTHER": "it's $x"}
    assert parse_secret_env("# comment\nnot a line\nBAD-KEY=1\nA=1 B=2\n") == {}
    assert redact("a %s b" % TOKEN_VALUE, [TOKEN_VALUE]) == "a <redacted> b"
    assert redact("Authorization: Bearer abc.def", []) == "Authorization: Bearer <redacted>"
    assert redact("api_" + "k" * 34, []) == "<redacted>"
    assert redact("hf_short and hf_transfer", []) == "hf_short and hf_transfer"  # not token-shaped: kept


@pytest.mark.parametrize("value", [v for v in HOSTILE if "\n" not in v])
def test_for_the_launcher_the_value_is_written_as_is_and_reads_back(value):
    text = secret_env_file({"MY_SECRET": value, "OTHER": "x"}, reader="launcher")
    assert parse_env_file(text) == {"MY_SECRET": value, "OTHER": "x"}


@pytest.mark.parametrize("value", ["new\nline", "cr\rhere", "trailing newline\n"])
def test_for_the_launcher_a_line_break_is_refused_naming_the_key_not_the_value(value):
    with pytest.raises(SecretError) as caught:
        secret_env_file({"MY_SECRET": value}, reader="launcher")
    assert "vllm_secret_env.MY_SECRET" in str(caught.value) and value.strip() not in str(caught.value)


def test_an_unknown_reader_is_refused():
    with pytest.raises(SecretError, match="reader must be one of sh, launcher"):
        secret_env_file({"A": "1"}, reader="bash")


# --- redacting a bundle (doctor) ---

PLANTED = {"api": "sk-planted-0123456789", "ray": "ray-planted-abcdefghij", "hf": "hf_" + "Zz09" * 9,
           "extra": "s3cr3t-extra-value"}


@pytest.mark.parametrize("key, secret", [
    ("VLLM_API_KEY", True), ("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("RAY_AUTH_TOKEN", True),
    ("DB_PASSWORD", True), ("aws_secret_access_key", True), ("--api-key", True),
    ("RAY_AUTH_TOKEN_PATH", False), ("auth_token_sha256", False), ("RAY_AUTH_MODE", False),
    ("NCCL_SOCKET_IFNAME", False), ("VLLM_HOST_IP", False), (3, False),
])
def test_is_secret_key(key, secret):
    assert is_secret_key(key) is secret


def test_redact_text_by_value_by_name_and_by_flag():
    text = ("vllm serve m --api-key %s --port 8000; env HF_TOKEN=%s RAY_AUTH_TOKEN='%s' ray status; "
            "DB_PASSWORD: %s" % (PLANTED["api"], PLANTED["hf"], PLANTED["ray"], PLANTED["extra"]))
    out = redact_text(text)
    for value in PLANTED.values():
        assert value not in out
    assert "--port 8000" in out


def test_redact_data_leaves_no_planted_secret_anywhere():
    data = {
        "env_file": {"VLLM_API_KEY": PLANTED["api"], "NCCL_SOCKET_IFNAME": "=enp1s0f1np1"},
        "vllm_secret_env": {"MY_SERVICE_CREDENTIAL": PLANTED["extra"]},
        "processes": [{"cmdline": ["vllm", "serve", "--api-key", PLANTED["api"]]},
                      {"cmdline": "python -c 'x' --hf-token=%s" % PLANTED["hf"]}],
        "logs": ("raylet token is %s!" % PLANTED["ray"], "the extra %s again" % PLANTED["extra"]),
        PLANTED["ray"]: "a secret as a key",
        "nested": [[{"deep": "prefix%ssuffix" % PLANTED["api"]}]],
        "count": 3, "flag": True, "none": None,
    }
    out = redact_data(data, secrets=[PLANTED["ray"]])
    dumped = json.dumps(out)
    for value in PLANTED.values():
        assert value not in dumped
    assert out["env_file"]["NCCL_SOCKET_IFNAME"] == "=enp1s0f1np1"
    assert (out["count"], out["flag"], out["none"]) == (3, True, None)
    assert isinstance(out["logs"], tuple)
    assert data["env_file"]["VLLM_API_KEY"] == PLANTED["api"]  # the input is not changed


def test_short_values_are_redacted_only_where_their_key_names_them():
    out = redact_data({"VLLM_API_KEY": "abc", "text": "abc is a word"})
    assert out == {"VLLM_API_KEY": REDACTED, "text": "abc is a word"}
