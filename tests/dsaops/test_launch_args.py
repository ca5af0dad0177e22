"""dsaops.launch_args: the one writer of SGLang's command line (cluster flags, then one node's)."""
import pytest

from dsaops.launch_args import ClusterSpec, NodeSpec, cluster_args, kv_cache_args, launch_args

SPARKS = ClusterSpec(tp_size=2, nnodes=2, kv_cache_dtype="fp8_e4m3", dsa_prefill_backend="tilelang",
                     dsa_decode_backend="tilelang", mem_fraction_static=0.8, max_running_requests=16,
                     enable_metrics=True)


def pairs(args: list[str]) -> dict[str, str | None]:
    """{flag: value or None}; fails on a flag given twice."""
    out, flag = {}, None
    for arg in args:
        if arg.startswith("--"):
            assert arg not in out, f"{arg} twice in {args}"
            out[flag := arg] = None
        else:
            assert flag and out[flag] is None, f"{arg} is not a flag's value in {args}"
            out[flag] = arg
    return out


def test_defaults_leave_sglang_its_own():
    assert cluster_args(ClusterSpec(tp_size=1, kv_cache_dtype="fp8_e4m3")) == ["--tp-size", "1", "--kv-cache-dtype",
                                                                               "fp8_e4m3"]


def test_every_setting_once_in_sglangs_spelling():
    spec = ClusterSpec(tp_size=8, dp_size=2, attn_dp_size=4, ep_size=8, nnodes=2, kv_cache_dtype="bf16",
                       dsa_prefill_backend="flashmla_sparse", dsa_decode_backend="fa3", mem_fraction_static=0.85,
                       context_length=32768, max_running_requests=240, max_mamba_cache_size=300,
                       mamba_full_memory_ratio=1.0, mamba_ssm_dtype="bfloat16", speculative_num_draft_tokens=6,
                       enable_metrics=True)
    assert pairs(cluster_args(spec)) == {
        "--tp-size": "8", "--dp-size": "2", "--attn-dp-size": "4", "--ep-size": "8", "--nnodes": "2",
        "--kv-cache-dtype": "bfloat16", "--dsa-prefill-backend": "flashmla_sparse", "--dsa-decode-backend": "fa3",
        "--mem-fraction-static": "0.85", "--context-length": "32768", "--max-running-requests": "240",
        "--max-mamba-cache-size": "300", "--mamba-full-memory-ratio": "1", "--mamba-ssm-dtype": "bfloat16",
        "--speculative-num-draft-tokens": "6", "--speculative-algorithm": "EAGLE", "--speculative-num-steps": "5",
        "--speculative-eagle-topk": "1", "--enable-metrics": None}


def test_numbers_keep_their_digits():
    """A fraction reaches SGLang as given, not rounded to six digits."""
    assert pairs(cluster_args(ClusterSpec(tp_size=1, kv_cache_dtype="fp8_e4m3", mem_fraction_static=0.8123456789)))[
        "--mem-fraction-static"] == "0.8123456789"


def test_a_node_adds_its_place_then_the_users_extras():
    head = NodeSpec(model_path="/models/glm", host="0.0.0.0", port=30000, node_rank=0,
                    dist_init_addr="10.0.0.1:25000", extra_args=("--trust-remote-code",))
    args = launch_args(SPARKS, head)
    assert args[:6] == ["--model-path", "/models/glm", "--host", "0.0.0.0", "--port", "30000"]
    assert args[6:6 + len(cluster_args(SPARKS))] == cluster_args(SPARKS)
    assert args[-5:] == ["--node-rank", "0", "--dist-init-addr", "10.0.0.1:25000", "--trust-remote-code"]
    one = launch_args(ClusterSpec(tp_size=8, kv_cache_dtype="fp8_e4m3"),
                      NodeSpec(model_path="m", host="127.0.0.1", port=1, dist_init_addr="ignored:1"))
    assert "--node-rank" not in one and "--dist-init-addr" not in one     # one node: nothing to join


@pytest.mark.parametrize("node, message", [
    (NodeSpec(model_path="m", host="h", port=1, node_rank=1), "needs the dist-init address"),
    (NodeSpec(model_path="m", host="h", port=1, node_rank=2, dist_init_addr="a:1"), "node rank 2 is not in 0..1"),
])
def test_a_node_that_cannot_join_is_refused(node, message):
    with pytest.raises(ValueError, match=message):
        launch_args(SPARKS, node)


def test_the_plan_reports_the_cluster_flags(capsys):
    from dsaops.plan import PlanRequest, make_plan

    plan = make_plan(PlanRequest(target="sm_121", nodes=2, gpus_per_node=1, tp_size=2, kv_cache_dtype="fp8_e4m3",
                                 dsa_prefill_backend="tilelang", dsa_decode_backend="tilelang",
                                 mem_fraction_static=0.8, gpu_memory_gib=115, weights_gib=140, max_running_requests=16))
    assert plan.sglang_args == cluster_args(ClusterSpec(
        tp_size=2, nnodes=2, kv_cache_dtype="fp8_e4m3", dsa_prefill_backend="tilelang", dsa_decode_backend="tilelang",
        mem_fraction_static=0.8, max_running_requests=16, chunked_prefill_size=4096))   # GB10's prefill bound
    assert plan.to_json()["sglang_args"] == plan.sglang_args


def test_kv_cache_args_name_sglangs_dtype():
    assert kv_cache_args("bf16") == ["--kv-cache-dtype", "bfloat16"]
    assert kv_cache_args("fp8_e4m3", "tilelang", "flashmla_sparse") == [
        "--kv-cache-dtype", "fp8_e4m3", "--dsa-prefill-backend", "tilelang", "--dsa-decode-backend", "flashmla_sparse"]
