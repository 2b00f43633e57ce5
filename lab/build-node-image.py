#!/usr/bin/env python3
"""Build the lab's node container image (Debian 12 + the node's pinned Ray and vLLM CPU) without a registry.

    lab/build-node-image.py [--print-tag]

No image registry is reachable from the lab machines, so the image is made from what is: a Debian bookworm rootfs
from ``debootstrap`` (the Debian mirror), the node venv installed into it by ``lab/build-node-venv.sh`` run inside
the rootfs (PyPI, and the torch wheel from pip's find-links), as users' images carry Ray and vLLM inside. The
result is written as a ``docker save`` archive (one layer) under ``$LAB_ROOT/cache/node-image/<tag>/``; labctl
``docker load``s it into each docker lab node's daemon.

Why not ``docker build``: the lab nodes' daemons have no route to PyPI, and ``docker import`` stamps the import
time into the image config, so two nodes importing the same rootfs would get two image IDs. Here the config is
written with a fixed creation time, so the image ID is a function of the layer's bytes, and every node that loads
the archive runs the same image ID (what the collection's stack check compares).

Idempotent: the tag is the hash of the inputs (requirements/node.lock, build-node-venv.sh, the lab platform
fixture, this script, the Debian suite and package list); an archive for that tag that is complete is reused.
Needs root, debootstrap, and a Debian mirror (LAB_DEBIAN_MIRROR, default http://deb.debian.org/debian).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
LAB_ROOT = os.path.abspath(os.environ.get("LAB_ROOT") or "/var/lib/multinode-vllm-lab")
CACHE = os.path.join(LAB_ROOT, "cache")
IMAGE_CACHE = os.path.join(CACHE, "node-image")
PIP_CACHE = os.path.join(CACHE, "pip")
REPOSITORY = "multinode-vllm-lab/node"
SUITE = "bookworm"
MIRROR = os.environ.get("LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What the node venv needs of the OS: python3.11 with venv for build-node-venv.sh, CA certificates for pip, libnuma
# for vLLM CPU's NUMA binding, procps for Ray's process tools, and a C++ compiler (vLLM CPU compiles its model with
# torch inductor at start: "InvalidCxxCompiler: No working C++ compiler found" without one; its C++ wrapper includes
# Python.h: python3.11-dev).
# debootstrap's resolver misses some dependencies of --include packages: python3.11-venv's (python3.11-distutils is provided by python3-distutils) are listed.
PACKAGES = ("python3.11", "python3.11-venv", "python3-distutils", "python3-lib2to3", "python3-pip-whl", "python3-setuptools-whl",
            "ca-certificates", "libnuma1", "procps", "iproute2", "g++", "python3.11-dev",
            # A systemd lab node (`labctl up --kind systemd`) boots this image with systemd as PID 1 and is reached
            # over SSH like any host: an init, sshd, nftables for the firewall role, python3 for Ansible's modules.
            "systemd", "openssh-server", "nftables", "python3")
VENV = "/opt/multinode-vllm/venv"
IMAGE_PATH = (VENV + "/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
# pip settings of the build machine that the build inside the rootfs needs too (CA bundle, torch's find-links).
PIP_ENV = ("PIP_CERT", "PIP_FIND_LINKS", "PIP_DEFAULT_TIMEOUT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
FIXED_TIME = "1970-01-01T00:00:00Z"


def log(msg):
    print("[build-node-image] %s" % msg, file=sys.stderr, flush=True)


def die(msg):
    log("ERROR: " + msg)
    sys.exit(1)


def input_files():
    files = [os.path.join(REPO, "requirements", "node.lock"), os.path.join(REPO, "lab", "build-node-venv.sh"),
             os.path.realpath(__file__)]
    plugin = os.path.join(REPO, "tests", "lab_fixtures", "vllm_lab_platform")
    for root, dirs, names in os.walk(plugin):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "build") and not d.endswith(".egg-info"))
        files.extend(os.path.join(root, n) for n in sorted(names) if n.endswith((".py", ".toml")))
    return files


def tag():
    h = hashlib.sha256()
    h.update(("suite %s\npackages %s\n" % (SUITE, " ".join(PACKAGES))).encode())
    for path in input_files():
        h.update(os.path.relpath(path, REPO).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def image_dir(t):
    return os.path.join(IMAGE_CACHE, t)


def complete(t):
    """The image's ID when its archive directory is complete, else None."""
    try:
        with open(os.path.join(image_dir(t), "image.id")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def run(args, **kw):
    log("$ " + " ".join(args))
    subprocess.run(args, check=True, **kw)


def debootstrap(rootfs):
    if not shutil.which("debootstrap"):
        die("debootstrap is not installed (make lab-deps installs it)")
    try:
        run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, rootfs, MIRROR],
            stdout=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        try:
            with open(os.path.join(rootfs, "debootstrap", "debootstrap.log"), errors="replace") as f:
                sys.stderr.write("".join(f.readlines()[-20:]))
        except OSError:
            pass
        die("debootstrap %s from %s failed (its log's last lines above); a mirror is set with LAB_DEBIAN_MIRROR"
            % (SUITE, MIRROR))


def build_venv(rootfs):
    """Run lab/build-node-venv.sh inside the rootfs: a private mount namespace, so every mount goes with it."""
    q = lambda s: "'" + s.replace("'", "'\\''") + "'"  # noqa: E731
    pip_env = {k: os.environ[k] for k in PIP_ENV if os.environ.get(k)}
    # pip's global config of the build machine (CA bundle, find-links) is read from the environment inside.
    mounts = ["mount -t proc proc %s/proc" % q(rootfs), "mount --rbind /dev %s/dev" % q(rootfs),
              "mkdir -p %s%s" % (q(rootfs), q(REPO)), "mount --bind %s %s%s" % (q(REPO), q(rootfs), q(REPO)),
              "mount -o remount,bind,ro %s%s" % (q(rootfs), q(REPO)),
              "mkdir -p %s %s/var/cache/pip" % (q(PIP_CACHE), q(rootfs)),
              "mount --bind %s %s/var/cache/pip" % (q(PIP_CACHE), q(rootfs)),
              "cp /etc/resolv.conf %s/etc/resolv.conf" % q(rootfs)]
    for key in ("PIP_CERT", "PIP_FIND_LINKS"):
        path = pip_env.get(key, "")
        if path.startswith("/") and os.path.exists(path):
            if os.path.isdir(path):
                mounts.append("mkdir -p %s%s" % (q(rootfs), q(path)))
            else:
                mounts.append("mkdir -p %s%s && touch %s%s" % (q(rootfs), q(os.path.dirname(path)), q(rootfs), q(path)))
            mounts.append("mount --bind %s %s%s" % (q(path), q(rootfs), q(path)))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "NODE_VENV": VENV,
           "PYTHON": "python3.11", "PIP_CACHE_DIR": "/var/cache/pip", **pip_env}
    if pip_env.get("PIP_FIND_LINKS"):
        env["NODE_VENV_FIND_LINKS"] = pip_env["PIP_FIND_LINKS"]
    inner = "env -i %s bash %s" % (" ".join(q("%s=%s" % kv) for kv in sorted(env.items())),
                                   q(os.path.join(REPO, "lab", "build-node-venv.sh")))
    script = " && ".join(mounts + ["chroot %s %s" % (q(rootfs), inner)])
    run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])


def slim(rootfs):
    for rel in ("var/cache/apt", "var/lib/apt/lists", "var/cache/pip", "var/log", "tmp", "root/.cache"):
        path = os.path.join(rootfs, rel)
        if os.path.isdir(path):
            for name in os.listdir(path):
                p = os.path.join(path, name)
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
    with open(os.path.join(rootfs, "etc", "resolv.conf"), "w") as f:
        f.write("")


def write_archive(rootfs, out, t):
    """A `docker save` directory: manifest.json, the config (fixed time), one layer.tar; returns the image ID."""
    layer_tmp = os.path.join(out, "layer.tar")
    # /dev, /proc and /sys are the runtime's; their contents do not belong in a layer.
    run(["tar", "-C", rootfs, "--numeric-owner", "--sort=name", "--xattrs", "--exclude=./dev/*",
         "--exclude=./proc/*", "--exclude=./sys/*", "-cf", layer_tmp, "."])
    h = hashlib.sha256()
    with open(layer_tmp, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    diff_id = h.hexdigest()
    os.makedirs(os.path.join(out, diff_id), exist_ok=True)
    os.replace(layer_tmp, os.path.join(out, diff_id, "layer.tar"))
    config = {
        "architecture": "amd64", "os": "linux", "created": FIXED_TIME,
        "config": {"Env": ["PATH=" + IMAGE_PATH, "LANG=C.UTF-8"], "Cmd": ["/bin/bash"],
                   "Labels": {"org.opencontainers.image.title": "multinode.vllm lab node",
                              "multinode.vllm.lab.inputs": t}},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
        "history": [{"created": FIXED_TIME, "created_by": "lab/build-node-image.py (debootstrap %s + %s)"
                     % (SUITE, "requirements/node.lock")}],
    }
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    image_id = hashlib.sha256(blob).hexdigest()
    with open(os.path.join(out, image_id + ".json"), "wb") as f:
        f.write(blob)
    manifest = [{"Config": image_id + ".json", "RepoTags": ["%s:%s" % (REPOSITORY, t), REPOSITORY + ":current"],
                 "Layers": [diff_id + "/layer.tar"]}]
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return "sha256:" + image_id


def build(t):
    os.makedirs(IMAGE_CACHE, exist_ok=True)
    work = os.path.join(IMAGE_CACHE, "build.%d" % os.getpid())
    out = os.path.join(work, "image")
    rootfs = os.path.join(work, "rootfs")
    os.makedirs(out)
    start = time.monotonic()
    try:
        debootstrap(rootfs)
        log("debootstrap done in %.0f s" % (time.monotonic() - start))
        build_venv(rootfs)
        slim(rootfs)
        image_id = write_archive(rootfs, out, t)
        with open(os.path.join(out, "image.id"), "w") as f:
            f.write(image_id + "\n")
        shutil.rmtree(rootfs)
        final = image_dir(t)
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.replace(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log("built %s:%s (%s) in %.0f s" % (REPOSITORY, t, image_id, time.monotonic() - start))
    # Older tags' archives are dead weight (4 GB each): keep the newest only.
    for name in os.listdir(IMAGE_CACHE):
        if name != t and not name.startswith("build.") and os.path.isdir(os.path.join(IMAGE_CACHE, name)):
            shutil.rmtree(os.path.join(IMAGE_CACHE, name), ignore_errors=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--print-tag", action="store_true", help="print the tag the inputs give and exit")
    args = p.parse_args(argv)
    t = tag()
    if args.print_tag:
        print(t)
        return 0
    if os.geteuid() != 0:
        die("needs root (debootstrap, chroot, mounts)")
    import fcntl
    os.makedirs(IMAGE_CACHE, exist_ok=True)
    with open(os.path.join(IMAGE_CACHE, ".build-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        image_id = complete(t)
        if image_id:
            log("up to date: %s:%s (%s)" % (REPOSITORY, t, image_id))
        else:
            build(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
