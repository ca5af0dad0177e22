import json
import subprocess
import sys

import pytest

from dsaops import build_host, targets
from dsaops.cli import main


def test_table_has_the_three_targets_with_their_budgets():
    t = targets.table()
    assert list(t) == ["sm_90", "sm_121", "gfx942"]
    assert t["sm_121"].smem_per_block_bytes == 101376 and t["sm_121"].platform == "linux/arm64"
    assert t["gfx942"].fp8_dtype == "float8_e4m3fnuz" and t["sm_90"].fp8_dtype == "float8_e4m3fn"
    assert t["sm_90"].has("q8_prefill") and not t["sm_121"].has("q8_prefill")
    assert t["sm_90"].tilelang_target == {"kind": "cuda", "arch": "sm_90a"}
    assert t["gfx942"].tilelang_target == {"kind": "hip", "mcpu": "gfx942"}
    assert (t["sm_90"].warp_lanes, t["sm_121"].warp_lanes, t["gfx942"].warp_lanes) == (32, 32, 64)


def test_every_target_can_key_a_cache():
    """The decode caches its compiled kernels and call plans by target (functools.cache): a target
    that cannot be hashed fails the server's first decode, on the GPU only."""
    for t in targets.table().values():
        assert {t: t.name}[t] == t.name


def test_each_targets_platform_is_one_linux_machine_both_ways():
    """Docker's platform and the machine (`uname -m`, a wheel's tag, a binfmt entry) from one table:
    the image's wheel, the stand-in's platform and the emulation check read it."""
    for t in targets.table().values():
        machine = build_host.machine_of(t.platform)
        assert build_host.PLATFORMS[machine] == t.platform
    assert (build_host.machine_of("linux/arm64"), build_host.machine_of("linux/amd64")) == ("aarch64", "x86_64")
    assert build_host.machine_of("linux/riscv64") == "riscv64"


def test_compute_capability_maps_back_to_a_target():
    assert targets.by_compute_capability("12.1").name == "sm_121"
    assert targets.by_compute_capability("9.0 ").name == "sm_90"
    assert targets.by_compute_capability("8.0") is None


def test_unknown_target_lists_the_valid_ones(capsys):
    assert main(["targets", "sm_80"]) == 2
    err = capsys.readouterr().err
    assert "sm_80" in err and "sm_90, sm_121, gfx942" in err


def test_cli_json_and_field(capsys):
    assert main(["targets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sm_90"]["smem_per_block_bytes"] == 232448
    assert main(["targets", "sm_121", "--field", "platform"]) == 0
    assert capsys.readouterr().out.strip() == "linux/arm64"
    assert main(["targets", "sm_121", "--field", "nope"]) == 2


@pytest.mark.parametrize("argv", [["targets", ""], ["targets", "sm_90", "--field", ""], ["targets", "--field", ""]])
def test_an_empty_name_or_field_is_refused_not_ignored(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err


def test_console_script_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "dsaops", "targets"], capture_output=True, text=True, check=True).stdout
    assert "sm_121" in out and "101376" in out


@pytest.mark.parametrize("area", ["kernels", "healthchecks", "sglang_patches"])
def test_project_folders_live_under_dsaops_not_top_level(area):
    import importlib
    import pathlib

    mod = importlib.import_module(f"dsaops.{area}")
    assert pathlib.Path(mod.__file__).parent.name == area
    # PyPI's `kernels` (an SGLang dependency) stays importable under its own name
    code = f"import dsaops.{area}, importlib.util as u; s = u.find_spec('kernels'); print(s and s.origin)"
    origin = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True).stdout
    assert origin.strip() != mod.__file__


def test_a_gpu_maps_to_its_target_by_its_properties():
    from types import SimpleNamespace as P

    assert targets.for_gpu(P(major=9, minor=0), hip=False).name == "sm_90"
    assert targets.for_gpu(P(major=12, minor=1), hip=False).name == "sm_121"
    assert targets.for_gpu(P(gcnArchName="gfx942:sramecc+:xnack-"), hip=True).name == "gfx942"
    assert targets.for_gpu(P(gcnArchName="gfx90a:sramecc+:xnack-"), hip=True) is None
    assert targets.for_gpu(P(major=8, minor=0), hip=False) is None
