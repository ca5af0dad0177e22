"""GPU runs (`make test-gpu`): every decode kernel the tests load is compiled first, in parallel
processes, into TileLang's cache; the tests then load each instead of compiling it in turn."""
import pytest

# The GPU's own kernels' target (None) and sm_121's compiled for a Hopper (decode.kernel_target):
# the GPU tests taking the `target` fixture run GB10's code path on the H200 too
TARGETS = [None, "sm_121@sm_90a"]


def _own_target(torch):
    from dsaops import targets

    return targets.for_gpu(torch.cuda.get_device_properties(0), bool(torch.version.hip))


@pytest.fixture(params=TARGETS, ids=["own", "sm121-proxy"])
def target(request):
    """None: the GPU's own kernels; else a decode.kernel_target name, run on a Hopper only."""
    if request.param is not None:
        torch = pytest.importorskip("torch")
        own = _own_target(torch) if torch.cuda.is_available() else None
        if own is None or not own.has("wgmma"):
            pytest.skip(f"{request.param} runs sm_121's kernels on a Hopper")
    return request.param


@pytest.fixture(scope="session", autouse=True)
def _decode_kernels_compiled(request):
    if not any("gpu" in item.keywords for item in request.session.items):
        return
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        return
    from dsaops.kernels import decode
    from dsaops.kernels.build import kernel_jobs

    own = _own_target(torch)
    if own is None or own.vendor != "nvidia":
        return
    jobs = []
    for name in [own.name] + [t for t in TARGETS if t and own.has("wgmma")]:
        target = decode.kernel_target(name)
        jobs += [(name, tile, d_tail, False) for tile, d_tail in kernel_jobs(target)]
        if name == own.name:
            jobs += [(name, tile, d_tail, True) for tile, d_tail in kernel_jobs(target, row_scaled=True, merges=False)]
    decode.warm_cache(jobs)
