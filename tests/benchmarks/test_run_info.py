"""benchmarks/run_info.py names a run's date, commit, machine and command, and a host without git or
outside a checkout still gets a result that says so."""
import datetime
import re
import subprocess

from benchmarks import run_info


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
