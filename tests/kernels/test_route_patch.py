"""0006 routes SGLang 0.5.23's raw fp8 DSA decode to dsaops.kernels: it applies with the series to the pinned
wheel and reverts byte for byte, and the routing it adds runs, lifted out of the patched file (importing
dsa_backend on CPU needs ~55 packages) with stand-ins for the two kernels."""
import ast
import hashlib
import logging
import os
import sys
import types

import dsaops.kernels
import pytest
import torch
from dsaops.kernels import reference
from dsaops.sglang_patches import apply as tree
from dsaops.sglang_patches.series import load

import dsaops
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
    assert series.patches[-1].name == PATCH and [fp.path for fp in series.patches[-1].files] == [BACKEND]
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
    assert "def _dsaops_decode_kernels(" in text and "DSAOPS_FORCE_SGLANG_DECODE" in text


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


@pytest.fixture
def route(patched, monkeypatch):
    """The patched _forward_tilelang and its routing, with SGLang's kernel and dsaops' kernels as recorders."""
    sglang_kernel = Recorder(lambda q, kv, indices, sm_scale, d_v: decode_reference(q, kv, indices, sm_scale, d_v)[None])
    for name in ["sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention",
                 "sglang.kernels.ops.attention.dsa", TILELANG_MODULE]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[TILELANG_MODULE].tilelang_sparse_fwd = sglang_kernel
    ours = types.SimpleNamespace(supported=Recorder(True), preferred=Recorder(True), kernel=Recorder(decode_reference),
                                 sglang=sglang_kernel)
    monkeypatch.setattr(dsaops.kernels, "decode_supported", ours.supported, raising=False)
    monkeypatch.setattr(dsaops.kernels, "decode_preferred", ours.preferred, raising=False)
    monkeypatch.setattr(dsaops.kernels, "sparse_mla_decode_fp8", ours.kernel, raising=False)
    monkeypatch.delenv("DSAOPS_FORCE_SGLANG_DECODE", raising=False)
    ns = sglang_definitions.lift(
        patched, ["_validate_raw_fp8_kv_rows", "_dsaops_decode_kernels", "DeepseekSparseAttnBackend._forward_tilelang"],
        {"torch": torch, "os": os, "_is_hip": False, "logger": logging.getLogger("dsa_backend")})
    ours.forward = lambda decode, kv_dtype=torch.float8_e4m3fn, width=576, **kw: ns["_forward_tilelang"](
        None, **case(kv_dtype, width), decode=decode, **kw)
    return ours


def case(kv_dtype, width):
    g = torch.Generator().manual_seed(0)
    S, H, slots = 3, 16, 300
    page_table = torch.randint(0, slots, (S, 100), generator=g, dtype=torch.int32)  # padded to 128 by the glue
    page_table[1, 7:] = -1
    return {"q_all": torch.randn(S, H, 576, generator=g).bfloat16(),
            "kv_cache": torch.randn(slots, 1, width, generator=g).to(kv_dtype),
            "v_head_dim": 512, "page_table_1": page_table, "sm_scale": 0.04}


def test_supported_decode_runs_dsaops(route, caplog):
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        out = route.forward(decode=True)
    assert not route.sglang.calls and len(route.kernel.calls) == 1
    assert route.supported.calls == [((16, 576, 512, 128, torch.float8_e4m3fn), {})]
    (q, kv, indices, sm_scale), kwargs = route.kernel.calls[0]
    assert q.shape == (3, 16, 576) and kv.dtype == torch.float8_e4m3fn and sm_scale == 0.04
    assert indices.shape == (3, 1, 128) and (indices[:, 0, 100:] == -1).all()
    assert kwargs == {"d_v": 512} and out.shape == (3, 16, 512)
    assert route.preferred.calls == [((3, 16), {})]        # S, H of this batch
    assert "DSA raw fp8 decode kernel: dsaops.kernels.sparse_mla_decode_fp8 for the batch sizes" in caplog.text
    assert "(heads=16 d_qk=576" in caplog.text
    # SGLang's path, on the same inputs, gives the same [S, H, d_v] output: the glue keeps the shape contract.
    assert torch.equal(route.forward(decode=False), out) and len(route.sglang.calls) == 1


@pytest.mark.parametrize("how,reason", [
    ("force", "DSAOPS_FORCE_SGLANG_DECODE=1"),
    ("unsupported", "does not support this geometry"),
    ("not installed", "dsaops.kernels does not import"),
])
def test_sglang_kernel_runs_when(route, monkeypatch, caplog, how, reason):
    if how == "force":
        monkeypatch.setenv("DSAOPS_FORCE_SGLANG_DECODE", "1")
    elif how == "unsupported":
        route.supported.result = False
    else:
        monkeypatch.setitem(sys.modules, "dsaops.kernels", None)
        monkeypatch.delattr(dsaops, "kernels")
    with caplog.at_level(logging.INFO, logger="dsa_backend"):
        out = route.forward(decode=True)
    assert len(route.sglang.calls) == 1 and not route.kernel.calls and out.shape == (3, 16, 512)
    assert "DSA raw fp8 decode kernel: SGLang tilelang_sparse_fwd (heads=16" in caplog.text and reason in caplog.text
    assert bool(route.supported.calls) == (how == "unsupported")


def test_batches_dsaops_does_not_prefer_stay_on_sglang(route):
    route.preferred.result = False
    out = route.forward(decode=True)
    assert len(route.sglang.calls) == 1 and not route.kernel.calls and out.shape == (3, 16, 512)
    assert route.preferred.calls == [((3, 16), {})]


def test_force_variable_other_than_1_keeps_dsaops(route, monkeypatch):
    monkeypatch.setenv("DSAOPS_FORCE_SGLANG_DECODE", "0")
    route.forward(decode=True)
    assert len(route.kernel.calls) == 1 and not route.sglang.calls


def test_prefill_and_bf16_pools_stay_on_sglang(route):
    route.forward(decode=False)
    route.forward(decode=True, kv_dtype=torch.bfloat16)
    assert len(route.sglang.calls) == 2 and not route.kernel.calls and not route.supported.calls


def test_validation_still_runs_before_routing(route):
    with pytest.raises(ValueError, match="576"):
        route.forward(decode=True, width=656)
    assert not route.kernel.calls and not route.sglang.calls


def test_dsaops_kernels_exports_what_the_patch_calls():
    import inspect

    assert list(inspect.signature(dsaops.kernels.decode_supported).parameters) == [
        "num_heads", "d_qk", "d_v", "topk", "kv_dtype"]
    assert list(inspect.signature(dsaops.kernels.decode_preferred).parameters) == ["num_queries", "num_heads"]
    assert list(inspect.signature(dsaops.kernels.sparse_mla_decode_fp8).parameters)[:6] == [
        "q", "kv", "indices", "sm_scale", "d_v", "return_lse"]
