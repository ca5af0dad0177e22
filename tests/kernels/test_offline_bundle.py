"""kernels/offline-bundle.sh, run for real against a local wheel folder (pip's --find-links, no index):
the bundle it writes, a failed build that leaves the bundle before it whole, and bad arguments."""
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from dsaops import pins

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "kernels" / "offline-bundle.sh"
KERNEL = "sglang/kernels/ops/attention/dsa/tilelang_kernel.py"
DOWNLOADED = {"tilelang": pins.TILELANG, "sgl-flash-mla": pins.FLASH_MLA, **pins.BUNDLE}  # what pip fetches: version


def wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def checkout(env: dict) -> Path:
    """The copy of the script and dsaops.pins that the test runs: its pins.toml also pins the stand-in wheels."""
    return Path(env["DSAOPS_CACHE"]).parent / "checkout"


def pin(env: dict, *wheels: Path) -> None:
    """Pin `wheels`' sha256 in the copy's pins.toml, as the real one pins PyPI's files."""
    table = checkout(env) / "dsaops" / "pins.toml"
    pinned = {**tomllib.loads(table.read_text())["sha256"], **{w.name: pins.sha256(w) for w in wheels}}
    table.write_text(table.read_text().split("[sha256]")[0] + "[sha256]\n"
                     + "".join(f'"{name}" = "{digest}"\n' for name, digest in pinned.items()))


@pytest.fixture
def env(tmp_path) -> dict:
    """pip sees only a folder of stand-in wheels for every pin the script downloads; SGLang's wheel is
    in the dsaops cache, where the script looks first. The pinned ones' hashes are pinned."""
    links, cache = tmp_path / "wheels", tmp_path / "cache"
    links.mkdir()
    (cache / "wheels").mkdir(parents=True)
    for name, version in DOWNLOADED.items():
        wheel(links, name, version, {f"{name.replace('-', '_')}/__init__.py": f"# {name}\n"})
    wheel(cache / "wheels", "sglang", pins.SGLANG, {KERNEL: "# the baseline\n"})
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(links), "DSAOPS_CACHE": str(cache)}
    (checkout(env) / "kernels").mkdir(parents=True)
    shutil.copy2(SCRIPT, checkout(env) / "kernels")
    shutil.copytree(ROOT / "dsaops", checkout(env) / "dsaops")
    pin(env, *links.glob("*.whl"), *(cache / "wheels").glob("*.whl"))
    return env


def bundle(out: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(checkout(env) / "kernels" / SCRIPT.name), "--out", str(out), *extra], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def failing_xz(tmp_path: Path, env: dict) -> dict:
    """env with an xz that fails: a step after the downloads."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "xz").write_text("#!/bin/sh\nexit 1\n")
    (fake / "xz").chmod(0o755)
    return {**env, "PATH": f"{fake}:{env['PATH']}"}


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_bundle_holds_the_site_the_baseline_and_its_manifest(tmp_path, env):
    out = tmp_path / "out"
    done = bundle(out, env)
    assert done.returncode == 0, done.stderr
    assert sorted(files(out)) == ["BUNDLE", "sgl/" + KERNEL, "site.tar.xz"]
    assert (out / "sgl" / KERNEL).read_text() == "# the baseline\n"
    with tarfile.open(out / "site.tar.xz") as tar:
        names = tar.getnames()
        assert tar.extractfile("site/BUNDLE").read() == (out / "BUNDLE").read_bytes()
    assert {"site/tilelang/__init__.py", "site/flash_mla/__init__.py", "site/sgl_flash_mla/__init__.py"} - set(names) \
        == {"site/flash_mla/__init__.py"}  # the stand-in wheel's package is named after it


def test_a_failed_build_leaves_the_bundle_before_it_whole(tmp_path, env):
    """A failing step after the downloads (here xz) truncated site.tar.xz and had already replaced
    sgl/ and BUNDLE: a half bundle whose manifest named what it did not hold."""
    out = tmp_path / "out"
    assert bundle(out, env).returncode == 0
    before = files(out)
    done = bundle(out, failing_xz(tmp_path, env), "--platform", "aarch64")
    assert done.returncode != 0
    assert files(out) == before and sorted(p.name for p in out.iterdir()) == ["BUNDLE", "sgl", "site.tar.xz"]


def test_a_failed_build_keeps_the_empty_folder_it_was_given(tmp_path, env):
    """--out names a folder made for the bundle (its owner, its mode): a failure leaves it there."""
    out = tmp_path / "out"
    out.mkdir(mode=0o750)
    assert bundle(out, failing_xz(tmp_path, env)).returncode != 0
    assert out.is_dir() and list(out.iterdir()) == []


@pytest.mark.parametrize("argv, says", [
    (["--out"], "--out needs a value"),
    (["--python", "3"], "--python takes X.Y"),
    (["--out", ""], "--out needs a value"),
    (["--platform", "arm"], "--platform must be x86_64 or aarch64"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, argv, says):
    done = subprocess.run(["bash", str(SCRIPT), *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["cut short", "a folder"])
def test_a_damaged_cached_sglang_wheel_is_passed_over_for_a_download(tmp_path, env, damage):
    """The cache is reused, never required: a wheel cut short there (or a folder under its name) stopped
    the bundle with a traceback; now it says so in one line and takes the wheel pip downloads."""
    pin(env, wheel(Path(env["PIP_FIND_LINKS"]), "sglang", pins.SGLANG, {KERNEL: "# the downloaded baseline\n"}))
    cached = next((Path(env["DSAOPS_CACHE"]) / "wheels").glob("sglang-*.whl"))
    if damage == "cut short":
        cached.write_bytes(cached.read_bytes()[:-30])
    else:
        cached.unlink()
        cached.mkdir()
    done = bundle(tmp_path / "out", env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "sgl" / KERNEL).read_text() == "# the downloaded baseline\n"
    [line] = [line for line in done.stderr.splitlines() if str(cached) in line]
    assert "no whole" in line and "Traceback" not in done.stderr


@pytest.mark.parametrize("where", ["cached sglang", "downloaded tilelang", "downloaded z3-solver"])
def test_a_wheel_of_another_content_is_refused_in_one_line(tmp_path, env, where):
    """A whole wheel that is not the pinned file (its zip checksums hold) went into the bundle."""
    if where == "cached sglang":
        replaced = wheel(Path(env["DSAOPS_CACHE"]) / "wheels", "sglang", pins.SGLANG, {KERNEL: "# not PyPI's\n"})
        says = f"{replaced} has sha256 {pins.sha256(replaced)}, dsaops/pins.toml pins "
    else:
        name = where.split()[1]
        replaced = wheel(Path(env["PIP_FIND_LINKS"]), name, DOWNLOADED[name],
                         {f"{name.replace('-', '_')}/__init__.py": "# not PyPI's\n"})
        says = f"{replaced.name} as downloaded has sha256 {pins.sha256(replaced)}, dsaops/pins.toml pins "
    done = bundle(tmp_path / "out", env)
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "sha256" in line]
    assert line.startswith(f"dsaops.pins: {says}") and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
