# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The env-file launcher, and the one env-file parser (a node script).

    PYTHON multinode-env-exec ENV_FILE [--env-file ENV_FILE]... PROGRAM [ARGS...]

Runs PROGRAM (looked up in the new environment's PATH when it has no '/') with the variables of every ENV_FILE
added to the environment, a later file winning over an earlier one. The role ``node_env`` installs this file as
``multinode-env-exec``; the runtimes run the node's processes through it: supervisord (runtime process) Ray and
vllm serve, systemd and the container vllm serve, so the env files stay the one copy of what a process runs with
and no secret is ever on a command line.

The rules are docker ``--env-file``'s (moby ``opts/envfile.go``), which the process runtime, the container and
the modules that read a node's env file (``_rendezvous.parse_env_file``) all follow through ``parse_env_file``:

- lines end at ``\\n`` (a ``\\r`` before it is dropped); a UTF-8 BOM at the start of the file is dropped;
- leading blanks of a line are dropped; an empty line or one starting with ``#`` is skipped;
- ``KEY=VALUE`` splits at the first ``=``; the value is taken literally: no quotes removed, no escapes, no ``$``
  expansion, trailing blanks kept;
- stricter than docker: the key must be a variable name (letters, digits and ``_``, not starting with a digit; docker
  refuses only blanks), and a line without ``=`` is refused (docker would copy that variable from the caller).

A bad line is named by its file and number, never shown (a secret file may hold it). The writers (``_env.env_file``,
``_serve.serve_env_file``, ``_secrets.secret_env_file(reader='launcher')``) only write what reads back unchanged.

No shebang and not executable on the node: always run by an explicit interpreter (the node venv's python, the
container's ``python3``, ``_runtime.launcher_command``), since a host may have python3 but no ``python``.
Standard library only, nothing of the collection (``docs/architecture.md``, "Python on a node").
"""

from __future__ import annotations

import os
import re
import sys

USAGE = "usage: PYTHON multinode-env-exec ENV_FILE [--env-file ENV_FILE]... PROGRAM [ARGS...]"
MORE = "--env-file"
_KEY = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


class EnvFileError(ValueError):
    """A line that is not ``KEY=VALUE``; the message names the file and the line, not its text."""


def parse_env_file(text: str, path: str = "env file") -> dict:
    """The variables of one env file's text, by docker ``--env-file``'s rules (module docstring)."""
    env = {}
    if text.startswith("\ufeff"):
        text = text[1:]
    for number, line in enumerate(text.split("\n"), 1):
        if line.endswith("\r"):
            line = line[:-1]
        line = line.lstrip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _KEY.match(key):
            raise EnvFileError("%s line %d is not KEY=VALUE (KEY letters, digits and _, not starting with a digit, "
                               "then '=' and the value); fix or remove the line" % (path, number))
        env[key] = value
    return env


def read_env_files(paths) -> dict:
    """The variables of several env files, a later file winning."""
    env = {}
    for path in paths:
        with open(path, encoding="utf-8", newline="") as handle:
            env.update(parse_env_file(handle.read(), path))
    return env


def split_argv(argv) -> tuple:
    """(env files, program and its arguments) of the launcher's own arguments (``argv[1:]``)."""
    if len(argv) < 2:
        raise EnvFileError(USAGE)
    files, rest = [argv[0]], list(argv[1:])
    while rest and rest[0] == MORE:
        if len(rest) < 2:
            raise EnvFileError(USAGE)
        files.append(rest[1])
        rest = rest[2:]
    if not rest:
        raise EnvFileError(USAGE)
    return files, rest


def main() -> None:
    try:
        files, command = split_argv(sys.argv[1:])
        env = dict(os.environ)
        env.update(read_env_files(files))
    except (OSError, ValueError) as exc:
        raise SystemExit("multinode-env-exec: %s" % exc) from None
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
