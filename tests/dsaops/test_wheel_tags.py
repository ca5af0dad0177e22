"""dsaops.wheel_tags: a wheel fits an interpreter by the tags in its name, checked against packaging's own lists."""
from pathlib import Path

import pytest
from packaging.tags import compatible_tags, cpython_tags

from dsaops.wheel_tags import best, linux_cpython_tags, parse, wheel_tags

SGLANG = "pkg-9.9-cp312-cp312-manylinux_2_34_aarch64.whl"


def test_a_wheel_name_carries_its_tag_sets():
    assert wheel_tags(SGLANG) == {("cp312", "cp312", "manylinux_2_34_aarch64")}
    assert parse(SGLANG) == ("pkg", "9.9", wheel_tags(SGLANG))
    assert wheel_tags("x-1.0-1-py2.py3-none-manylinux1_x86_64.manylinux2014_x86_64.whl") == {
        (py, "none", plat) for py in ("py2", "py3") for plat in ("manylinux1_x86_64", "manylinux2014_x86_64")}
    with pytest.raises(ValueError, match="not a wheel file name"):
        wheel_tags("sglang-0.5.23.tar.gz")


@pytest.mark.parametrize("python, machine", [("3.12", "aarch64"), ("3.11", "x86_64")])
def test_target_tags_are_packagings_for_the_same_platforms(python, machine):
    """Same tags, same order as packaging.tags builds them for that interpreter and those platforms."""
    ours = linux_cpython_tags(python, machine, (2, 34))
    platforms = list(dict.fromkeys(p for _, _, p in ours if p != "any"))
    version = tuple(int(n) for n in python.split("."))
    theirs = [(t.interpreter, t.abi, t.platform) for t in
              [*cpython_tags(version, abis=[f"cp{version[0]}{version[1]}"], platforms=platforms),
               *compatible_tags(version, f"cp{version[0]}{version[1]}", platforms)]]
    assert ours == theirs
    assert platforms[:2] == [f"manylinux_2_34_{machine}", f"manylinux_2_33_{machine}"]
    assert f"manylinux2014_{machine}" in platforms and platforms[-1] == f"linux_{machine}"
    assert ("manylinux1_aarch64" in platforms) is False   # aarch64 wheels start at manylinux2014


def test_best_takes_the_fitting_wheel_not_the_first_listed():
    names = ["pkg-9.9-cp311-cp311-manylinux_2_34_x86_64.whl", SGLANG,
             "pkg-9.9-cp312-cp312-manylinux_2_34_x86_64.whl", "notes.txt"]
    paths = [Path("/cache") / n for n in names]
    assert best(paths, linux_cpython_tags("3.12", "aarch64", (2, 34))).name == SGLANG
    assert best(paths, linux_cpython_tags("3.12", "x86_64", (2, 34))).name == names[2]
    assert best(paths, linux_cpython_tags("3.11", "x86_64", (2, 34))).name == names[0]
    assert best(paths, linux_cpython_tags("3.13", "x86_64", (2, 34))) is None
    assert best(paths, linux_cpython_tags("3.12", "x86_64", (2, 31))) is None   # manylinux_2_34 needs glibc 2.34
    abi3 = Path("abi3pkg-9.9-cp310-abi3-manylinux2014_x86_64.whl")
    assert best([abi3], linux_cpython_tags("3.12", "x86_64", (2, 34))) == abi3
