# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One env-file syntax (issue 17): what _env.env_file writes reads back identically under the three readers that
consume node.env, and what it refuses is exactly what they would read differently.

- the process runtime's launcher (plugins/module_utils/_node_env_exec.py, installed as multinode-env-exec): the real
  script, run in a subprocess;
- docker --env-file: a port of moby's ParseEnvFile (opts/envfile.go, Docker 20.10 as Debian 12 ships it: leading
  whitespace of a line dropped, '#' lines skipped, split at the first '=', value raw). No Docker engine here;
- systemd's EnvironmentFile: a port of parse_env_file_internal (src/basic/env-file.c, systemd 252 as Debian 12
  ships it: quotes removed, backslash escapes, blanks around an unquoted value stripped, '#'/';' comments).
  systemd runs no units here, so its own parser cannot be called.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.multinode.vllm.plugins.module_utils._env import EnvError, env_file

# The launcher as the node_env role installs it: the node script itself, run as a program.
LAUNCHER = os.path.join(os.path.dirname(__file__), *[".."] * 4, "plugins", "module_utils", "_node_env_exec.py")
DUMP = "import json, os, sys; json.dump(dict(os.environ), sys.stdout)"


def launcher_read(text: str, tmp_path) -> dict:
    path = tmp_path / "node.env"
    path.write_text(text)
    out = subprocess.run([sys.executable, LAUNCHER, str(path), sys.executable, "-c", DUMP], env={},
                         capture_output=True, text=True, check=True).stdout
    env = json.loads(out)
    env.pop("LC_CTYPE", None)  # set by Python itself (PEP 538 locale coercion), not read from the file
    return env


def docker_read(text: str) -> dict:
    env = {}
    for raw in text.split("\n"):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and key and not any(c.isspace() for c in key), raw
        env[key] = value
    return env


def systemd_read(text: str) -> dict:
    env, key, value, state = {}, "", "", "pre_key"
    key_blanks = value_blanks = 0

    def push():
        env[key[:len(key) - key_blanks]] = value[:len(value) - value_blanks] if value_blanks else value

    for char in text:
        if state == "pre_key":
            if char in "#;":
                state = "comment"
            elif char not in " \t\n\r":
                state, key, key_blanks = "key", char, 0
        elif state == "key":
            if char in "\n\r":
                state = "pre_key"
            elif char == "=":
                state, value, value_blanks = "pre_value", "", 0
            else:
                key_blanks = key_blanks + 1 if char in " \t" else 0
                key += char
        elif state == "pre_value":
            if char in "\n\r":
                push()
                state = "pre_key"
            elif char == "'":
                state = "single"
            elif char == '"':
                state = "double"
            elif char == "\\":
                state = "escape"
            elif char not in " \t":
                state, value = "value", value + char
        elif state == "value":
            if char in "\n\r":
                push()
                state = "pre_key"
            elif char == "\\":
                state, value_blanks = "escape", 0
            else:
                value_blanks = value_blanks + 1 if char in " \t" else 0
                value += char
        elif state == "escape":
            state = "value"
            if char not in "\n\r":
                value += char
        elif state == "single":
            if char == "'":
                state = "pre_value"
            else:
                value += char
        elif state == "double":
            if char == '"':
                state = "pre_value"
            elif char == "\\":
                state = "double_escape"
            else:
                value += char
        elif state == "double_escape":
            state = "double"
            if char in '"\\`$':
                value += char
            elif char != "\n":
                value += "\\" + char
        elif state == "comment":
            if char in "\n\r":
                state = "pre_key"
    if state in ("pre_value", "value"):
        push()
    return env


KEYS = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,12}\Z")
# Printable text without line breaks or NUL (those are refused by the one-line rule, tested elsewhere).
VALUES = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")) | st.sampled_from(" \t'\"\\#;=$`"),
                 max_size=24)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.dictionaries(KEYS, VALUES, min_size=1, max_size=6))
def test_accepted_values_read_back_identically_and_refused_ones_would_not(tmp_path_factory, env):
    try:
        text = env_file(env)
    except EnvError as exc:
        # Refused: at least one value the readers would not agree on; the message names its key.
        naive = "".join("%s=%s\n" % (k, env[k]) for k in sorted(env))
        assert systemd_read(naive) != docker_read(naive), (env, str(exc))
        assert any(("value of %s " % k) in str(exc) for k in env), str(exc)
        return
    tmp = tmp_path_factory.mktemp("env")
    assert docker_read(text) == env
    assert systemd_read(text) == env
    assert launcher_read(text, tmp) == env


@pytest.mark.parametrize("value", ['"quoted"', "'single'", "C:\\path", " lead", "trail\t", "x\\"])
def test_values_systemd_would_read_differently_are_refused(value):
    naive = "K=%s\n" % value
    assert systemd_read(naive) != docker_read(naive)  # the reason for the refusal, shown on the port
    with pytest.raises(EnvError, match="env file value of K"):
        env_file({"K": value})


@pytest.mark.parametrize("value", ['{"a": 1}', "it's", "a 'b' c", "=x", "$HOME", "#x", ";x"])
def test_quotes_inside_a_value_and_other_text_are_kept_alike(tmp_path, value):
    text = env_file({"K": value})
    assert systemd_read(text) == docker_read(text) == launcher_read(text, tmp_path) == {"K": value}


def test_the_systemd_port_follows_systemds_documented_rules():
    text = "# c\n; c\n  A=1\nB = 2 \nC='x y'\nD=\"q\\\"t\"\nE=a\\ b\nF=\n"
    assert systemd_read(text) == {"A": "1", "B": "2", "C": "x y", "D": 'q"t', "E": "a b", "F": ""}
