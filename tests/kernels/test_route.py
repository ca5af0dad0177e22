"""dsaops.kernels.route: the decode-kernel decision per target, on evidence, and `dsaops kernels route`
(no GPU). The patch's use of it is tests/kernels/test_route_patch.py."""
import ast
import json
import shutil
from pathlib import Path

import pytest
from dsaops.kernels import route

from dsaops import targets
from dsaops.cli import main
from tests.kernels.verdicts import write_verdict

KERNELS = Path(route.__file__).parent
GB10 = {"name": "NVIDIA GB10", "compute_capability": "12.1"}


@pytest.fixture(autouse=True)
def no_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("DSAOPS_CACHE", str(tmp_path / "cache"))
    for name in ("DSAOPS_DECODE", "DSAOPS_FORCE_SGLANG_DECODE"):
        monkeypatch.delenv(name, raising=False)


def route_cli(capsys, *args):
    code = main(["kernels", "route", *args])
    out = capsys.readouterr()
    return code, out.out.strip(), out.err.strip()


@pytest.mark.parametrize(("target", "expected"), [
    ("sm_90", "DSA decode kernel: dsaops for every batch size; reason=measured: measured on an H200"),
    ("sm_121", "DSA decode kernel: sglang for every batch size; reason=not_measured: not measured on GB10"),
    ("gfx942", "DSA decode kernel: sglang for every batch size; reason=no_hip_kernels: no HIP kernels"),
])
def test_each_target_says_its_kernel_and_why(capsys, target, expected):
    code, out, _ = route_cli(capsys, "--target", target)
    assert code == 0 and out.startswith(expected) and out.endswith(f"target={target} heads=64"), out


def test_a_passing_sm121_selftest_turns_dsaops_on(capsys, tmp_path):
    verdict = tmp_path / "v.json"
    write_verdict(verdict, "sm_121", GB10, heads=64, speedups={1: 0.8, 8: 1.2, 64: 1.5})
    code, out, _ = route_cli(capsys, "--target", "sm_121", "--selftest", str(verdict))
    assert code == 0
    assert out.startswith("DSA decode kernel: dsaops for batch sizes >= 8, sglang below; reason=selftest_passed: "
                          "selftest on NVIDIA GB10, 64 heads"), out
    # the server's default place for it is read too
    write_verdict(route.verdict_path(), "sm_121", GB10, heads=64, speedups={1: 1.1})
    assert route_cli(capsys, "--target", "sm_121")[1].startswith("DSA decode kernel: dsaops for every batch size")


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"correct": False}, "reason=selftest_incorrect"),
    ({"speedups": {1: 0.5, 64: 0.9}}, "reason=selftest_slower"),
])
def test_a_failing_selftest_keeps_sglang(capsys, tmp_path, kwargs, reason):
    verdict = tmp_path / "v.json"
    write_verdict(verdict, "sm_121", GB10, heads=64, **({"speedups": {1: 2.0}} | kwargs))
    out = route_cli(capsys, "--target", "sm_121", "--selftest", str(verdict))[1]
    assert out.startswith(f"DSA decode kernel: sglang for every batch size; {reason}"), out


@pytest.mark.parametrize(("change", "why"), [
    ({"heads": 32}, "it measured 32 heads, this server runs 64"),
    ({"kernels": "0" * 64}, "it measured another build of the kernels"),
    ({"target": "sm_90"}, "it was measured on sm_90"),
])
def test_a_verdict_for_something_else_does_not_count(capsys, tmp_path, change, why):
    verdict = tmp_path / "v.json"
    write_verdict(verdict, change.get("target", "sm_121"), GB10, heads=change.get("heads", 64), speedups={1: 2.0},
                  kernels=change.get("kernels"))
    out = route_cli(capsys, "--target", "sm_121", "--selftest", str(verdict))[1]
    assert out.startswith("DSA decode kernel: sglang for every batch size; reason=not_measured") and why in out, out


def test_a_verdict_cannot_turn_on_kernels_that_do_not_exist(capsys, tmp_path):
    verdict = tmp_path / "v.json"
    write_verdict(verdict, "gfx942", {"name": "AMD Instinct MI300X", "compute_capability": "gfx942"}, 64, {1: 9.0})
    assert "reason=no_hip_kernels" in route_cli(capsys, "--target", "gfx942", "--selftest", str(verdict))[1]


@pytest.mark.parametrize(("env", "start"), [
    ({"DSAOPS_DECODE": "sglang"}, "DSA decode kernel: sglang for every batch size; reason=setting: DSAOPS_DECODE=sglang"),
    ({"DSAOPS_FORCE_SGLANG_DECODE": "1"},
     "DSA decode kernel: sglang for every batch size; reason=setting: DSAOPS_FORCE_SGLANG_DECODE=1"),
    ({"DSAOPS_DECODE": "dsaops", "DSAOPS_FORCE_SGLANG_DECODE": "1"},
     "DSA decode kernel: dsaops for every batch size; reason=setting: DSAOPS_DECODE=dsaops"),
    ({"DSAOPS_DECODE": "AUTO"}, "DSA decode kernel: dsaops for every batch size; reason=measured"),
])
def test_the_setting_and_its_alias(capsys, monkeypatch, env, start):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert route_cli(capsys, "--target", "sm_90")[1].startswith(start)


def test_dsaops_asked_for_on_gfx942_still_has_no_kernels(capsys, monkeypatch):
    monkeypatch.setenv("DSAOPS_DECODE", "dsaops")
    assert "reason=no_hip_kernels" in route_cli(capsys, "--target", "gfx942")[1]


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--target", "sm_90"], {"DSAOPS_DECODE": "fast"}, "DSAOPS_DECODE='fast': set it to auto, dsaops or sglang"),
    (["--target", "sm_99"], {}, "unknown target 'sm_99'"),
    (["--target", "sm_90", "--selftest", "/nonexistent/v.json"], {}, "cannot read selftest verdict /nonexistent/v.json"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch, args, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = route_cli(capsys, *args)
    assert code == 2 and out == "" and message in err and len(err.splitlines()) == 1, err


def test_the_heads_move_the_measured_threshold(capsys):
    """decode_preferred (S x H >= 16, the H200 measurements): 8 heads start at batch 2."""
    assert route_cli(capsys, "--target", "sm_90", "--heads", "8")[1].startswith(
        "DSA decode kernel: dsaops for batch sizes >= 2, sglang below; reason=measured")


@pytest.mark.parametrize("broken", [
    "{", "[]", '{"gpu": {}}', "[" * 100_000,
    json.dumps({"gpu": {}, "target": "sm_121", "kernels": "x", "heads": 64, "batch_sizes": [1], "correct": True,
                "speedup": {"1": 2.0}, "decision": {"kernel": "dsaops", "min_batch": 0, "reason": "selftest_passed"}}),
])
def test_a_malformed_verdict_is_refused_by_name_and_ignored_by_the_server(capsys, tmp_path, broken):
    path = tmp_path / "v.json"
    path.write_text(broken)
    code, _, err = route_cli(capsys, "--target", "sm_121", "--selftest", str(path))
    assert code == 2 and str(path) in err
    route.verdict_path().parent.mkdir(parents=True, exist_ok=True)
    route.verdict_path().write_text(broken)  # where the server reads it: ignored, said, and the server starts
    code, out, _ = route_cli(capsys, "--target", "sm_121")
    assert code == 0 and "reason=not_measured" in out and "(verdict ignored: " in out


def test_verdict_decision():
    assert route.verdict_decision(False, {1: 3.0}) == {"kernel": "sglang", "min_batch": None,
                                                       "reason": "selftest_incorrect"}
    assert route.verdict_decision(True, {1: 0.9, 2: 0.99}) == {"kernel": "sglang", "min_batch": None,
                                                              "reason": "selftest_slower"}
    assert route.verdict_decision(True, {1: 0.9, 2: 1.0, 4: 1.3})["min_batch"] == 2
    # a slower batch above faster ones: dsaops only from above it
    assert route.verdict_decision(True, {1: 1.2, 8: 0.9, 64: 1.5})["min_batch"] == 64
    assert route.verdict_decision(True, {1: 1.2, 8: 1.1, 64: 0.9})["reason"] == "selftest_slower"


def test_geometry_takes_only_what_the_kernel_was_built_for():
    ok = (64, 512, 512, 2048, "torch.float8_e4m3fn")
    assert route.geometry_supported(*ok)
    assert not route.geometry_supported(64, 512, 512, 2048, "torch.float8_e4m3fnuz")  # no HIP kernels
    assert not route.geometry_supported(64, 512, 512, 2048, "torch.bfloat16")
    assert not route.geometry_supported(64, 544, 512, 2048, "float8_e4m3fn")


def test_every_table_value_has_a_reason_label():
    for t in targets.table().values():
        assert t.dsaops_decode in ("default", "selftest", "never") and t.decode_evidence
    assert targets.get("sm_90").dsaops_decode == "default" and "BENCHMARKS.md" in targets.get("sm_90").decode_evidence
    assert (Path(__file__).parents[2] / "BENCHMARKS.md").is_file()
    assert targets.get("sm_121").dsaops_decode == "selftest" and targets.get("gfx942").dsaops_decode == "never"


def test_the_kernel_hash_covers_every_decode_source(tmp_path):
    """decode.py and what it imports from dsaops.kernels, transitively, with the CUDA headers: a change to
    any of them changes the hash; the routing itself is not a kernel source."""
    names = {f.name for f in route.kernel_sources()}
    assert {"decode.py", "tiles.py", "pv_registers.cuh"} <= names and "route.py" not in names
    for path in KERNELS.glob("decode*.py"):  # every decode module the dispatch reaches
        text = path.read_text()
        if path.name != "decode.py" and f"import {path.stem}" not in (KERNELS / "decode.py").read_text():
            continue
        assert path.name in names, path.name
        imported = {m for m in ast.walk(ast.parse(text)) if isinstance(m, ast.ImportFrom)
                    and (m.module or "").startswith("dsaops.kernels.")}
        assert {f"{m.module.split('.')[2]}.py" for m in imported} <= names
    copy = tmp_path / "kernels"
    shutil.copytree(KERNELS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert route.kernel_hash(copy) == route.kernel_hash()
    (copy / "route.py").write_text("# another routing rule\n")
    assert route.kernel_hash(copy) == route.kernel_hash()
    imported = min(names - {"decode.py", "pv_registers.cuh"})  # a module decode.py reaches by import
    (copy / imported).write_bytes((KERNELS / imported).read_bytes() + b"\n")
    assert route.kernel_hash(copy) != route.kernel_hash()


def test_the_module_stays_stdlib_at_import():
    import subprocess
    import sys

    code = "import sys, dsaops.kernels.route; print(sorted(m for m in ('torch', 'tilelang', 'triton') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_the_image_build_compiles_nothing_for_rocm_and_says_so_in_one_line(capsys):
    assert main(["kernels", "compile", "--target", "gfx942", "--skip-unsupported"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"dsaops kernels: nothing compiled for gfx942: {targets.get('gfx942').decode_evidence}"]
    assert main(["kernels", "compile", "--target", "gfx942"]) == 2  # asked for by hand: refused, as before
