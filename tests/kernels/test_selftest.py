"""`dsaops kernels selftest` without a GPU: SGLang's captured batch sizes pinned to the wheel, the
measurement loop with stand-in kernels and timer (the planted wrong kernel fails the check and keeps
SGLang's kernel), the verdict the routing reads, and the command's refusals. The GPU run is
tests/kernels/test_selftest_gpu.py."""
import ast
import json
import os
import stat

import pytest

torch = pytest.importorskip("torch")

from dsaops.kernels import accuracy, reference, route, selftest

from dsaops import targets
from dsaops.cli import main
from tests.support import sglang_definitions

SLOTS = 4096
GB10 = {"name": "NVIDIA GB10", "compute_capability": "12.1"}


def test_capture_batch_sizes_are_sglangs():
    hook = sglang_definitions.source_file("srt/arg_groups/cuda_graph_hook.py")
    ns = sglang_definitions.lift(hook, ["generate_decode_cuda_graph_batch_sizes"], {"resolving_view": lambda a: a})
    args = type("Args", (), {"disable_cuda_graph_padding": False, "speculative_algorithm": None})()
    for max_bs in (1, 8, 12, 48, 100, 160, 256, 300, 512, 600):
        assert selftest.capture_batch_sizes(max_bs) == ns["generate_decode_cuda_graph_batch_sizes"](args, max_bs)
    assert selftest.capture_batch_sizes(256)[:7] == [1, 2, 4, 8, 12, 16, 24] and len(selftest.capture_batch_sizes(256)) == 36


def _max_bs_table():
    """(below MiB, max_bs at TP < 4, at TP >= 4) of memory_hook.handle_gpu_memory_settings, read from its source."""
    fn = sglang_definitions._node(sglang_definitions.source_file("srt/arg_groups/memory_hook.py"),
                                  "handle_gpu_memory_settings")
    outer = next(n for n in ast.walk(fn) if isinstance(n, ast.If) and ast.unparse(n.test) == "gpu_mem is not None")

    def max_bs(body):
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "cfg.tp_size < 4":
                return max_bs(node.body)[0], max_bs(node.orelse)[0]
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "decode_cuda_graph_config.max_bs":
                return node.value.value, node.value.value

    rows, branch = [], outer.body[0]
    while True:
        below = eval(ast.unparse(branch.test.comparators[0]))  # e.g. 20 * 1024
        rows.append((below, *max_bs(branch.body)))
        if not (len(branch.orelse) == 1 and isinstance(branch.orelse[0], ast.If)):
            return rows, max_bs(branch.orelse)  # the last `else`: GPUs above every threshold
        branch = branch.orelse[0]


def test_default_max_bs_is_sglangs():
    rows, last = _max_bs_table()
    assert tuple(rows) == selftest._MAX_BS_BY_MEMORY
    assert selftest.default_max_bs(200 * 1024) == 512 and selftest.default_max_bs(143771) == 256  # an H200
    assert selftest.default_max_bs(143771, tp_size=8) == 512 and selftest.default_max_bs(143771, 1, 48) == 48
    assert last == (512, 512) and selftest.default_max_bs(10**7, 1) == 512


class FakeTimer:
    """Calls each of a rotation's calls once (the plumbing runs), returns a fixed time per kernel."""

    def __init__(self, dsaops_us, sglang_us):
        self.dsaops_us, self.sglang_us, self.calls = dsaops_us, sglang_us, 0

    def __call__(self, calls):
        for fn in calls:
            fn()
            self.calls += 1
        return self.sglang_us if calls[0].func is sglang_standin else self.dsaops_us


def dsaops_standin(q, kv, indices, sm_scale):
    rows, local = accuracy.gathered(kv, indices)
    return reference.sparse_mla_decode(accuracy.q_halves(q), rows, local, sm_scale).bfloat16()


def sglang_standin(q, kv, indices, sm_scale, d_v=512):
    rows, local = accuracy.gathered(kv, indices)
    return reference.sparse_mla_decode(accuracy.round_q(q), rows, local, sm_scale, d_v)


def run_measure(decode, dsaops_us=10.0, sglang_us=25.0):
    timer = FakeTimer(dsaops_us, sglang_us)
    rows = selftest.measure(16, [1, 2], decode, sglang_standin, timer, slots=SLOTS, rotate_bytes=1 << 20, device="cpu",
                            log=lambda line: None)
    return rows, timer


def test_the_measurement_checks_and_times_each_batch_size():
    rows, timer = run_measure(dsaops_standin)
    assert [r.batch for r in rows] == [1, 2] and all(r.correct for r in rows)
    assert all(r.speedup == 2.5 for r in rows) and all(r.kernel_err < 0.01 for r in rows)
    # a rotation of at least two input sets, each call made (S=1: 1 MiB / 1 MiB a call)
    assert timer.calls >= 2 * 2 * 2
    verdict = selftest.make_verdict(GB10, "sm_121", 16, rows, kernels=route.kernel_hash())
    assert verdict["decision"] == {"kernel": "dsaops", "min_batch": 1, "reason": "selftest_passed"}
    assert verdict["speedup"] == {"1": 2.5, "2": 2.5} and verdict["correct"] and not verdict["planted_wrong_kernel"]


def test_a_planted_wrong_kernel_fails_the_check_and_keeps_sglang(tmp_path):
    wrong = selftest.wrong(dsaops_standin, SLOTS)
    rows, _ = run_measure(wrong)
    assert not any(r.correct for r in rows) and all(r.kernel_err > 10 * selftest.KERNEL_ERR_MAX for r in rows)
    verdict = selftest.make_verdict(GB10, "sm_121", 16, rows, kernels=route.kernel_hash(), planted=True)
    selftest.write_verdict(verdict, tmp_path / "v.json")
    read = route.read_verdict(tmp_path / "v.json")
    decision = route.decide(targets.get("sm_121"), 16, verdict=read, gpu=GB10, env={"DSAOPS_DECODE": "dsaops"})
    assert (decision.kernel, decision.reason) == ("sglang", "selftest_incorrect")
    assert "dsaops' output was wrong" in decision.line


def test_the_verdict_holds_the_fields_kernels_readme_names(tmp_path):
    rows, _ = run_measure(dsaops_standin, sglang_us=9.0)
    verdict = selftest.make_verdict(GB10, "sm_121", 16, rows, kernels=route.kernel_hash())
    for key in ("gpu", "target", "kernels", "heads", "batch_sizes", "correct", "speedup", "decision"):
        assert key in verdict
    assert verdict["decision"]["kernel"] == "sglang" and verdict["decision"]["reason"] == "selftest_slower"
    selftest.write_verdict(verdict, tmp_path / "deep" / "v.json")
    assert json.loads((tmp_path / "deep" / "v.json").read_text()) == verdict
    assert not list((tmp_path / "deep").glob("*.partial"))


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA GB10, 12.1'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("DSAOPS_CACHE", str(tmp_path / "cache"))


def test_if_stale_does_nothing_for_a_current_verdict(fake_nvidia_smi, capsys):
    rows, _ = run_measure(dsaops_standin)
    selftest.write_verdict(selftest.make_verdict(GB10, "sm_121", 16, rows, kernels=route.kernel_hash()),
                           route.verdict_path())
    assert main(["kernels", "selftest", "--heads", "16", "--if-stale"]) == 0
    assert "is current for this GPU, kernel build and 16 heads (dsaops); nothing to do" in capsys.readouterr().out
    # another head count, or another build of the kernels, is stale: the test would run (no GPU here: refused)
    assert main(["kernels", "selftest", "--heads", "64", "--if-stale"]) == 2
    assert "no GPU visible" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    ([], "no GPU visible: run on the serving GPU"),
    (["--batch-sizes", "0,4"], "--batch-sizes takes batch sizes from 1 to 8192, e.g. 1,16,64; got '0,4'"),
    (["--batch-sizes", "1,100000"], "--batch-sizes takes batch sizes from 1 to 8192, e.g. 1,16,64; got '1,100000'"),
    (["--batch-sizes", "1,\u0663"], "--batch-sizes takes comma-separated whole numbers, e.g. 1,16,64; got '1,\u0663'"),
    (["--batch-sizes", "1_000"], "--batch-sizes takes comma-separated whole numbers, e.g. 1,16,64; got '1_000'"),
    (["--batch-sizes", ""], "--batch-sizes takes batch sizes from 1 to 8192, e.g. 1,16,64; got ''"),  # not the default
    (["--out", "{tmp}"], "is a folder; give the verdict file's path, e.g. {tmp}/decode-verdict.json"),
    (["--out", "{tmp}/afile/verdict.json"], "cannot write in {tmp}/afile; give a file in a folder"),
    (["--out", "/proc/dsaops/verdict.json"], "cannot write in /proc/dsaops; give a file in a folder"),  # even as root
])
def test_refusals_are_one_line(capsys, tmp_path, args, message):
    """Bad arguments are refused before the GPU check (no GPU here), so a run never measures and then fails."""
    (tmp_path / "afile").write_text("")
    args, message = [a.format(tmp=tmp_path) for a in args], message.format(tmp=tmp_path)
    assert main(["kernels", "selftest", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_batch_sizes_argument(monkeypatch):
    import argparse

    def of(**kw):
        return selftest.batch_sizes_of(argparse.Namespace(**({"batch_sizes": None, "max_bs": None, "tp_size": 1} | kw)),
                                       143771)
    assert of(batch_sizes="64,1, 8,8") == [1, 8, 64]
    assert of(max_bs=12) == [1, 2, 4, 8, 12]
    assert of()[-1] == 256
    for bad in ("a,b", "0,4", ",", ""):
        with pytest.raises(Exception, match="--batch-sizes"):
            of(batch_sizes=bad)


def test_a_verdict_path_in_a_folder_yet_to_be_made_is_accepted(tmp_path):
    selftest.check_out(tmp_path / "new" / "deeper" / "verdict.json", given=True)
    assert not (tmp_path / "new").exists()
