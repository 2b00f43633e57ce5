# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Secret environment values: one 0600 file per process, read at start, never on a command line.

A value passed through Ansible's ``environment:`` or written as an ``env KEY=VALUE`` word is visible in
``/proc/*/cmdline``, in unit files, supervisor sections and ``docker inspect``. A secret instead goes to a
file (mode 0600, written through ``node_files``' ``secret_files``: never diffed, never printed) that the process
reads when it starts:

    /bin/sh -c 'set -a && . "$0" && set +a && exec "$@"' FILE PROGRAM ARGS...

``SOURCE_ARGV`` is that prefix. Values are single-quoted for sh, so any byte but NUL survives unchanged.

vllm serve's secret file is read instead by the launcher that reads its other env files (``_node_env_exec``, one
layer, docker ``--env-file``'s rules): ``secret_env_file(..., reader="launcher")`` writes it, values as they are,
one line each.

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import re
import shlex
from typing import Mapping, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._checks import is_env_key
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._text import LINE_BREAKS

# The argv prefix that reads a secret env file and runs the program with its variables exported.
SOURCE_ARGV = ("/bin/sh", "-c", 'set -a && . "$0" && set +a && exec "$@"')
# Credentials vLLM's Ray executor would otherwise copy to every Ray worker (VLLM_API_KEY is a registered vLLM
# variable; HF_* is a copied prefix, vllm/ray/ray_env.py in 0.32.0), and so into Ray's runtime environment.
ALWAYS_SECRET_KEYS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY")


class SecretError(MultinodeError, ValueError):
    """A secret variable that cannot be written; the message names the variable, never the value."""


READERS = ("sh", "launcher")


def secret_env_file(values: Mapping[str, object], what: str = "vllm_secret_env", reader: str = "sh") -> str:
    """The text of a secret env file, sorted: ``KEY='value'`` lines for ``SOURCE_ARGV`` (``reader`` sh), or
    ``KEY=value`` lines for the launcher (``reader`` launcher: literal values, so no line break in one).

    Keys must be environment variable names; values any text without NUL (a NUL cannot be in an environment).
    Errors name the variable and the key, never the value.
    """
    if reader not in READERS:
        raise SecretError("%s: reader must be one of %s; got %r" % (what, ", ".join(READERS), reader))
    lines = []
    for key in sorted(values):
        value = values[key]
        if not is_env_key(key):
            raise SecretError("%s: key %r is not an environment variable name (letters, digits and _, not starting "
                              "with a digit); rename it" % (what, key))
        if value is None or isinstance(value, (dict, list)):
            raise SecretError("%s.%s: the value must be a string (got %s); quote it in the inventory"
                              % (what, key, type(value).__name__))
        text = str(value)
        if "\0" in text:
            raise SecretError("%s.%s: the value contains a NUL byte, which no environment can carry; remove it"
                              % (what, key))
        if reader == "launcher":
            char = next((c for c in text if c in LINE_BREAKS), None)
            if char is not None:
                raise SecretError("%s.%s: the value contains a line break (%r at position %d), which an env file "
                                  "cannot carry (one KEY=VALUE per line); write it on one line"
                                  % (what, key, char, text.index(char)))
            lines.append("%s=%s" % (key, text))
        else:
            lines.append("%s=%s" % (key, shlex.quote(text)))
    return "".join(line + "\n" for line in lines)


def non_carry_over_with_secrets(keys: Sequence[str], secret_keys: Sequence[str] = ()) -> list[str]:
    """vLLM's non-carry-over list plus every secret key: a secret stays in the process that read it."""
    return sorted(set(keys) | set(ALWAYS_SECRET_KEYS) | {str(k) for k in secret_keys})


REDACTED = "<redacted>"
# What a Hugging Face token looks like (``hf_`` and 30-40 letters and digits; the API's old ``api_`` ones too),
# and an Authorization header's value: redacted even when the value itself is not known here (a token
# huggingface_hub found in its own login file, say).
TOKEN_PATTERNS = (
    re.compile(r"\b(?:hf|api)_[A-Za-z0-9]{30,}\b"),
    re.compile(r"(?i)(\bBearer\s+)[^\s'\",;]+"),
)


def parse_secret_env(text: str) -> dict[str, str]:
    """The ``KEY=value`` pairs of a file written by ``secret_env_file`` (values single-quoted for sh)."""
    values = {}
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if len(words) == 1 and "=" in words[0]:
            key, _sep, value = words[0].partition("=")
            if is_env_key(key):
                values[key] = value
    return values


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with every occurrence of each secret value, and anything shaped like a token, replaced by
    ``<redacted>``. For messages built from what a process holding a secret printed or raised."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    for pattern in TOKEN_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.lastindex else "") + REDACTED, text)
    return text


# ---------------------------------------------------------------------------
# Redacting a whole bundle (doctor): by value, by the name of the key that holds it, by shape
# ---------------------------------------------------------------------------

# A key that names a secret: VLLM_API_KEY, HF_TOKEN, RAY_AUTH_TOKEN, DB_PASSWORD, aws_secret_access_key, ...
_SECRET_NAME = re.compile(r"(?i)(token|secret|passw(or)?d|passwd|api[_-]?key|private[_-]?key|credential|"
                          r"access[_-]?key|auth[_-]?key|^key$|_key$)")
# ... unless it only points at one or fingerprints it (RAY_AUTH_TOKEN_PATH, auth_token_sha256): kept, doctor
# compares them.
_NOT_SECRET_NAME = re.compile(r"(?i)(_path|_file|_dir|_sha256|_digest|_hash|_mode|_set|_present)$")
# ``KEY=value`` (an env file line, ``env KEY=VALUE`` words, a log echoing its environment), and a command-line flag
# with its value (``--api-key sk-1``, ``--hf-token=hf_x``).
_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)(\s*[=:]\s*)(['\"]?)([^\s'\",;]+)")
_SECRET_FLAG_VALUE = re.compile(r"(?i)(--?[\w-]*(?:key|token|secret|password|passwd)(?:=|\s+))(['\"]?)([^\s'\"]+)")
_SECRET_FLAG = re.compile(r"(?i)^--?[\w-]*(key|token|secret|password|passwd)$")
# A harvested value shorter than this is not replaced everywhere (``true``, ``1``); it is still redacted where its
# key names it.
MIN_HARVESTED = 6


def is_secret_key(key: object) -> bool:
    """Whether a variable or field name says it holds a secret (``VLLM_API_KEY``, ``HF_TOKEN``,
    ``RAY_AUTH_TOKEN``, ``*PASSWORD*``...), not a path to one or its digest (``RAY_AUTH_TOKEN_PATH``,
    ``auth_token_sha256``)."""
    if not isinstance(key, str):
        return False
    name = key.strip().lstrip("-")
    return (name.upper() in ALWAYS_SECRET_KEYS or _SECRET_NAME.search(name) is not None) \
        and _NOT_SECRET_NAME.search(name) is None


def redact_text(text: str, secrets: Sequence[str] = ()) -> str:
    """``redact`` (every known secret value, anything shaped like a token), then the value of every ``KEY=value``
    whose key names a secret and of every secret-looking command-line flag (``--api-key VALUE``)."""
    text = redact(text, secrets)

    def assignment(match: "re.Match[str]") -> str:
        if not is_secret_key(match.group(1)) or match.group(4) == REDACTED:
            return match.group(0)
        return match.group(1) + match.group(2) + match.group(3) + REDACTED

    text = _ASSIGNMENT.sub(assignment, text)
    return _SECRET_FLAG_VALUE.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)


def harvest_secrets(obj: object, found: "set[str] | None" = None) -> set[str]:
    """Every string value held under a key that names a secret (``is_secret_key``), anywhere in nested data, and
    every ``KEY=value`` of such a key inside a string: the values to redact wherever else they appear."""
    found = set() if found is None else found
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if is_secret_key(key) and isinstance(value, (str, int)) and not isinstance(value, bool):
                if len(str(value)) >= MIN_HARVESTED:
                    found.add(str(value))
            else:
                harvest_secrets(value, found)
    elif isinstance(obj, (list, tuple)):
        for index, item in enumerate(obj):
            harvest_secrets(item, found)
            if isinstance(item, str) and _SECRET_FLAG.match(item) and index + 1 < len(obj):
                following = obj[index + 1]
                if isinstance(following, str) and len(following) >= MIN_HARVESTED:
                    found.add(following)
    elif isinstance(obj, str):
        for match in _ASSIGNMENT.finditer(obj):
            if is_secret_key(match.group(1)) and len(match.group(4)) >= MIN_HARVESTED:
                found.add(match.group(4))
        for match in _SECRET_FLAG_VALUE.finditer(obj):
            if len(match.group(3)) >= MIN_HARVESTED:
                found.add(match.group(3))
    return found


def redact_data(obj: object, secrets: Sequence[str] = ()) -> object:
    """``obj`` (dicts, lists, tuples, strings, scalars) with no secret left in any string, key or value.

    The secrets are ``secrets`` (the API key, the Ray token, the HF token, the values of ``vllm_secret_env``) plus
    every value found under a secret-looking key (``harvest_secrets``); each is replaced wherever it occurs, inside
    longer strings and command lines too; a value under a secret-looking key is replaced whole, and in a list the
    word after a secret-looking flag (``["--api-key", "sk-1"]``). Returns new data; ``obj`` is not changed.
    """
    known = sorted({str(s) for s in secrets if s} | harvest_secrets(obj), key=len, reverse=True)
    return _redact_data(obj, known)


def _redact_data(obj: object, known: Sequence[str]) -> object:
    if isinstance(obj, str):
        return redact_text(obj, known)
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            new_key = redact_text(key, known) if isinstance(key, str) else key
            if is_secret_key(key) and value not in (None, "") and not isinstance(value, (bool, Mapping, list, tuple)):
                out[new_key] = REDACTED
            else:
                out[new_key] = _redact_data(value, known)
        return out
    if isinstance(obj, (list, tuple)):
        items = []
        mask_next = False
        for item in obj:
            if mask_next and isinstance(item, str):
                items.append(REDACTED)
            else:
                items.append(_redact_data(item, known))
            mask_next = isinstance(item, str) and _SECRET_FLAG.match(item) is not None
        return items if isinstance(obj, list) else tuple(items)
    return obj
