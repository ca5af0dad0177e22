"""One wheel cache, two consumers: `make image` takes the target's SGLang wheel, the tests their own.

`make image ARCH=sm_121` leaves the aarch64 cp312 wheel in $DSAOPS_CACHE/wheels; the tests' helper
and the image build must each still find the wheel that fits them. pip's own compatibility check
(`pip install --dry-run`) is the judge of what this interpreter can install.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

import dsaops.image
from dsaops import pins, targets
from dsaops.errors import UserError
from dsaops.pins import SGLANG
from tests.images.test_sglang_wheel_option import RIGHT, make_wheel
from tests.support import sglang_wheel

MACHINE = os.uname().machine
FOREIGN = {"aarch64": "x86_64", "x86_64": "aarch64"}[MACHINE]


def pip_accepts(wheel) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index", "-q",
                           str(wheel)], capture_output=True, text=True, check=False, timeout=300)


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A cache holding the real host wheel plus foreign-platform copies that a glob would list first."""
    real = sglang_wheel.sglang_wheel()
    monkeypatch.setenv("DSAOPS_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    names = {"host": real.name,
             "aarch64_cp312": f"sglang-{SGLANG}-cp312-cp312-manylinux_2_34_{FOREIGN}.whl",
             "other_python": f"sglang-{SGLANG}-cp310-cp310-manylinux_2_34_{MACHINE}.whl"}
    for name in names.values():
        (wheels / name).symlink_to(real)
    assert min(names.values()) != names["host"]   # cp310 lists first: a first-listed pick would be wrong
    return wheels, names


def test_the_tests_take_the_wheel_pip_installs_here(planted):
    wheels, names = planted
    chosen = sglang_wheel.sglang_wheel()
    assert chosen == wheels / names["host"]
    assert pip_accepts(chosen).returncode == 0
    # the negative control: pip itself refuses the foreign ones the helper passed over
    for key in ("aarch64_cp312", "other_python"):
        refused = pip_accepts(wheels / names[key])
        assert refused.returncode != 0 and "is not a supported wheel on this platform" in refused.stderr, key


def test_the_image_build_takes_the_targets_wheel_from_the_same_cache(tmp_path, monkeypatch):
    """What `make image` finds next to the tests' wheels: each target's own, or a download."""
    monkeypatch.setenv("DSAOPS_CACHE", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    cached = [f"sglang-{SGLANG}-cp311-cp311-manylinux_2_34_x86_64.whl",     # what this machine's tests use
              f"sglang-{SGLANG}-cp312-cp312-manylinux_2_34_aarch64.whl"]    # what `make image ARCH=sm_121` left
    for name in cached:
        monkeypatch.setitem(pins.SHA256, name, pins.sha256(make_wheel(tmp_path / "wheels", name)))
    downloads = []
    monkeypatch.setattr(dsaops.image, "_pip", lambda *args, **kw: downloads.append(args))
    assert dsaops.image.sglang_wheel_for(targets.get("sm_121"), SGLANG).name == cached[1]
    assert not downloads
    # sm_90 needs cp312 on x86_64, which the cache lacks: pip is asked for exactly that, not handed cp311
    with pytest.raises(UserError, match="no sglang .* wheel for CPython 3.12 on x86_64"):
        dsaops.image.sglang_wheel_for(targets.get("sm_90"), SGLANG)
    [args] = downloads
    assert args[args.index("--python-version") + 1] == "3.12"
    assert args[args.index("--platform") + 1] == "manylinux_2_34_x86_64"


@pytest.fixture
def index(tmp_path, monkeypatch):
    """pip sees only a local folder (--find-links, no index) holding a small real sm_90 wheel; the cache is empty."""
    links, cache = tmp_path / "links", tmp_path / "cache"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("DSAOPS_CACHE", str(cache))
    whole = make_wheel(links, RIGHT)
    monkeypatch.setitem(pins.SHA256, RIGHT, pins.sha256(whole))   # as pins.toml pins PyPI's file
    return whole, cache / "wheels"


def replaced(path):
    """`path` rewritten as another whole wheel of the same name and METADATA: its zip checksums hold."""
    path.unlink(missing_ok=True)
    make_wheel(path.parent, path.name)
    with zipfile.ZipFile(path, "a") as whl:
        whl.writestr("sglang/__init__.py.bak", "import os  # not PyPI's\n")
    with zipfile.ZipFile(path) as whl:
        assert whl.testzip() is None
    return path


def test_a_cached_wheel_of_another_content_is_refused_not_used(index):
    """A whole wheel under the pinned name passed the zip and METADATA checks and went into the image."""
    whole, wheels = index
    wheels.mkdir(parents=True)
    cached = replaced(wheels / RIGHT)
    before = cached.read_bytes()
    with pytest.raises(UserError) as e:
        dsaops.image.sglang_wheel_for(targets.get("sm_90"), SGLANG)
    assert str(e.value) == (f"{cached} has sha256 {pins.sha256(cached)}, dsaops/pins.toml pins "
                            f"{pins.sha256(whole)}: a damaged or replaced file; delete it and run again to "
                            "download it")
    assert cached.read_bytes() == before   # left for the user to look at, not replaced behind their back
    cached.unlink()   # what the message says to do
    assert dsaops.image.sglang_wheel_for(targets.get("sm_90"), SGLANG).read_bytes() == whole.read_bytes()


def test_a_download_of_another_content_is_refused_and_not_kept(index):
    whole, wheels = index
    replaced(whole)
    with pytest.raises(UserError, match=rf"^{RIGHT} as downloaded has sha256 {pins.sha256(whole)}, "
                                        r"dsaops/pins.toml pins [0-9a-f]{64}: the package index"):
        dsaops.image.sglang_wheel_for(targets.get("sm_90"), SGLANG)
    assert [p.name for p in wheels.iterdir()] == [".sglang.lock"]


def test_the_tests_refuse_a_cached_wheel_of_another_content(tmp_path, monkeypatch):
    """The tests' helper took any cached file under the host wheel's name, unchecked."""
    real = sglang_wheel.sglang_wheel()
    monkeypatch.setenv("DSAOPS_CACHE", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    cached = replaced(tmp_path / "wheels" / real.name)
    with pytest.raises(UserError, match=f"^{cached} has sha256 {pins.sha256(cached)}, dsaops/pins.toml pins "
                                        f"{pins.SHA256[real.name]}: a damaged or replaced file; delete it"):
        sglang_wheel.sglang_wheel()


def test_a_cut_short_cached_wheel_is_downloaded_again_not_staged(index, capsys):
    whole, wheels = index
    wheels.mkdir(parents=True)
    (wheels / RIGHT).write_bytes(whole.read_bytes()[:-200])   # an interrupted copy under the final name
    got = dsaops.image.sglang_wheel_for(targets.get("sm_90"), SGLANG)
    assert got == wheels / RIGHT and got.read_bytes() == whole.read_bytes()
    [line] = capsys.readouterr().err.splitlines()
    assert f"{wheels / RIGHT} is not a wheel" in line and "downloading it again" in line
    assert sorted(p.name for p in wheels.iterdir()) == [".sglang.lock", RIGHT]   # no download folder left


def test_a_damaged_download_is_refused_and_not_left_in_the_cache(index):
    whole, wheels = index
    with zipfile.ZipFile(whole, "a") as whl:
        whl.writestr("sglang/kernel.py", "# a kernel\n" * 100, zipfile.ZIP_STORED)
    data = bytearray(whole.read_bytes())
    data[data.index(b"# a kernel")] ^= 1   # its checksum no longer matches
    whole.write_bytes(data)
    with pytest.raises(UserError, match=r"fails its checksum.*pass --sglang-wheel FILE"):
        dsaops.image.sglang_wheel_for(targets.get("sm_90"), SGLANG)
    assert [p.name for p in wheels.iterdir()] == [".sglang.lock"]


def test_a_folder_under_the_wheels_name_is_refused(index):
    _, wheels = index
    (wheels / RIGHT).mkdir(parents=True)
    with pytest.raises(UserError, match=f"{wheels / RIGHT} is a folder where the cache keeps a wheel: remove it"):
        dsaops.image.sglang_wheel_for(targets.get("sm_90"), SGLANG)


@pytest.mark.parametrize("case", ["no index", "no cache folder"])
def test_a_download_that_cannot_happen_is_one_line(index, monkeypatch, case):
    whole, wheels = index
    if case == "no index":
        whole.unlink()
        says = "pip could not download sglang"
    else:
        wheels.parent.mkdir()
        wheels.write_text("")   # DSAOPS_CACHE/wheels is a file: nothing can be kept there
        says = "cannot keep the sglang wheel in"
    with pytest.raises(UserError, match=says) as e:
        dsaops.image.sglang_wheel_for(targets.get("sm_90"), SGLANG)
    assert "\n" not in str(e.value)
