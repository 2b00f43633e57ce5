# Stand-in for pip's get-pip.py, which ansible-test downloads from ci-files.testing.ansible.com
# to bootstrap pip into its sanity venvs. That host is not reachable from our CI machines;
# this does what get-pip.py does (run pip from a wheel on sys.path) with a wheel
# fetched from PyPI by tests/sanity/run.sh. Installed as ~/.ansible/test/cache/get_pip_<ver>.py.
import os
import runpy
import sys

WHEEL = os.environ.get("MULTINODE_PIP_WHEEL", "@PIP_WHEEL@")
sys.path.insert(0, WHEEL)
# get-pip.py options that pip itself does not know.
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.argv = ["pip", "install", "--ignore-installed"] + args
runpy.run_module("pip", run_name="__main__", alter_sys=True)
