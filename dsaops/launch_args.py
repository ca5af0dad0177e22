"""The SGLang command line (`python -m sglang.launch_server ...`): every flag dsaops passes is spelled here.

`cluster_args` gives the flags every node of a deployment shares, from a `ClusterSpec`;
`launch_args` adds one node's own flags (`NodeSpec`) and the user's extra arguments. The
planner reports `cluster_args` as `sglang_args`, the playbooks render `launch_args` into each
node's server command (the dsaops_sglang_args filter in playbooks/roles/dsaops/filter_plugins/),
and the boot gate takes its refused pairing from `kv_cache_args`. Spelling follows SGLang 0.5.23 (`--attn-dp-size`,
not the deprecated `--enable-dp-attention`). Stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClusterSpec:
    """What every node of one deployment launches with; None (or 1) leaves SGLang's default."""

    tp_size: int
    kv_cache_dtype: str                      # bf16 | bfloat16 | fp8_e4m3 (SGLang's spelling)
    dsa_prefill_backend: str | None = None   # None: SGLang picks for the target and KV dtype
    dsa_decode_backend: str | None = None
    nnodes: int = 1
    dp_size: int = 1                         # data-parallel replicas
    attn_dp_size: int = 1                    # attention-DP groups inside the TP group
    ep_size: int = 1                         # expert parallelism
    mem_fraction_static: float | None = None
    context_length: int | None = None
    max_running_requests: int | None = None  # per deployment: SGLang divides it by attn_dp_size
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float | None = None
    mamba_ssm_dtype: str = "float32"
    speculative_num_draft_tokens: int | None = None   # MTP: NextN layers as the EAGLE draft, a chain of N - 1 steps
    speculative_adaptive: bool = False       # SGLang adapts the steps at run time, starting at N - 1
    chunked_prefill_size: int | None = None  # most tokens one prefill chunk takes (the target's bound)
    served_model_name: str | None = None     # the model id clients see, when --model-path is a local folder
    enable_metrics: bool = False             # Prometheus /metrics on the server port
    nccl_port: int | None = None             # one node: the TCPStore's port (SGLang draws one at random without it)
    mm_feature_transport: str = "cpu"        # cuda_ipc: multimodal features through a GPU pool (SGLang's auto: cpu)


@dataclass(frozen=True)
class NodeSpec:
    """One node's place in the deployment; node_rank and dist_init_addr matter with nnodes > 1."""

    model_path: str
    host: str                  # the HTTP API's bind address
    port: int
    node_rank: int = 0
    dist_init_addr: str | None = None    # HOST:PORT of node rank 0
    config_file: str | None = None       # SGLang's --config: a YAML file of flags kept off the command line (keys)
    model_revision: str | None = None    # a Hub id's branch, tag or commit, for a server that downloads it itself
    extra_args: tuple[str, ...] = field(default_factory=tuple)   # appended last, so they win


def kv_cache_args(kv_cache_dtype: str, prefill: str | None = None, decode: str | None = None) -> list[str]:
    """The KV cache dtype and the DSA backends that read and write it."""
    out = ["--kv-cache-dtype", "bfloat16" if kv_cache_dtype == "bf16" else kv_cache_dtype]
    if prefill is not None:
        out += ["--dsa-prefill-backend", prefill]
    if decode is not None:
        out += ["--dsa-decode-backend", decode]
    return out


def cluster_args(spec: ClusterSpec) -> list[str]:
    """The flags every node of the deployment passes, in a fixed order."""
    out = ["--tp-size", str(spec.tp_size)]
    for flag, value in (("--dp-size", spec.dp_size), ("--attn-dp-size", spec.attn_dp_size),
                        ("--ep-size", spec.ep_size), ("--nnodes", spec.nnodes)):
        if value > 1:
            out += [flag, str(value)]
    out += kv_cache_args(spec.kv_cache_dtype, spec.dsa_prefill_backend, spec.dsa_decode_backend)
    for flag, value in (("--mem-fraction-static", spec.mem_fraction_static),
                        ("--context-length", spec.context_length),
                        ("--max-running-requests", spec.max_running_requests),
                        ("--max-mamba-cache-size", spec.max_mamba_cache_size),
                        ("--mamba-full-memory-ratio", spec.mamba_full_memory_ratio),
                        ("--speculative-num-draft-tokens", spec.speculative_num_draft_tokens),
                        ("--chunked-prefill-size", spec.chunked_prefill_size)):
        if value is not None:
            out += [flag, _number(value)]
    if spec.served_model_name:
        out += ["--served-model-name", spec.served_model_name]
    if spec.mamba_ssm_dtype != "float32":
        out += ["--mamba-ssm-dtype", spec.mamba_ssm_dtype]
    if spec.mm_feature_transport != "cpu":
        out += ["--mm-feature-transport", spec.mm_feature_transport]
    if spec.speculative_num_draft_tokens:
        # with the steps and top-k given: SGLang asserts that draft tokens come with them, and with top-k 1
        # makes them steps + 1 (arg_groups/speculative_hook.py _handle_eagle_family)
        out += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(spec.speculative_num_draft_tokens - 1),
                "--speculative-eagle-topk", "1"]
        if spec.speculative_adaptive:
            out.append("--speculative-adaptive")
    if spec.enable_metrics:
        out.append("--enable-metrics")
    if spec.nccl_port is not None:
        out += ["--nccl-port", str(spec.nccl_port)]
    return out


def launch_args(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    """One node's whole `sglang.launch_server` argument list: the cluster's flags, its own, the extras."""
    out = ["--model-path", node.model_path]
    if node.model_revision:
        out += ["--revision", node.model_revision]
    out += ["--host", node.host, "--port", str(node.port), *cluster_args(spec)]
    if spec.nnodes > 1:
        if not node.dist_init_addr:
            raise ValueError(f"a {spec.nnodes}-node deployment needs the dist-init address (HOST:PORT of node rank 0)")
        if not 0 <= node.node_rank < spec.nnodes:
            raise ValueError(f"node rank {node.node_rank} is not in 0..{spec.nnodes - 1}")
        out += ["--node-rank", str(node.node_rank), "--dist-init-addr", node.dist_init_addr]
    if node.config_file:
        out += ["--config", node.config_file]
    return out + list(node.extra_args)


def _number(value: float) -> str:
    """As typed, without a float's trailing `.0` (0.8 -> 0.8, 16 -> 16, 1.0 -> 1)."""
    text = repr(value)
    return text[:-2] if isinstance(value, float) and text.endswith(".0") else text
