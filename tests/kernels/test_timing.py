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
