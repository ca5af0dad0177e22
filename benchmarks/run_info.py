"""What every benchmark JSON says about its run: the date, the commit, the machine and the command;
and the one line a GPU benchmark stops with where there is no CUDA GPU (cuda_torch).

    from benchmarks.run_info import run_info   # scripts run with the repository on sys.path (PYTHONPATH=.)
    result = {**run_info("make bench-exporter"), ...}

benchmarks/report.py refuses a JSON without these fields: a number without its commit and machine
is not a result.
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

from dsaops.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
# Files a benchmark run rewrites itself; a change to them does not make the measured code dirty.
OUTPUTS = (":(exclude)benchmarks/*.json", ":(exclude)benchmarks/*.png", ":(exclude)BENCHMARKS.md")


def commit() -> str:
    """The checkout's short commit, with "+changes" when tracked files differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)

    try:
        head = git("rev-parse", "--short", "HEAD")
    except OSError:                                   # a GPU host may have no git: the run goes on
        return "unknown (no git here)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    dirty = git("diff", "--quiet", "HEAD", "--", ".", *OUTPUTS).returncode != 0
    return head.stdout.strip() + ("+changes" if dirty else "")


def cpu_machine() -> str:
    """The CPU machine in a line: architecture, cores, Python, load average when the run started."""
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.1f} at the start")


def no_cuda_gpu(torch_found: bool, alternative: str = "") -> str:
    """What a GPU benchmark says where this Python has no torch or sees no GPU (make's gpu-check says the
    same); `alternative`: what the script can do without one, e.g. "pass --dry-run"."""
    return (f"needs a CUDA GPU, and {sys.executable} {'sees no GPU' if torch_found else 'finds no torch'}: "
            f"run it on an H100/H200 host (CONTRIBUTING.md){f', or {alternative}' if alternative else ''}")


def cuda_torch(alternative: str = ""):
    """torch, where it sees a CUDA GPU; else a UserError saying no_cuda_gpu's line."""
    try:
        import torch
    except ImportError:
        raise UserError(no_cuda_gpu(False, alternative)) from None
    if not torch.cuda.is_available():
        raise UserError(no_cuda_gpu(True, alternative))
    return torch


def gpu_machine() -> str:
    """The CUDA machine in a line: the GPU, torch, Python (imports torch: call it where a GPU runs)."""
    import torch

    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Python {platform.python_version()}"


def run_info(command: str, machine: str | None = None) -> dict:
    """date, commit, machine and command of a run that starts now (machine: this CPU unless given)."""
    return {"date": datetime.date.today().isoformat(), "commit": commit(),
            "machine": machine if machine is not None else cpu_machine(), "command": command}
