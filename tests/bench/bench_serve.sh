#!/usr/bin/env bash
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Serve benchmark (docs/benchmarks.md, section Serve). Root, from the repo root: tests/bench/bench_serve.sh
# BURST=12 requests of 64 tokens by default (SETTLE=10 s before them), ROUNDS=4 to MAX_ROUNDS=16 alternations (until the tokens/s ratio's 95% interval is within +-TARGET_HALF=0.03), PAIRS=2 deploy pairs; BENCH_WRITE=0 prints without writing the doc. Leaves the lab down.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/python tests/bench/bench_serve.py
