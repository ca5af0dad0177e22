"""sm_121's kernels compiled for a Hopper (decode.kernel_target("sm_121@sm_90a")), so the H200 runs
GB10's code path (make test-gpu): no wgmma, GB10's shared-memory budget, and the same tiles,
shared-memory layout and tensor-core, ldmatrix and cp.async code as the sm_121a build. What differs
is what TileLang vectorises per arch: sm_121a's elementwise loops take 256-bit global loads and
packed fp32x2 arithmetic, sm_90a's 128-bit loads and scalar arithmetic (so the threads of q's load
and its row-max reduction are grouped differently), and ptxas's instruction selection."""
import os
import re
from collections import Counter

import pytest
from dsaops.kernels import build, decode, tiles

from dsaops import targets
from dsaops.cache import cache_dir
from tests.support.prerequisites import need_nvcc

PROXY = "sm_121@sm_90a"
# the tensor-core products, their operand loads and the gathers: what must be GB10's own
PRODUCT_CODE = re.compile(r"mma_sync|ldmatrix|cp_async")
NUMBERED = re.compile(r"\b([A-Za-z]\w*?)_\d+\b")  # TileLang numbers loop variables in the order it writes loops


@pytest.fixture(scope="module")
def sources():
    """{(tile, d_tail): (proxy source, proxy shared memory, sm_121a source, sm_121a shared memory)}."""
    need_nvcc()
    os.environ.setdefault("TILELANG_CACHE_DIR", str(cache_dir("tilelang")))
    gb10 = targets.get("sm_121")
    jobs = build.kernel_jobs(gb10)
    decode.warm_cache([(name, tile, d_tail, False) for name in (PROXY, "sm_121") for tile, d_tail in jobs])
    out = {}
    for tile, d_tail in jobs:
        name = "combine" if isinstance(tile, tiles.Combine) else "decode"
        built = []
        for target in (decode.kernel_target(PROXY), gb10):
            kernel = decode.compile_kernel(target, tile, d_tail)
            device = kernel.get_kernel_source()
            built += [device, build.shared_memory_bytes(kernel.get_host_source(), device, name)]
        out[(tile, d_tail)] = tuple(built)
    return out


def test_the_proxy_is_gb10s_target_compiled_for_hopper():
    proxy, gb10 = decode.kernel_target(PROXY), targets.get("sm_121")
    assert proxy.gpu_arch == "sm_90a" and proxy.tilelang_target == {"kind": "cuda", "arch": "sm_90a"}
    assert (proxy.smem_per_block_bytes, proxy.features, proxy.fp8_dtype) == (
        gb10.smem_per_block_bytes, gb10.features, gb10.fp8_dtype)
    assert not proxy.has("wgmma")
    for h, d_tail in ((16, 0), (64, 0), (64, 64), (128, 0)):
        assert tiles.choose(proxy, h, d_tail=d_tail) == tiles.choose(gb10, h, d_tail=d_tail)
    assert decode.kernel_target("sm_90") == targets.get("sm_90")
    for bad in ("sm_121@sm_99a", "gfx942@sm_90a", "sm_77@sm_90a"):
        with pytest.raises(targets.UnknownTarget, match="valid targets|TARGET@ARCH"):
            decode.kernel_target(bad)


def test_proxy_kernels_use_no_wgmma_and_fit_gb10(sources):
    budget = targets.get("sm_121").smem_per_block_bytes
    for (tile, d_tail), (proxy, proxy_smem, gb10, gb10_smem) in sources.items():
        assert "wgmma" not in proxy and "__global__" in proxy, (tile, d_tail)
        assert proxy_smem == gb10_smem <= budget, (tile, d_tail, proxy_smem, gb10_smem)


def test_proxy_kernels_run_gb10s_products_and_gathers(sources):
    """Line for line, the mma.sync products, their ldmatrix loads and the cp.async gathers (every
    shared-memory address of them) are the sm_121a build's, loop variables' numbering aside."""
    for (tile, d_tail), (proxy, _, gb10, _) in sources.items():
        lines = [Counter(NUMBERED.sub(r"\1_N", line.strip()) for line in src.splitlines() if PRODUCT_CODE.search(line))
                 for src in (proxy, gb10)]
        assert lines[0] == lines[1], (tile, d_tail)
        assert isinstance(tile, tiles.Combine) or sum(lines[0].values()) > 0


def test_without_the_pass_config_hopper_would_take_wgmma():
    """Negative control: GB10's 64-head tile compiled for sm_90a with wgmma left on takes wgmma."""
    need_nvcc()
    import tilelang

    os.environ.setdefault("TILELANG_CACHE_DIR", str(cache_dir("tilelang")))
    proxy = decode.kernel_target(PROXY)
    program = decode.program(proxy, tiles.choose(proxy, 64, d_tail=0), 0)  # GB10's program, as the proxy builds it
    assert "wgmma" in tilelang.compile(program, target=proxy.tilelang_target).get_kernel_source()
