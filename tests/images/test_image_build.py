"""Real `docker build`s of every stage of the Dockerfile, for the three targets' arguments, on the
stand-in bases (conftest.py), through `dsaops image build --base standin`: the offline route, no RUN
step with network. sm_121 is built as linux/amd64 with its own arguments (its kernels compiled for
sm_121a); its arm64 image is built on a Spark.

The built runtime images then run their entrypoint with a stand-in SGLang (standin_server.py): the
exporter answers /metrics, and Docker's HEALTHCHECK goes healthy, then unhealthy when a rank is
SIGKILLed. Patch-stage refusals (a hunk that does not apply, a mislabelled series, a base without
SGLang where one is expected) stop the build by name.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dsaops.sglang_patches.series import load

from dsaops import targets
from dsaops.pins import SGLANG as SGLANG_PIN
from tests.images.docker_build import REPO, copy_sources, docker

HERE = Path(__file__).parent
# sm_90 first: sm_121 reuses its python -> app stages (same base and arguments up to `kernels`)
TARGETS = ("sm_90", "sm_121", "gfx942")


def image_build(env: dict, source: Path, context: Path, tag: str, *build_args: str, arch: str = "sm_90",
                stage: str = "runtime"):
    cmd = [sys.executable, "-m", "dsaops", "image", "build", "--arch", arch, "--base", "standin", "--stage", stage,
           "--context", str(context), "--tag", tag]
    for arg in build_args:
        cmd += ["--build-arg", arg]
    return subprocess.run(cmd, cwd=source, env=env | {"PYTHONPATH": str(source)}, capture_output=True, text=True,
                          timeout=1800, check=False)


@pytest.fixture(scope="module")
def built(dockerd, standin_bases, tmp_path_factory):
    """Each target's runtime image, built once (on first use) from every stage: {target: (tag, build log)}."""
    images = {}

    def build(name):
        if name not in images:
            for earlier in TARGETS[:TARGETS.index(name)]:
                build(earlier)  # in TARGETS' order, so the shared stages are built once
            out = image_build(dockerd, REPO, tmp_path_factory.mktemp(f"context-{name}"), f"ci-{name}", arch=name)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
            images[name] = (f"dsaops/sglang:ci-{name}", out.stdout + out.stderr)
        return images[name]
    return build


def run_in(env, image, *command):
    return docker(env, "run", "--rm", "--network", "none", image, *command).stdout


@pytest.mark.parametrize("name", TARGETS)
def test_every_stage_builds(dockerd, built, name):
    image, log = built(name)
    for stage in ("python", "engine", "patched", "app", "kernels", "runtime"):
        assert f"[{stage} " in log, f"stage {stage} did not run for {name}"
    config = json.loads(docker(dockerd, "image", "inspect", image).stdout)[0]["Config"]
    target = targets.get(name)
    assert config["Labels"]["dsaops.target"] == name and config["Labels"]["dsaops.fp8-dtype"] == target.fp8_dtype
    assert config["Labels"]["dsaops.patch-series.sha256"] == load().sha256
    assert config["Labels"]["sglang.version"] == SGLANG_PIN
    assert run_in(dockerd, image, "dsaops", "patches", "status").strip() == f"applied: series sha256 {load().sha256}"


@pytest.mark.parametrize("name", ["sm_90", "sm_121"])
def test_nvidia_kernels_are_compiled_for_the_target(dockerd, built, name):
    image, log = built(name)
    budget = f"{targets.get(name).smem_per_block_bytes:,}"
    table = [line for line in log.splitlines() if line.rstrip().endswith(" yes") and budget in line]
    assert len(table) >= 10, log[-3000:]  # one row a configuration, each within this target's budget
    compiled = run_in(dockerd, image, "sh", "-c", "find /opt/dsaops/tilelang-cache -name '*.cubin' | wc -l")
    assert int(compiled) > 0


def test_rocm_compiles_nothing_and_says_so_in_one_line(dockerd, built):
    _, log = built("gfx942")
    said = [line for line in log.splitlines() if "nothing compiled for gfx942" in line]
    assert len(said) == 1 and "no HIP kernels" in said[0]


@pytest.mark.parametrize(("name", "kernel"), [("sm_90", "dsaops"), ("sm_121", "sglang"), ("gfx942", "sglang")])
def test_the_image_routes_as_its_target_says(dockerd, built, name, kernel):
    image, _ = built(name)
    line = run_in(dockerd, image, "dsaops", "kernels", "route", "--target", name)
    assert line.startswith(f"DSA decode kernel: {kernel} for every batch size; reason="), line


@pytest.mark.parametrize("name", TARGETS)
def test_entrypoint_exporter_and_health_check_in_the_image(dockerd, built, name):
    """Two stand-in ranks (--tp 2) on a worker-like server (/health always 200): healthy, /metrics answered;
    one rank SIGKILLed: Docker's HEALTHCHECK turns the container unhealthy."""
    image, _ = built(name)
    container = f"ci-health-{name}"
    docker(dockerd, "rm", "-f", container, check=False)
    docker(dockerd, "run", "-d", "--name", container, "--network", "none",
           "-v", f"{HERE / 'standin_server.py'}:/standin/standin_server.py:ro",
           "-e", "PYTHONPATH=/standin", "-e", "DSAOPS_SERVER_MODULE=standin_server", "-e", "STANDIN_SERVE=1",
           "--health-interval", "1s", "--health-timeout", "10s", "--health-retries", "1", "--health-start-period", "1s",
           image, "--model-path", "/models/x", "--tp", "2")
    try:
        assert health(dockerd, container, "healthy"), logs(dockerd, container)
        assert run_exec(dockerd, container, "cat", "/run/dsaops/healthcheck.args") == "--expect-ranks 2\n"
        metrics = run_exec(dockerd, container, "python3", "-c", "import urllib.request as u; print(u.urlopen("
                           "'http://127.0.0.1:9860/metrics', timeout=5).read().decode())")
        assert 'dsa_server_up{node="' in metrics and "dsa_host_memory_available_bytes" in metrics
        ranks = run_exec(dockerd, container, "sh", "-c", "grep -o 'pids=.*' /var/log/dsaops/sglang.log")
        run_exec(dockerd, container, "sh", "-c", f"kill -9 {ranks.strip().split('=')[1].split(',')[-1]}")
        assert health(dockerd, container, "unhealthy"), logs(dockerd, container)
        last = json.loads(docker(dockerd, "inspect", "--format", "{{json .State.Health}}", container).stdout)["Log"][-1]
        assert "1 of 2 scheduler ranks alive on this node (TP0)" in last["Output"]
    finally:
        docker(dockerd, "rm", "-f", container, check=False)


def run_exec(env, container, *command):
    return docker(env, "exec", container, *command).stdout


def logs(env, container):
    out = docker(env, "logs", container, check=False)
    return out.stdout[-2000:] + out.stderr[-2000:]


def health(env, container, status, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker(env, "inspect", "--format", "{{.State.Health.Status}}", container).stdout.strip() == status:
            return True
        time.sleep(0.5)
    return False


def test_docker_stop_reaches_the_server_through_the_entrypoint(dockerd, built, tmp_path):
    """The entrypoint as PID 1 of the built image: `docker stop` is a clean server shutdown."""
    image, _ = built("sm_90")
    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    uid = targets.get("sm_90").image_uid
    os.chown(logs_dir, uid, uid)           # as the playbooks give the node's log folder to the image's user
    name = "ci-entrypoint"
    docker(dockerd, "run", "-d", "--name", name, "--network", "none",
           "-v", f"{HERE / 'standin_server.py'}:/standin/standin_server.py:ro", "-v", f"{logs_dir}:/var/log/dsaops",
           "-e", "PYTHONPATH=/standin", "-e", "DSAOPS_SERVER_MODULE=standin_server", "-e", "DSAOPS_EXPORTER=0",
           image, "--model-path", "/models/x")
    try:
        docker(dockerd, "exec", name, "sh", "-c", "for i in $(seq 300); do grep -q standin /var/log/dsaops/sglang.log "
               "2>/dev/null && exit 0; sleep 0.1; done; exit 1")
        docker(dockerd, "stop", "-t", "30", name)
        state = json.loads(docker(dockerd, "inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, docker(dockerd, "logs", name).stderr
        text = (logs_dir / "sglang.log").read_text()
        assert "args=--model-path /models/x --port 30000" in text
        assert "standin on stderr" in text and "SIGTERM received" in text
        assert "SIGTERM received" in docker(dockerd, "logs", name).stdout  # docker logs shows it too
    finally:
        docker(dockerd, "rm", "-f", name, check=False)


@pytest.mark.parametrize("name", TARGETS)
def test_the_server_runs_as_the_targets_user(dockerd, built, name):
    """The image's user is the targets table's image_uid (not root on NVIDIA), and owns what it writes."""
    image, _ = built(name)
    uid = targets.get(name).image_uid
    config = json.loads(docker(dockerd, "image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == str(uid)
    owners = run_in(dockerd, image, "stat", "-c", "%u", "/var/log/dsaops", "/var/cache/dsaops", "/run/dsaops",
                    "/opt/dsaops/tilelang-cache").split()
    assert run_in(dockerd, image, "id", "-u").strip() == str(uid) and set(owners) == {str(uid)}
    if uid:
        assert run_in(dockerd, image, "sh", "-c", "echo $HOME").strip() == "/home/dsaops"


def test_labels_carry_no_secret(dockerd, built):
    image, _ = built("sm_90")
    config = json.loads(docker(dockerd, "image", "inspect", image).stdout)[0]["Config"]
    history = docker(dockerd, "history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    for secret in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        assert secret not in history and not any(e.startswith(secret) for e in config["Env"] or [])


def test_a_patch_that_does_not_apply_fails_the_build_naming_file_and_hunk(dockerd, built, tmp_path):
    built("sm_90")  # its stages up to `engine` are cached: this build redoes `patched` only
    source = copy_sources(tmp_path / "src")
    series = load()
    patch, target = series.patches[0], series.patches[0].files[0]
    path = source / "sglang_patches" / patch.name
    text = path.read_text()
    # Alter one line the first hunk expects in the pinned sglang: the patch no longer matches the file.
    hunk = target.hunks[0]
    marked = [("-" if line not in hunk.new else " ") + line for line in hunk.old if line.strip()]
    expected = next(m for m in marked if text.count(m) == 1)
    path.write_text(text.replace(expected, expected.rstrip("\n") + "  # altered\n"))
    out = image_build(dockerd, source, tmp_path / "context", "ci-broken", stage="patched")
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"dsaops patches apply: {patch.name}: {target.path}: hunk #1" in log, log[-4000:]
    assert docker(dockerd, "image", "inspect", "dsaops/sglang:ci-broken", check=False).returncode != 0


def test_the_label_cannot_claim_another_series(dockerd, built, tmp_path):
    built("sm_90")
    out = image_build(dockerd, REPO, tmp_path / "context", "ci-mislabelled", "PATCH_SERIES_SHA256=" + "0" * 64,
                      stage="patched")
    assert out.returncode != 0
    assert f"the build expected series sha256 '{'0' * 64}'" in out.stdout + out.stderr
    assert docker(dockerd, "image", "inspect", "dsaops/sglang:ci-mislabelled", check=False).returncode != 0


def test_gfx942_takes_sglang_from_its_base(dockerd, standin_bases, built, tmp_path):
    """The ROCm base carries SGLang: no wheel goes into the context; a base without it is refused by name."""
    built("gfx942")
    context = tmp_path / "context"
    out = image_build(dockerd, REPO, context, "ci-nosglang", f"BASE_IMAGE={standin_bases['sm_90']}", arch="gfx942",
                      stage="engine")
    assert out.returncode != 0
    assert "no SGLang in this image: the base must carry it" in out.stdout + out.stderr
    assert not list((context / "sglang").iterdir())  # no SGLang wheel went into the context
