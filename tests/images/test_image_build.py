"""A real `docker build` of the Dockerfile's target-independent stages (python, engine, patched)
on a locally made Debian base, through `dsaops image build --stage patched --offline`: no RUN
step has network, the wheels come from the build context.

What a real target adds on top (PyPI dependencies, nvcc kernels) cannot be built here: the
CUDA and ROCm bases cannot be pulled (no registry).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dsaops.sglang_patches.series import load

from dsaops.pins import SGLANG as SGLANG_PIN
from tests.images.docker_build import REPO, copy_sources, docker
from tests.support.sglang_wheel import sglang_wheel

# sm_90 is linux/amd64 like this machine, and installs the SGLang wheel (gfx942's base carries it).
TARGET = "sm_90"
OFFLINE_BASE_ARGS = ("SYSTEM_PACKAGES=python3 python3-venv", "SGLANG_DEPS=none")


def image_build(env: dict, source: Path, context: Path, tag: str, base: str, *build_args: str,
                arch: str = TARGET, stage: str = "patched"):
    cmd = [sys.executable, "-m", "dsaops", "image", "build", "--arch", arch, "--stage", stage, "--offline",
           "--context", str(context), "--tag", tag, "--sglang-wheel", str(sglang_wheel()),
           "--build-arg", f"BASE_IMAGE={base}"]
    for arg in (*OFFLINE_BASE_ARGS, *build_args):
        cmd += ["--build-arg", arg]
    return subprocess.run(cmd, cwd=source, env=env | {"PYTHONPATH": str(source)}, capture_output=True, text=True,
                          timeout=1200, check=False)


@pytest.fixture(scope="module")
def patched(dockerd, local_base, tmp_path_factory):
    out = image_build(dockerd, REPO, tmp_path_factory.mktemp("context"), "ci-patched", local_base)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return "dsaops/sglang:ci-patched"


def test_patch_stage_applied_the_series_inside_the_image(dockerd, patched):
    run = docker(dockerd, "run", "--rm", "--network", "none", patched, "sh", "-c", "dsaops patches status && "
                 "python3 -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'")
    assert run.stdout.splitlines() == [f"applied: series sha256 {load().sha256}", SGLANG_PIN]


def test_labels_carry_the_series_hash_and_no_secret(dockerd, patched):
    config = json.loads(docker(dockerd, "image", "inspect", patched).stdout)[0]["Config"]
    assert config["Labels"]["dsaops.patch-series.sha256"] == load().sha256
    assert config["Labels"]["sglang.version"] == SGLANG_PIN
    history = docker(dockerd, "history", "--no-trunc", "--format", "{{.CreatedBy}}", patched).stdout
    for secret in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        assert secret not in history and not any(e.startswith(secret) for e in config["Env"] or [])


def test_a_patch_that_does_not_apply_fails_the_build_naming_file_and_hunk(dockerd, local_base, patched, tmp_path):
    source = copy_sources(tmp_path / "src")
    series = load()
    patch, target = series.patches[0], series.patches[0].files[0]
    path = source / "sglang_patches" / patch.name
    text = path.read_text()
    # Alter one line the first hunk expects in sglang 0.5.23: the patch no longer matches the file.
    hunk = target.hunks[0]
    marked = [("-" if line not in hunk.new else " ") + line for line in hunk.old if line.strip()]
    expected = next(m for m in marked if text.count(m) == 1)
    path.write_text(text.replace(expected, expected.rstrip("\n") + "  # altered\n"))
    out = image_build(dockerd, source, tmp_path / "context", "ci-broken", local_base)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"dsaops patches apply: {patch.name}: {target.path}: hunk #1" in log, log[-4000:]
    assert docker(dockerd, "image", "inspect", "dsaops/sglang:ci-broken", check=False).returncode != 0


def test_the_label_cannot_claim_another_series(dockerd, local_base, patched, tmp_path):
    out = image_build(dockerd, REPO, tmp_path / "context", "ci-mislabelled", local_base,
                      "PATCH_SERIES_SHA256=" + "0" * 64)
    assert out.returncode != 0
    assert f"the build expected series sha256 '{'0' * 64}'" in out.stdout + out.stderr
    assert docker(dockerd, "image", "inspect", "dsaops/sglang:ci-mislabelled", check=False).returncode != 0


def test_docker_stop_reaches_the_server_through_the_entrypoint(dockerd, patched, tmp_path):
    """The entrypoint as PID 1 of a real container: `docker stop` is a clean server shutdown."""
    logs = tmp_path / "logs"
    logs.mkdir()
    name = "ci-entrypoint"
    here = Path(__file__).parent
    docker(dockerd, "run", "-d", "--name", name, "--network", "none",
           "-v", f"{REPO / 'images' / 'entrypoint.sh'}:/usr/local/bin/dsaops-entrypoint:ro",
           "-v", f"{here / 'standin_server.py'}:/standin/standin_server.py:ro", "-v", f"{logs}:/var/log/dsaops",
           "-e", "PYTHONPATH=/standin", "-e", "DSAOPS_SERVER_MODULE=standin_server", "-e", "DSAOPS_EXPORTER=0",
           "--entrypoint", "/usr/local/bin/dsaops-entrypoint", patched, "--model-path", "/models/x")
    try:
        log = logs / "sglang.log"
        docker(dockerd, "exec", name, "sh", "-c", "for i in $(seq 300); do grep -q standin /var/log/dsaops/sglang.log "
               "2>/dev/null && exit 0; sleep 0.1; done; exit 1")
        docker(dockerd, "stop", "-t", "30", name)
        state = json.loads(docker(dockerd, "inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, docker(dockerd, "logs", name).stderr
        text = log.read_text()
        assert "args=--model-path /models/x --port 30000" in text
        assert "standin on stderr" in text and "SIGTERM received" in text
        assert "SIGTERM received" in docker(dockerd, "logs", name).stdout  # docker logs shows it too
    finally:
        docker(dockerd, "rm", "-f", name, check=False)


def test_a_base_that_carries_sglang_is_patched_in_place(dockerd, local_base, patched, tmp_path):
    """gfx942's path (the ROCm base ships SGLang): here the `engine` stage built above stands in for that base."""
    out = image_build(dockerd, REPO, tmp_path / "c1", "ci-engine", local_base, stage="engine")
    assert out.returncode == 0, out.stderr[-3000:]
    out = image_build(dockerd, REPO, tmp_path / "c2", "ci-carried", "dsaops/sglang:ci-engine", arch="gfx942")
    assert out.returncode == 0, out.stderr[-3000:]
    # Succeeding means `dsaops patches status` inside said applied with this hash (the mislabel test shows
    # that check failing the build), which is what the label then carries.
    labels = json.loads(docker(dockerd, "image", "inspect", "dsaops/sglang:ci-carried").stdout)[0]["Config"]["Labels"]
    assert labels["dsaops.patch-series.sha256"] == load().sha256
    assert not list((tmp_path / "c2" / "sglang").iterdir())  # no SGLang wheel went into the context


def test_a_base_without_sglang_is_refused_where_the_target_expects_one(dockerd, local_base, tmp_path):
    out = image_build(dockerd, REPO, tmp_path / "context", "ci-nosglang", local_base, arch="gfx942")
    assert out.returncode != 0
    assert "no SGLang in this image: the base must carry it" in out.stdout + out.stderr
