"""`dsaops verify boot-gate` with small real launch scripts: refused (pass) vs started,
hung, refused-but-lingering, other errors and clean exits (fail, and killed)."""
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dsaops import boot_gate
from dsaops.cli import main
from dsaops.image import image_name
from tests.dsaops.test_sglang_formulas import patched_check
from tests.support.prerequisites import need

REPO = Path(__file__).resolve().parents[2]
IMAGE = image_name("sm_90")


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return f"{sys.executable} {path}"


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_sglangs_own_validation_refuses_and_passes(tmp_path, capsys):
    """The launch runs the pinned wheel's _check_dsa_backend_constraints with the gate's flags:
    SGLang's exception, traceback and exit code, not a copy of its text."""
    launch = script(tmp_path, "launch", f"""
        import sys
        sys.path[:0] = [{str(REPO)!r}]
        import torch
        from tests.support.sglang_definitions import define
        flags = dict(zip(sys.argv[1::2], sys.argv[2::2]))
        print("[2026-11-29 14:00:00] server_args=...", flush=True)
        torch.cuda.get_device_capability = lambda *a: (9, 0)
        check = define("srt/arg_groups/overrides.py", "_check_dsa_backend_constraints", {{}})
        check(flags["--kv-cache-dtype"], flags["--dsa-prefill-backend"], flags["--dsa-decode-backend"], hip=False)
        print("The server is fired up and ready to roll!", flush=True)
        """) + " " + " ".join(boot_gate.GATE_ARGS)
    assert main(["verify", "boot-gate", "--command", launch, "--timeout", "60"]) == 0
    out = capsys.readouterr()
    assert "boot gate PASS: refused at startup with SGLang's message (exit code 1)" in out.out
    assert "ValueError: CUDA TileLang FP8 KV requires both DSA backends to be tilelang" in out.err


def test_the_patched_image_refuses_with_the_same_text(patched_root, monkeypatch):
    """DESIGN: the boot gate expects the refusal of the *patched* SGLang; the series keeps the pairing
    refused and SGLang's text, so one expectation serves both."""
    check = patched_check(patched_root, monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    flags = dict(zip(boot_gate.GATE_ARGS[::2], boot_gate.GATE_ARGS[1::2]))
    with pytest.raises(ValueError) as refusal:
        check(flags["--kv-cache-dtype"], flags["--dsa-prefill-backend"], flags["--dsa-decode-backend"], hip=False)
    assert boot_gate.MIXED_TILELANG_REFUSAL in str(refusal.value)


def test_a_launch_that_starts_serving_fails_and_is_killed(tmp_path, capsys):
    pidfile = tmp_path / "pid"
    launch = script(tmp_path, "serve", f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])   # a scheduler
        open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        print("The server is fired up and ready to roll!", flush=True)
        time.sleep(120)
        """)
    assert main(["verify", "boot-gate", "--command", launch, "--timeout", "60", "--json"]) == 1
    assert '"the launch started serving instead of refusing"' in capsys.readouterr().out
    assert all(gone(int(pid)) for pid in pidfile.read_text().split())


@pytest.mark.parametrize("body, says", [
    ("import time; time.sleep(120)", "still running after 1 s; killed"),
    (f"import time; print({boot_gate.MIXED_TILELANG_REFUSAL!r}, flush=True); time.sleep(120)",
     "printed the refusal but kept running; killed"),
    ("raise RuntimeError('CUDA driver initialization failed')", "without SGLang's refusal"),
    ("print('nothing to do')", "exited 0 without refusing"),
])
def test_other_endings_fail(tmp_path, body, says):
    cleaned = []
    result = boot_gate.run_gate(script(tmp_path, "launch", body), timeout=1, grace=0.5,
                                cleanup=lambda: cleaned.append(True))
    assert not result.passed and says in result.detail
    assert bool(cleaned) == ("killed" in says)   # the container clean-up runs only when the launch had to be killed


def test_image_launch_command_carries_the_gate_flags():
    argv = boot_gate.docker_command(IMAGE, model_path="/models/glm", name="gate",
                                    docker_args=["-v", "/models:/models"], sglang_args=["--tp-size", "8"])
    image = argv.index(IMAGE)
    assert argv[:4] == ["docker", "run", "--rm", "--name"] and argv[image - 2:image] == ["-v", "/models:/models"]
    assert argv[image + 1:] == ["--model-path", "/models/glm", *boot_gate.GATE_ARGS, "--tp-size", "8"]


def test_a_missing_launcher_is_a_failure_not_a_crash(capsys):
    assert main(["verify", "boot-gate", "--command", "/nonexistent/launch_server --kv-cache-dtype fp8_e4m3",
                 "--timeout", "5"]) == 1
    assert "without SGLang's refusal" in capsys.readouterr().out


def test_image_without_docker_says_what_to_do(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["verify", "boot-gate", "--image", IMAGE]) == 2
    assert capsys.readouterr().err.startswith("dsaops verify: --image needs the docker CLI")


def test_image_without_a_docker_engine_stops_in_one_line(tmp_path, monkeypatch, capsys):
    """docker's own failure (exit 125: no engine here, no GPU runtime, no such image) is not the image's verdict."""
    need(shutil.which("docker") is not None, "the docker CLI runs the gate's --image launch")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    assert main(["verify", "boot-gate", "--image", IMAGE, "--timeout", "60"]) == 2
    out = capsys.readouterr()
    assert "boot gate FAIL" not in out.out
    last = out.err.splitlines()[-1]
    assert last.startswith("dsaops verify: docker could not start the gate's container (exit code 125: docker: ")
    assert f"unix://{tmp_path}/no.sock" in last and "Docker engine" in last


def test_an_empty_command_names_the_subcommand(capsys):
    assert main(["verify", "boot-gate", "--command", " "]) == 2
    assert capsys.readouterr().err.startswith("dsaops verify: --command is empty")


def test_a_timeout_that_never_ends_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["verify", "boot-gate", "--command", "sleep 6", "--timeout", "nan"])
    assert exit_.value.code == 2
    assert "argument --timeout: must be a positive number of seconds" in capsys.readouterr().err
