"""0006 routes SGLang 0.5.23's raw fp8 DSA decode to dsaops.kernels as dsaops.kernels.route decides: it
applies with the series to the pinned wheel and reverts byte for byte, and the routing it adds runs, lifted
out of the patched file (importing dsa_backend on CPU needs ~55 packages), with the real route module
deciding for a GPU the test names and stand-ins for the two kernels."""
import ast
import functools
import hashlib
import logging
import sys
import types

import dsaops.kernels
import pytest
import torch
from dsaops.kernels import reference, tiles
from dsaops.kernels import route as dsaops_route
from dsaops.sglang_patches import apply as tree
from dsaops.sglang_patches.series import load

import dsaops
from dsaops import targets
from tests.kernels.verdicts import write_verdict
from tests.support import sglang_definitions
from tests.support.sglang_wheel import pristine_copy

PATCH = "0006-route-raw-fp8-decode-to-dsaops-kernels.patch"
BACKEND = "sglang/srt/layers/attention/dsa_backend.py"
TILELANG_MODULE = "sglang.kernels.ops.attention.dsa.tilelang_kernel"


def digests(root, rels):
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in rels}


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    series = load()
    route = next(p for p in series.patches if p.name == PATCH)
    assert [fp.path for fp in route.files] == [BACKEND]
    root = pristine_copy(tmp_path_factory.mktemp("route"))
    before = digests(root, series.targets)
    tree.apply(root, series)
    after = digests(root, series.targets)
    tree.revert(root, series)
    assert digests(root, series.targets) == before and not (root / tree.MARKER).exists()
    tree.apply(root, series)
    assert digests(root, series.targets) == after
    return root / BACKEND


def test_series_with_0006_applies_and_reverts_byte_exact(patched):
    text = patched.read_text()
    assert "@functools.cache\ndef _dsaops_decode_route(" in text and "route.for_server(" in text and "logger.info(decision.line)" in text


def test_only_decode_asks_for_the_dsaops_kernel(patched):
    cls = next(n for n in ast.parse(patched.read_text()).body if getattr(n, "name", "") == "DeepseekSparseAttnBackend")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}

    def tilelang_calls(method):
        return [c for c in ast.walk(methods[method]) if isinstance(c, ast.Call)
                and getattr(c.func, "attr", None) == "_forward_tilelang"]

    def passes_decode(call):
        return any(k.arg == "decode" and getattr(k.value, "value", None) is True for k in call.keywords)

    assert [passes_decode(c) for c in tilelang_calls("forward_decode")] == [True]
    assert [passes_decode(c) for c in tilelang_calls("forward_extend")] == [False]




class Recorder:
    def __init__(self, result):
        self.result, self.calls = result, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.result(*args, **kwargs) if callable(self.result) else self.result


def decode_reference(q, kv, indices, sm_scale, d_v=512):
    return reference.sparse_mla_decode(q, kv, indices, sm_scale, d_v=d_v).bfloat16()


def gpu(name, major, minor):
    return types.SimpleNamespace(name=name, major=major, minor=minor, gcnArchName="")


@pytest.fixture
def route(patched, monkeypatch, tmp_path):
    """The patched _forward_tilelang and its routing: dsaops.kernels.route.for_server deciding for the GPU
    that `ours.gpu` names (torch's device query answered by the test), SGLang's kernel and dsaops' as
    recorders, the dsaops cache (where the verdict lives) in tmp_path."""
    sglang_kernel = Recorder(lambda q, kv, indices, sm_scale, d_v: decode_reference(q, kv, indices, sm_scale, d_v)[None])
    for name in ["sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
                 "sglang.kernels.ops.attention.dsa", TILELANG_MODULE]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[TILELANG_MODULE].tilelang_sparse_fwd = sglang_kernel
    ours = types.SimpleNamespace(kernel=Recorder(decode_reference), sglang=sglang_kernel, gpu=gpu("NVIDIA H200", 9, 0),
                                 hip=None)
    monkeypatch.setattr(dsaops.kernels, "sparse_mla_decode_fp8", ours.kernel, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: ours.gpu)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("DSAOPS_CACHE", str(tmp_path))
    for name in ("DSAOPS_DECODE", "DSAOPS_FORCE_SGLANG_DECODE"):
        monkeypatch.delenv(name, raising=False)
    ns = sglang_definitions.lift(
        patched, ["_validate_raw_fp8_kv_rows", "_dsaops_decode_route", "DeepseekSparseAttnBackend._forward_tilelang"],
        {"torch": torch, "_is_hip": False, "logger": logging.getLogger("dsa_backend")})
    ns["_dsaops_decode_route"] = functools.cache(ns["_dsaops_decode_route"])  # as decorated: once per geometry
    ours.forward = lambda decode, kv_dtype=torch.float8_e4m3fn, width=576, S=3, topk=100, **kw: ns["_forward_tilelang"](
        None, **case(kv_dtype, width, S, topk), decode=decode, **kw)
    return ours


def case(kv_dtype, width, S=3, topk=100):
    g = torch.Generator().manual_seed(0)
    H, slots = 16, 300
    page_table = torch.randint(0, slots, (S, topk), generator=g, dtype=torch.int32)  # padded to 64s by the glue
    page_table[min(1, S - 1), 7:] = -1
    return {"q_all": torch.randn(S, H, 576, generator=g).bfloat16(),
            "kv_cache": torch.randn(slots, 1, width, generator=g).to(kv_dtype),
            "v_head_dim": 512, "page_table_1": page_table, "sm_scale": 0.04}


def the_line(caplog):
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("DSA decode kernel: ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_an_h200_runs_dsaops_from_the_measured_batch_and_says_why(route, caplog):
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        out = route.forward(decode=True)
    assert not route.sglang.calls and len(route.kernel.calls) == 1
    (q, kv, indices, sm_scale), kwargs = route.kernel.calls[0]
    assert q.shape == (3, 16, 576) and kv.dtype == torch.float8_e4m3fn and sm_scale == 0.04
    assert indices.shape == (3, 1, 128) and (indices[:, 0, 100:] == -1).all()
    assert kwargs == {"d_v": 512} and out.shape == (3, 16, 512)
    assert the_line(caplog) == ("DSA decode kernel: dsaops for every batch size; reason=measured: "
                                f"{targets.get('sm_90').decode_evidence}; target=sm_90 heads=16")
    # SGLang's path, on the same inputs, gives the same [S, H, d_v] output: the glue keeps the shape contract.
    assert torch.equal(route.forward(decode=False), out) and len(route.sglang.calls) == 1


def test_batches_below_the_measured_threshold_stay_on_sglang(route):
    """8 heads (decode_preferred: S x H >= 16): dsaops from batch 2."""
    decision = dsaops_route.for_server(8, 576, 512, 128, torch.float8_e4m3fn)
    assert decision.runs_dsaops(2) and not decision.runs_dsaops(1)
    assert decision.line.startswith("DSA decode kernel: dsaops for batch sizes >= 2, sglang below; reason=measured")


@pytest.mark.parametrize(("gpu_props", "hip", "reason"), [
    (gpu("NVIDIA GB10", 12, 1), None, "reason=not_measured: not measured on GB10"),
    (types.SimpleNamespace(name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+:xnack-"), "6.4",
     "reason=no_hip_kernels: no HIP kernels"),
    (types.SimpleNamespace(name="AMD Instinct MI355X", gcnArchName="gfx950:sramecc+:xnack-"), "6.4",
     "reason=no_hip_kernels: no HIP kernels for AMD Instinct MI355X (gfx950)"),
    (gpu("NVIDIA B200", 10, 0), None, "reason=unknown_gpu: no dsaops target for NVIDIA B200 (10.0)"),
])
def test_gpus_without_measured_kernels_keep_sglang(route, monkeypatch, caplog, gpu_props, hip, reason):
    route.gpu = gpu_props
    monkeypatch.setattr(torch.version, "hip", hip)
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        out = route.forward(decode=True)
    assert len(route.sglang.calls) == 1 and not route.kernel.calls and out.shape == (3, 16, 512)
    assert the_line(caplog).startswith("DSA decode kernel: sglang for every batch size; " + reason)


def test_a_passing_selftest_verdict_turns_dsaops_on_for_a_gb10(route, tmp_path, caplog):
    route.gpu = gpu("NVIDIA GB10", 12, 1)
    write_verdict(tmp_path / "decode-verdict.json", "sm_121", {"name": "NVIDIA GB10", "compute_capability": "12.1"},
                  heads=16, speedups={1: 0.9, 2: 1.1, 4: 1.4})
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        route.forward(decode=True, S=3)
        route.forward(decode=True, S=1)
    assert len(route.kernel.calls) == 1 and len(route.sglang.calls) == 1  # S=3 on dsaops, S=1 below the threshold
    assert the_line(caplog).startswith("DSA decode kernel: dsaops for batch sizes >= 2, sglang below; "
                                       "reason=selftest_passed: selftest on NVIDIA GB10, 16 heads")


def test_a_verdict_from_another_gpu_does_not_count(route, tmp_path, caplog):
    route.gpu = gpu("NVIDIA GB10", 12, 1)
    write_verdict(tmp_path / "decode-verdict.json", "sm_121", {"name": "NVIDIA RTX PRO", "compute_capability": "12.1"},
                  heads=16, speedups={1: 2.0})
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        route.forward(decode=True)
    assert len(route.sglang.calls) == 1 and not route.kernel.calls
    assert "reason=not_measured" in the_line(caplog) and "measured on a NVIDIA RTX PRO" in the_line(caplog)


def test_a_failed_selftest_keeps_sglang_even_when_dsaops_is_asked_for(route, monkeypatch, tmp_path, caplog):
    write_verdict(tmp_path / "decode-verdict.json", "sm_90", {"name": "NVIDIA H200", "compute_capability": "9.0"},
                  heads=16, speedups={1: 3.0}, correct=False)
    monkeypatch.setenv("DSAOPS_DECODE", "dsaops")
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        route.forward(decode=True)
    assert len(route.sglang.calls) == 1 and not route.kernel.calls
    assert "reason=selftest_incorrect: selftest on NVIDIA H200, 16 heads: dsaops' output was wrong" in the_line(caplog)


@pytest.mark.parametrize(("env", "reason"), [
    ({"DSAOPS_DECODE": "sglang"}, "reason=setting: DSAOPS_DECODE=sglang"),
    ({"DSAOPS_FORCE_SGLANG_DECODE": "1"}, "reason=setting: DSAOPS_FORCE_SGLANG_DECODE=1"),
    ({"DSAOPS_DECODE": "fastest"}, "reason=bad_setting: DSAOPS_DECODE='fastest': set it to auto, dsaops or sglang"),
])
def test_the_setting_keeps_sglang(route, monkeypatch, caplog, env, reason):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        route.forward(decode=True)
    assert len(route.sglang.calls) == 1 and not route.kernel.calls
    assert reason in the_line(caplog)


def test_dsaops_can_be_asked_for_on_a_gb10_without_a_verdict(route, monkeypatch, caplog):
    route.gpu = gpu("NVIDIA GB10", 12, 1)
    monkeypatch.setenv("DSAOPS_DECODE", "dsaops")
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        route.forward(decode=True, S=1)
    assert len(route.kernel.calls) == 1 and not route.sglang.calls
    assert the_line(caplog).startswith("DSA decode kernel: dsaops for every batch size; reason=setting: "
                                       "DSAOPS_DECODE=dsaops")


def test_an_alias_of_0_keeps_the_default(route, monkeypatch):
    monkeypatch.setenv("DSAOPS_FORCE_SGLANG_DECODE", "0")
    route.forward(decode=True)
    assert len(route.kernel.calls) == 1 and not route.sglang.calls


def test_without_dsaops_installed_sglang_runs_and_says_so(route, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "dsaops.kernels.route", None)
    monkeypatch.delattr(dsaops.kernels, "route")
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        out = route.forward(decode=True)
    assert len(route.sglang.calls) == 1 and not route.kernel.calls and out.shape == (3, 16, 512)
    assert the_line(caplog).startswith("DSA decode kernel: sglang for every batch size; reason=not_installed: "
                                       "dsaops.kernels does not import")


def test_unsupported_geometry_stays_on_sglang(route, caplog):
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        route.forward(decode=True, topk=tiles.MAX_TOPK + 1)  # more rows than a split holds ids for
    assert len(route.sglang.calls) == 1 and not route.kernel.calls
    assert "reason=unsupported_geometry" in the_line(caplog)


def test_prefill_and_bf16_pools_stay_on_sglang(route, caplog):
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        route.forward(decode=False)
        route.forward(decode=True, kv_dtype=torch.bfloat16)
    assert len(route.sglang.calls) == 2 and not route.kernel.calls
    assert "DSA decode kernel" not in caplog.text  # no decision was needed


def test_validation_still_runs_before_routing(route):
    with pytest.raises(ValueError, match="576"):
        route.forward(decode=True, width=656)
    assert not route.kernel.calls and not route.sglang.calls


def test_dsaops_kernels_exports_what_the_patch_calls():
    import inspect

    assert list(inspect.signature(dsaops_route.for_server).parameters) == [
        "num_heads", "d_qk", "d_v", "topk", "kv_dtype"]
    assert list(inspect.signature(dsaops.kernels.sparse_mla_decode_fp8).parameters)[:6] == [
        "q", "kv", "indices", "sm_scale", "d_v", "return_lse"]
