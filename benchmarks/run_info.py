"""What every benchmark JSON says about its run: the date, the commit, the machine and the command.

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
from pathlib import Path

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


def gpu_machine() -> str:
    """The CUDA machine in a line: the GPU, torch, Python (imports torch: call it where a GPU runs)."""
    import torch

    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Python {platform.python_version()}"


def run_info(command: str, machine: str | None = None) -> dict:
    """date, commit, machine and command of a run that starts now (machine: this CPU unless given)."""
    return {"date": datetime.date.today().isoformat(), "commit": commit(),
            "machine": machine if machine is not None else cpu_machine(), "command": command}
