"""kernels/timing.py: how many input sets a rotation cycles (CPU), and on a GPU that a rotation
really reads from HBM where same-input replay reads from L2."""
import pytest
from dsaops.kernels import timing


def test_rotation_reads_at_least_256_mib_between_two_calls_of_one_set():
    for per_call in (1, 1 << 20, 3 << 20, 100 << 20, 256 << 20, 1 << 30):
        n = timing.rotation_count(per_call)
        assert (n - 1) * per_call >= timing.ROTATE_BYTES and n >= 2
        assert (n - 2) * per_call < timing.ROTATE_BYTES  # and no more sets than that takes
    # one decode query of top-k 2048 reads 2048 rows of 512 B and their int32 ids
    assert timing.rotation_count(2048 * 516) == 256
    with pytest.raises(ValueError, match="positive"):
        timing.rotation_count(0)
    with pytest.raises(ValueError, match="two input sets"):
        timing.rotated_us([print])


@pytest.mark.gpu
def test_rotated_inputs_miss_l2_where_the_same_input_hits_it():
    """A 16 MiB read fits the H200's 50 MB L2 (even at half of it, where both partitions hold a copy):
    replayed on the same tensor it comes from L2 after the graph's first call, rotated over tensors
    that add up to more than 256 MiB it comes from HBM, measurably slower."""
    torch = pytest.importorskip("torch")

    n = 16 << 20
    tensors = [torch.ones(n // 4, device="cuda") for _ in range(timing.rotation_count(n))]
    out = torch.empty(1, device="cuda")
    calls = [lambda t=t: torch.sum(t.view(1, -1), dim=1, out=out) for t in tensors]  # out= needs a dim
    same, rotated = timing.graph_us(calls[0]), timing.rotated_us(calls)
    assert rotated > 1.1 * same, (same, rotated)


def test_host_runs_take_turns_so_a_slow_phase_spares_every_calls_least():
    """Run r of every call before run r + 1 of any, the GPU waited for after each run, one (least,
    median) a call. A slow phase of the host as long as one call's runs (here: the first four runs,
    each call 2 ms slower) then slows half the runs of each call, and no call's least; timed one call
    after the other, it would slow every run of the first call."""
    log, repeats = [], 4

    def sync():
        log.append("sync")

    def call(name):
        def fn():
            log.append(name)
            if 1 <= log.count("sync") <= repeats:  # after the warm-up's sync, during the first four runs
                timing.time.sleep(2e-3)
        return fn

    times = timing.host_us([call("a"), call("b")], calls=3, repeats=repeats, sync=sync)
    assert log[:3] == ["a", "b", "sync"]  # a warm-up call each, then the GPU waited for
    assert log[3:] == (["a"] * 3 + ["sync"] + ["b"] * 3 + ["sync"]) * repeats
    assert len(times) == 2
    for least, median in times:
        assert least < 1000 < median  # two slow runs of four: the median is between a slow and a fast one
