# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Doctor's collection and bundle: part-level error isolation, every host's result assembled (an unreachable one
too), the bundle's layout, and no planted secret in any file of the extracted tarball."""

from __future__ import annotations

import copy
import os
import tarfile
from datetime import datetime, timezone

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._doctor import (
    DoctorError,
    build,
    bundle_name,
    cluster_part,
    collected,
    collection_errors,
    fabric_env,
    node_from_result,
    run_parts,
    safe_name,
    secret_file_values,
    secret_values,
    write_bundle,
)
from ansible_collections.multinode.vllm.plugins.module_utils._memory import GIB

WHEN = datetime(2026, 1, 5, 10, 15, 0, tzinfo=timezone.utc)
CIDR = "198.18.200.0/24"
FABRIC_IF = "enp1s0f1np1"
HOSTS = {
    "spark1": {"fabric_ip": "198.18.200.12", "mgmt_ip": "198.19.1.10"},
    "spark2": {"fabric_ip": "198.18.200.13", "mgmt_ip": "198.19.1.11"},
}
STACK = {"python": "3.12.3", "ray": "2.52.0", "vllm": "0.11.0", "torch": "2.8.0+cu128",
         "nccl": "pip nvidia-nccl-cu12 2.27.3", "cuda_runtime": None, "driver": None}


def healthy():
    """The lab's two nodes as doctor_collect reads them (the shapes of test__diagnosis.py), the firewall aside."""
    nodes = {}
    for host, addr in HOSTS.items():
        nodes[host] = {
            "system": {"kernel": "6.8.0-1015-nvidia", "os": "Ubuntu 24.04"},
            "stack": dict(STACK),
            "network": {"interfaces": [
                {"name": "eth0", "addresses": [addr["mgmt_ip"] + "/24"], "mtu": 1500, "operstate": "up",
                 "carrier": True, "default_route": True},
                {"name": FABRIC_IF, "addresses": [addr["fabric_ip"] + "/24"], "mtu": 9000, "operstate": "up",
                 "carrier": True}], "rdma": []},
            "fabric": {"interface": FABRIC_IF, "ip": addr["fabric_ip"], "mtu": 9000, "mgmt_ip": addr["mgmt_ip"]},
            "env_file": {"NCCL_SOCKET_IFNAME": "=" + FABRIC_IF, "GLOO_SOCKET_IFNAME": FABRIC_IF,
                         "VLLM_HOST_IP": addr["fabric_ip"]},
            "ray_node": {"running": True, "raylet_pid": 4100, "node_ip_address": addr["fabric_ip"],
                         "env": {"VLLM_HOST_IP": addr["fabric_ip"], "GLOO_SOCKET_IFNAME": FABRIC_IF},
                         "serve_pid": 5200 if host == "spark1" else None},
            "processes": [{"pid": 4100, "ppid": 1, "name": "raylet", "cmdline": "raylet"}],
            "memory": {"mem_total": 128 * GIB, "mem_available": 100 * GIB},
            "disk": {"path": "/models", "free_bytes": 200 * GIB, "total_bytes": 900 * GIB},
            "logs": {"ray": ["INFO raylet started"], "vllm": ["INFO: Application startup complete."]},
            "nccl": [],
            "errors": {},
        }
    nodes["spark1"]["ray_table"] = {"nodes": [
        {"node_id": "a" * 32, "node_manager_address": "198.18.200.12", "alive": True, "resources": {"CPU": 4.0},
         "is_head": True},
        {"node_id": "b" * 32, "node_manager_address": "198.18.200.13", "alive": True, "resources": {"CPU": 4.0},
         "is_head": False}], "error": None}
    return {
        "cluster": {"fabric_cidr": CIDR, "head": "spark1", "hosts": copy.deepcopy(HOSTS), "backend": "ray",
                    "serve": True, "firewall_enabled": False, "required_gpus": 0,
                    "ports": {"ray_gcs_port": 6379, "vllm_api_port": 8000}},
        "nodes": nodes,
    }


def _raise(exc):
    def part():
        raise exc
    return part


@pytest.mark.parametrize("workers", [1, 4])
@pytest.mark.parametrize("broken, error", [
    (_raise(OSError("nft: not found")), "nft: not found"),
    (_raise(ValueError("bad json")), "ValueError: bad json"),
    (_raise(KeyError("python")), "KeyError: 'python'"),
    (_raise(RuntimeError()), "RuntimeError"),
    (lambda: ["not", "a", "mapping"], "returned list, not a mapping"),
])
def test_a_failing_part_records_its_error_and_the_others_still_run(workers, broken, error):
    parts = [("system", lambda: {"system": {"kernel": "6.8"}}), ("firewall", broken),
             ("memory", lambda: {"memory": {"mem_available": 1}})]
    node, errors = run_parts(parts, workers=workers)
    assert node == {"system": {"kernel": "6.8"}, "memory": {"mem_available": 1}}
    assert list(errors) == ["firewall"]
    assert errors["firewall"].endswith(error)


def test_every_part_failing_still_returns():
    node, errors = run_parts([("a", _raise(OSError("x"))), ("b", _raise(OSError("y")))], workers=2)
    assert node == {} and sorted(errors) == ["a", "b"]


def test_the_env_files_network_keys_only():
    env = {"NCCL_SOCKET_IFNAME": "=enp1s0f1np1", "NCCL_IB_HCA": "=rocep1s0f1:1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
           "UCX_NET_DEVICES": "rocep1s0f1:1", "TP_SOCKET_IFNAME": "enp1s0f1np1", "VLLM_HOST_IP": "198.18.200.12",
           "MASTER_ADDR": "198.18.200.12", "HF_TOKEN": "hf_x", "VLLM_API_KEY": "sk-1", "PATH": "/usr/bin"}
    assert sorted(fabric_env(env)) == ["GLOO_SOCKET_IFNAME", "MASTER_ADDR", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME",
                                       "TP_SOCKET_IFNAME", "UCX_NET_DEVICES", "VLLM_HOST_IP"]


@pytest.mark.parametrize("text, values", [
    ("VLLM_API_KEY=sk-lab-0123456789\nHF_TOKEN=hf_abcdefghij\n", ["sk-lab-0123456789", "hf_abcdefghij"]),
    ("VLLM_API_KEY='sk-lab 0123'\nexport DB_PASS=\"hunter22\"\n", ["sk-lab 0123", "hunter22"]),
    ("raytoken-9f8e7d6c5b4a39281706\n", ["raytoken-9f8e7d6c5b4a39281706"]),
    ("FLAG=1\nDEBUG=true\n", []),
    ("", []),
])
def test_secret_file_values(text, values):
    assert secret_file_values(text) == values


def test_secret_values_flattens_the_inventorys_secrets():
    assert secret_values(["sk-lab-0123456789", "", None], {"HF_TOKEN": "hf_abcdefghij", "N": 1},
                         [["nested-secret"]]) == ["hf_abcdefghij", "nested-secret", "sk-lab-0123456789"]


@pytest.mark.parametrize("result, expected", [
    ({"unreachable": True, "changed": False,
      "msg": "Task failed: Failed to connect to the host via ssh: ssh: connect to host 198.19.1.11 port 22: "
             "Connection timed out"},
     {"ssh_unreachable": True,
      "ssh_error": "Failed to connect to the host via ssh: ssh: connect to host 198.19.1.11 port 22: "
                   "Connection timed out"}),
    ({"failed": True, "msg": "MODULE FAILURE", "module_stderr": "Traceback...\n/usr/bin/python3: not found"},
     {"ssh_unreachable": False, "errors": {"collect": "MODULE FAILURE: /usr/bin/python3: not found"}}),
    ({"failed": False, "msg": "MODULE FAILURE", "module_stderr": "boom"},
     {"ssh_unreachable": False, "errors": {"collect": "MODULE FAILURE: boom"}}),
    ({"skipped": True, "skip_reason": "Conditional result was False"},
     {"ssh_unreachable": False, "errors": {"collect": "skipped (Conditional result was False)"}}),
    ({}, {"ssh_unreachable": False, "errors": {"collect": "no result: the host was not in the play"}}),
    (None, {"ssh_unreachable": False, "errors": {"collect": "no result: the host was not in the play"}}),
    ({"changed": False, "node": {"system": {"kernel": "6.8"}, "errors": {}}},
     {"system": {"kernel": "6.8"}, "errors": {}, "ssh_unreachable": False}),
])
def test_node_from_each_kind_of_result(result, expected):
    assert node_from_result(result) == expected


def test_the_cluster_part_takes_numbers_and_the_nodes_own_addresses():
    cluster = {"head": "spark1", "fabric_cidr": "198.18.200.0/24", "serve": "True", "firewall_enabled": "false",
               "fabric_expected_mtu": "", "required_gpus": "2",
               "ports": {"ray_gcs_port": "6379", "vllm_api_port": 8000, "bogus": "x"},
               "hosts": {"spark1": {"fabric_ip": "198.18.200.12", "mgmt_ip": "spark1.example", "fabric_interface": None},
                         "spark2": {"fabric_ip": None, "mgmt_ip": "198.19.1.11"}}}
    nodes = {"spark1": {"fabric": {"ip": "198.18.200.12", "mgmt_ip": "198.19.1.10"}},
             "spark2": {"fabric": {"ip": "198.18.200.13", "mgmt_ip": "198.19.1.11"}}}
    out = cluster_part(cluster, nodes)
    assert out["ports"] == {"ray_gcs_port": 6379, "vllm_api_port": 8000}
    assert (out["serve"], out["firewall_enabled"], out["required_gpus"]) == (True, False, 2)
    assert "fabric_expected_mtu" not in out
    assert out["hosts"] == {"spark1": {"fabric_ip": "198.18.200.12", "mgmt_ip": "198.19.1.10"},
                            "spark2": {"fabric_ip": "198.18.200.13", "mgmt_ip": "198.19.1.11"}}


def _results(data):
    """What each host's doctor_collect task registered, for the nodes of a collected fixture."""
    return {h: {"changed": False, "node": n, "errors": n.get("errors") or {}} for h, n in data["nodes"].items()}


def test_an_unreachable_node_is_the_first_finding_and_the_others_are_still_diagnosed():
    data = healthy()
    data["nodes"]["spark1"]["disk"]["free_bytes"] = 10 * 1024 * 1024
    results = _results(data)
    results["spark2"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh: Connection timed out"}
    name, report, _files = build(data["cluster"], results, [], "spark1", WHEN)
    assert name == "doctor-spark1-20260105T101500Z"
    assert [(f["rule"], f["host"]) for f in report["findings"]][:2] == [
        ("ssh_unreachable", "spark2"), ("model_disk_full", "spark1")]
    assert report["lines"][0].startswith("spark2: SSH to the node failed (Failed to connect")


def test_collection_errors_name_host_and_part():
    data = collected({}, {"spark1": {"node": {"errors": {"stack": "OSError: /opt/venv/bin/python: not found"}}},
                          "spark2": {"unreachable": True, "msg": "timed out"}})
    assert collection_errors(data) == ["spark1: stack: OSError: /opt/venv/bin/python: not found"]


@pytest.mark.parametrize("name, expected", [
    ("spark1", "doctor-spark1-20260105T101500Z"),
    ("gpu head/01", "doctor-gpu_head_01-20260105T101500Z"),
    ("../x", "doctor-x-20260105T101500Z"),
])
def test_bundle_name(name, expected):
    assert bundle_name(name, WHEN) == expected


def test_bundle_name_refuses_an_empty_cluster_name():
    with pytest.raises(DoctorError, match="doctor_cluster_name is empty"):
        bundle_name(" ", WHEN)


def test_safe_name_is_one_path_component():
    assert "/" not in safe_name("../../etc/passwd") and safe_name("..") == "_"


# ---------------------------------------------------------------------------
# The bundle secret test: plant every kind of secret, extract the tarball, grep every file
# ---------------------------------------------------------------------------

API_KEY = "sk-lab-0123456789abcdef"
RAY_TOKEN = "raytoken-9f8e7d6c5b4a39281706"
HF_TOKEN = "hf_" + "Q9w8E7r6" * 5
SECRET_ENV_VALUE = "correct-horse-battery-staple"
PLANTED = (API_KEY, RAY_TOKEN, HF_TOKEN, SECRET_ENV_VALUE)


def planted():
    """The lab's facts with each secret where a broken cluster leaves it: env values, log lines, command lines,
    Ray's token in a raylet's environment and a log, an HF token in a download error."""
    data = healthy()
    head = data["nodes"]["spark1"]
    head["env_file"]["VLLM_API_KEY"] = API_KEY
    head["env_file"]["MY_DB_PASSWORD"] = SECRET_ENV_VALUE
    head["ray_node"]["env"]["RAY_AUTH_TOKEN"] = RAY_TOKEN
    head["processes"].append({"pid": 5200, "name": "vllm",
                              "cmdline": "vllm serve /models/m --api-key %s --hf-token=%s" % (API_KEY, HF_TOKEN)})
    head["ray_node"]["serve_pid"] = None  # vllm serve crashed: its log is quoted in the findings
    head["logs"]["vllm"] = [
        "INFO args: Namespace(api_key='%s', model='/models/m')" % API_KEY,
        "DEBUG env MY_DB_PASSWORD=%s" % SECRET_ENV_VALUE,
        "Authorization: Bearer %s" % API_KEY,
        "huggingface_hub.errors.GatedRepoError: 401 for token %s" % HF_TOKEN,
        "RuntimeError: engine core died (%s)" % SECRET_ENV_VALUE,
    ]
    head["logs"]["ray"] = ["raylet started with token %s" % RAY_TOKEN]
    head["nccl"] = ["spark1:1:1 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:198.18.200.12<0> %s" % RAY_TOKEN]
    data["nodes"]["spark2"]["errors"] = {"stack": "OSError: /usr/bin/python -c ... HF_TOKEN=%s" % HF_TOKEN}
    data["cluster"]["hosts"]["spark1"]["note"] = "api key %s" % API_KEY
    return data


def test_no_planted_secret_is_in_any_file_of_the_bundle(tmp_path):
    data = planted()
    # The inventory's secrets (vllm_api_key, vllm_secret_env's values) and the Ray token the nodes' secret files hold.
    secrets = secret_values([API_KEY], {"MY_DB_PASSWORD": SECRET_ENV_VALUE}, [RAY_TOKEN])
    name, report, files = build(data["cluster"], _results(data), secrets, "spark1", WHEN)
    path = write_bundle(str(tmp_path / "doctor"), name, files, mtime=0)
    assert path == str(tmp_path / "doctor" / (name + ".tar.gz"))
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "doctor").st_mode & 0o777) == "0o700"
    out = tmp_path / "extracted"
    with tarfile.open(path) as tar:
        members = sorted(m.name for m in tar.getmembers())
        tar.extractall(out)  # noqa: S202  # our own tarball, names made by safe_name
    assert members == sorted("%s/%s" % (name, f) for f in (
        "diagnosis.txt", "diagnosis.json", "cluster.json", "nodes/spark1.json", "nodes/spark2.json",
        "logs/spark1/ray.log", "logs/spark1/vllm.log", "logs/spark1/nccl.log", "logs/spark2/ray.log",
        "logs/spark2/vllm.log"))
    every = [p for p in out.rglob("*") if p.is_file()]
    assert len(every) == len(members)
    for file in every:
        text = file.read_text()
        for secret in PLANTED:
            assert secret not in text, "%s holds %s" % (file.relative_to(out), secret)
    # Redacted, not dropped: the crash is still diagnosed, the lines still there.
    assert "<redacted>" in (out / name / "logs" / "spark1" / "vllm.log").read_text()
    assert report["findings"][0]["host"] == "spark1"
    diagnosis = (out / name / "diagnosis.txt").read_text()
    assert diagnosis.startswith("doctor: cluster spark1, 2 nodes, collected 2026-01-05 10:15:00 UTC")
    assert " 1. spark1: vllm serve is not running" in diagnosis
    assert "spark2: stack: OSError:" in diagnosis


def test_the_report_itself_holds_no_planted_secret():
    data = planted()
    _name, report, _files = build(data["cluster"], _results(data), [API_KEY, SECRET_ENV_VALUE, RAY_TOKEN], "spark1",
                                  WHEN)
    text = repr(report)
    assert not [s for s in PLANTED if s in text]


def test_the_bundle_of_a_healthy_cluster_says_so():
    data = healthy()
    _name, report, files = build(data["cluster"], _results(data), [], "spark1", WHEN)
    assert report["lines"] == ["no problem found in what was collected"]
    text = files["doctor-spark1-20260105T101500Z/diagnosis.txt"]
    assert " 1. no problem found in what was collected" in text
    assert "What could not be read:\n  nothing" in text
    assert "spark1: python 3.12.3 ray 2.52.0 vllm 0.11.0 torch 2.8.0+cu128" in text


def test_the_input_is_not_changed():
    data = planted()
    before = copy.deepcopy(data)
    build(data["cluster"], _results(data), [API_KEY], "spark1", WHEN)
    assert data == before


def test_an_unwritable_bundle_directory_names_doctor_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DoctorError, match="set doctor_dir to a writable directory"):
        write_bundle(str(blocker / "sub"), "doctor-x", {"doctor-x/a": "b"})


def test_hosts_fixture_is_the_lab():
    assert sorted(HOSTS) == ["spark1", "spark2"] and GIB == 1024 ** 3
