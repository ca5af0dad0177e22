#!/usr/bin/python
"""Ansible module: a sha256 manifest of a checkpoint folder, written on the source node, checked on each copy.

The Hugging Face index lists shards but carries no hashes, so the source node hashes every file
once; a file whose size and modification time match the manifest's entry keeps its hash. A copy
is checked by hashing its files against the source's manifest (a bit flip keeps size and time, and
rsync's quick check misses it); a file that matched is recorded with its inode and change time, which
any write or rename moves (utime cannot set it back), and is not hashed again while they stand and
the manifest keeps its hash. Before the copy, the receiving node's free space is weighed against what
it still lacks. A node removes the files its last staging recorded that the new one no longer lists (a revision or
a source that dropped them), and only those: a stale model.safetensors.index.json would send SGLang's loader to
shards the checkpoint no longer has.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: dsaops_weights_manifest
short_description: Write a checkpoint folder's sha256 manifest, or check a copy against it
description:
  - C(write) hashes the files under I(path) (skipping hidden folders such as .cache) into I(manifest), reusing the
    hash of every file whose size and mtime are unchanged.
  - C(check) hashes the files the I(expected) manifest lists under I(path) and returns those missing or different;
    with I(record), a file unchanged since it last matched (size, mtime, change time, inode, device and the
    manifest's hash all as recorded) is not hashed again, and the files that match are recorded there.
  - C(room) returns the bytes of the files the I(expected) manifest lists that I(path) lacks (missing, of another
    size, or with another sha256 than the node's I(manifest) records) and the free bytes of I(path)'s filesystem
    (of its nearest existing folder when it is missing).
  - C(read) returns whether I(manifest) is a manifest (staged; unreadable or missing is none) and its revision.
  - C(prune) removes from I(path) the files I(manifest) lists that I(expected) does not, and folders they leave
    empty, after taking them out of I(manifest); in check mode it only names them.
options:
  path: {type: path, required: true, description: The checkpoint folder.}
  manifest: {type: path, description: The node's manifest (JSON), which C(write) writes and the others read.}
  expected: {type: json, description: The source's manifest C(check), C(room) and C(prune) compare against.}
  mode: {type: str, choices: [write, check, room, read, prune], default: check, description: What to do.}
  record: {type: path, description: The node's record of the files C(check) found matching.}
  revision: {type: str, description: The Hub revision C(write) records the files as (the one they were downloaded at).}
  every: {type: bool, default: false, description: C(check) hashes every file, whatever I(record) holds.}
  jobs: {type: int, default: 8, description: Files hashed at once.}
"""

CHUNK = 8 << 20


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)   # releases the GIL: threads hash files in parallel
    return digest.hexdigest()


def _write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = path + ".partial"
    with open(partial, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(partial, path)   # a reader finds the old file or the new, never half of one


def _files(root: str) -> dict[str, os.stat_result]:
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))   # .cache (hf download), .rsync-partial
        for name in names:
            if not name.startswith("."):
                path = os.path.join(folder, name)
                found[os.path.relpath(path, root)] = os.stat(path)
    return found


def _read_json(path: str | None) -> dict:
    try:
        with open(path) as f:
            found = json.load(f)
        return found if isinstance(found, dict) else {}
    except (OSError, TypeError, ValueError):   # none yet, or unreadable: nothing known
        return {}


def _staged(manifest: dict) -> dict:
    """A read manifest's {name: entry}, or {} where it is not one."""
    files = manifest.get("files")
    return files if isinstance(files, dict) else {}


def write(root: str, manifest: str, jobs: int, revision: str | None = None) -> dict:
    before = _read_json(manifest)
    old = _staged(before)
    stats = _files(root)
    if not stats:
        return {"failed": True, "msg": f"{root} holds no files to serve"}
    keep = {rel: old[rel] for rel, st in stats.items()
            if rel in old and old[rel]["size"] == st.st_size and old[rel]["mtime_ns"] == st.st_mtime_ns}
    todo = sorted(set(stats) - set(keep))
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        hashes = dict(zip(todo, pool.map(lambda rel: _sha256(os.path.join(root, rel)), todo)))
    files = {rel: keep.get(rel) or {"size": stats[rel].st_size, "mtime_ns": stats[rel].st_mtime_ns,
                                    "sha256": hashes[rel]} for rel in sorted(stats)}
    data = {"folder": root, "files": files, **({"revision": revision} if revision else {})}
    changed = data != before
    if changed:
        _write_json(manifest, data)
    return {"changed": changed, "files": len(files), "bytes": sum(e["size"] for e in files.values()),
            "hashed": todo}


def _stamp(sha256: str, st: os.stat_result) -> dict:
    # st_ctime_ns moves on every write, rename or utime, so a file edited and given its old mtime
    # back no longer matches; a copy rsync replaced is another inode
    return {"sha256": sha256, "stat": [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]}


def check(root: str, files: dict, jobs: int, record: str | None = None, every: bool = False) -> dict:
    recorded = _read_json(record)   # none, or unreadable: everything is hashed
    known = {} if every else recorded

    def judge(rel: str) -> tuple[str | None, dict | None, bool]:
        """(what differs or None, the stamp of a match, whether it was hashed)"""
        path = os.path.join(root, rel)
        try:
            st = os.stat(path)
        except OSError:
            return "missing", None, False
        if not stat.S_ISREG(st.st_mode):
            return "missing", None, False
        if st.st_size != files[rel]["size"]:
            return "size", None, False
        stamp = _stamp(files[rel]["sha256"], st)   # taken before hashing: a write meanwhile voids it
        if known.get(rel) == stamp:
            return None, stamp, False
        return (None, stamp, True) if _sha256(path) == files[rel]["sha256"] else ("sha256", None, True)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        verdicts = dict(zip(files, pool.map(judge, files)))
    matched = {rel: stamp for rel, (_, stamp, _) in sorted(verdicts.items()) if stamp}
    changed = record is not None and matched != recorded
    if changed:
        _write_json(record, matched)
    return {"changed": changed, "files": len(files), "bytes": sum(e["size"] for e in files.values()),
            "mismatched": sorted(rel for rel, (v, _, _) in verdicts.items() if v),
            "hashed": sorted(rel for rel, (_, _, hashed) in verdicts.items() if hashed)}


def room(root: str, files: dict, manifest: str | None = None) -> dict:
    known = _staged(_read_json(manifest))

    def lacks(rel: str, entry: dict) -> bool:
        path = os.path.join(root, rel)
        if not os.path.isfile(path) or os.path.getsize(path) != entry["size"]:
            return True
        # the same size, but the node's manifest hashed other contents (a shard retrained at its size)
        return "sha256" in entry and rel in known and known[rel].get("sha256") != entry["sha256"]

    # rsync writes each file it copies whole beside the old one (or its partial) before the rename; hf download,
    # which deletes an outdated file first, is weighed without a manifest
    lacking = sum(entry["size"] for rel, entry in files.items() if lacks(rel, entry))
    existing = root
    while not os.path.isdir(existing):     # --check: the folder is not made yet
        existing = os.path.dirname(existing)
    fs = os.statvfs(existing)
    return {"changed": False, "needed": lacking, "free": fs.f_bavail * fs.f_frsize}


def read(manifest: str) -> dict:
    found = _read_json(manifest)
    staged = bool(_staged(found))
    return {"changed": False, "staged": staged, "revision": str(found.get("revision") or "") if staged else ""}


def prune(root: str, manifest: str, files: dict, dry: bool) -> dict:
    def inside(rel: str) -> bool:   # a manifest names files under its folder; anything else is left alone
        return not os.path.isabs(rel) and not os.path.normpath(rel).startswith(os.pardir)

    found = _read_json(manifest)
    staged = _staged(found)
    gone = sorted(rel for rel in set(staged) - set(files) if inside(rel) and os.path.isfile(os.path.join(root, rel)))
    if gone and not dry:
        # first: the manifest lists no file that is not there, and keeps the hashes of the rest
        _write_json(manifest, {**found, "files": {rel: e for rel, e in staged.items() if rel not in gone}})
        for rel in gone:
            os.remove(os.path.join(root, rel))
            folder = os.path.dirname(rel)
            while folder and not os.listdir(os.path.join(root, folder)):
                os.rmdir(os.path.join(root, folder))
                folder = os.path.dirname(folder)
    return {"changed": bool(gone), "removed": gone}


def main() -> None:
    module = AnsibleModule(argument_spec={
        "path": {"type": "path", "required": True}, "manifest": {"type": "path"}, "expected": {"type": "json"},
        "mode": {"type": "str", "choices": ["write", "check", "room", "read", "prune"], "default": "check"},
        "record": {"type": "path"}, "every": {"type": "bool", "default": False}, "revision": {"type": "str"},
        "jobs": {"type": "int", "default": 8}}, supports_check_mode=True,
        required_if=[("mode", "write", ["manifest"]), ("mode", "check", ["expected"]), ("mode", "room", ["expected"]),
                     ("mode", "read", ["manifest"]), ("mode", "prune", ["manifest", "expected"])])
    p = module.params
    if p["mode"] == "room":
        module.exit_json(**room(p["path"], json.loads(p["expected"])["files"], p["manifest"]))
    if p["mode"] == "read":
        module.exit_json(**read(p["manifest"]))
    if p["mode"] == "prune":
        module.exit_json(**prune(p["path"], p["manifest"], json.loads(p["expected"])["files"], module.check_mode))
    if not os.path.isdir(p["path"]):
        module.fail_json(msg=f"{p['path']} is not a folder")
    if p["mode"] == "write" and module.check_mode:
        module.exit_json(changed=not os.path.isfile(p["manifest"]), skipped_hashing=True)
    if p["mode"] == "write":
        result = write(p["path"], p["manifest"], p["jobs"], p["revision"])
    else:
        # --check writes no record: it hashes what the record would have spared
        result = check(p["path"], json.loads(p["expected"])["files"], p["jobs"],
                       None if module.check_mode else p["record"], p["every"])
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
