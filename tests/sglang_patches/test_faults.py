"""`dsaops patches apply|revert` when the file system does not cooperate, on the real pinned wheel.

Every failure exits 2 with one line naming the file and the reason, and leaves every file of the
tree byte-identical (the sha256 of each file, dot files included, before and after). The faults are
real: as root, `chattr +i` on a file or a folder (EPERM), a read-only bind mount of the tree (EROFS)
or of one file (a mount point: EXDEV), a small tmpfs (ENOSPC); without root, a symlink that leaves
the tree, another apply holding the lock, and a process killed between two renames. Only the
commit step's own failure is injected (into os.replace), since every real fault is meant to hit the
prepare step first, and so is another program's write to a target at the first rename (a real write,
at the one moment that tests the check). Every mount and attribute is undone in a `finally`, whatever the test did.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys

import pytest
from dsaops.sglang_patches import apply as tree
from dsaops.sglang_patches import atomic_files

from dsaops import cli
from tests.sglang_patches.conftest import tree_hash
from tests.support.prerequisites import need
from tests.support.sglang_wheel import pristine_copy, sparse_copy

LAST = "sglang/srt/observability/metrics_collector.py"   # the series' last target: the others come first
MANAGERS = "sglang/srt/managers"                          # holds scheduler.py, a later target


def patches(action, root):
    return cli.main(["patches", action, "--sglang-root", str(root)])


def refused(action, root, capsys, reason):
    """Exit 2, one line on stderr that names the reason; returns the line."""
    assert patches(action, root) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and reason in captured.err, captured.err
    assert "Traceback" not in captured.err + captured.out
    return captured.err


def sh(*argv):
    subprocess.run([str(a) for a in argv], check=True, capture_output=True)


@pytest.fixture(scope="module")
def wheel_tree(tmp_path_factory):
    """A full copy of the unpacked wheel and the hash of every file in it, shared by this module's tests."""
    root = pristine_copy(tmp_path_factory.mktemp("wheel"))
    return root, tree_hash(root)


@pytest.fixture
def root(wheel_tree):
    """The shared copy, pristine when each test starts (copied afresh if a failing test left it changed)."""
    root, pristine = wheel_tree
    yield root
    if tree_hash(root) != pristine:
        shutil.rmtree(root)
        root.mkdir()
        pristine_copy(root)


@pytest.fixture
def started(root, action, capsys):
    """The tree the action starts from (applied first for revert) and its hash."""
    if action == "revert":
        assert patches("apply", root) == 0
        capsys.readouterr()
    return root, tree_hash(root)


@pytest.fixture(scope="module")
def as_root(tmp_path_factory):
    need(os.geteuid() == 0, "root: chattr +i and mount inject the write failures")
    probe = tmp_path_factory.mktemp("probe")
    try:
        sh("chattr", "+i", probe)
        sh("chattr", "-i", probe)
        sh("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe)
        sh("umount", probe)
    except (OSError, subprocess.CalledProcessError) as e:
        need(False, f"chattr +i and mount (CAP_LINUX_IMMUTABLE, CAP_SYS_ADMIN): {e}")


@contextlib.contextmanager
def immutable(path):
    sh("chattr", "+i", path)
    try:
        yield
    finally:
        sh("chattr", "-i", path)


@contextlib.contextmanager
def read_only(path):
    sh("mount", "--bind", path, path)
    try:
        sh("mount", "-o", "remount,ro,bind", path, path)
        yield
    finally:
        sh("umount", path)


FAULTS = {
    # what is made unwritable, and the errno the one line must name
    "immutable file": (lambda root: immutable(root / LAST), "EPERM"),
    "immutable folder": (lambda root: immutable(root / MANAGERS), "EPERM"),
    "immutable marker folder": (lambda root: immutable(root / "sglang"), "EPERM"),
    "read-only mount": (lambda root: read_only(root), "EROFS"),
    "file mounted on itself": (lambda root: read_only(root / LAST), "EXDEV"),
}


@pytest.mark.parametrize("action", ["apply", "revert"])
@pytest.mark.parametrize("fault", FAULTS)
def test_a_write_failure_changes_no_file(as_root, started, action, fault, capsys):
    root, before = started
    make, reason = FAULTS[fault]
    with make(root):
        err = refused(action, root, capsys, reason)
    assert "nothing was changed" in err
    assert tree_hash(root) == before
    # and the tool still works on the tree once the fault is gone
    assert patches(action, root) == 0
    if action == "apply":
        assert patches("revert", root) == 0


@pytest.mark.parametrize("action", ["apply", "revert"])
def test_a_full_disk_changes_no_file(as_root, tmp_path, series, action, capsys):
    """A tmpfs holding the tree, filled to 256 KiB free: memory_pool.py (253 KiB, the second target) cannot be
    written whole."""
    disk = tmp_path / "disk"
    disk.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", disk)
    try:
        root = sparse_copy(disk / "tree", series)
        if action == "revert":
            assert patches("apply", root) == 0
        with open(disk / "filler", "wb") as filler:
            st = os.statvfs(disk)
            filler.write(b"\0" * (st.f_bavail * st.f_frsize - (256 << 10)))
        before = tree_hash(root)
        err = refused(action, root, capsys, "ENOSPC")
        assert ".memory_pool.py.dsaops-new" in err   # it failed half way through writing a new file
        assert tree_hash(root) == before
        (disk / "filler").unlink()
        assert patches(action, root) == 0
    finally:
        sh("umount", disk)


@pytest.mark.parametrize("action", ["apply", "revert"])
def test_a_failed_rename_is_undone(started, action, monkeypatch, capsys):
    """The commit step's own failure (injected: real faults stop the prepare step): apply fails on the
    marker, after every file was renamed; revert on the last file, after the marker went."""
    root, before = started
    fail_at = tree.MARKER if action == "apply" else LAST
    real = os.replace

    def replace(src, dst):
        if str(dst).endswith(fail_at) and not str(src).endswith(atomic_files.OLD):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        real(src, dst)

    monkeypatch.setattr(atomic_files.os, "replace", replace)
    err = refused(action, root, capsys, "(EIO); nothing was changed")
    assert fail_at in err
    assert tree_hash(root) == before


@pytest.mark.parametrize("edit", ["appended", "replaced"])
@pytest.mark.parametrize("action", ["apply", "revert"])
def test_a_file_edited_meanwhile_is_kept_and_nothing_changes(started, action, edit, monkeypatch, capsys):
    """Another program writes the last target after it was read, as the first rename happens: a byte appended
    in place, or the same bytes renamed over it (another file). The edit stays, no other file changes."""
    root, before = started
    target = root / LAST
    read = target.read_bytes()
    edited = read + b"#" if edit == "appended" else read
    real, renames = os.replace, []

    def replace(src, dst):
        if not renames:
            if edit == "appended":  # in place: the same file
                with open(target, "ab") as f:
                    f.write(b"#")
            else:  # another file with the same bytes, renamed over it
                shutil.copy2(target, f"{target}.tmp")
                real(f"{target}.tmp", target)
        renames.append(dst)
        real(src, dst)

    monkeypatch.setattr(atomic_files.os, "replace", replace)
    err = refused(action, root, capsys, "run this again once nothing else edits the tree")
    assert str(target) in err and "nothing was changed" in err
    assert target.read_bytes() == edited
    target.write_bytes(read)
    assert tree_hash(root) == before
    monkeypatch.undo()
    assert patches(action, root) == 0
    if action == "apply":
        assert patches("revert", root) == 0


def test_an_undo_that_fails_too_is_said_and_recoverable(root, series, monkeypatch, capsys):
    """If putting a file back fails as well, the line says so, the old file is kept beside it, and the tree
    reads as interrupted: apply finishes it."""
    real = os.replace

    def replace(src, dst):
        if str(dst).endswith(tree.MARKER) or (str(src).endswith(atomic_files.OLD) and str(dst).endswith(LAST)):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        real(src, dst)

    monkeypatch.setattr(atomic_files.os, "replace", replace)
    err = refused("apply", root, capsys, "failed too")
    assert LAST in err.split("putting back", 1)[1]
    assert (root / LAST).with_name(f".metrics_collector.py{atomic_files.OLD}").exists()
    monkeypatch.undo()
    assert patches("status", root) == 1
    assert capsys.readouterr().out.startswith(f"interrupted: no marker, but 1 of {len(series.targets)} files")
    assert patches("apply", root) == 0
    assert patches("revert", root) == 0
    assert not list(root.rglob(f"*{atomic_files.OLD}"))


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_symlink_leaving_the_tree_is_refused(root, tmp_path, where, capsys):
    """The outside copy is pristine, so the series would apply to it: only the symlink check stops the write."""
    inside = root / (LAST if where == "file" else os.path.dirname(LAST))
    outside = tmp_path / "outside"
    (shutil.copy2 if where == "file" else shutil.copytree)(inside, outside)
    moved = tmp_path / "moved"
    inside.rename(moved)
    inside.symlink_to(outside)
    try:
        before, outside_before = tree_hash(root), tree_hash(tmp_path)
        for action in ("apply", "status", "check"):
            refused(action, root, capsys, "a symlink that leaves the tree")
        assert tree_hash(root) == before and tree_hash(tmp_path) == outside_before
    finally:
        inside.unlink()
        moved.rename(inside)


def test_a_symlink_inside_the_tree_is_followed(root, capsys):
    """The file it points to is patched and restored; the link stays a link."""
    before = tree_hash(root)
    link = root / LAST
    real = link.with_name("metrics_collector_real.py")
    link.rename(real)
    link.symlink_to(real.name)
    try:
        assert patches("apply", root) == 0
        assert link.is_symlink() and tree_hash(root)[LAST] != before[LAST]
        assert patches("revert", root) == 0
        assert link.is_symlink()
    finally:
        link.unlink()
        real.rename(link)
    assert tree_hash(root) == before


@pytest.mark.parametrize("where", [LAST, tree.MARKER])
def test_a_symlink_loop_is_refused_in_one_line(sparse_root, where, capsys):
    """A link to itself: resolving it fails (RuntimeError before Python 3.13, OSError after)."""
    loop = sparse_root / where
    with contextlib.suppress(FileNotFoundError):
        loop.unlink()
    loop.symlink_to(loop.name)
    for action in ("status", "check", "apply", "revert"):
        refused(action, sparse_root, capsys, f"{where}: cannot resolve")
    assert loop.is_symlink() and not list(sparse_root.rglob(f".*{atomic_files.NEW}"))


HOLDING = """
import sys
from dsaops.cli import main
from dsaops.sglang_patches import atomic_files
replace_all = atomic_files.replace_all
def paused(changes):
    print("holding the lock", flush=True)
    sys.stdin.readline()
    replace_all(changes)
atomic_files.replace_all = paused
sys.exit(main(["patches", "apply", "--sglang-root", sys.argv[1]]))
"""


def test_a_second_apply_is_refused_while_one_runs(root, capsys):
    """A real apply, paused just before it writes (its lock held), and a second apply and a revert beside it."""
    before = tree_hash(root)
    first = subprocess.Popen([sys.executable, "-c", HOLDING, str(root)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "holding the lock\n"
        for action in ("apply", "revert"):
            refused(action, root, capsys, "another `dsaops patches apply` or `revert` is running")
        assert tree_hash(root) == before
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.wait(timeout=60) == 0
    finally:
        first.kill()
        first.wait()
    assert patches("status", root) == 0
    assert capsys.readouterr().out.startswith("applied")
    assert patches("revert", root) == 0


CRASHING = """
import os, signal, sys
from dsaops.cli import main
root, action, renames = sys.argv[1], sys.argv[2], int(sys.argv[3])
replace, done = os.replace, []
def crash_after(src, dst):
    if len(done) == renames:
        os.kill(os.getpid(), signal.SIGKILL)
    replace(src, dst)
    done.append(dst)
os.replace = crash_after
main(["patches", action, "--sglang-root", root])
"""


@pytest.mark.parametrize("crashed, renames, then", [
    ("apply", 1, "apply"), ("apply", 5, "revert"),
    ("apply", 13, "apply"), ("apply", 13, "revert"),    # every file renamed, the marker not
    ("revert", 0, "revert"), ("revert", 4, "apply"),    # the marker gone, files not (all) put back
])
def test_a_crash_between_renames_is_recognised_and_recovered(sparse_root, patched_root, series, crashed, renames,
                                                             then, capsys):
    """SIGKILL between two renames: no half-written file, `status` says interrupted (exit 1), and either
    action brings the tree to exactly what it would be without the crash, temporary files gone."""
    assert len(series.targets) == 13
    pristine = tree_hash(sparse_root)
    if crashed == "revert":
        assert patches("apply", sparse_root) == 0
    child = subprocess.run([sys.executable, "-c", CRASHING, str(sparse_root), crashed, str(renames)], check=False)
    assert child.returncode == -9
    carried = renames if crashed == "apply" else len(series.targets) - renames
    capsys.readouterr()
    assert patches("status", sparse_root) == 1
    assert capsys.readouterr().out.startswith(f"interrupted: no marker, but {carried} of 13 files carry the series")
    assert patches(then, sparse_root) == 0
    assert tree_hash(sparse_root) == (tree_hash(patched_root) if then == "apply" else pristine)
