# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Secret env files (_secrets.py): what sh reads back is exactly what was written; errors never show the value."""
from __future__ import annotations

import subprocess

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import parse_env_file
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import (
    ALWAYS_SECRET_KEYS,
    SOURCE_ARGV,
    SecretError,
    non_carry_over_with_secrets,
    parse_secret_env,
    redact,
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
