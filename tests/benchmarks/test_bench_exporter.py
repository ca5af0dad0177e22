"""benchmarks/bench_exporter.py refuses what would spoil a run before it writes its log, in one line. Its
timings are taken by `make bench-exporter`, never here."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_exporter.py"
QUICK = ["--log-gb", "0.001", "--scrapes", "3", "--cpu-seconds", "1"]  # a short run if a check is missing


def bench(*args, pythonpath=(), **kw):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, pythonpath), str(ROOT)]))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False, **kw)


@pytest.mark.parametrize("argv, message", [
    (["--scrapes", "0"], "--scrapes 0: give a whole number from 1"),
    (["--log-gb", "-1"], "--log-gb -1: give a number above 0"),
    (["--log-gb", "nan"], "--log-gb nan: give a number above 0"),
    (["--cpu-seconds", "0"], "--cpu-seconds 0: give a number above 0"),
    (["--out", "{tmp}"], "--out {tmp}: cannot write there"),                     # a folder
    (["--out", "{tmp}/no/such/e.json"], "--out {tmp}/no/such/e.json: cannot write there"),
])
def test_bad_input_is_one_line_and_exit_2_before_the_run(tmp_path, argv, message):
    out = tmp_path / "e.json"
    done = bench(*QUICK, "--out", str(out), *[a.format(tmp=tmp_path) for a in argv])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"bench_exporter: {message.format(tmp=tmp_path)}"), done.stderr
    assert not out.exists() and done.stdout == ""


@pytest.mark.parametrize("missing", ["psutil", "prometheus_client", "setproctitle"])
def test_a_missing_package_is_named_in_one_line(tmp_path, missing):
    """setproctitle is the stand-in's: without it its ranks died untitled and the run ended in an assertion
    dumping 2 kB of metrics."""
    (tmp_path / f"{missing}.py").write_text(f"raise ModuleNotFoundError({f'No module named {missing!r}'!r})\n")
    out = tmp_path / "e.json"
    done = bench(*QUICK, "--out", str(out), pythonpath=[tmp_path])
    assert done.returncode == 2 and done.stderr == (
        f"bench_exporter: {missing} is not importable: `make bench-exporter` runs this in the project's .venv, "
        "which has it\n"), done.stderr
    assert not out.exists()
