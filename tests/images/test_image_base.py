"""dsaops/image_base.py without an engine: what the stand-in bases carry and how the serving build
uses them (the builds themselves: test_image_build.py)."""
from __future__ import annotations

import re
import shutil
import tomllib
import zipfile

import pytest

from dsaops import image_base, pins, targets
from dsaops.errors import UserError
from tests.images.docker_build import REPO


def test_the_standins_carry_what_the_stages_after_them_need_offline():
    reqs = image_base.requirements()
    exporter = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["exporter"]
    assert reqs["common"][0].startswith("torch==") and set(exporter) <= set(reqs["common"])
    assert "setproctitle" in reqs["common"]  # SGLang titles its schedulers with it; so does the stand-in server
    assert pins.requirement("tilelang") in reqs["nvidia"]
    assert {r.split("==")[0] for r in reqs["nvidia"]} >= {"nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-cuda-cccl",
                                                          "nvidia-cuda-runtime", "nvidia-nvvm"}
    assert all(r.split("==")[1].startswith("13.0.") for r in image_base.CUDA_WHEELS)  # CUDA 13.0, as the real base


def test_the_serving_build_on_a_standin():
    for name, kind in (("sm_90", "nvidia"), ("sm_121", "nvidia"), ("gfx942", "rocm")):
        args = image_base.build_args(targets.get(name))
        assert args == {"BASE_IMAGE": f"dsaops-standin/base:{kind}", "SYSTEM_PACKAGES": "python3 python3-venv g++",
                        "SGLANG_DEPS": "none"}
    assert set(image_base.SYSTEM_PACKAGES.split()) - {"python3"} == set(image_base.DEBIAN_PACKAGES)


def test_every_argument_the_standin_build_passes_is_declared():
    text = image_base.DOCKERFILE.read_text()
    declared = {line.split()[1].split("=")[0] for line in text.splitlines() if line.startswith("ARG ")}
    assert declared == {"DEBIAN_IMAGE", "COMMON_REQUIREMENTS", "NVIDIA_REQUIREMENTS", "SGLANG_WHEEL", "STANDIN_KEY"}
    assert all(f"{arg}=" in (REPO / "dsaops" / "image_base.py").read_text() for arg in declared)
    assert {"FROM common AS nvidia", "FROM common AS rocm"} <= set(text.splitlines())
    assert set(image_base.KINDS.values()) == {"nvidia", "rocm"}


def test_pip_sees_every_manylinux_tag_bookworm_runs():
    tags = image_base._platform_tags()
    m = image_base.machine()
    assert tags[0] == f"manylinux_2_36_{m}" and f"manylinux2014_{m}" in tags and f"manylinux_2_17_{m}" in tags


def small_wheel(folder, filename, name, version):
    """A small real wheel named `filename`, its METADATA saying `name` `version`."""
    with zipfile.ZipFile(folder / filename, "w") as whl:
        whl.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
                     f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{name.replace('-', '_')}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        whl.writestr(f"{name.replace('-', '_')}/__init__.py", "")
    return folder / filename


def another_tilelang(tmp_path, monkeypatch) -> str:
    """pip's index is a local folder (no network) of small wheels for the stand-ins' requirements, whose
    TileLang, under PyPI's own file name, is another whole wheel; that file name."""
    links = tmp_path / "links"
    links.mkdir()
    for spec in [r for group in image_base.requirements().values() for r in group]:
        name, _, version = re.split(r"(==|>=)", spec) if re.search("==|>=", spec) else (spec, "", "1.0")
        if name != "tilelang":
            small_wheel(links, f"{name.replace('-', '_')}-{version}-py3-none-any.whl", name, version)
    [tilelang] = [n for n in pins.SHA256 if n.startswith(f"tilelang-{pins.TILELANG}-") and
                  n.endswith(f"_{image_base.machine()}.whl")]
    small_wheel(links, tilelang, "tilelang", pins.TILELANG)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("DSAOPS_CACHE", str(tmp_path / "cache"))
    return tilelang


def test_a_standin_wheel_of_another_content_is_refused(tmp_path, monkeypatch):
    """The index's TileLang of another content was taken into the base; now it is refused, not kept."""
    tilelang = another_tilelang(tmp_path, monkeypatch)
    links = tmp_path / "links"
    with pytest.raises(UserError, match=rf"^{re.escape(tilelang)} as downloaded has sha256 "
                                        rf"{pins.sha256(links / tilelang)}, dsaops/pins.toml pins "
                                        rf"{pins.SHA256[tilelang]}: the package index"):
        image_base.wheel_context(targets.get("sm_90"))
    kept = next((tmp_path / "cache" / "images").glob("standin-*/wheels"))
    assert not list(kept.glob("tilelang-*")) and not list(kept.glob(".complete-*"))   # the next run downloads again


def test_a_kept_standin_wheel_of_another_content_is_named_not_the_index(tmp_path, monkeypatch):
    """A file of another content left in the folder, its download unfinished (no completion stamp): pip
    would take it as its download, and the index was blamed for it; it is named as the folder's file."""
    tilelang = another_tilelang(tmp_path, monkeypatch)
    wheels = image_base.cache_dir("images", f"standin-cp{image_base.PYTHON.replace('.', '')}-{image_base.machine()}",
                                  "wheels")
    wheels.mkdir(parents=True)
    shutil.copy2(tmp_path / "links" / tilelang, wheels / tilelang)
    with pytest.raises(UserError, match=rf"^{re.escape(str(wheels / tilelang))} has sha256 .*: a damaged or "
                                        "replaced file; delete it and run again"):
        image_base.wheel_context(targets.get("sm_90"))
