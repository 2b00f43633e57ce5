# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Hostile inventory values against every validator and renderer of arguments and environments (property-based).

Nothing hostile (a line break, CR, NUL; an env key starting with '-' or holding '=') may reach a command line, a
systemd unit, a supervisor section or an env file unescaped: the validators refuse it naming the variable, and
whatever they accept is read back by each runtime's parser as exactly the words and values that went in, in one
program. Supervisor's own parser (4.3, from the lab's node venv) is run when that venv is there; the emulation
below (its configparser settings, '%(here)s', '%' expansion, shlex) runs always. systemd-analyze checks a batch of
generated units where it is installed.
"""

from __future__ import annotations

import configparser
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ansible_collections.multinode.vllm.plugins.module_utils._env import (
    EnvError,
    EnvSettings,
    env_file,
    env_file_value_error,
    node_environment,
)
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import parse_network, select_fabric
from ansible_collections.multinode.vllm.plugins.module_utils._ray_start import (
    RaySettings,
    RayStartError,
    ray_start_args,
)
from ansible_collections.multinode.vllm.plugins.module_utils._runtime import (
    HASH_ENV,
    RuntimeConfigError,
    docker_container_params,
    render,
    supervisor_program,
    supervisord_config,
    systemd_unit,
)
from ansible_collections.multinode.vllm.plugins.module_utils._serve import (
    ServeError,
    ServeSettings,
    serve_args,
    serve_env_file,
    serve_environment,
)
from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import parse_env_file
from ansible_collections.multinode.vllm.plugins.module_utils._text import REFUSED, one_line_error

# Reproducible in CI, nothing written to the work tree (applied to each test, not loaded as a global profile).
HOSTILE = settings(database=None, derandomize=True, deadline=None, max_examples=200,
                   suppress_health_check=[HealthCheck.too_slow])

LAB_PYTHON = "/var/lib/multinode-vllm-lab/cache/node-venv/bin/python"
VENV = "/opt/multinode-vllm/venv"
ENV_PATH = "/etc/multinode-vllm/node.env"
LAUNCHER = "/var/lib/multinode-vllm/bin/multinode-env-exec"
INCLUDE_DIR = "/etc/multinode-vllm/supervisor.d"
CIDR = "198.18.200.0/24"
HEAD = "198.18.200.12"
EVIL = "x\n[program:evil]\ncommand=/usr/bin/touch /tmp/pwned\nuser=root\n;"

# --- strategies ---------------------------------------------------------------

# What the readers treat specially, so that the safe text hits it often.
_TRICKY = " \t;#%()'\"\\$=-[]{}:,/@*&|<>!`~"
_safe_char = st.one_of(
    st.sampled_from(_TRICKY),
    st.characters(exclude_characters=REFUSED, exclude_categories=("Cs",)),
)
safe_text = st.text(_safe_char, max_size=40)
safe_word = st.one_of(
    safe_text,
    st.sampled_from(["%(here)s", "a ;b", "a #b", "--hf-overrides={\"a\": 1}", ";", "#", "$HOME", "${X}", "%n",
                     "%%", "a\\", "\"", "'", " ", ""]),
)
hostile_text = st.one_of(
    st.tuples(safe_text, st.sampled_from(REFUSED), safe_text).map("".join),
    st.just(EVIL),
    st.just(json.dumps({"rope_scaling": {"type": "yarn", "factor": 4.0}}, indent=2)),
)
env_key = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
bad_env_key = st.one_of(
    st.sampled_from(["--split-string", "-S", "-i", "-u", "A=B", "=", "", "1A", "A B", "A-B", "A\nB"]),
    st.tuples(st.sampled_from(["-", "--"]), safe_text).map("".join),
    st.tuples(env_key, st.just("="), safe_text).map("".join),
)


def _args_with(hostile, at, length=3):
    args = ["--flag%d" % i for i in range(length)]
    args.insert(min(at, length), hostile)
    return args


# --- validators: each refuses, naming the variable and showing the value -------


def _refused(exc_info, variable, value):
    message = str(exc_info.value)
    assert variable in message, message
    assert repr(value)[:60] in message or repr(value[:120])[:60] in message, message
    assert "single line" in message and "remove" in message, message


@HOSTILE
@given(hostile_text, st.integers(0, 3))
@example(EVIL, 0)
def test_serve_args_refuse_a_hostile_extra_arg(hostile, at):
    args = _args_with(hostile, at)
    with pytest.raises(ServeError) as caught:
        serve_args("ray", ServeSettings(model="/m", api_host="198.19.1.10", extra_args=args))
    _refused(caught, "vllm_extra_args[%d]" % min(at, 3), hostile)


@pytest.mark.parametrize("field, variable", [("model", "vllm_model"), ("served_model_name", "vllm_served_model_name"),
                                             ("api_host", "vllm_api_host"), ("dtype", "vllm_dtype")])
@HOSTILE
@given(hostile=hostile_text)
def test_serve_args_refuse_a_hostile_setting(field, variable, hostile):
    values = {"model": "/m", "api_host": "198.19.1.10", field: hostile}
    with pytest.raises(ServeError) as caught:
        serve_args("ray", ServeSettings(**values))
    _refused(caught, variable, hostile)


@HOSTILE
@given(hostile_text, st.integers(0, 3))
def test_ray_start_args_refuse_a_hostile_extra_arg(hostile, at):
    args = _args_with(hostile, at)
    with pytest.raises(RayStartError) as caught:
        ray_start_args("worker", "198.18.200.13", HEAD, RaySettings(extra_args=tuple(args)))
    _refused(caught, "ray_extra_args[%d]" % min(at, 3), hostile)


def _selection():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "networks.yml")) as handle:
        layout = yaml.safe_load(handle)["spark1"]
    return select_fabric("spark1", parse_network(layout), CIDR)


SELECTION = _selection()


@HOSTILE
@given(env_key, hostile_text, st.sampled_from(["extra", "overrides"]))
def test_node_environment_refuses_a_hostile_value(key, hostile, where):
    settings_ = EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, extra={key: hostile} if where == "extra" else {})
    with pytest.raises(EnvError) as caught:
        node_environment(SELECTION, settings_, overrides={key: hostile} if where == "overrides" else None)
    _refused(caught, "node_env_%s[%s]" % (where, key), hostile)


@HOSTILE
@given(bad_env_key)
def test_node_environment_refuses_a_bad_key(key):
    with pytest.raises(EnvError, match="not a valid environment variable name"):
        node_environment(SELECTION, EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, extra={key: "1"}))


@HOSTILE
@given(st.dictionaries(env_key, safe_text.filter(lambda v: env_file_value_error("K", v) is None), min_size=1,
                       max_size=6))
def test_env_file_reads_back_as_written(env):
    """One KEY=VALUE line per key, read back the way the launcher (and docker's --env-file) reads it. (Values systemd
    would read differently are refused: test_env_file_readers.py.)"""
    text = env_file(env)
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == len(env) + 1
    read = {}
    for line in lines[:-1]:
        key, value = line.split("=", 1)
        read[key] = value
    assert read == {k: str(v) for k, v in env.items()}
    assert text.splitlines() == lines[:-1]  # no other line break hides inside a value


@HOSTILE
@given(env_key, hostile_text)
def test_env_file_refuses_a_hostile_value(key, hostile):
    with pytest.raises(EnvError) as caught:
        env_file({key: hostile})
    _refused(caught, "env file value of %s" % key, hostile)


@HOSTILE
@given(bad_env_key)
def test_env_file_refuses_a_bad_key(key):
    with pytest.raises(EnvError, match="not a valid environment variable name"):
        env_file({key: "1"})


# --- vllm_env: vllm serve's own env file -----------------------------------------


@HOSTILE
@given(bad_env_key)
@example("--split-string")
def test_serve_environment_refuses_a_key_that_is_no_variable_name(key):
    with pytest.raises(ServeError) as caught:
        serve_environment("/var/cache/vllm", extra={key: "sh -c id"})
    message = str(caught.value)
    assert "vllm_env" in message and repr(key) in message and "rename or remove it" in message, message


@HOSTILE
@given(env_key, hostile_text)
def test_serve_environment_refuses_a_hostile_value(key, hostile):
    with pytest.raises(ServeError) as caught:
        serve_environment("/var/cache/vllm", extra={key: hostile})
    _refused(caught, "vllm_env[%s]" % key, hostile)


@pytest.mark.parametrize("variable, kwargs", [("vllm_cache_root", {"cache_root": "/c\n"}),
                                              ("vllm_hf_home", {"cache_root": "/c", "hf_home": "/h\r"})])
def test_serve_environment_refuses_a_hostile_path(variable, kwargs):
    with pytest.raises(ServeError, match=variable):
        serve_environment(**kwargs)


@HOSTILE
@given(st.dictionaries(env_key, st.one_of(st.none(), safe_text), max_size=6), st.booleans())
def test_the_serve_env_file_reads_back_through_the_launcher(extra, offline):
    text = serve_env_file("/var/cache/vllm", ray_address="198.18.200.12:6379", hf_home="/h", hf_offline=offline,
                          extra=extra)
    lines = text.splitlines()
    # One KEY=VALUE line per variable, sorted; the launcher's parser (the one env-file parser) reads each back.
    keys = [line.split("=", 1)[0] for line in lines]
    assert keys == sorted(keys) and all("=" in line and not line.startswith("-") for line in lines)
    read = parse_env_file(text)
    expected = {"VLLM_CACHE_ROOT": "/var/cache/vllm", "RAY_ADDRESS": "198.18.200.12:6379", "HF_HOME": "/h"}
    if offline:
        expected.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    for key, value in extra.items():
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = value
    assert read == expected and len(lines) == len(read)
    assert read == serve_environment("/var/cache/vllm", ray_address="198.18.200.12:6379", hf_home="/h",
                                     hf_offline=offline, extra=extra)


# --- renderers: hostile refused; safe words read back exactly -----------------


@HOSTILE
@given(hostile_text, st.integers(0, 3), st.sampled_from(["process", "systemd", "docker"]))
@example(EVIL, 0, "process")
def test_every_runtime_refuses_a_hostile_word(hostile, at, runtime):
    with pytest.raises(RuntimeConfigError) as caught:
        render(runtime, "vllm", {"A": "1"}, VENV + "/bin/vllm", _args_with(hostile, at), ENV_PATH,
               python=VENV + "/bin/python", launcher=LAUNCHER, image="example/vllm")
    # process: python, launcher, env file, program, then the arguments; systemd and docker: program, arguments.
    assert "word %d of the command" % (min(at, 3) + (4 if runtime == "process" else 1)) in str(caught.value)
    assert "single line" in str(caught.value)


def _supervisor_emulated(text, here=INCLUDE_DIR):
    """What supervisor 4.3 makes of one include file: its parser settings, '%(here)s', '%' expansion, shlex."""
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";", "#"), strict=False)
    parser.read_file(io.StringIO(text, newline=None))  # open() in text mode: \r and \r\n end lines too
    programs = {}
    for section in parser.sections():
        values = {k: v.replace("%(here)s", here) for k, v in parser.items(section)}
        command = values["command"] % {}  # any %(name)s left would raise KeyError: only %% may be there
        programs[section] = {"argv": shlex.split(command), "environment": values.get("environment")}
    return programs


@HOSTILE
@given(st.lists(safe_word, max_size=6))
@example(["a ;b", "c"])
@example(["a #b", "--block"])
@example(["%(here)s", "%(ENV_HOME)s"])
def test_supervisor_section_reads_back_as_one_program(args):
    command = [VENV + "/bin/python", LAUNCHER, ENV_PATH, VENV + "/bin/vllm"] + args
    text = supervisor_program("vllm", command, "abc123", "/var/log/multinode-vllm")
    assert _supervisor_emulated(text) == {
        "program:vllm": {"argv": command, "environment": '%s="abc123"' % HASH_ENV}}


_SUPERVISOR_READER = textwrap.dedent('''
    import json, os, shlex, sys
    from supervisor.options import ServerOptions
    for line in sys.stdin:
        conf = line.strip()
        try:
            options = ServerOptions()
            options.configfile = conf
            options.here = os.path.dirname(conf)
            section = options.read_config(conf)
            out = []
            for group in section.process_group_configs:
                for process in group.process_configs:
                    try:
                        argv = shlex.split(process.command)
                    except ValueError as exc:
                        argv = "shlex: %s" % exc
                    out.append({"name": group.name, "argv": argv, "environment": process.environment,
                                "autostart": process.autostart})
        except Exception as exc:
            out = {"error": "%s: %s" % (type(exc).__name__, exc)}
        sys.stdout.write(json.dumps(out) + "\\n")
        sys.stdout.flush()
''')


@pytest.fixture(scope="module")
def supervisor_reader(tmp_path_factory):
    """Supervisor's own config reader, in the lab node venv's python (supervisor is not a controller package)."""
    probe = subprocess.run([LAB_PYTHON, "-c", "import supervisor.options"], capture_output=True, check=False) \
        if os.access(LAB_PYTHON, os.X_OK) else None
    if probe is None or probe.returncode != 0:
        pytest.skip("supervisor is not importable from %s (make lab-venv builds it)" % LAB_PYTHON)
    root = tmp_path_factory.mktemp("supervisor")
    (root / "supervisor.d").mkdir()
    conf = root / "supervisord.conf"
    conf.write_text(supervisord_config(str(root), str(root), str(root / "supervisor.d")))
    proc = subprocess.Popen([LAB_PYTHON, "-c", _SUPERVISOR_READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)

    def read(program_text):
        (root / "supervisor.d" / "vllm.conf").write_text(program_text)
        proc.stdin.write(str(conf) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    # supervisor refuses a log file whose directory is missing: the sections it reads log here.
    read.log_dir = str(root)
    yield read
    proc.stdin.close()
    proc.wait(timeout=10)


@settings(HOSTILE, max_examples=150)
@given(st.lists(safe_word, max_size=6))
@example(["a ;b", "c"])
@example(["%(here)s"])
def test_supervisor_own_parser_sees_exactly_one_program(supervisor_reader, args):
    command = [VENV + "/bin/python", LAUNCHER, ENV_PATH, VENV + "/bin/vllm"] + args
    programs = supervisor_reader(supervisor_program("vllm", command, "abc123", supervisor_reader.log_dir))
    assert programs == [{"name": "vllm", "argv": command, "environment": {HASH_ENV: "abc123"}, "autostart": True}]


def test_supervisor_reader_sees_an_injected_program(supervisor_reader):
    """The harness sees the finding: the text the unchecked renderer wrote for EVIL is a second, root program."""
    text = "[program:vllm]\ncommand=%s\n" % " ".join(shlex.quote(word) for word in ["/bin/echo", EVIL])
    programs = {p["name"]: p for p in supervisor_reader(text)}
    assert sorted(programs) == ["evil", "vllm"]
    assert programs["evil"]["argv"] == ["/usr/bin/touch", "/tmp/pwned"] and programs["evil"]["autostart"] is True


def _systemd_exec_words(line):
    """ExecStart= words as systemd 252 reads them: quotes and C escapes, then '%%' and '$$'."""
    words, word, quote, i, started = [], [], None, 0, False
    while i < len(line):
        char = line[i]
        if quote is None and char in " \t":
            if started:
                words.append("".join(word))
            word, started = [], False
        elif char == "\\":
            escaped = line[i + 1]
            assert escaped in "\\\"'", "an escape systemd would read differently: %r" % line
            word.append(escaped)
            started, i = True, i + 1
        elif quote is None and char in "\"'":
            quote, started = char, True
        elif char == quote:
            quote = None
        else:
            word.append(char)
            started = True
        i += 1
    assert quote is None, "unbalanced quoting: %r" % line
    if started:
        words.append("".join(word))
    out = []
    for raw in words:
        # A lone % is a specifier and a lone $ a variable: both must come doubled.
        assert raw.replace("%%", "").count("%") == 0 and raw.replace("$$", "").count("$") == 0, raw
        out.append(raw.replace("%%", "%").replace("$$", "$"))
    return out


@HOSTILE
@given(st.lists(safe_word, max_size=6))
@example(["--hf-overrides", json.dumps({"rope_scaling": {"type": "yarn", "factor": 4.0}})])
def test_systemd_unit_keeps_each_argument_one_word(args):
    unit = systemd_unit("multinode.vllm vllm", ENV_PATH, VENV + "/bin/vllm", args, "abc123")
    lines = unit.splitlines()
    shape = systemd_unit("multinode.vllm vllm", ENV_PATH, VENV + "/bin/vllm", [], "abc123").splitlines()
    assert len(lines) == len(unit.split("\n")) - 1 == len(shape)  # nothing added a line, nor hid a line break
    exec_start = [line for line in lines if line.startswith("ExecStart=")]
    assert len(exec_start) == 1
    assert _systemd_exec_words(exec_start[0][len("ExecStart="):]) == [VENV + "/bin/vllm"] + args


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed here")
def test_systemd_analyze_accepts_every_generated_unit(tmp_path):
    (tmp_path / "node.env").write_text("A=1\n")
    units = []

    @settings(HOSTILE, max_examples=60)
    @given(st.lists(safe_word, max_size=6))
    def collect(args):
        path = tmp_path / ("u%d.service" % len(units))
        path.write_text(systemd_unit("x", str(tmp_path / "node.env"), "/bin/true", args, "h"))
        units.append(str(path))

    collect()
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no"] + units, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path) not in proc.stderr, proc.stderr


@HOSTILE
@given(st.lists(safe_word, max_size=6))
def test_docker_command_is_the_words(args):
    params = docker_container_params("multinode-vllm", "example/vllm", ENV_PATH, "vllm", args, "abc123")
    assert params["command"] == ["vllm"] + args and params["env"] == {HASH_ENV: "abc123"}


def test_one_line_error_names_variable_value_and_fix():
    assert one_line_error("vllm_model", "/models/tiny") is None
    message = one_line_error("vllm_extra_args[1]", "a\x00b")
    assert message.startswith("vllm_extra_args[1] = 'a\\x00b' contains a NUL character at position 1")
    assert len(one_line_error("x", "\n" + "y" * 1000)) < 700  # a long value is cut in the message


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
