"""Fixtures: the pinned SGLang 0.5.23 wheel unpacked, pristine and with the series applied.

A full copy of the unpacked wheel (5,800 files, 132 MB) takes ~8 s on a CI disk, so only
the test that proves the tool touches nothing else copies it all; the others work on a
sparse copy (tests.support.sglang_wheel.sparse_copy).
"""
import hashlib

import pytest
from dsaops.sglang_patches import apply as tree
from dsaops.sglang_patches.series import load

from tests.support.sglang_wheel import sglang_source, sparse_copy


@pytest.fixture(scope="session")
def series():
    return load()


def tree_hash(root):
    """sha256 of every file under root (dot files too), by relative path: any change anywhere shows."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def sparse_root(tmp_path, series):
    return sparse_copy(tmp_path / "tree", series)


@pytest.fixture(scope="session")
def pristine_root():
    """The unpacked wheel itself: tests only read it."""
    return sglang_source()


@pytest.fixture(scope="session")
def patched_root(tmp_path_factory, series):
    """The files the series touches, patched; shared by the tests that only read them."""
    root = sparse_copy(tmp_path_factory.mktemp("patched"), series)
    tree.apply(root, series)
    return root
