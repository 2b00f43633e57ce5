#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: serve_bench
short_description: Run vLLM's own serving benchmark (vllm bench serve) against the deployed API, case by case
version_added: 0.1.0
description:
  - Runs C(vllm bench serve) from the vLLM the node runs (O(command) - the venv's C(vllm), or C(docker exec) into the
    serve container) once per case (each of O(concurrencies) with each of O(shapes)), with the random dataset and
    C(--ignore-eos), against O(base_url) with the API key of O(api_key_file) in C(OPENAI_API_KEY) (read
    on the node, never in an argument list, never returned).
  - Returns each case's result JSON (without the generated texts) and its summary row (TTFT, TPOT, ITL p50 and
    p99, output tokens/s, requests/s); C(playbooks/bench.yml) writes them on the controller (C(bench_report)).
  - Fails at the first case that completes no request or whose benchmark exits non-zero, naming the case and the
    last lines of its output; the cases before it are returned.
  - Sends requests to the API, so it runs in check mode only with C(check_mode=false) (the playbook sets it).
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
  idempotent:
    support: full
    details: Leaves nothing behind on the node (each result file is read, then removed).
options:
  command:
    description: The C(vllm) command as an argument list, for example V([/opt/venv/bin/vllm]) or
      V([docker, exec, -e, OPENAI_API_KEY, multinode-vllm-serve, vllm]).
    type: list
    elements: str
    required: true
  read_command:
    description: Prefix to read and remove the result file where C(vllm) runs (V([docker, exec, NAME]) under docker);
      empty reads it here.
    type: list
    elements: str
    default: []
  result_dir:
    description: Directory for the result files where C(vllm) runs (created; each file removed once read).
    type: str
    default: /tmp/multinode-vllm-bench
  base_url:
    description: The API, as the benchmark reaches it (C(http://<api address>:<port>)).
    type: str
    required: true
  model:
    description: The served model name (C(vllm_served_model_name)).
    type: str
    required: true
  tokenizer:
    description: The model path or name the benchmark loads its tokenizer from, as seen where C(vllm) runs.
    type: str
    required: true
  concurrencies:
    description: The concurrencies (C(--max-concurrency)) to run, each with every shape of O(shapes).
    type: list
    elements: raw
    required: true
  shapes:
    description: Prompt and output lengths, each C({input_len, output_len}) (random dataset tokens).
    type: list
    elements: raw
    required: true
  prompts_per_concurrency:
    description: Prompts per case, as a multiple of its concurrency.
    type: int
    default: 4
  min_prompts:
    description: The fewest prompts of a case.
    type: int
    default: 8
  environment:
    description: More environment for the benchmark (C(HF_HUB_OFFLINE) on an offline head).
    type: dict
    default: {}
  label:
    description: Names this configuration in the result files and tables.
    type: str
    required: true
  api_key_file:
    description:
      - File on the node holding the API key - the serve role's env file (C(serve_api_env_file), its
        C(VLLM_API_KEY=) line) or a file holding only the key. Unset sends none.
    type: path
  seed:
    description: The random dataset's seed (the same prompts for every label).
    type: int
    default: 0
  timeout:
    description: Seconds one case may run.
    type: int
    default: 900
  extra_args:
    description: More C(vllm bench serve) arguments.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Run vLLM's serving benchmark at two concurrencies
  multinode.vllm.serve_bench:
    command: [/opt/multinode-vllm/venv/bin/vllm]
    base_url: http://10.0.0.10:8000
    model: tiny
    tokenizer: /var/lib/multinode-vllm/models/tiny
    concurrencies: [1, 4]
    shapes: [{input_len: 128, output_len: 64}]
    label: tp2
    api_key_file: /etc/multinode-vllm/vllm-api.env
  check_mode: false
"""

RETURN = r"""
runs:
  description: One entry per case run - C(name), C(case), C(row) (the summary) and C(result) (the JSON without the
    generated texts), C(seconds).
  returned: always
  type: list
  elements: dict
"""

import json
import os
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._bench import (
    BenchError,
    api_key_from,
    bench_argv,
    cases,
    case_name,
    check_label,
    raw_result,
    summarize,
)


def _tail(text, key, lines=15):
    out = "\n".join((text or "").strip().splitlines()[-lines:])
    return out.replace(key, "<redacted>") if key else out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            command=dict(type="list", elements="str", required=True),
            read_command=dict(type="list", elements="str", default=[]),
            result_dir=dict(type="str", default="/tmp/multinode-vllm-bench"),
            base_url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            tokenizer=dict(type="str", required=True, no_log=False),
            concurrencies=dict(type="list", elements="raw", required=True),
            shapes=dict(type="list", elements="raw", required=True),
            prompts_per_concurrency=dict(type="int", default=4),
            min_prompts=dict(type="int", default=8),
            environment=dict(type="dict", default={}),
            label=dict(type="str", required=True),
            api_key_file=dict(type="path"),
            seed=dict(type="int", default=0),
            timeout=dict(type="int", default=900),
            extra_args=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=False,
    )
    p = module.params
    key = ""
    if p["api_key_file"]:
        try:
            with open(p["api_key_file"]) as handle:
                key = api_key_from(handle.read())
        except OSError as exc:
            module.fail_json(msg="serve_bench: cannot read the API key file %s (%s); set vllm_api_key_file to the "
                                 "file the serve role wrote" % (p["api_key_file"], exc.strerror or exc))
        if key:
            module.no_log_values.add(key)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", NO_COLOR="1")
    env.update({str(k): str(v) for k, v in p["environment"].items()})
    env["OPENAI_API_KEY"] = key
    reader = p["read_command"]
    runs = []
    try:
        label = check_label(p["label"])
        todo = cases(p["concurrencies"], p["shapes"], p["prompts_per_concurrency"], p["min_prompts"])
        subprocess.run([*reader, "mkdir", "-p", p["result_dir"]], check=True, capture_output=True)
        for case in todo:
            name = case_name(label, case)
            path = "%s/%s.json" % (p["result_dir"].rstrip("/"), name)
            argv = bench_argv(p["command"], p["base_url"], p["model"], p["tokenizer"], case, p["result_dir"],
                              name + ".json", p["seed"], p["extra_args"])
            start = time.monotonic()
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=p["timeout"],
                                      check=False)
            except subprocess.TimeoutExpired as exc:
                raise BenchError("vllm bench serve (%s) ran past %d s (bench_case_timeout): %s" % (
                    name, p["timeout"], _tail(exc.stdout if isinstance(exc.stdout, str) else "", key)))
            seconds = round(time.monotonic() - start, 1)
            if proc.returncode != 0:
                raise BenchError("vllm bench serve (%s) exited %d: %s" % (
                    name, proc.returncode, _tail(proc.stdout + proc.stderr, key)))
            read = subprocess.run([*reader, "cat", path], capture_output=True, text=True, check=False)
            subprocess.run([*reader, "rm", "-f", path], capture_output=True, check=False)
            if read.returncode != 0:
                raise BenchError("vllm bench serve (%s) wrote no result file %s: %s" % (
                    name, path, _tail(read.stderr or proc.stdout, key)))
            result = json.loads(read.stdout)
            runs.append({"name": name, "case": case, "row": summarize(result, case, label),
                         "result": raw_result(result), "seconds": seconds})
    except (BenchError, ValueError, OSError, subprocess.CalledProcessError) as exc:
        module.fail_json(msg=str(exc), runs=runs)
    module.exit_json(changed=False, runs=runs)


if __name__ == "__main__":
    main()
