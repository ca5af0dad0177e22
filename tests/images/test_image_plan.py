"""`make image-plan` / `dsaops image plan|build`: the exact build command, from the targets table."""
from __future__ import annotations

import itertools
import os
import shlex
import subprocess
import sys
import tomllib
import zipfile

import pytest
from dsaops.sglang_patches.series import load

from dsaops import image_base, pins, targets
from dsaops.errors import UserError
from dsaops.image import build_wheel, dockerfile_args, plan, render, sglang_wheel_for, stage_context
from dsaops.pins import SGLANG as SGLANG_PIN
from tests.images.docker_build import REPO, copy_sources
from tests.images.test_sglang_wheel_option import make_wheel

TABLE = tomllib.loads((REPO / "dsaops" / "targets.toml").read_text())


def make_plan(*assignments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "image-plan", *assignments], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


def commands(output: str) -> list[list[str]]:
    """The shell commands a plan prints (comment lines dropped, continuation lines joined)."""
    text = "\n".join(line for line in output.splitlines() if not line.startswith("#"))
    return [shlex.split(cmd) for cmd in text.replace("\\\n", " ").splitlines() if cmd.strip()]


def options(cmd: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """({--option: value}, {BUILD_ARG: value}) of one build command."""
    opts, build_args = {}, {}
    for flag, value in itertools.pairwise(cmd):
        if flag == "--build-arg":
            key, _, val = value.partition("=")
            build_args[key] = val
        elif flag.startswith("--") and not value.startswith("--"):
            opts[flag] = value
    return opts, build_args


@pytest.mark.parametrize("name", sorted(TABLE))
def test_plan_has_the_targets_platform_base_and_arguments(name):
    row = TABLE[name]
    base = row["base_image"].format(sglang=SGLANG_PIN)   # the table's `{sglang}`: the pin
    out = make_plan(f"ARCH={name}")
    assert out.returncode == 0, out.stderr
    [cmd] = commands(out.stdout)
    assert cmd[:3] == ["docker", "buildx", "build"] or cmd[:4] == ["env", "DOCKER_BUILDKIT=1", "docker", "build"]
    opts, args = options(cmd)
    assert opts["--platform"] == row["platform"]
    assert opts["--file"] == str(REPO / "images" / "Dockerfile")
    assert opts["--target"] == "runtime"
    assert opts["--tag"] == f"dsaops/sglang:{SGLANG_PIN}-{name}"
    assert cmd[-1] == str(REPO / "images" / "context")
    assert args["BASE_IMAGE"] == base
    assert args["BASE_CARRIES_SGLANG"] == str(row["base_carries_sglang"]).lower()
    assert args["TORCH_CUDA_ARCH_LIST"] == row["torch_cuda_arch_list"]
    assert args["PYTORCH_ROCM_ARCH"] == (row["gpu_arch"] if row["vendor"] == "amd" else "")
    assert args["FP8_DTYPE"] == row["fp8_dtype"]
    assert args["DSAOPS_TARGET"] == name
    assert args["SGLANG_VERSION"] == SGLANG_PIN
    assert args["PATCH_SERIES_SHA256"] == load().sha256
    assert f"#   base      {base}" in out.stdout
    assert not any("TOKEN" in key or "SECRET" in key for key in args)


def test_every_build_argument_is_declared_in_the_dockerfile():
    _, args = options(commands(make_plan("ARCH=sm_90").stdout)[0])
    assert set(args) <= set(dockerfile_args()), set(args) - set(dockerfile_args())


def test_tag_registry_and_push():
    out = make_plan("ARCH=sm_121", "TAG=nightly", "REGISTRY=registry.example.com/team/", "PUSH=1")
    assert out.returncode == 0, out.stderr
    build, *rest = commands(out.stdout)
    image = "registry.example.com/team/dsaops/sglang:nightly"
    assert options(build)[0]["--tag"] == image
    if build[:2] == ["docker", "buildx"]:
        assert "--push" in build and not rest
    else:
        assert rest == [["docker", "push", image]]


def test_buildx_pushes_or_loads_in_one_command():
    def plan(*extra):
        out = subprocess.run([sys.executable, "-m", "dsaops", "image", "plan", "--arch", "gfx942", "--builder", "buildx",
                              *extra], cwd=REPO, capture_output=True, text=True, check=True)
        return commands(out.stdout)

    [load_cmd] = plan()
    assert load_cmd[:3] == ["docker", "buildx", "build"] and "--load" in load_cmd and "--push" not in load_cmd
    [push_cmd] = plan("--push", "--registry", "r.example/x")
    assert "--push" in push_cmd and "--load" not in push_cmd


def test_cross_platform_build_says_to_build_natively():
    host = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}[os.uname().machine]
    for name, row in TABLE.items():
        out = make_plan(f"ARCH={name}").stdout
        assert ("QEMU" in out) == (row["platform"] != host), name
    if host == "linux/amd64":
        assert "on the DGX Spark itself" in make_plan("ARCH=sm_121").stdout


@pytest.mark.parametrize("name", sorted(TABLE))
def test_a_standin_plan_builds_offline_for_this_machine_with_the_targets_arguments(name):
    """BASE=standin: the stand-in base (dsaops image base), this machine's platform (sm_121's kernels still
    compile for sm_121a: its arguments stay), RUN steps without network, a tag that says stand-in."""
    host = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}[os.uname().machine]
    out = make_plan(f"ARCH={name}", "BASE=standin")
    assert out.returncode == 0, out.stderr
    [cmd] = commands(out.stdout)
    opts, args = options(cmd)
    assert opts["--platform"] == host and "--network" in cmd and opts["--network"] == "none"
    assert opts["--tag"] == f"dsaops/sglang:{SGLANG_PIN}-{name}-standin"
    kind = "rocm" if TABLE[name]["vendor"] == "amd" else "nvidia"
    assert args["BASE_IMAGE"] == f"dsaops-standin/base:{kind}" and args["SGLANG_DEPS"] == "none"
    assert args["DSAOPS_TARGET"] == name and args["TORCH_CUDA_ARCH_LIST"] == TABLE[name]["torch_cuda_arch_list"]
    assert "QEMU" not in out.stdout and f"#   base      dsaops-standin/base:{kind}" in out.stdout


def test_make_lists_the_standin_base():
    out = subprocess.run(["make", "--no-print-directory"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "make image-base" in out and "BASE=standin" in out


@pytest.mark.parametrize(("assignments", "message"), [
    (["ARCH=sm_80"], "unknown target 'sm_80'; valid targets: sm_90, sm_121, gfx942"),
    ([], "ARCH= (--arch) is required; valid targets: sm_90, sm_121, gfx942"),
    (["ARCH=sm_90", "PUSH=1"], "PUSH=1 needs REGISTRY="),
    (["ARCH=sm_90", "TAG=bad tag!"], "--tag (TAG=) 'bad tag!' is not a Docker tag: use at most 128 letters"),
    (["ARCH=sm_90", "TAG=.hidden"], "--tag (TAG=) '.hidden' is not a Docker tag"),
    (["ARCH=sm_90", "REGISTRY=Bad Registry"], "--registry (REGISTRY=) 'Bad Registry' is not a registry prefix"),
    (["ARCH=sm_90", "REGISTRY=r.example/team:1"], "use lowercase HOST[:PORT][/NAMESPACE]"),
])
def test_bad_input_fails_with_what_to_change(assignments, message):
    out = make_plan(*assignments)
    assert out.returncode != 0
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not commands(out.stdout)


@pytest.mark.parametrize("bad", ["=x", "NOEQUALS", "1ARG=x", "BAD NAME=x"])
def test_a_build_arg_without_a_name_is_refused(bad, capsys):
    from dsaops.cli import main

    assert main(["image", "plan", "--arch", "sm_90", "--build-arg", "GOOD=1", "--build-arg", bad]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"dsaops image: --build-arg takes KEY=VALUE, KEY of letters, digits and '_' not starting "
                            f"with a digit; not {bad!r}\n") and not captured.out


@pytest.mark.parametrize(("arg", "message"), [
    ("SGLANG_DEP=none", ("--build-arg SGLANG_DEP: images/Dockerfile takes no such argument; check the spelling (it "
                         "takes BASE_IMAGE, BASE_CARRIES_SGLANG, SYSTEM_PACKAGES, SGLANG_VERSION, SGLANG_DEPS, ")),
    ("SGLANG_DEPS=pip", "--build-arg SGLANG_DEPS takes pypi or none, not 'pip'"),
    # the Dockerfile tests for "true" alone, so "yes" would build with a wheel the host never staged
    ("BASE_CARRIES_SGLANG=yes", "--build-arg BASE_CARRIES_SGLANG takes true or false, not 'yes'"),
])
def test_a_build_arg_the_dockerfile_cannot_use_is_refused_before_building(tmp_path, arg, message):
    """Docker would only warn about the misspelt name, and reject the bad value after building a stage."""
    context = tmp_path / "context"
    out = subprocess.run([sys.executable, "-m", "dsaops", "image", "build", "--arch", "sm_90", "--context", str(context),
                          "--build-arg", arg], cwd=REPO, env=os.environ | {"DOCKER_HOST": f"unix://{tmp_path}/no.sock"},
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2
    assert out.stderr.startswith(f"dsaops image: {message}") and out.stderr.count("\n") == 1, out.stderr
    assert not context.exists()


def test_the_targets_table_is_the_only_source(tmp_path):
    """Change a base in a copy's table: the copy's plan follows it (no second copy of the fact)."""
    source = copy_sources(tmp_path / "src")
    table = source / "dsaops" / "targets.toml"
    table.write_text(table.read_text().replace(TABLE["sm_90"]["base_image"], "example.org/other/base:1", 1))
    out = subprocess.run([sys.executable, "-m", "dsaops", "image", "plan", "--arch", "sm_90"], cwd=source,
                         env=os.environ | {"PYTHONPATH": str(source)}, capture_output=True, text=True, check=True)
    assert options(commands(out.stdout)[0])[1]["BASE_IMAGE"] == "example.org/other/base:1"


def test_no_docker_engine_is_a_clear_error_and_stages_nothing(tmp_path):
    context = tmp_path / "context"
    out = subprocess.run([sys.executable, "-m", "dsaops", "image", "build", "--arch", "sm_90", "--context", str(context)],
                         cwd=REPO, env=os.environ | {"DOCKER_HOST": f"unix://{tmp_path}/no.sock"}, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 2
    assert f"no Docker engine answers at unix://{tmp_path}/no.sock" in out.stderr
    assert "nothing was built" in out.stderr and "Traceback" not in out.stderr
    assert not context.exists()


def test_no_docker_command_says_to_install_docker(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    out = subprocess.run([str(bindir / "python3"), "-m", "dsaops", "image", "build", "--arch", "sm_90"], cwd=REPO,
                         env=os.environ | {"PATH": str(bindir)}, capture_output=True, text=True, check=False)
    assert out.returncode == 2
    assert "no `docker` command here: install Docker Engine" in out.stderr


def test_dsaops_wheel_comes_from_the_sources_and_is_reproducible(tmp_path):
    """The wheel in the context: the package data the image needs, byte-identical across builds."""
    first = build_wheel(tmp_path / "a")
    second = build_wheel(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()  # same sources -> Docker's layer cache holds
    names = zipfile.ZipFile(first).namelist()
    assert "dsaops/sglang_patches/series" in names
    assert all(f"dsaops/sglang_patches/{p.name}" in names for p in load().patches)
    assert "dsaops/kernels/pv_registers.cuh" in names  # read by the Hopper decode kernel's compile
    assert not any(n.startswith(("tests/", "images/")) for n in names)


def test_unknown_stage_is_refused():
    out = subprocess.run([sys.executable, "-m", "dsaops", "image", "plan", "--arch", "sm_90", "--stage", "nope"],
                         cwd=REPO, capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "invalid choice: 'nope'" in out.stderr


def test_makefile_fragment_is_listed_by_make_help():
    out = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert "make image " in out and "make image-plan" in out



def test_a_context_folder_with_other_files_is_refused_and_kept(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "sglang").mkdir()
    with pytest.raises(UserError, match=r"holds other things \(notes.txt\)"):
        stage_context(tmp_path, None)
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "sglang").is_dir()


def test_the_sglang_pin_is_the_only_source(tmp_path):
    """Change the pin in a copy's dsaops/pins.toml: the copy's tag, SGLANG_VERSION and ROCm base follow it."""
    source = copy_sources(tmp_path / "src")
    pins = source / "dsaops" / "pins.toml"
    pins.write_text(pins.read_text().replace(f'sglang = "{SGLANG_PIN}"', 'sglang = "9.8.7"', 1))
    for name, base in (("sm_90", TABLE["sm_90"]["base_image"]), ("gfx942", "lmsysorg/sglang:v9.8.7-rocm10-mi30x")):
        out = subprocess.run([sys.executable, "-m", "dsaops", "image", "plan", "--arch", name], cwd=source,
                             env=os.environ | {"PYTHONPATH": str(source)}, capture_output=True, text=True, check=True)
        opts, args = options(commands(out.stdout)[0])
        assert (opts["--tag"], args["SGLANG_VERSION"], args["BASE_IMAGE"]) == (f"dsaops/sglang:9.8.7-{name}", "9.8.7", base)


@pytest.mark.parametrize(("origin", "label"), [
    ("https://ci:ghp_0123456789abcdef@git.example.com/team/dsaops.git", "https://git.example.com/team/dsaops.git"),
    ("ssh://deploy@git.example.com:2222/team/dsaops.git", "ssh://git.example.com:2222/team/dsaops.git"),
    ("git@git.example.com:team/dsaops.git", "git@git.example.com:team/dsaops.git"),
])
def test_the_source_label_carries_no_credentials_of_the_clone(tmp_path, origin, label):
    """A clone made with a token in its URL: the image's source label (public with the image) drops it."""
    source = copy_sources(tmp_path / "src")
    subprocess.run(["git", "-C", str(source), "remote", "add", "origin", origin], check=True)
    out = subprocess.run([sys.executable, "-m", "dsaops", "image", "plan", "--arch", "sm_90"], cwd=source,
                         env=os.environ | {"PYTHONPATH": str(source)}, capture_output=True, text=True, check=True)
    assert options(commands(out.stdout)[0])[1]["SOURCE_URL"] == label
    assert "ghp_" not in out.stdout


@pytest.mark.parametrize("name", ["sm_90", "sm_121"])
def test_a_standin_plan_names_the_wheel_its_build_takes(name, tmp_path, monkeypatch):
    """The stand-in base's Python (3.11), not the target's (3.12): the plan, the serving build and the base
    itself take the same SGLang wheel."""
    machine = {"arm64": "aarch64"}.get(os.uname().machine, os.uname().machine)
    monkeypatch.setenv("DSAOPS_CACHE", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    for python in ("cp311", "cp312"):
        made = make_wheel(tmp_path / "wheels", f"sglang-{SGLANG_PIN}-{python}-{python}-manylinux_2_34_{machine}.whl")
        monkeypatch.setitem(pins.SHA256, made.name, pins.sha256(made))   # as pins.toml pins PyPI's
    p = plan(name, standin=True)
    staged = sglang_wheel_for(p.target, SGLANG_PIN)   # what `dsaops image build --base standin` stages
    assert staged == image_base.sglang_wheel(targets.get(name)) and staged.name.split("-")[2] == "cp311"
    assert f"sglang/ (the sglang cp311 {machine} wheel)" in render(p)
