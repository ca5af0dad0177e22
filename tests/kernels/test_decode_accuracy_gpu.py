"""dsaops' decode against what a user loses, on a GPU (`make test-gpu`): the error against fp32
attention over the unquantized bf16 KV with bf16 q is at most 1.1x the raw-KV floor (fp32 attention
over the raw fp8 KV with bf16 q: what no kernel over that pool can beat), on the three data kinds of
kernels/accuracy.py (N(0, 1); outlier channels; peaked scores).

Negative control: q rounded to e4m3 for QK^T, as the kernel did before q was split into two e4m3
halves, fails that bound on every kind (the fp32 reference with q rounded: 1.2x the floor on
peaked scores, 1.5x on N(0, 1), 3.2x on outlier channels). The kernel fed a q already rounded to
e4m3 (and cast back to bf16, exactly) fails it too, and by the same margin: its two halves are then
hi = q, lo = 0, so its QK^T is exactly the product the rounding kernel made from the original q,
and everything after QK^T is the same code.

FlashMLA's caller (kernels/peers.py, the benchmark's peer) is checked here too, where the
sgl-flash-mla wheel is on the path (`make test-gpu` unzips it from .devbundle/peers).
"""
import pytest

torch = pytest.importorskip("torch")

from dsaops.kernels import accuracy, sparse_mla_decode_fp8

pytestmark = pytest.mark.gpu
SLOTS = 1 << 16
BOUND = 1.1


def _errors(kind, S, H, seed, feed=lambda q: q, references=()):
    """accuracy.decode_errors of the kernel fed feed(q) over one case's raw fp8 KV."""
    q, kv, idx = accuracy.make_case(kind, S, H, SLOTS, seed=seed, device="cuda")
    out = sparse_mla_decode_fp8(feed(q), kv.to(accuracy.FP8), idx, accuracy.SM_SCALE)
    return accuracy.decode_errors(q, kv, idx, accuracy.SM_SCALE, out, references=references)


# (16, 64): the 64-head tiles, a split or two a query; (64, 16): the 16-head tiles as two-split
# clusters; (1, 128): two head blocks, many splits merged by the merge kernel
@pytest.mark.parametrize(("S", "H"), [(16, 64), (64, 16), (1, 128)])
@pytest.mark.parametrize("kind", accuracy.DATA_KINDS)
def test_error_against_bf16_kv_is_within_the_raw_kv_floors_bound(kind, S, H):
    errs = _errors(kind, S, H, seed=S + H)
    assert errs["err_vs_bf16"] <= BOUND * errs["raw_kv_floor"], (kind, errs)
    assert errs["rel_err"] <= 0.01  # and the kernel-only error stays in its budget


@pytest.mark.parametrize("kind", accuracy.DATA_KINDS)
def test_q_rounded_to_e4m3_fails_the_same_bound(kind):
    errs = _errors(kind, 16, 64, seed=7, feed=accuracy.round_q, references=("q_rounded_err",))
    assert errs["q_rounded_err"] > BOUND * errs["raw_kv_floor"], (kind, errs)
    assert errs["err_vs_bf16"] > BOUND * errs["raw_kv_floor"], (kind, errs)  # the kernel fed the rounded q


@pytest.mark.parametrize("H", [16, 128])  # padded to 64 heads; FlashMLA's 128-head kernel
def test_flashmla_caller_computes_attention_over_its_format(H):
    """peers.FlashMLADecode over accuracy.flashmla_pages: within FlashMLA's own rounding of the fp32
    attention over its dequantized pool; scrambled indices are seen (the page view maps row ids):
    their error is ten times the pass bound or more."""
    pytest.importorskip("flash_mla", reason="sgl-flash-mla is not on the path (the offline bundle carries it)")
    from dsaops.kernels import peers

    S = 16
    q, kv, idx = accuracy.make_case("outliers", S, H, SLOTS, seed=H, device="cuda")
    pages = accuracy.flashmla_pages(accuracy.quantize_v32_no_rope(kv))
    fm = peers.FlashMLADecode(S, H, idx.shape[2], "cuda")
    out = fm(fm.pad(q), pages, idx, accuracy.SM_SCALE)
    assert out.shape == (S, H, 512) and out.dtype == torch.bfloat16
    want = accuracy.reference_outputs(q, kv, idx, accuracy.SM_SCALE, ("flashmla_format_floor",))
    assert accuracy.rel_err(out, want["flashmla_format_floor"]) <= 0.01
    scrambled = torch.randint(0, SLOTS, idx.shape, device="cuda", dtype=torch.int32)
    assert accuracy.rel_err(fm(fm.pad(q), pages, scrambled, accuracy.SM_SCALE), want["flashmla_format_floor"]) >= 0.1
