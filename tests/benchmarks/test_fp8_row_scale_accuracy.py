"""benchmarks/fp8_row_scale_accuracy.py refuses what would spoil a run before its first draw, in one line
(the accuracy it measures: tests/kernels/test_row_scale_reference.py)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
_path = ROOT / "benchmarks" / "fp8_row_scale_accuracy.py"
_spec = importlib.util.spec_from_file_location("fp8_row_scale_accuracy", _path)
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


@pytest.fixture
def draws(monkeypatch):
    """The draws a run makes, each stubbed (the decode takes seconds)."""
    made = []
    monkeypatch.setattr(study, "errors", lambda *case: made.append(case) or (0.02, 0.01))
    return made


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "--seeds 0: give a whole number from 1"),
    (["--seeds", "-2"], "--seeds -2: give a whole number from 1"),
    (["--out", "{tmp}"], "--out {tmp}: cannot write there"),                     # a folder
    (["--out", "{tmp}/no/such/r.json"], "--out {tmp}/no/such/r.json: cannot write there"),
])
def test_bad_input_is_one_line_and_exit_2_before_the_run(tmp_path, capsys, draws, argv, message):
    out = tmp_path / "r.json"
    assert study.main(["--out", str(out), *[a.format(tmp=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fp8_row_scale_accuracy: {message.format(tmp=tmp_path)}"), err
    assert draws == [] and not out.exists()


def test_without_torch_it_says_so_in_one_line(tmp_path):
    (tmp_path / "torch.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    done = subprocess.run([sys.executable, str(_path), "--out", str(tmp_path / "r.json")], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"), timeout=60,
                          check=False)
    assert done.returncode == 2 and done.stderr == (
        "fp8_row_scale_accuracy: torch is not importable: run this with a Python that has torch "
        "(CONTRIBUTING.md)\n"), done.stderr
    assert not (tmp_path / "r.json").exists()


def test_results_that_cannot_be_written_keep_the_old_ones(tmp_path):
    """A file-size limit below the JSON's size stands in for a full disk (Python ignores SIGXFSZ: the write
    raises EFBIG); the draws are stubbed."""
    out = tmp_path / "r.json"
    out.write_text('{"old": true}\n')
    script = (f"import importlib.util as u, resource, sys; sys.path.insert(0, {str(ROOT)!r}); "
              f"spec = u.spec_from_file_location('study', {str(_path)!r}); s = u.module_from_spec(spec); "
              "spec.loader.exec_module(s); s.errors = lambda *case: (0.02, 0.01); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY)); "
              f"sys.exit(s.main(['--seeds', '1', '--out', {str(out)!r}]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr == (
        f"fp8_row_scale_accuracy: --out {out}: cannot write {tmp_path}/.r.json.dsaops-new: File too large (EFBIG); "
        "nothing was changed\n"), done.stderr
    assert out.read_text() == '{"old": true}\n' and [p.name for p in tmp_path.iterdir()] == ["r.json"]
