"""`dsaops patches` against the real pinned sglang==0.5.23 wheel: apply, idempotence, revert, refusals."""
import json
import shutil

import pytest
from dsaops.sglang_patches import apply as tree
from dsaops.sglang_patches.series import load

from dsaops import cli, pins
from tests.sglang_patches.conftest import tree_hash
from tests.support.sglang_wheel import pristine_copy

OVERRIDES = "sglang/srt/arg_groups/overrides.py"


def patches(*argv, root=None):
    args = ["patches", *argv] + (["--sglang-root", str(root)] if root is not None else [])
    return cli.main(args)


def refused_unchanged(root, capsys, *says):
    """check, apply and status each refuse (exit 2) saying all of `says`; the tree is untouched."""
    before = tree_hash(root)
    for action in ("check", "apply", "status"):
        assert patches(action, root=root) == 2
        err = capsys.readouterr().err
        assert all(s in err for s in says), err
    assert tree_hash(root) == before


@pytest.fixture
def root(sparse_root):
    return sparse_root


def test_apply_is_clean_idempotent_and_reverts_byte_for_byte(tmp_path, series, capsys):
    """On a full copy of the wheel: only the series' targets and the marker change, and revert restores all."""
    root = pristine_copy(tmp_path)
    before = tree_hash(root)
    assert patches("status", root=root) == 0
    assert capsys.readouterr().out.startswith("pristine")
    assert patches("check", root=root) == 0
    capsys.readouterr()

    assert patches("apply", root=root) == 0
    assert f"applied {len(series.patches)} patches" in capsys.readouterr().out
    applied = tree_hash(root)
    changed = {p for p in applied if before.get(p) != applied[p]}
    assert changed == set(series.targets) | {tree.MARKER}
    marker = json.loads((root / tree.MARKER).read_text())
    assert marker["series_sha256"] == series.sha256
    assert {rel: h["pristine_sha256"] for rel, h in marker["files"].items()} == {t: before[t] for t in series.targets}

    assert patches("status", root=root) == 0
    assert capsys.readouterr().out == f"applied: series sha256 {series.sha256}\n"
    assert patches("apply", root=root) == 0
    assert "already applied" in capsys.readouterr().out
    assert tree_hash(root) == applied
    assert patches("check", root=root) == 0

    assert patches("revert", root=root) == 0
    assert tree_hash(root) == before
    assert patches("revert", root=root) == 0
    assert "nothing to revert" in capsys.readouterr().out
    assert tree_hash(root) == before


@pytest.mark.parametrize("where", ["metadata", "version_py"])
def test_wrong_version_exits_2_and_changes_nothing(root, where, capsys):
    if where == "metadata":
        meta = next(root.glob("sglang-*.dist-info/METADATA"))
        meta.write_text(meta.read_text().replace(f"Version: {pins.SGLANG}", "Version: 0.5.24", 1))
    else:
        version_py = root / "sglang/_version.py"
        version_py.write_text(version_py.read_text().replace(f"'{pins.SGLANG}'", "'0.5.24'"))
    refused_unchanged(root, capsys, f"sglang=={pins.SGLANG}", "0.5.24")


def test_a_version_py_not_in_utf8_is_read_not_a_traceback(root, capsys):
    """A stray non-UTF-8 byte in sglang/_version.py: a wrong version is named, a right one still passes."""
    version_py = root / "sglang/_version.py"
    text = version_py.read_text()
    version_py.write_bytes(text.replace(f"'{pins.SGLANG}'", "'0.5.\xff'").encode("latin-1"))
    refused_unchanged(root, capsys, f"sglang=={pins.SGLANG}", "sglang/_version.py says 0.5.")
    version_py.write_bytes(b"# \xff\n" + text.encode())
    assert patches("check", root=root) == 0


def test_altered_target_file_names_patch_file_and_hunk(root, capsys):
    target = root / OVERRIDES
    target.write_text(target.read_text().replace(
        'raise ValueError("CUDA TileLang FP8 KV requires SM89 or newer.")',
        'raise ValueError("CUDA TileLang FP8 KV needs SM89 or newer.")'))
    before = tree_hash(root)
    assert patches("apply", root=root) == 2
    err = capsys.readouterr().err
    assert f"0002-warn-cuda-tilelang-raw-fp8-kv.patch: {OVERRIDES}: hunk #1 (@@ -581,6 +581,14 @@)" in err
    assert "no fuzz, no offset" in err
    assert patches("check", root=root) == 2
    assert patches("status", root=root) == 1
    assert capsys.readouterr().out.startswith("foreign: no marker")
    assert tree_hash(root) == before


def test_a_shifted_file_is_refused_not_offset(root, capsys):
    """GNU patch would apply at an offset; the exact applier must not."""
    target = root / OVERRIDES
    target.write_text("# one extra line\n" + target.read_text())
    before = tree_hash(root)
    assert patches("apply", root=root) == 2
    assert f"{OVERRIDES}: hunk #1" in capsys.readouterr().err
    assert tree_hash(root) == before


def test_a_broken_patch_names_its_file_and_hunk(root, tmp_path, capsys):
    """A patch whose context is not SGLang's fails in the later of two patches: nothing is written."""
    series_dir = tmp_path / "series"
    shutil.copytree(load().path.parent, series_dir, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    broken = series_dir / "0004-q8-prefill-over-raw-fp8-nope-pool.patch"
    text = broken.read_text()
    context = "     decode_impl: str,\n     kv_cache_dtype: torch.dtype,\n"
    assert text.count(context) == 1
    broken.write_text(text.replace(context, "     decode_impl: str,\n     kv_cache_dtype: torch.Tensor,\n"))
    before = tree_hash(root)
    assert patches("apply", "--series", str(series_dir / "series"), root=root) == 2
    err = capsys.readouterr().err
    assert "0004-q8-prefill-over-raw-fp8-nope-pool.patch: sglang/srt/layers/attention/dsa_backend.py: hunk #2" in err
    assert tree_hash(root) == before


def test_status_reports_foreign_changes_and_refuses_to_revert_them(root, series, capsys):
    assert patches("apply", root=root) == 0
    target = root / OVERRIDES
    target.write_text(target.read_text() + "# local edit\n")
    assert patches("status", root=root) == 1
    assert capsys.readouterr().out.endswith(f"foreign: files changed since the series was applied: {OVERRIDES}\n")
    before = tree_hash(root)
    assert patches("revert", root=root) == 2
    assert patches("apply", root=root) == 2
    assert tree_hash(root) == before


def test_a_marker_from_another_series_is_foreign(root, series, capsys):
    assert patches("apply", root=root) == 0
    marker = root / tree.MARKER
    marker.write_text(marker.read_text().replace(series.sha256, "0" * 64))
    assert patches("status", root=root) == 1
    assert "from another series" in capsys.readouterr().out
    before = tree_hash(root)
    assert patches("revert", root=root) == 2
    assert tree_hash(root) == before


def test_list_names_every_patch(capsys):
    assert patches("list") == 0
    out = capsys.readouterr().out
    for name in load().path.read_text().split():
        assert name in out


def test_no_sglang_importable_is_a_user_error(monkeypatch, capsys):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert patches("status") == 2
    assert "sglang is not importable here; pass --sglang-root" in capsys.readouterr().err


def test_a_root_without_sglang_is_refused(tmp_path, capsys):
    assert patches("apply", root=tmp_path) == 2
    assert "holds no sglang/ package" in capsys.readouterr().err


def test_each_target_reads_as_shipped_or_patched(pristine_root, patched_root, series):
    """Without a marker (a crash between the renames) each file is told by content: the series must apply
    forwards only to the shipped file and backwards only to the patched one, for every target."""
    assert not any(f.is_patched for f in tree.files(pristine_root, series))
    assert all(f.is_patched for f in tree.files(patched_root, series))


def test_a_target_that_is_not_utf8_is_refused(root, capsys):
    target = root / OVERRIDES
    target.write_bytes(b"\xff" + target.read_bytes())
    before = tree_hash(root)
    for action in ("apply", "check"):
        assert patches(action, root=root) == 2
        assert f"{OVERRIDES}: not UTF-8 text" in capsys.readouterr().err
    assert tree_hash(root) == before


def test_a_folder_where_the_marker_goes_is_named_as_such(root, capsys):
    (root / tree.MARKER).mkdir()
    before = tree_hash(root)
    assert patches("apply", root=root) == 2
    err = capsys.readouterr().err
    assert "a folder stands where the file goes; move it aside" in err and "lsattr" not in err, err
    assert len(err.splitlines()) == 1 and tree_hash(root) == before


@pytest.mark.parametrize("text", ["[]", "{}", '{"files": []}', "not json"])
def test_a_marker_that_is_not_one_reads_as_foreign(root, text, capsys):
    (root / tree.MARKER).write_text(text)
    before = tree_hash(root)
    assert patches("status", root=root) == 1
    assert "dsaops did not write it" in capsys.readouterr().out
    for action in ("apply", "revert"):
        assert patches(action, root=root) == 2
        assert "refusing to" in capsys.readouterr().err
    assert tree_hash(root) == before


@pytest.mark.parametrize("damage", ["nested", "nul in a file name", "a file the series does not touch"])
def test_a_damaged_marker_is_foreign_and_says_what_to_do(root, series, damage, capsys):
    assert patches("apply", root=root) == 0
    capsys.readouterr()
    marker = root / tree.MARKER
    recorded = json.loads(marker.read_text())
    if damage == "nested":
        marker.write_text("[" * 100_000)
    else:
        name = "sglang/a\0b.py" if damage.startswith("nul") else "sglang/__init__.py"
        recorded["files"][name] = recorded["files"].pop(OVERRIDES)
        marker.write_text(json.dumps(recorded))
    before = tree_hash(root)
    assert patches("status", root=root) == 1
    out, err = capsys.readouterr()
    assert out.startswith("foreign: marker ") and "delete it" in out and len(out.splitlines()) == 1, out + err
    for action in ("revert", "apply"):
        assert patches(action, root=root) == 2
        err = capsys.readouterr().err
        assert "refusing to" in err and "delete it" in err and len(err.splitlines()) == 1, err
    assert tree_hash(root) == before
    marker.unlink()   # what the message says: the files are then told by their content
    assert patches("revert", root=root) == 0
