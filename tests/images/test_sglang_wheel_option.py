"""`dsaops image build --sglang-wheel FILE`: a file the engine stage's pip would refuse minutes into the
build is refused before anything is built, in one line naming the file and what to give instead."""
from __future__ import annotations

import zipfile

import pytest

import dsaops.image
from dsaops import targets
from dsaops.cli import main
from dsaops.pins import SGLANG as PIN

RIGHT = f"sglang-{PIN}-cp312-cp312-manylinux_2_34_x86_64.whl"   # sm_90: CPython 3.12 on x86_64


def make_wheel(folder, filename, *, name="sglang", version=PIN):
    """A small real wheel: a zip with the package and its dist-info METADATA saying `name` `version`."""
    path = folder / filename
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        whl.writestr("sglang/__init__.py", "")
        whl.writestr(f"{name}-{version}.dist-info/METADATA",
                     f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\nSummary: x\n\n{'long text ' * 500}\n")
        whl.writestr(f"{name}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return path


@pytest.mark.parametrize("filename", [RIGHT, f"sglang-{PIN}-py3-none-any.whl",
                                      f"sglang-{PIN}-cp312-abi3-manylinux2014_x86_64.whl"])
def test_a_wheel_the_image_installs_is_taken(tmp_path, filename):
    wheel = make_wheel(tmp_path, filename)
    assert dsaops.image.check_sglang_wheel(wheel, targets.get("sm_90"), PIN) == wheel


def refused(tmp_path, monkeypatch, capsys, wheel, *extra, arch="sm_90"):
    """`dsaops image build --sglang-wheel wheel`: its exit status and one-line message; nothing staged."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")   # a build that got past the check fails here
    context = tmp_path / "context"
    rc = main(["image", "build", "--arch", arch, "--context", str(context), "--sglang-wheel", str(wheel), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"dsaops image: --sglang-wheel {wheel}") and err.count("\n") == 1, err
    assert "no Docker engine" not in err and not context.exists()
    return err


@pytest.mark.parametrize(("filename", "name", "version", "message"), [
    ("sglang-0.5.22-cp312-cp312-manylinux_2_34_x86_64.whl", "sglang", "0.5.22", "is sglang 0.5.22, not sglang"),
    (f"vllm-{PIN}-cp312-cp312-manylinux_2_34_x86_64.whl", "vllm", PIN, f"is vllm {PIN}, not sglang {PIN}"),
    (f"sglang-{PIN}-cp311-cp311-manylinux_2_34_x86_64.whl", "sglang", PIN,
     "tags cp311-cp311-manylinux_2_34_x86_64 do not install on CPython 3.12 on x86_64"),
    (f"sglang-{PIN}-cp312-cp312-manylinux_2_34_aarch64.whl", "sglang", PIN, "do not install on CPython 3.12 on x86_64"),
    (f"sglang-{PIN}.tar.gz", "sglang", PIN, "is not a wheel's name (name-version[-build]-python-abi-platform.whl)"),
])
def test_a_wheel_the_engine_stage_would_refuse_is_refused_by_its_name(tmp_path, monkeypatch, capsys, filename, name,
                                                                      version, message):
    wheel = make_wheel(tmp_path, filename, name=name, version=version)
    err = refused(tmp_path, monkeypatch, capsys, wheel)
    assert message in err and f"give the sglang {PIN} wheel for CPython 3.12 on x86_64" in err, err


def test_a_file_that_is_no_zip_is_refused(tmp_path, monkeypatch, capsys):
    wheel = tmp_path / RIGHT
    wheel.write_text("<html>404 Not Found</html>\n")   # what a failed download saves
    assert "is not a wheel: not a zip archive" in refused(tmp_path, monkeypatch, capsys, wheel)


def test_a_wheel_whose_metadata_says_another_version_is_refused(tmp_path, monkeypatch, capsys):
    wheel = make_wheel(tmp_path, RIGHT, version="0.5.22")
    assert f"its METADATA says sglang 0.5.22, its name sglang {PIN}" in refused(tmp_path, monkeypatch, capsys, wheel)


def test_a_zip_without_metadata_is_refused(tmp_path, monkeypatch, capsys):
    wheel = tmp_path / RIGHT
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("sglang/__init__.py", "")
    assert "holds no *.dist-info/METADATA" in refused(tmp_path, monkeypatch, capsys, wheel)


def test_a_standin_build_wants_the_standins_python(tmp_path, monkeypatch, capsys):
    """--base standin builds on Python 3.11: the target's cp312 wheel would not install there."""
    err = refused(tmp_path, monkeypatch, capsys, make_wheel(tmp_path, RIGHT), "--base", "standin")
    assert "do not install on CPython 3.11" in err, err


def test_a_missing_file_is_refused(tmp_path, monkeypatch, capsys):
    assert "no such file" in refused(tmp_path, monkeypatch, capsys, tmp_path / RIGHT)


def test_on_a_base_of_ones_own_only_the_platform_is_checked(tmp_path, monkeypatch, capsys):
    """--build-arg BASE_IMAGE: the base's Python is not in the table (a bookworm base has 3.11), its machine is."""
    ours = make_wheel(tmp_path, f"sglang-{PIN}-cp311-cp311-manylinux_2_34_x86_64.whl")
    assert dsaops.image.check_sglang_wheel(ours, targets.get("sm_90"), PIN, own_base=True) == ours
    arm = make_wheel(tmp_path, f"sglang-{PIN}-cp311-cp311-manylinux_2_34_aarch64.whl")
    err = refused(tmp_path, monkeypatch, capsys, arm, "--build-arg", "BASE_IMAGE=my/base:bookworm")
    assert "do not install on the base's CPython on x86_64" in err, err


@pytest.mark.parametrize("extra", [(), ("--base", "standin")])
def test_a_base_that_carries_sglang_takes_no_wheel(tmp_path, monkeypatch, capsys, extra):
    """gfx942's image keeps the SGLang its base carries: a wheel given for it is refused, not left unused."""
    wheel = make_wheel(tmp_path, f"sglang-{PIN}-cp311-cp311-manylinux_2_34_x86_64.whl")
    err = refused(tmp_path, monkeypatch, capsys, wheel, *extra, arch="gfx942")
    assert "carries SGLang" in err and "leave --sglang-wheel out" in err, err


def test_a_base_said_to_carry_sglang_takes_no_wheel(tmp_path, monkeypatch, capsys):
    """--build-arg BASE_CARRIES_SGLANG=true on sm_90: the build stages no wheel, so one given is refused."""
    wheel = make_wheel(tmp_path, RIGHT)
    err = refused(tmp_path, monkeypatch, capsys, wheel, "--build-arg", "BASE_IMAGE=my/sglang:cuda",
                  "--build-arg", "BASE_CARRIES_SGLANG=true")
    assert "carries SGLang" in err and "leave --sglang-wheel out" in err, err


def test_the_build_arg_decides_whether_a_wheel_is_staged(capsys):
    """The plan (and the build that stages the context) follows BASE_CARRIES_SGLANG as given, not the table's default."""
    assert main(["image", "plan", "--arch", "sm_90", "--build-arg", "BASE_CARRIES_SGLANG=true"]) == 0
    assert "sglang/ (empty: the base carries SGLang)" in capsys.readouterr().out


def test_gfx942_keeps_its_bases_sglang(capsys):
    """The table knows no Python for gfx942's base, so no wheel could be picked for it."""
    assert main(["image", "plan", "--arch", "gfx942", "--build-arg", "BASE_CARRIES_SGLANG=false"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsaops image: --build-arg BASE_CARRIES_SGLANG=false: gfx942's image runs the SGLang")
    assert err.count("\n") == 1, err
