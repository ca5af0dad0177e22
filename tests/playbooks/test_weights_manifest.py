"""The weights role's manifest module (playbooks/roles/weights/library/dsaops_weights_manifest.py), run as Ansible
runs a module: its arguments in a file, its answer one JSON object on stdout."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.playbooks.ansible_sandbox import PLAYBOOKS

MODULE = PLAYBOOKS / "roles/weights/library/dsaops_weights_manifest.py"
SHARDS = {"config.json": b"{}\n", "model-1.safetensors": b"a" * 70_000, "model-2.safetensors": b"b" * 50_000}


def run_module(tmp_path, **args) -> dict:
    given = tmp_path / "args.json"
    given.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {key: str(v) if isinstance(v, os.PathLike) else v
                                                         for key, v in args.items()}}))
    done = subprocess.run([sys.executable, MODULE, given], check=False, capture_output=True, text=True, timeout=60)
    answer = json.loads(done.stdout)
    assert not answer.get("failed"), answer
    return answer


@pytest.fixture
def copy(tmp_path):
    """(source manifest, a copy of the source folder as rsync --times leaves it, the record's path)"""
    source, copied = tmp_path / "source", tmp_path / "copy"
    source.mkdir()
    for name, data in SHARDS.items():
        (source / name).write_bytes(data)
    run_module(tmp_path, path=source, manifest=tmp_path / "manifest.json", mode="write")
    shutil.copytree(source, copied)   # copy2: the times kept, as rsync --times keeps them
    return (tmp_path / "manifest.json").read_text(), copied, tmp_path / "checked.json"


def check(tmp_path, copy, **extra) -> dict:
    manifest, copied, record = copy
    return run_module(tmp_path, path=copied, expected=manifest, mode="check", record=record, **extra)


def flip_keeping_size_and_mtime(path):
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[1234] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_file_unchanged_since_it_matched_is_not_hashed_again(tmp_path, copy):
    first = check(tmp_path, copy)
    assert first["hashed"] == sorted(SHARDS) and first["mismatched"] == [] and first["changed"]
    again = check(tmp_path, copy)
    assert again["hashed"] == [] and again["mismatched"] == [] and not again["changed"]


def test_a_bit_flip_that_keeps_size_and_mtime_is_hashed_and_found(tmp_path, copy):
    """The write moves the change time, which utime cannot set back: the recorded match no longer holds."""
    check(tmp_path, copy)
    flip_keeping_size_and_mtime(copy[1] / "model-1.safetensors")
    found = check(tmp_path, copy)
    assert found["hashed"] == ["model-1.safetensors"] and found["mismatched"] == ["model-1.safetensors"]
    # a mismatch leaves the record, so the next check hashes it again too
    assert check(tmp_path, copy)["mismatched"] == ["model-1.safetensors"]


def test_a_file_replaced_by_a_rename_is_hashed_again(tmp_path, copy):
    """rsync writes a file it copies again beside the old one and renames it over it: another inode."""
    check(tmp_path, copy)
    shard = copy[1] / "model-2.safetensors"
    stat = shard.stat()
    fresh = shard.with_name(".model-2.partial")
    fresh.write_bytes(SHARDS["model-2.safetensors"])
    os.utime(fresh, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(fresh, shard)
    replaced = check(tmp_path, copy)
    assert replaced["hashed"] == ["model-2.safetensors"] and replaced["mismatched"] == []


def test_a_hash_the_manifest_changes_is_checked_again(tmp_path, copy):
    """The source's shard changed (same size): its new hash was never checked against this copy."""
    manifest, copied, record = copy
    check(tmp_path, copy)
    changed = json.loads(manifest)
    changed["files"]["model-2.safetensors"]["sha256"] = "0" * 64
    rechecked = check(tmp_path, (json.dumps(changed), copied, record))
    assert rechecked["hashed"] == ["model-2.safetensors"] and rechecked["mismatched"] == ["model-2.safetensors"]


def test_every_hashes_every_file_whatever_the_record_says(tmp_path, copy):
    check(tmp_path, copy)
    assert check(tmp_path, copy, every=True)["hashed"] == sorted(SHARDS)


@pytest.mark.parametrize("record", ["not json", "[1, 2]", '{"model-1.safetensors": "x"}'])
def test_an_unreadable_record_hashes_everything_and_is_written_anew(tmp_path, copy, record):
    copy[2].write_text(record)
    answer = check(tmp_path, copy)
    assert answer["hashed"] == sorted(SHARDS) and answer["mismatched"] == [] and answer["changed"]
    assert check(tmp_path, copy)["hashed"] == []


def test_the_manifest_records_the_revision_it_was_written_at(tmp_path, copy):
    """The role downloads again where the staged revision differs from the inventory's: the manifest must say which
    one its files are, change when only that changes, and say none when none was given (the default branch)."""
    manifest = tmp_path / "manifest.json"
    assert "revision" not in json.loads(manifest.read_text())
    source = tmp_path / "source"
    first = run_module(tmp_path, path=source, manifest=manifest, mode="write", revision="v1")
    assert first["changed"] and first["hashed"] == [] and json.loads(manifest.read_text())["revision"] == "v1"
    assert not run_module(tmp_path, path=source, manifest=manifest, mode="write", revision="v1")["changed"]
    assert run_module(tmp_path, path=source, manifest=manifest, mode="write", revision="v2")["changed"]
    assert json.loads(manifest.read_text())["revision"] == "v2"


@pytest.mark.parametrize("content", [None, "", "{not json", "[1, 2]", '{"folder": "/x"}', '{"files": "all"}'])
def test_read_finds_no_staging_where_the_manifest_is_missing_or_not_one(tmp_path, content):
    """The role downloads again where nothing is staged: a torn or foreign file is that, not a template error."""
    manifest = tmp_path / "manifest.json"
    if content is not None:
        manifest.write_text(content)
    answer = run_module(tmp_path, path=tmp_path, manifest=manifest, mode="read")
    assert (answer["staged"], answer["revision"], answer["changed"]) == (False, "", False)


def test_read_gives_the_revision_a_staging_recorded(tmp_path, copy):
    manifest = tmp_path / "manifest.json"
    answer = run_module(tmp_path, path=tmp_path, manifest=manifest, mode="read")
    assert answer["staged"] and answer["revision"] == ""
    run_module(tmp_path, path=tmp_path / "source", manifest=manifest, mode="write", revision="v7")
    assert run_module(tmp_path, path=tmp_path, manifest=manifest, mode="read")["revision"] == "v7"


@pytest.fixture
def staged(tmp_path):
    """A folder staged at one revision (its manifest written), with a file no staging recorded beside it, and the
    expected manifest of the next revision, which drops model-2 and original/params.json and adds model-3."""
    folder, manifest = tmp_path / "models", tmp_path / "manifest.json"
    (folder / "original").mkdir(parents=True)
    for name, data in {**SHARDS, "original/params.json": b"{}"}.items():
        (folder / name).write_bytes(data)
    run_module(tmp_path, path=folder, manifest=manifest, mode="write")
    (folder / "notes.txt").write_text("the user's own\n")
    files = {name: {"size": len(data)} for name, data in SHARDS.items() if name != "model-2.safetensors"}
    return folder, manifest, json.dumps({"files": {**files, "model-3.safetensors": {"size": 3}}})


def test_prune_removes_what_the_last_staging_had_and_the_next_has_not(tmp_path, staged):
    folder, manifest, expected = staged
    answer = run_module(tmp_path, path=folder, manifest=manifest, expected=expected, mode="prune")
    assert answer["changed"] and answer["removed"] == ["model-2.safetensors", "original/params.json"]
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model-1.safetensors", "notes.txt"]
    kept = json.loads(manifest.read_text())["files"]   # what is left, with the hashes it had
    assert sorted(kept) == ["config.json", "model-1.safetensors"] and all(e["sha256"] for e in kept.values())
    again = run_module(tmp_path, path=folder, manifest=manifest, expected=expected, mode="prune")
    assert not again["changed"] and again["removed"] == []


def test_prune_in_check_mode_only_names_them(tmp_path, staged):
    folder, manifest, expected = staged
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    answer = run_module(tmp_path, path=folder, manifest=manifest, expected=expected, mode="prune",
                        _ansible_check_mode=True)
    assert answer["changed"] and answer["removed"] == ["model-2.safetensors", "original/params.json"]
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before and manifest.exists()


def test_prune_leaves_a_name_outside_the_folder_alone(tmp_path, staged):
    folder, manifest, expected = staged
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x")
    recorded = json.loads(manifest.read_text())
    recorded["files"].update({"../outside.bin": {"size": 1}, str(outside): {"size": 1}})
    manifest.write_text(json.dumps(recorded))
    answer = run_module(tmp_path, path=folder, manifest=manifest, expected=expected, mode="prune")
    assert answer["removed"] == ["model-2.safetensors", "original/params.json"] and outside.exists()


def test_prune_without_a_readable_manifest_removes_nothing(tmp_path, staged):
    folder, manifest, expected = staged
    manifest.write_text("{torn")
    answer = run_module(tmp_path, path=folder, manifest=manifest, expected=expected, mode="prune")
    assert not answer["changed"] and (folder / "model-2.safetensors").exists()


def test_room_counts_a_file_of_the_same_size_whose_hash_the_node_knows_changed(tmp_path, staged):
    """A revision that retrains a shard keeps its size; the fetch writes the new file beside the old one, so the
    room check must count it where the node's manifest shows other contents, and only there."""
    folder, manifest, _ = staged
    hashes = {rel: e["sha256"] for rel, e in json.loads(manifest.read_text())["files"].items()}
    changed = {"model-1.safetensors": {"size": len(SHARDS["model-1.safetensors"]), "sha256": "0" * 64},
               "model-2.safetensors": {"size": len(SHARDS["model-2.safetensors"]), "sha256": hashes["model-2.safetensors"]},
               "config.json": {"size": len(SHARDS["config.json"])}}

    def needed(**args) -> int:
        return run_module(tmp_path, path=folder, expected=json.dumps({"files": changed}), mode="room", **args)["needed"]

    assert needed(manifest=manifest) == len(SHARDS["model-1.safetensors"])
    assert needed() == 0                                    # no manifest: a file at its size counts as there
    manifest.write_text("{torn")
    assert needed(manifest=manifest) == 0
