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
