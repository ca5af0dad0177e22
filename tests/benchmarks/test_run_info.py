"""benchmarks/run_info.py names a run's date, commit, machine and command, and a host without git or
outside a checkout still gets a result that says so; each GPU benchmark stops in its one line on a host
without a GPU (this one)."""
import datetime
import os
import re
import subprocess
import sys

import pytest

from benchmarks import run_info

# Each GPU benchmark: the arguments of a real run, and what its line offers instead of a GPU.
GPU_SCRIPTS = {
    "h200_decode": (["--sections", "cases", "--out", "{tmp}/r.json"], "pass --dry-run"),
    "bench_kv_copy": (["--no-sweep"], ""),
    "fp8_row_scale_accuracy": (["--kernels", "--out", "{tmp}/r.json"], "leave --kernels out for the fp32 references"),
}


def test_a_run_names_its_date_commit_machine_and_command():
    info = run_info.run_info("make bench-exporter")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=run_info.ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert info["date"] == datetime.date.today().isoformat() and info["command"] == "make bench-exporter"
    assert re.fullmatch(rf"{head}(\+changes)?", info["commit"]), info["commit"]
    assert re.match(r"\S+, \d+ cores, Python \d", info["machine"]), info["machine"]
    assert run_info.run_info("x", machine="NVIDIA H200, torch 2.11")["machine"] == "NVIDIA H200, torch 2.11"


def test_without_git_or_a_checkout_the_commit_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(run_info, "ROOT", tmp_path)
    assert run_info.commit() == "unknown (not a git checkout)"
    monkeypatch.setenv("PATH", str(tmp_path))                      # no git on the PATH
    assert run_info.commit() == "unknown (no git here)"


@pytest.mark.parametrize("torch_found", [True, False], ids=["cpu-torch", "no-torch"])
@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_a_gpu_benchmark_without_a_gpu_stops_in_one_line(tmp_path, script, torch_found):
    """Run as a file, as CONTRIBUTING.md runs it: no_cuda_gpu's line, exit 2, nothing written; without
    torch (a torch that fails to import first on the path) too, not a traceback."""
    if torch_found and pytest.importorskip("torch").cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    if not torch_found:
        (tmp_path / "torch.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    argv, alternative = GPU_SCRIPTS[script]
    path = [str(run_info.ROOT)] if torch_found else [str(tmp_path), str(run_info.ROOT)]
    done = subprocess.run([sys.executable, str(run_info.ROOT / "benchmarks" / f"{script}.py"),
                           *[a.format(tmp=tmp_path) for a in argv]], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)), check=False)
    assert (done.returncode, done.stdout) == (2, "") and not (tmp_path / "r.json").exists(), done.stdout
    assert done.stderr == f"{script}: {run_info.no_cuda_gpu(torch_found, alternative)}\n", done.stderr
