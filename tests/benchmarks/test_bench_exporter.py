"""benchmarks/bench_exporter.py refuses what would spoil a run before it writes its log, in one line. Its
timings are taken by `make bench-exporter`, never here."""
import importlib.util
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


def test_results_that_cannot_be_written_keep_the_old_ones(tmp_path):
    """A file-size limit below the JSON's size stands in for a full disk (Python ignores SIGXFSZ: the write
    raises EFBIG); the measurement is stubbed, the stand-in server and ranks are real."""
    out = tmp_path / "e.json"
    out.write_text('{"old": true}\n')
    script = (f"import resource, sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks import bench_exporter as b; "
              "b.write_log = lambda log, gib: log.write_bytes(b''); "
              "b.scrape_latency = lambda log, url, n: {'scrape_ms_p95': 1.0}; "
              "b.steady_cpu = lambda log, url, s: {'cpu_pct_of_core': 0.1}; "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY)); "
              f"sys.exit(b.main(['--out', {str(out)!r}]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr == (f"bench_exporter: --out {out}: cannot write {tmp_path}/.e.json"
                                                    ".dsaops-new: File too large (EFBIG); nothing was changed\n"), done.stderr
    assert out.read_text() == '{"old": true}\n' and [p.name for p in tmp_path.iterdir()] == ["e.json"]


@pytest.mark.parametrize("argv, command", [
    ([], "make bench-exporter"),
    (QUICK, "python3 benchmarks/bench_exporter.py " + " ".join(QUICK)),
])
def test_the_command_recorded_is_the_one_run(argv, command):
    """BENCHMARKS.md's command row comes from the JSON: a short run must not read as the make target's."""
    spec = importlib.util.spec_from_file_location("bench_exporter", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.parse_args(argv).command == command
