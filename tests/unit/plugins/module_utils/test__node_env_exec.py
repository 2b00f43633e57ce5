# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The env-file launcher and the one env-file parser (_node_env_exec.py): docker --env-file's rules, several files."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _node_env_exec
from ansible_collections.multinode.vllm.plugins.module_utils._checks import is_env_key
from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import (
    EnvFileError,
    parse_env_file,
    read_env_files,
    split_argv,
)
from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import RendezvousError
from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import parse_env_file as rendezvous_parse
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import secret_env_file

DUMP = "import json, os, sys; json.dump(dict(os.environ), sys.stdout)"


@pytest.mark.parametrize("text, expected", [
    ("A=1\nB=2\n", {"A": "1", "B": "2"}),
    ("# comment\n\n   \n  # indented comment\n", {}),
    ("  A=1\n\tB=2\n", {"A": "1", "B": "2"}),  # leading blanks of a line dropped
    ("A=x \nB= y\n", {"A": "x ", "B": " y"}),  # the value literal, blanks kept
    ("A='q' \"d\" \\n $HOME #c\n", {"A": "'q' \"d\" \\n $HOME #c"}),
    ("A=b=c\n", {"A": "b=c"}),
    ("A=1\r\nB=2\r\n", {"A": "1", "B": "2"}),
    ("\ufeffA=1\n", {"A": "1"}),
    ("A=1\nA=2\n", {"A": "2"}),
    ("A=", {"A": ""}),
])
def test_docker_env_file_rules(text, expected):
    assert parse_env_file(text) == expected


@pytest.mark.parametrize("text, line", [("A=1\ntoken-without-key\n", 2), ("=secret\n", 1), ("1A=x\n", 1),
                                        ("A B=x\n", 1), ("A-B=x\n", 1)])
def test_a_bad_line_is_named_and_never_shown(text, line):
    with pytest.raises(EnvFileError) as caught:
        parse_env_file(text, "/etc/multinode-vllm/vllm-api.env")
    message = str(caught.value)
    assert "/etc/multinode-vllm/vllm-api.env line %d is not KEY=VALUE" % line in message
    assert "secret" not in message.replace("vllm-api.env", "") and "token" not in message


def test_the_key_rule_is_the_collections_one():
    for key in ["A", "_a1", "a_B_2", "1A", "A-B", "", "A B", "-S", "é"]:
        assert bool(_node_env_exec._KEY.match(key)) is is_env_key(key), key


def test_rendezvous_reads_env_files_with_the_same_parser():
    text = "# c\n  NCCL_SOCKET_IFNAME==enp1s0f1np1\nX=a b 'c' \n"
    assert rendezvous_parse(text) == parse_env_file(text)
    with pytest.raises(RendezvousError, match="node.env line 1 is not KEY=VALUE"):
        rendezvous_parse("A-B=1\n", "node.env")


@pytest.mark.parametrize("argv, files, command", [
    (["/n.env", "/bin/prog"], ["/n.env"], ["/bin/prog"]),
    (["/n.env", "/bin/prog", "--env-file", "x"], ["/n.env"], ["/bin/prog", "--env-file", "x"]),
    (["/n.env", "--env-file", "/s.env", "--env-file", "/k.env", "vllm", "serve"], ["/n.env", "/s.env", "/k.env"],
     ["vllm", "serve"]),
])
def test_split_argv(argv, files, command):
    assert split_argv(argv) == (files, command)


@pytest.mark.parametrize("argv", [[], ["/n.env"], ["/n.env", "--env-file"], ["/n.env", "--env-file", "/s.env"]])
def test_split_argv_refuses_a_missing_program(argv):
    with pytest.raises(EnvFileError, match="usage"):
        split_argv(argv)


def test_later_files_win(tmp_path):
    (tmp_path / "a.env").write_text("A=1\nB=1\n")
    (tmp_path / "b.env").write_text("B=2\n")
    assert read_env_files([str(tmp_path / "a.env"), str(tmp_path / "b.env")]) == {"A": "1", "B": "2"}


def test_the_launcher_runs_a_program_with_every_file_and_a_secret_file(tmp_path):
    node, serve, secret = tmp_path / "node.env", tmp_path / "vllm.env", tmp_path / "vllm-api.env"
    node.write_text("VLLM_HOST_IP=198.18.200.12\nPATH=/usr/bin:/bin\n")
    serve.write_text("VLLM_CACHE_ROOT=/c\nQ=\"as is\" \\\\x\n")
    hostile = "it's $x \"q\" \\ #;`id`"
    secret.write_text(secret_env_file({"VLLM_API_KEY": hostile}, reader="launcher"))
    out = subprocess.run([sys.executable, _node_env_exec.__file__, str(node), "--env-file", str(serve),
                          "--env-file", str(secret), sys.executable, "-c", DUMP], env={}, capture_output=True, text=True,
                         check=True).stdout
    env = json.loads(out)
    assert env["VLLM_HOST_IP"] == "198.18.200.12" and env["VLLM_CACHE_ROOT"] == "/c"
    assert env["Q"] == "\"as is\" \\\\x" and env["VLLM_API_KEY"] == hostile


def test_the_launcher_finds_a_bare_program_in_the_files_path(tmp_path):
    node = tmp_path / "node.env"
    node.write_text("PATH=/usr/bin:/bin\nX=1\n")
    out = subprocess.run([sys.executable, _node_env_exec.__file__, str(node), "env"], env={}, capture_output=True,
                         text=True, check=True).stdout
    assert "X=1" in out.splitlines()


def test_the_launcher_fails_naming_the_file_without_running_the_program(tmp_path):
    bad = tmp_path / "vllm-api.env"
    bad.write_text("not-a-line-hf_secretvalue\n")
    done = subprocess.run([sys.executable, _node_env_exec.__file__, str(bad), "/bin/true"], env={},
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "vllm-api.env line 1 is not KEY=VALUE" in done.stderr
    assert "secretvalue" not in done.stderr
