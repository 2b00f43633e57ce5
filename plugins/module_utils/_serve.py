# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM serve's command line and environment: its arguments, its sizing check, its own env file.

- ``serve_args``: the ``vllm serve`` argument list for backend ``ray`` (head
  only, Ray executor) or ``native`` (every node, ``--nnodes``/``--node-rank``,
  ranks above 0 ``--headless``).
- ``check_parallel``: tensor * pipeline parallel size against nodes and GPUs.
- ``serve_environment`` / ``serve_env_file``: vllm serve's own environment (its
  settings, then ``vllm_env``), every key and value checked, and the text of
  the env file the launcher reads after the node's (``_node_env_exec``).

Whether the server came up is ``_serve_ready.py``'s; why it did not, ``_serve_failure.py``'s.
Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._checks import is_env_key, port_number
from ansible_collections.multinode.vllm.plugins.module_utils._env import env_file
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._text import one_line_error

BACKENDS = ("ray", "native")


class ServeError(MultinodeError):
    """A serve setting or state that is wrong; the message is what the user sees."""


@dataclass(frozen=True)
class ServeSettings:
    model: str
    served_model_name: str = ""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    api_host: str = ""
    api_port: int = 8000
    max_model_len: Optional[int] = None
    dtype: str = ""
    gpu_memory_utilization: Optional[float] = None
    extra_args: Sequence[str] = field(default_factory=tuple)
    master_port: int = 29500


def _positive(value: Any, what: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ServeError("%s must be a positive integer; got %r" % (what, value))
    if number < 1:
        raise ServeError("%s must be at least 1; got %d" % (what, number))
    return number


def _port(value: Any, what: str) -> str:
    number = _positive(value, what)
    if port_number(number) is None:
        raise ServeError("%s must be between 1 and 65535; got %d" % (what, number))
    return str(number)


# Flags the collection sets itself; extra args may not repeat them.
_OWNED_FLAGS = (
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--distributed-executor-backend",
    "--host", "--port", "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port", "--headless",
    "--served-model-name",
)


def check_parallel(backend: str, tensor_parallel_size: Any, pipeline_parallel_size: Any, nodes: Any,
                   gpus_per_node: Mapping[str, Any]) -> int:
    """Validate T*P against the nodes and their GPUs; returns the world size.

    ``gpus_per_node`` maps host -> GPUs it offers (for Ray: what it advertises).
    """
    if backend not in BACKENDS:
        raise ServeError("vllm_backend %r is not one of %s" % (backend, ", ".join(BACKENDS)))
    tp = _positive(tensor_parallel_size, "tensor_parallel_size")
    pp = _positive(pipeline_parallel_size, "pipeline_parallel_size")
    n = _positive(nodes, "the number of nodes")
    world = tp * pp
    gpus = {h: _positive(g, "GPUs of %s" % h) for h, g in sorted(gpus_per_node.items())}
    total = sum(gpus.values())
    shown = ", ".join("%s=%d" % (h, g) for h, g in gpus.items())
    if world > total:
        raise ServeError(
            "tensor_parallel_size * pipeline_parallel_size = %d * %d = %d, but the %d nodes have %d GPUs (%s); "
            "lower the parallel sizes or add nodes" % (tp, pp, world, n, total, shown)
        )
    if backend == "native":
        if world % n:
            raise ServeError(
                "backend native runs one vllm serve per node and needs the world size (tensor * pipeline = %d) "
                "to be a multiple of the number of nodes (%d); change the sizes or the inventory" % (world, n)
            )
        per_node = world // n
        short = ["%s=%d" % (h, g) for h, g in gpus.items() if g < per_node]
        if short:
            raise ServeError(
                "backend native places %d ranks on each of the %d nodes, but these have fewer GPUs: %s; "
                "lower the parallel sizes" % (per_node, n, ", ".join(short))
            )
    elif world < total and world < n:
        # Not an error: Ray places the ranks where the GPUs are. Said by the caller if wanted.
        pass
    return world


def serve_args(
    backend: str,
    settings: ServeSettings,
    nnodes: int = 1,
    node_rank: int = 0,
    head_fabric_ip: str = "",
) -> list[str]:
    """Arguments after ``vllm`` for this node (``serve <model> ...``)."""
    if backend not in BACKENDS:
        raise ServeError("vllm_backend %r is not one of %s" % (backend, ", ".join(BACKENDS)))
    if not settings.model:
        raise ServeError("no model given; set vllm_model to a path on every node or a model id")
    # Every value below becomes a word of a supervisor section or a systemd unit: one line, no NUL.
    named = [("vllm_model", settings.model), ("vllm_served_model_name", settings.served_model_name),
             ("vllm_api_host", settings.api_host), ("vllm_dtype", settings.dtype)]
    named += [("vllm_extra_args[%d]" % i, arg) for i, arg in enumerate(settings.extra_args)]
    for variable, value in named:
        error = one_line_error(variable, value)
        if error:
            raise ServeError(error)
    for arg in settings.extra_args:
        name = str(arg).split("=", 1)[0]
        if name in _OWNED_FLAGS:
            raise ServeError(
                "vllm_extra_args sets %s, which the collection sets itself from the inventory and the serve "
                "variables; use the matching vllm_* variable instead" % name
            )
    tp = _positive(settings.tensor_parallel_size, "tensor_parallel_size")
    pp = _positive(settings.pipeline_parallel_size, "pipeline_parallel_size")
    args = ["serve", settings.model]
    rank = int(node_rank)
    headless = backend == "native" and rank > 0
    if settings.served_model_name and not headless:
        args += ["--served-model-name", settings.served_model_name]
    args += ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    if backend == "ray":
        args += ["--distributed-executor-backend", "ray"]
    else:
        n = _positive(nnodes, "nnodes")
        if not 0 <= rank < n:
            raise ServeError("node rank %d is outside 0..%d" % (rank, n - 1))
        if not head_fabric_ip:
            raise ServeError("backend native needs the head's fabric address for --master-addr")
        args += [
            "--nnodes", str(n), "--node-rank", str(rank),
            "--master-addr", head_fabric_ip, "--master-port", _port(settings.master_port, "master_port"),
        ]
    if headless:
        args.append("--headless")
    else:
        if not settings.api_host:
            raise ServeError("no API address given for the head (vllm_api_host)")
        args += ["--host", settings.api_host, "--port", _port(settings.api_port, "api_port")]
    if settings.max_model_len:
        args += ["--max-model-len", str(_positive(settings.max_model_len, "max_model_len"))]
    if settings.dtype:
        args += ["--dtype", settings.dtype]
    if settings.gpu_memory_utilization is not None:
        value = float(settings.gpu_memory_utilization)
        if not 0 < value <= 1:
            raise ServeError("gpu_memory_utilization must be in (0, 1]; got %s" % value)
        args += ["--gpu-memory-utilization", "%g" % value]
    args += [str(a) for a in settings.extra_args]
    return args


def checked_env(env: Mapping[str, Any], variable: str = "the serve environment") -> dict[str, str]:
    """``env`` with every key and value checked, as strings; a None value leaves its key out.

    The launcher reads env files by docker ``--env-file``'s rules: a line splits at its first '=' and ends at a line
    break, so a key must be a plain variable name and a value one line.
    """
    checked = {}
    for key in sorted(env, key=str):
        if not is_env_key(str(key)):
            raise ServeError(
                "%s has the key %r, which is not a valid environment variable name: expected letters, digits and '_', "
                "not starting with a digit (the env file splits a line at its first '=', and a key starting with "
                "'-' is no variable a program can read); rename or remove it" % (variable, key)
            )
        value = env[key]
        if value is None:
            continue
        error = one_line_error("%s[%s]" % (variable, key), value)
        if error:
            raise ServeError(error)
        checked[str(key)] = str(value)
    return checked


def serve_environment(
    cache_root: str,
    ray_address: str = "",
    hf_home: str = "",
    hf_offline: bool = False,
    extra: Optional[Mapping[str, Any]] = None,
) -> dict[str, str]:
    """vllm serve's own environment: its settings, then ``vllm_env`` (which may replace them).

    The only builder of it: each key and value is checked and the message names its variable. The node's
    environment (``_env.node_environment``) comes from the node env file, read before this one.
    """
    for variable, value in (("vllm_cache_root", cache_root), ("vllm_hf_home", hf_home)):
        error = one_line_error(variable, value)
        if error:
            raise ServeError(error)
    env: dict[str, Any] = {"VLLM_CACHE_ROOT": cache_root}
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    if hf_home:
        env["HF_HOME"] = hf_home
    if hf_offline:
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    extra = dict(extra or {})
    checked_env(extra, "vllm_env")  # checked under its own name before the merge
    env.update(extra)
    return checked_env(env)


def serve_env_file(
    cache_root: str,
    ray_address: str = "",
    hf_home: str = "",
    hf_offline: bool = False,
    extra: Optional[Mapping[str, Any]] = None,
) -> str:
    """The text of vllm serve's own env file (``serve_environment``, ``KEY=VALUE`` lines, sorted).

    Only the launcher reads it, so values are kept as written (a quote, a backslash, blanks), as they were when
    they were ``/usr/bin/env`` words.
    """
    return env_file(serve_environment(cache_root, ray_address, hf_home, hf_offline, extra), systemd=False)
