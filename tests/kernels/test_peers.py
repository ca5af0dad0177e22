"""kernels/peers.py without a GPU: SGLang's kernel file loads through its stand-ins, and FlashMLA is
called as SGLang 0.5.23 calls it, pinned to SGLang's source and to the sgl-flash-mla wheel's API
(the call itself runs on the H200: test_decode_accuracy_gpu.py)."""
import ast
import zipfile

import pytest

torch = pytest.importorskip("torch")

from dsaops.kernels import peers

from dsaops import pins
from tests.support.sglang_wheel import sglang_source, wheel


def _function(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _call(fn, name):
    """The first call of `name` (a plain or attribute name) inside fn."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == name:
            return node
    raise AssertionError(f"no call of {name} in {fn.name}")


@pytest.fixture(scope="module")
def sglang_dsa():
    root = sglang_source() / "sglang"
    backend = (root / "srt" / "layers" / "attention" / "dsa_backend.py").read_text()
    wrapper = (root / "kernels" / "ops" / "attention" / "flash_mla_interface.py").read_text()
    return backend, ast.parse(backend), ast.parse(wrapper)


@pytest.fixture(scope="module")
def flashmla_api():
    with zipfile.ZipFile(wheel("sgl-flash-mla", pins.FLASH_MLA)) as whl:
        return ast.parse(whl.read("flash_mla/flash_mla_interface.py").decode())


class Recorder:
    """Stands in for the flash_mla module to record how FlashMLADecode calls it."""

    def __init__(self):
        self.calls = []
        recorder = self

        class FlashMLASchedMeta:
            def __init__(self, **fields):
                recorder.calls.append(("FlashMLASchedMeta", (), fields))
                self.fields = fields

        self.flash_mla_interface = type("interface", (), {"FlashMLASchedMeta": FlashMLASchedMeta})

    def get_mla_decoding_metadata(self, *args, **kwargs):
        self.calls.append(("get_mla_decoding_metadata", args, kwargs))
        return torch.zeros(4, 8, dtype=torch.int32), torch.zeros(args[0].shape[0] + 1, dtype=torch.int32)

    def flash_mla_with_kvcache(self, **kwargs):
        self.calls.append(("flash_mla_with_kvcache", (), kwargs))
        q = kwargs["q"]
        return q.float().mul(2).to(q.dtype), torch.zeros(q.shape[0], q.shape[2], 1)


def test_load_sglang_reads_the_pinned_kernel_file_with_stand_ins():
    pytest.importorskip("tilelang")
    import sys

    before = {name for name in sys.modules if name == "sglang" or name.startswith("sglang.")}
    module = peers.load_sglang(str(sglang_source()))
    assert callable(module.tilelang_sparse_fwd) and callable(module.sparse_mla_fwd_decode_partial_fp8)
    assert {name for name in sys.modules if name == "sglang" or name.startswith("sglang.")} == before


@pytest.mark.parametrize(("H", "heads"), [(16, 64), (64, 64), (100, 128), (128, 128), (256, 256)])
def test_flashmla_heads_are_sglangs_padding(sglang_dsa, H, heads):
    backend, _, _ = sglang_dsa
    assert ("if self.num_q_heads <= 64:\n            self.flashmla_kv_num_q_heads = 64\n"
            "        elif self.num_q_heads <= 128:\n            self.flashmla_kv_num_q_heads = 128") in backend
    assert peers.flashmla_heads(H) == heads


def test_flashmla_is_called_as_sglangs_fp8_decode_calls_it(sglang_dsa, flashmla_api):
    backend, tree, wrapper = sglang_dsa
    rec = Recorder()
    S, H = 3, 16
    fm = peers.FlashMLADecode(S, H, 2048, "cpu", flash_mla=rec)
    q = torch.randn(S, H, 512).bfloat16()
    padded = fm.pad(q)
    pages, idx = torch.zeros(2, 64, 1, 528, dtype=torch.uint8), torch.zeros(S, 1, 2048, dtype=torch.int32)
    out = fm(padded, pages, idx, 0.04)
    assert padded.shape == (S, 1, 64, 512) and torch.equal(padded[:, 0, :H], q) and (padded[:, 0, H:] == 0).all()
    assert out.shape == (S, H, 512) and torch.equal(out, q.float().mul(2).bfloat16())

    # the metadata: SGLang's _compute_flashmla_metadata through its get_mla_metadata wrapper
    (name, args, kwargs), meta, (_, _, call) = rec.calls
    sgl_meta = {k.arg: k.value for k in _call(_function(tree, "_compute_flashmla_metadata"), "get_mla_metadata").keywords}
    assert [ast.unparse(sgl_meta[k]) for k in ("num_heads_k", "is_fp8_kvcache")] == ["1", "True"]
    assert ast.unparse(sgl_meta["num_q_tokens_per_head_k"]) == "seq_len_q * num_heads_q // 1"
    wrapped = _call(_function(wrapper, "get_mla_metadata"), "get_mla_decoding_metadata")
    assert [ast.unparse(a) for a in wrapped.args] == ["cache_seqlens", "num_q_tokens_per_head_k", "num_heads_k",
                                                      "num_heads_q", "is_fp8_kvcache", "topk"]
    assert {k.arg: ast.unparse(k.value) for k in wrapped.keywords} == {"use_legacy": "True"}
    assert name == "get_mla_decoding_metadata" and kwargs == {"use_legacy": True}
    assert args[0].tolist() == [2048] * S and args[1:] == (64, 1, 64, True, 2048)  # seq_len_q 1, 64 padded heads

    # the decode: SGLang's _forward_flashmla_kv keywords, with num_splits riding on the schedule
    # object as its wrapper puts it there, and the wrapper's use_legacy=True
    sgl_call = {k.arg: k.value for k in _call(_function(tree, "_forward_flashmla_kv"), "flash_mla_with_kvcache").keywords}
    assert set(call) == set(sgl_call) - {"num_splits"} | {"use_legacy"}
    assert ast.unparse(sgl_call["is_fp8_kvcache"]) == "True" and call["is_fp8_kvcache"] is True
    assert ast.unparse(sgl_call["kv_format"]) == "self.flashmla_kv_format"
    assert 'self.flashmla_kv_format = "V32_NO_ROPE" if self.qk_rope_head_dim == 0 else "V32"' in backend
    assert call["kv_format"] == "V32_NO_ROPE" and call["use_legacy"] is True
    wrapper_call = _function(wrapper, "flash_mla_with_kvcache")
    legacy = dict(zip([a.arg for a in wrapper_call.args.kwonlyargs], wrapper_call.args.kw_defaults))["use_legacy"]
    assert ast.unparse(legacy) == "True"
    sched = _call(wrapper_call, "FlashMLASchedMeta")
    assert {k.arg for k in sched.keywords} == {"tile_scheduler_metadata", "num_splits"}
    fields = call["tile_scheduler_metadata"].fields
    assert meta[0] == "FlashMLASchedMeta" and fields is meta[2]
    assert fields["tile_scheduler_metadata"] is fm.tile_scheduler_metadata and fields["num_splits"] is fm.num_splits
    assert call["block_table"].shape == (S, 0) and call["block_table"].dtype == torch.int32
    assert call["cache_seqlens"].tolist() == [2048] * S and call["softmax_scale"] == 0.04
    assert call["q"] is padded and call["k_cache"] is pages and call["indices"] is idx and call["head_dim_v"] == 512

    # the wheel takes every keyword, and its scheduler the arguments in that order
    params = {a.arg for a in _function(flashmla_api, "flash_mla_with_kvcache").args.args}
    assert set(call) <= params
    meta_fn = _function(flashmla_api, "get_mla_decoding_metadata").args
    assert [a.arg for a in meta_fn.args] == ["seqlens_k", "num_q_tokens_per_head_k", "h_k", "h_q", "is_fp8_kvcache",
                                              "topk", "use_legacy"]
    fields = {n.target.id for c in ast.walk(flashmla_api) if isinstance(c, ast.ClassDef) and c.name == "FlashMLASchedMeta"
              for n in c.body if isinstance(n, ast.AnnAssign)}
    assert {"tile_scheduler_metadata", "num_splits"} <= fields
