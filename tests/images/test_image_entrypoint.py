"""The image's entrypoint, run here as it runs in the image: SGLang's place taken by a stand-in
(no GPU), the exporter the real `dsaops exporter`. The in-container `docker stop` case is in
test_image_build.py."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from dsaops import server_address
from tests.images.docker_build import REPO
from tests.support import sglang_cli, sglang_definitions
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.prerequisites import need

ENTRYPOINT = REPO / "images" / "entrypoint.sh"
HERE = Path(__file__).parent


def start(tmp_path: Path, *args: str, wrap: tuple[str, ...] = (), **env: str) -> subprocess.Popen:
    """The entrypoint with args, its environment updated by env; wrap: a command line it runs under."""
    environ = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # python3 and dsaops of this venv
        "PYTHONPATH": f"{HERE}{os.pathsep}{REPO}",    # the stand-in; dsaops of this checkout, whatever is installed
        "DSAOPS_SERVER_MODULE": "standin_server",
        "DSAOPS_LOG_FILE": str(tmp_path / "log" / "sglang.log"),
        "DSAOPS_EXPORTER": "0",
    } | env
    return subprocess.Popen([*wrap, str(ENTRYPOINT), *args], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)




def log_of(tmp_path: Path) -> str:
    path = tmp_path / "log" / "sglang.log"
    return path.read_text() if path.is_file() else ""


def metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return ""


def test_sigterm_stops_server_then_exporter_with_servers_status(tmp_path):
    port = free_port()
    proc = start(tmp_path, "--model-path", "/m", DSAOPS_EXPORTER="1", DSAOPS_EXPORTER_LISTEN=f"127.0.0.1:{port}",
                 DSAOPS_NODE="node-a", DSAOPS_SERVER_HOST="127.0.0.2", DSAOPS_SERVER_PORT="31000")
    try:
        assert wait_for(lambda: "standin pid=" in log_of(tmp_path), 20), proc.stderr
        assert wait_for(lambda: "dsa_" in metrics(port), 30), "the exporter never answered"
        children = psutil.Process(proc.pid).children()
        exporter = next(c for c in children if "exporter" in c.cmdline())
        assert exporter.cmdline()[-10:] == ["--server-url", "http://127.0.0.2:31000", "--log-file",
                                            str(tmp_path / "log" / "sglang.log"), "--state-file",
                                            str(tmp_path / "log" / "dsaops-exporter.state.json"),
                                            "--listen", f"127.0.0.1:{port}", "--node", "node-a"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    text = log_of(tmp_path)
    assert "args=--model-path /m --port 31000" in text  # DSAOPS_SERVER_PORT becomes SGLang's --port
    assert "standin on stderr" in text and "SIGTERM received" in text
    assert not exporter.is_running()
    assert metrics(port) == ""
    assert (tmp_path / "log" / "dsaops-exporter.state.json").is_file()  # in-container mode: state on the log volume


def status(port: int, token: str | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_an_exporter_on_every_address_wants_the_token_file(tmp_path):
    """As the playbooks' dsaops_exporter_mode inside runs it: with DSAOPS_EXPORTER_TOKEN_FILE a scrape needs the
    token; without it the exporter does not start, in one line, and SGLang serves on."""
    token = tmp_path / "token"
    token.write_text("the-scrape-token-0123456789\n")
    port = free_port()
    proc = start(tmp_path, "--model-path", "/m", DSAOPS_EXPORTER="1", DSAOPS_EXPORTER_LISTEN=f"0.0.0.0:{port}",
                 DSAOPS_EXPORTER_TOKEN_FILE=str(token), DSAOPS_SERVER_PORT=str(free_port()))
    try:
        assert wait_for(lambda: status(port, "the-scrape-token-0123456789") == 200, 30), "the exporter never answered"
        assert status(port) == status(port, "the-scrape-token-012345678") == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    (tmp_path / "log" / "sglang.log").unlink()
    proc = start(tmp_path, "--model-path", "/m", DSAOPS_EXPORTER="1", DSAOPS_EXPORTER_LISTEN=f"0.0.0.0:{port}",
                 DSAOPS_SERVER_PORT=str(free_port()))
    try:
        assert wait_for(lambda: "standin pid=" in log_of(tmp_path), 20)
        assert wait_for(lambda: not any("exporter" in c.cmdline() for c in psutil.Process(proc.pid).children()), 20)
        assert proc.poll() is None and status(port) == 0
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert f"dsaops exporter: --listen '0.0.0.0:{port}' is reachable from other machines: add --token-file" in stderr


def test_the_log_holds_the_servers_last_lines_when_the_entrypoint_exits(tmp_path):
    """The entrypoint is PID 1 in the image: when it exits, the kernel ends every process left in the
    container, the one writing SGLang's output to the log included. So it waits for that writer,
    which ends once SGLang and its children (which log their own shutdown) are gone."""
    proc = start(tmp_path, "--model-path", "/m", STANDIN_CHILD_LAST_WORDS="1")
    try:
        assert wait_for(lambda: "standin pid=" in log_of(tmp_path), 20), proc.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "child last words" in log_of(tmp_path)  # read at once: nothing may still be on its way
    finally:
        proc.kill()


def test_server_exit_ends_the_container_with_its_status(tmp_path):
    proc = start(tmp_path, "--model-path", "/m", STANDIN_EXIT="3")
    assert proc.wait(timeout=30) == 3
    assert "standin pid=" in log_of(tmp_path)


def test_mismatched_port_is_refused_before_anything_starts(tmp_path):
    proc = start(tmp_path, "--model-path", "/m", "--port=8000")
    assert proc.wait(timeout=30) == 2
    assert "run with -e DSAOPS_SERVER_PORT=8000" in proc.stderr.read()
    assert log_of(tmp_path) == ""
    proc = start(tmp_path, "--model-path", "/m", "--port", "8000", DSAOPS_SERVER_PORT="8000", STANDIN_EXIT="0")
    assert proc.wait(timeout=30) == 0
    assert "args=--model-path /m --port 8000\n" in log_of(tmp_path)


@pytest.mark.parametrize("flag", ["--por", "--po=", "--port="])
def test_an_abbreviated_port_counts_as_the_port(tmp_path, flag):
    """SGLang's argparse reads --por as --port: one that differs is refused, not left beside the
    --port the entrypoint would add (argparse would take the last, silently)."""
    args = [flag + "8000"] if flag.endswith("=") else [flag, "8000"]
    proc = start(tmp_path, "--model-path", "/m", *args)
    assert proc.wait(timeout=30) == 2
    assert "run with -e DSAOPS_SERVER_PORT=8000" in proc.stderr.read()
    proc = start(tmp_path, "--model-path", "/m", *args, DSAOPS_SERVER_PORT="8000", STANDIN_EXIT="0")
    assert proc.wait(timeout=30) == 0
    assert f"args=--model-path /m {' '.join(args)}\n" in log_of(tmp_path)


def test_the_abbreviations_read_are_those_sglang_reads():
    """The pinned SGLang parses with argparse's default abbreviations; a prefix the entrypoint reads as
    --host, --port or --api-key either means that option to SGLang or is one SGLang refuses as ambiguous."""
    source = sglang_definitions.source_file("srt/server_args.py").read_text()
    assert 'argparse.ArgumentParser(prog="sglang serve")' in source and "allow_abbrev" not in source
    flags = sglang_cli.cli_flags()
    for option, least in server_address.OPTIONS.items():
        for end in range(least, len(option) + 1):
            sharing = {flag for flag in flags if flag.startswith(option[:end])}
            assert option in sharing, option
            assert sharing == {option} or option[:end] == "--po", sharing  # --po: --post-capture-kv-sizing too


@pytest.mark.parametrize("flags, reach", [(["--host", "10.0.0.5"], "10.0.0.5"), (["--host=fd00::5"], "[fd00::5]"),
                                          (["--ho", "10.0.0.6"], "10.0.0.6"), (["--hos=10.0.0.7"], "10.0.0.7")])
def test_a_host_the_checks_do_not_reach_is_refused_before_anything_starts(tmp_path, flags, reach):
    """SGLang bound to one address answers there only; without DSAOPS_SERVER_HOST the health check and the
    exporter would read 127.0.0.1."""
    proc = start(tmp_path, "--model-path", "/m", *flags)
    assert proc.wait(timeout=30) == 2
    err = proc.stderr.read()
    assert f"run with -e DSAOPS_SERVER_HOST={reach} (or drop --host)" in err and err.count("\n") == 1
    assert log_of(tmp_path) == ""


def test_a_host_name_is_resolved_once(monkeypatch):
    """Every check reads the same answer for --host, and a slow resolver delays the start once, not once a check."""
    asked, resolve = [], socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda name, *a, **k: asked.append(name) or resolve(name, *a, **k))
    assert server_address.check("127.0.0.1", "30000", ["--host", "lOcAlHoSt"]) is None
    assert asked.count("lOcAlHoSt") == 1, asked


@pytest.mark.parametrize("host", ["no-such-host.invalid", "[::1]"])
def test_a_host_that_resolves_to_no_address_is_refused(tmp_path, host):
    """SGLang cannot bind a name that resolves to nothing (nor an IPv6 address in brackets): refused
    before anything starts, even where DSAOPS_SERVER_HOST spells it the same."""
    proc = start(tmp_path, "--model-path", "/m", "--host", host, STANDIN_EXIT="0", DSAOPS_ALLOW_NO_API_KEY="1",
                 DSAOPS_SERVER_HOST=host)
    assert proc.wait(timeout=30) == 2
    err = proc.stderr.read()
    assert f"--host {host} resolves to no address here" in err and err.count("\n") == 1, err
    assert log_of(tmp_path) == ""


@pytest.mark.parametrize("host, env", [("127.0.0.2", {"DSAOPS_SERVER_HOST": "127.0.0.2"}),
                                       ("FD00:0::5", {"DSAOPS_SERVER_HOST": "[fd00::5]"}),   # the playbooks' spelling
                                       ("0.0.0.0", {}), ("::", {})])
def test_a_host_the_checks_reach_starts_the_server(tmp_path, host, env):
    proc = start(tmp_path, "--model-path", "/m", "--host", host, STANDIN_EXIT="0", DSAOPS_ALLOW_NO_API_KEY="1", **env)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert f"args=--model-path /m --host {host} --port 30000\n" in log_of(tmp_path)


@pytest.mark.parametrize("given", [["--port", "08000"], ["--config", "{}"]])
def test_a_port_with_a_leading_zero_is_that_port(tmp_path, given):
    """SGLang reads --port as an int, and YAML keeps 08000 a string: both are port 8000."""
    args = [arg.format(config_file(tmp_path, "port: 08000\n")) for arg in given]
    proc = start(tmp_path, "--model-path", "/m", *args, STANDIN_EXIT="0", DSAOPS_SERVER_PORT="8000")
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert f"args=--model-path /m {' '.join(args)}\n" in log_of(tmp_path)


def config_file(tmp_path: Path, text: str, name: str = "sglang.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, env, drop", [
    ("api-key: k\nport: 8000\n", "DSAOPS_SERVER_PORT=8000", "port:"),
    ("por: 8000\n", "DSAOPS_SERVER_PORT=8000", "por:"),                # SGLang makes it --por: an abbreviation
    ("api-key: k\nhost: 10.0.0.5\n", "DSAOPS_SERVER_HOST=10.0.0.5", "host:"),
])
def test_the_config_files_host_and_port_are_checked_as_the_command_lines(tmp_path, text, env, drop):
    """SGLang reads its --config YAML's keys as options: a port there is SGLang's port (not one for the
    entrypoint's own --port to override unseen), a host there the one address it answers at."""
    path = config_file(tmp_path, text)
    proc = start(tmp_path, "--model-path", "/m", "--config", path)
    assert proc.wait(timeout=30) == 2
    err = proc.stderr.read()
    assert f"run with -e {env} (or drop {drop} from {path})" in err and err.count("\n") == 1, err
    assert log_of(tmp_path) == ""
    name, value = env.split("=")
    proc = start(tmp_path, "--model-path", "/m", "--config", path, STANDIN_EXIT="0", **{name: value})
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    added = "" if name == "DSAOPS_SERVER_PORT" else " --port 30000"   # none beside the file's port
    assert f"args=--model-path /m --config {path}{added}\n" in log_of(tmp_path)


@pytest.mark.parametrize("text, flags", [("port: 8000\n", ["--port", "30000"]), ("port: 8000\n", ["--po=30000"]),
                                         ("host: 10.0.0.5\napi-key: k\n", ["--host", "0.0.0.0"])])
def test_the_command_line_wins_over_the_config_file(tmp_path, text, flags):
    """SGLang puts the file's options before the command line's, and argparse keeps the last."""
    path = config_file(tmp_path, text)
    proc = start(tmp_path, "--model-path", "/m", *flags, "--config", path, STANDIN_EXIT="0")
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    port = "" if "port" in text else " --port 30000"
    assert f"args=--model-path /m {' '.join(flags)} --config {path}{port}\n" in log_of(tmp_path)


@pytest.mark.parametrize("args, name, text", [
    (["--config", "{}"], "sglang.txt", "port: 8000\n"),     # not .yaml/.yml: SGLang refuses it
    (["--config", "{}"], "sglang.yaml", "port: [8000\n"),   # invalid YAML
    (["--config", "{}"], "sglang.yaml", "- port\n"),        # not a mapping
    (["--config", "{}", "--config", "{}"], "sglang.yaml", "port: 8000\n"),
    (["--config", "{}x"], "sglang.yaml", "port: 8000\n"),   # no such file
])
def test_a_config_file_sglang_does_not_read_is_left_to_sglang(tmp_path, args, name, text):
    """SGLang says what is wrong with a file it refuses; the entrypoint neither repeats it nor fails."""
    path = config_file(tmp_path, text, name)
    args = [arg.format(path) for arg in args]
    proc = start(tmp_path, "--model-path", "/m", *args, STANDIN_EXIT="0")
    assert proc.wait(timeout=30) == 0
    assert proc.stderr.read() == ""
    assert f"args=--model-path /m {' '.join(args)} --port 30000\n" in log_of(tmp_path)


@pytest.mark.parametrize("args", [["--config={}"], ["--conf", "{}"], ["--confi={}"]])
def test_a_config_file_sglang_would_not_read_is_refused(tmp_path, args):
    """SGLang's argparse takes these for --config, but its merger reads the file only after `--config`
    alone: the keys file's API keys would silently not apply."""
    path = config_file(tmp_path, "api-key: k\n")
    args = [arg.format(path) for arg in args]
    proc = start(tmp_path, "--model-path", "/m", *args)
    assert proc.wait(timeout=30) == 2
    err = proc.stderr.read()
    assert f"{args[0]} would leave the file's settings (the API keys too) unapplied; write --config FILE" in err, err
    assert err.count("\n") == 1 and log_of(tmp_path) == ""


def test_unwritable_log_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    proc = start(tmp_path, "--model-path", "/m", DSAOPS_LOG_FILE=str(tmp_path / "file" / "sglang.log"))
    assert proc.wait(timeout=30) == 2
    assert "cannot write DSAOPS_LOG_FILE" in proc.stderr.read()


def test_a_command_instead_of_options_runs_that_command(tmp_path):
    proc = start(tmp_path, "dsaops", "patches", "list")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "series" in out
    assert log_of(tmp_path) == ""


def test_a_plan_reaches_the_exporter_for_the_kv_alert(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"kv_pool_tokens_per_rank": 161600}')
    port = free_port()
    proc = start(tmp_path, "--model-path", "/m", DSAOPS_EXPORTER="1", DSAOPS_EXPORTER_LISTEN=f"127.0.0.1:{port}",
                 DSAOPS_EXPORTER_PLAN=str(plan))
    try:
        assert wait_for(lambda: "dsa_kv_pool_planned_tokens" in metrics(port), 30), proc.stderr
        planned = [line for line in metrics(port).splitlines() if line.startswith("dsa_kv_pool_planned_tokens")]
        assert planned and planned[0].endswith(" 161600.0"), planned
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_health_check_learns_the_ranks_of_this_node_once(tmp_path):
    args_file = tmp_path / "run" / "healthcheck.args"
    proc = start(tmp_path, "--model-path", "/m", "--tp", "4", "--nnodes", "2", STANDIN_EXIT="0",
                 DSAOPS_HEALTHCHECK_ARGS=str(args_file))
    assert proc.wait(timeout=30) == 0
    assert args_file.read_text() == "--expect-ranks 2\n"


def test_the_health_check_counts_the_ranks_the_config_file_asks_for(tmp_path):
    """SGLang reads --tp from its --config YAML too; the command line's still wins."""
    args_file = tmp_path / "run" / "healthcheck.args"
    path = config_file(tmp_path, "tp-size: 8\npp-size: 2\n")
    proc = start(tmp_path, "--model-path", "/m", "--config", path, "--pp-size", "1", STANDIN_EXIT="0",
                 DSAOPS_HEALTHCHECK_ARGS=str(args_file))
    assert proc.wait(timeout=30) == 0
    assert args_file.read_text() == "--expect-ranks 8\n"


def test_arguments_it_cannot_count_leave_the_health_check_without_a_count(tmp_path):
    args_file = tmp_path / "healthcheck.args"
    args_file.write_text("--expect-ranks 8\n")  # from an earlier start
    proc = start(tmp_path, "--model-path", "/m", "--tp", "0", STANDIN_EXIT="0", DSAOPS_HEALTHCHECK_ARGS=str(args_file))
    assert proc.wait(timeout=30) == 0  # SGLang itself says what is wrong with its arguments
    assert not args_file.exists()
    assert "--tp-size must be >= 1" in proc.stderr.read()


def test_the_before_start_command_runs_first_and_its_failure_ends_the_container(tmp_path):
    """DSAOPS_BEFORE_START (the playbooks' memory wait): SGLang starts only after it succeeds; when it fails,
    its status is the container's, so Docker's restart policy tries again later."""
    hook = tmp_path / "wait.sh"
    hook.write_text('#!/bin/sh\necho "wait $1: memory not back" >&2\nexit "$(cat "$0.status")"\n')
    hook.chmod(0o755)
    (tmp_path / "wait.sh.status").write_text("75")
    refused = start(tmp_path, "--model-path", "/m", DSAOPS_BEFORE_START=f"{hook} wait-memory")
    assert refused.wait(timeout=30) == 75
    assert "wait wait-memory: memory not back" in refused.stderr.read()
    assert "standin pid=" not in log_of(tmp_path)                     # SGLang never started
    (tmp_path / "wait.sh.status").write_text("0")
    proc = start(tmp_path, "--model-path", "/m", DSAOPS_BEFORE_START=f"{hook} wait-memory")
    try:
        assert wait_for(lambda: "standin pid=" in log_of(tmp_path), 20), proc.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_a_stop_during_the_before_start_command_ends_it_and_starts_nothing(tmp_path):
    """`docker stop` while the memory wait runs: PID 1 ignores a SIGTERM it has no trap for, so without one the
    wait ran on and SGLang started, to be SIGKILLed at the stop timeout. Now the wait ends and nothing starts."""
    hook = tmp_path / "wait.sh"
    hook.write_text("#!/bin/sh\nexec sleep 60\n")
    hook.chmod(0o755)
    proc = start(tmp_path, "--model-path", "/m", DSAOPS_BEFORE_START=str(hook))
    try:
        assert wait_for(lambda: [c for c in psutil.Process(proc.pid).children() if c.name() == "sleep"], 20)
        [waiting] = [c for c in psutil.Process(proc.pid).children() if c.name() == "sleep"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
        assert not waiting.is_running()
    finally:
        proc.kill()
    assert "standin pid=" not in log_of(tmp_path)


@pytest.mark.parametrize("args, env", [
    (["--host", "0.0.0.0"], {}),
    (["--ho=::"], {}),
    (["--host", "10.0.0.5"], {"DSAOPS_SERVER_HOST": "10.0.0.5"}),
    (["--host", ""], {}),                                   # binds every address
    (["--host", "0.0.0.0", "--api-key", ""], {}),           # SGLang takes an empty key for none
    (["--config", "{}"], {"text": "host: 0.0.0.0\nadmin-api-key: a\n"}),   # the admin key guards admin routes only
])
def test_a_network_address_without_an_api_key_is_refused(tmp_path, args, env):
    """SGLang without --api-key answers every route to anyone who reaches it: beyond loopback that takes
    a key, or DSAOPS_ALLOW_NO_API_KEY=1."""
    text = env.pop("text", "")
    args = [arg.format(config_file(tmp_path, text)) for arg in args]
    proc = start(tmp_path, "--model-path", "/m", *args, **env)
    assert proc.wait(timeout=30) == 2
    err = proc.stderr.read()
    assert "with no API key" in err and "DSAOPS_ALLOW_NO_API_KEY=1" in err and err.count("\n") == 1, err
    assert log_of(tmp_path) == ""
    proc = start(tmp_path, "--model-path", "/m", *args, STANDIN_EXIT="0", DSAOPS_ALLOW_NO_API_KEY="1", **env)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()


@pytest.mark.parametrize("args, text", [
    (["--host", "0.0.0.0", "--config", "{}"], "api-key: k\n"),
    (["--config", "{}"], "host: '::'\napi-key: k\n"),
    (["--host", "0.0.0.0", "--api", "k"], ""),               # argparse's abbreviation of --api-key
    (["--host", "127.0.0.1"], ""),
    (["--host", "localhost"], ""),                          # a name: what it resolves to, here 127.0.0.1
    (["--host", "LOCALHOST"], ""),
    (["--config", "{}"], "host: localhost\n"),
    (["--host", "0.0.0.0", "--config", "{}"], "port: [8000\n"),   # a file SGLang refuses: it stops there
])
def test_a_network_address_with_an_api_key_or_loopback_starts(tmp_path, args, text):
    args = [arg.format(config_file(tmp_path, text)) for arg in args]
    proc = start(tmp_path, "--model-path", "/m", *args, STANDIN_EXIT="0")
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert "standin pid=" in log_of(tmp_path)


def test_a_name_is_loopback_only_when_all_its_addresses_are(tmp_path):
    """SGLang's server binds every address its --host resolves to: a name that resolves to loopback and
    to a network address serves that network. Run with an /etc/hosts of the test's own (a mount namespace)."""
    unshare = ["unshare", "--mount"] + (["--map-root-user"] if os.geteuid() else [])
    need(shutil.which("unshare") is not None
         and subprocess.run([*unshare, "true"], capture_output=True, check=False).returncode == 0,
         "a mount namespace (root, or unprivileged user namespaces) for `unshare --mount`")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost both\n10.0.0.5 both\n127.0.0.1 loop\n::1 loop\n")
    wrap = (*unshare, "sh", "-c", f'mount --bind {hosts} /etc/hosts && exec "$@"', "sh")
    proc = start(tmp_path, "--model-path", "/m", "--host", "both", wrap=wrap)
    assert proc.wait(timeout=30) == 2
    err = proc.stderr.read()
    assert "--host both serves beyond this machine with no API key" in err and err.count("\n") == 1, err
    proc = start(tmp_path, "--model-path", "/m", "--host", "loop", STANDIN_EXIT="0", wrap=wrap)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert "args=--model-path /m --host loop --port 30000\n" in log_of(tmp_path)
