"""dsaops/image_base.py without an engine: what the stand-in bases carry and how the serving build
uses them (the builds themselves: test_image_build.py)."""
from __future__ import annotations

import tomllib

from dsaops import image_base, pins, targets
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
