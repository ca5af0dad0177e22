"""Replace a set of files all or nothing, under a lock, so that a crash leaves no half-written file.

`replace_all(changes)` runs in two steps:

1. Prepare. Beside each file (same directory, so that a rename is atomic), keep the current file
   as a hard link `.NAME.dsaops-old` and write the new bytes to `.NAME.dsaops-new`, with the old
   file's mode (and owner, as root), then fsync the file and its directory. If any of this fails
   (EROFS, EACCES/EPERM, ENOSPC, a file that is a mount point), the temporary files are removed
   and no visible file has changed.
2. Commit. Rename each new file over its target, or unlink a target that is to go, in the order
   given, fsyncing the directory after each step, so on disk the steps happen in that order too.
   Just before its own step, a target given the bytes it was read as (`Change.read`) must still
   be the file kept as its link and hold exactly those bytes; otherwise another program wrote it
   meanwhile, and the step fails rather than lose that edit. If a step fails, the steps already
   done are undone from the kept links. Then the links are removed.

Every directory the commit step touches gets a new entry in the prepare step, and every file it
replaces is linked there, so a read-only or immutable directory or file, a mount point and a full
disk all fail in the prepare step, where failing costs nothing.

What the check cannot see: a write landing between a target's check and its rename (one system
call), or in a target already renamed before a later step fails and the undo puts the old file
back. Another program that edits the tree while this runs can still lose that write; the lock
keeps out only other holders of `locked`.

A crash in step 2 leaves every file either old or new, never half written, and may leave
temporary files behind: the caller must recognise such a tree by its content (apply.py's
`interrupted` state) and call `remove_leftovers` before the next `replace_all`.

`locked(directory)` takes an exclusive flock on the directory itself (no lock file is created,
so it works on a read-only tree too); a second holder is refused at once.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

NEW, OLD = ".dsaops-new", ".dsaops-old"

_DENIED = "run as the tree's owner, and check `lsattr` for an immutable (i) flag"
_MOUNTED = "it is a mount point; patch the tree where its files are not mounted one by one"
_FULL = "free some space on it"
_IN_THE_WAY = "a folder stands where the file goes; move it aside"
_HINTS = {errno.EROFS: "remount it read-write", errno.ENOSPC: _FULL,
          errno.EDQUOT: _FULL, errno.EPERM: _DENIED, errno.EACCES: _DENIED, errno.EXDEV: _MOUNTED,
          errno.EBUSY: _MOUNTED}


class WriteError(Exception):
    """A file could not be written or renamed; the message says which, why, and whether anything changed."""


@dataclass(frozen=True)
class Change:
    path: Path
    data: bytes | None  # None: remove the file
    read: bytes | None = None  # what `data` was computed from: the file must still hold it (None: not checked)


def side(path: Path, suffix: str) -> Path:
    """The temporary name beside `path` (a dot file in the same directory)."""
    return path.with_name(f".{path.name}{suffix}")


def describe(e: OSError, path: Path, verb: str = "write") -> str:
    """One line: the file, the system's reason, and what to do about it."""
    name = errno.errorcode.get(e.errno, str(e.errno))
    target = Path(e.filename or path)
    # a folder in a file's place fails as EPERM or EISDIR, which reads as a permissions problem
    hint = _IN_THE_WAY if target.is_dir() and not target.is_symlink() else _HINTS.get(e.errno)
    return f"cannot {verb} {e.filename or path}: {e.strerror} ({name})" + (f"; {hint}" if hint else "")


@contextlib.contextmanager
def locked(directory: Path, holder: str):
    """Hold an exclusive lock on `directory` for the block; WriteError at once if someone else holds it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WriteError(f"another {holder} is running on {directory} (it holds the lock); wait for it to "
                             "finish, then run this again; nothing was changed") from None
        yield
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new(path: Path, data: bytes) -> None:
    """`data` into a fresh file (O_EXCL: never through a link) with the mode and owner of `path` if it exists."""
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    fd = os.open(side(path, NEW), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        if st is not None:
            os.fchmod(fd, st.st_mode & 0o7777)
            if os.geteuid() == 0:
                os.fchown(fd, st.st_uid, st.st_gid)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporaries(paths) -> list[Path]:
    return [t for path in paths for t in (side(path, NEW), side(path, OLD)) if os.path.lexists(t)]


def remove_leftovers(paths: list[Path]) -> None:
    """Remove the temporary files a crashed run left beside `paths` (only those: unlinking a missing
    name on a read-only file system fails with EROFS)."""
    for temporary in _temporaries(paths):
        try:
            temporary.unlink()
        except OSError as e:
            raise WriteError(describe(e, temporary, "remove") + ", left by an interrupted run") from None


def _prepare(changes: list[Change]) -> list[Path]:
    """Links and new files for every change; returns the targets that existed. Undoes itself on failure."""
    made: list[Path] = []
    existed: list[Path] = []
    try:
        for c in changes:
            if os.path.lexists(c.path):
                os.link(c.path, side(c.path, OLD), follow_symlinks=False)
                made.append(side(c.path, OLD))
                existed.append(c.path)
            if c.data is not None:
                made.append(side(c.path, NEW))  # before writing: a half-written file is removed too
                _write_new(c.path, c.data)
        for directory in dict.fromkeys(c.path.parent for c in changes):
            _fsync_dir(directory)
    except OSError as e:
        for path in made:
            with contextlib.suppress(OSError):
                path.unlink()
        raise WriteError(describe(e, made[-1] if made else changes[0].path) + "; nothing was changed") from None
    return existed


def _undo(done: list[Change], existed: list[Path]) -> list[str]:
    """Put back what the commit step changed, newest first; returns the paths that could not be."""
    stuck = []
    for c in reversed(done):
        try:
            if c.path in existed:
                os.replace(side(c.path, OLD), c.path)
            else:
                c.path.unlink()
            _fsync_dir(c.path.parent)
        except OSError:
            stuck.append(str(c.path))
    return stuck


def _remove_temporaries(changes: list[Change]) -> None:
    for temporary in _temporaries(c.path for c in changes):
        with contextlib.suppress(OSError):  # a leftover is harmless: the next run removes it
            temporary.unlink()


def _as_read(c: Change) -> bool:
    """Whether `c.path` is still the file kept as its link and holds exactly `c.read`."""
    try:
        fd = os.open(c.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP):  # removed, or a symlink put in its place
            return False
        raise
    with open(fd, "rb") as f:
        return os.path.samestat(os.fstat(fd), os.lstat(side(c.path, OLD))) and f.read() == c.read


def replace_all(changes: list[Change]) -> None:
    """Make every change or none (see the module's docstring); WriteError says which file failed and why."""
    existed = _prepare(changes)
    done: list[Change] = []
    for c in changes:
        try:
            if c.read is not None and not _as_read(c):
                said = f"{c.path} was written by another program after this run read it"
                then = "nothing was changed; run this again once nothing else edits the tree"
            else:
                if c.data is None:
                    c.path.unlink()
                else:
                    os.replace(side(c.path, NEW), c.path)
                done.append(c)
                _fsync_dir(c.path.parent)
                continue
        except OSError as e:
            said, then = describe(e, c.path), "nothing was changed"
        stuck = _undo(done, existed)
        if stuck:  # the kept links stay: they are the only copies of the old files
            raise WriteError(f"{said}; putting back {', '.join(stuck)} failed too: the tree is half changed "
                             f"(the old files are beside them as .NAME{OLD}), see `dsaops patches status`") from None
        _remove_temporaries(changes)
        raise WriteError(f"{said}; {then}") from None
    _remove_temporaries(changes)
