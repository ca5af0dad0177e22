"""`dsaops plan`: KV layout, pool sizes and what caps concurrency, before a launch.

SGLang 0.5.23 tells these only in its startup log, minutes into a launch. The plan
replays its sizing (dsaops.model_geometry, dsaops.kv_layout, dsaops.kv_budget) and its
request limit (dsaops.concurrency.resolve). The one input that cannot be known ahead is the
GPU memory left after the weights load: give it with --free-memory-gib (the `avail mem=` of
SGLang's `Load weight end` log line), or --weights-gib; otherwise the model preset's
checkpoint estimate and the target's reserved memory stand in, and the output says so.

From Python: `make_plan(PlanRequest(...))` returns a `Plan`; `Plan.to_json()` is the object
`--json` prints (its fields document the keys).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from dsaops import concurrency, kv_budget, kv_layout, launch_args, model_geometry, plan_input, targets
from dsaops.cli_args import whole_up_to
from dsaops.errors import UserError

DRAFT_NOTE = ("speculative decoding is sized as MTP (NextN layers as the EAGLE draft: their KV and the mamba "
              "scratch per draft token); a DFLASH drafter's own KV is not counted; SGLang loads the draft's "
              "weights before it sizes the pools, so --free-memory-gib is the `avail mem=` of the draft's "
              "`Load weight end` line, the later one, and --weights-gib counts the draft's weights too")
# speculative/adaptive_spec_params.py DEFAULT_ADAPTIVE_CONFIG, every batch-size tier's candidate steps together
# (resolve_candidate_steps_from_config): --speculative-adaptive starts at the middle one, stops at startup on steps
# outside them, and the mamba pool keeps a verify scratch for the largest + 1 draft tokens
ADAPTIVE_STEPS = (0, 1, 3, 5, 7)
# arg_groups/serving_hook.py handle_multimodal_feature_transport, word for word
CUDA_IPC_ONE_NODE = "--mm-feature-transport=cuda_ipc only supports a single node."


def add_parser(sub) -> None:
    count = whole_up_to(plan_input.INT_MOST)  # check()'s bound, in ASCII digits: int() took '٣', '1_000', ' 7 '
    p = sub.add_parser("plan", help="KV pool, mamba slots and concurrency caps for a launch, before launching",
                       description=__doc__.splitlines()[0])
    m = p.add_mutually_exclusive_group()
    m.add_argument("--model", default=None, help="a model preset (default glm-5.3-flash)")
    m.add_argument("--model-config", help="the model's config.json instead of a preset")
    p.add_argument("--target", required=True, help="sm_90 | sm_121 | gfx942 (see `dsaops targets`)")
    p.add_argument("--nodes", type=count, required=True)
    p.add_argument("--gpus-per-node", type=count, required=True)
    p.add_argument("--tp-size", type=count, required=True)
    p.add_argument("--dp-size", type=count, default=1, help="data-parallel replicas (with --enable-dp-attention and "
                   "no --attn-dp-size above 1: the attention-DP size, SGLang's deprecated spelling)")
    p.add_argument("--enable-dp-attention", action="store_true", help="deprecated: use --attn-dp-size")
    p.add_argument("--attn-dp-size", type=count, default=None, help="attention-DP groups inside the TP group")
    p.add_argument("--kv-cache-dtype", required=True, choices=["bf16", "bfloat16", "fp8_e4m3"])
    p.add_argument("--dsa-prefill-backend", help="e.g. tilelang (default: what SGLang picks for the target and KV "
                   "dtype); SGLang's names only")
    p.add_argument("--dsa-decode-backend", help="e.g. tilelang; as --dsa-prefill-backend")
    p.add_argument("--mem-fraction-static", type=float, required=True)
    p.add_argument("--gpu-memory-gib", type=float, required=True, help="memory of one GPU (GB10: what the GPU may use)")
    p.add_argument("--free-memory-gib", type=float, help="free memory per GPU after weights: the `avail mem=` "
                   "of SGLang's last `Load weight end` log line (the draft's with speculative decoding), the smallest "
                   "across ranks (most exact)")
    p.add_argument("--weights-gib", type=float, help="checkpoint size, all ranks together (default: the preset's)")
    p.add_argument("--context-length", type=whole_up_to(plan_input.INT_MOST, sizes=True),
                   help="tokens; 131072, 128k or 128Ki, as SGLang takes it")
    p.add_argument("--max-running-requests", type=count)
    p.add_argument("--max-mamba-cache-size", type=count, help="mamba state slots, all DP ranks together")
    p.add_argument("--mamba-ssm-dtype", choices=plan_input.MAMBA_SSM_DTYPES, default="float32")
    p.add_argument("--mamba-full-memory-ratio", type=float)
    p.add_argument("--mamba-radix-cache-strategy", default="auto", choices=plan_input.MAMBA_RADIX_CACHE_STRATEGIES)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--skip-decode-lock", action="store_true", help="as with SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1")
    p.add_argument("--mm-feature-transport", choices=plan_input.MM_FEATURE_TRANSPORTS, default="cpu",
                   help="cuda_ipc reserves SGLang's GPU feature pool out of a multimodal model's KV budget "
                        "(one node only; SGLang refuses cuda_vmm for DSA models)")
    p.add_argument("--speculative-num-draft-tokens", type=whole_up_to(plan_input.INT_MOST, least=2),
                   help="MTP (NextN) speculative decoding: the draft tokens a step, 2 or more (a chain of N - 1 draft steps)")
    p.add_argument("--speculative-adaptive", action="store_true",
                   help="SGLang's adaptive draft steps, started at --speculative-num-draft-tokens - 1 (one of "
                        f"{', '.join(map(str, ADAPTIVE_STEPS))}); no attention DP")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    request = PlanRequest(**{f.name: getattr(args, f.name) for f in fields(PlanRequest)})
    p = make_plan(request)
    print(json.dumps(p.to_json(), indent=2) if args.json else render(p))
    return 0


@dataclass(frozen=True)
class PlanRequest:
    """One planned launch: the `dsaops plan` options, by the same names (None: not given)."""

    target: str                              # a name in dsaops/targets.toml
    nodes: int
    gpus_per_node: int
    tp_size: int
    kv_cache_dtype: str                      # bf16 | bfloat16 | fp8_e4m3
    mem_fraction_static: float
    gpu_memory_gib: float                    # memory of one GPU (GB10: what the GPU may use)
    model: str | None = None                 # a preset; None with model_config None: glm-5.3-flash
    model_config: str | None = None          # a config.json instead of a preset
    dp_size: int = 1
    enable_dp_attention: bool = False        # deprecated spelling: with attn_dp_size 1, dp_size is the attention-DP size
    attn_dp_size: int | None = None
    dsa_prefill_backend: str | None = None   # None: what SGLang picks for the target and KV dtype
    dsa_decode_backend: str | None = None
    free_memory_gib: float | None = None     # `avail mem=` of SGLang's `Load weight end` line (most exact)
    weights_gib: float | None = None         # checkpoint size, all ranks together
    context_length: int | None = None
    max_running_requests: int | None = None
    max_mamba_cache_size: int | None = None
    mamba_ssm_dtype: str = "float32"
    mamba_full_memory_ratio: float | None = None
    mamba_radix_cache_strategy: str = "auto"
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    skip_decode_lock: bool = False
    speculative_num_draft_tokens: int | None = None
    speculative_adaptive: bool = False       # SGLang's default candidate steps, started at draft tokens - 1
    mm_feature_transport: str = "cpu"        # cpu | cuda_ipc: a multimodal model's GPU feature pool


@dataclass(frozen=True)
class Parallel:
    gpus: int
    tp_size: int
    dp_size: int             # data-parallel replicas
    attn_dp_size: int        # attention-DP groups inside the TP group
    attn_tp_size: int        # tp_size // attn_dp_size: the width of one rank's attention


@dataclass(frozen=True)
class Memory:
    """GiB per GPU."""

    gpu_memory_gib: float
    reserved_gib: float              # the target's reserved_memory_gib
    pre_load_free_gib: float         # free before the weights load
    free_after_weights_gib: float
    free_after_weights_source: str   # --free-memory-gib | --weights-gib | preset estimate
    slack_gib: float                 # pre_load_free_gib x (1 - mem_fraction_static)
    rest_gib: float                  # for the mamba state and the KV pool
    mamba_pool_gib: float
    kv_budget_gib: float
    verify_scratch_gib: float        # --speculative-adaptive's scratch beyond the pools, out of the slack (else 0)

    @property
    def activation_room_gib(self) -> float:
        """What prefill activations have beside the pools: the slack less the verify scratch."""
        return round(self.slack_gib - self.verify_scratch_gib, 3)


@dataclass(frozen=True)
class Plan:
    """The plan, and (`to_json()`) the contract `dsaops plan --json` prints, the playbook's
    preflight checks and `dsaops exporter --plan` reads: these keys, in this order."""

    model: str
    target: str
    kv_layout: str                           # bf16 | raw_fp8 | scaled_fp8 (dsaops.kv_layout)
    kv_cache_dtype: str                      # bf16 | fp8_e4m3
    kv_storage_dtype: str                    # bfloat16, or the target's fp8 dtype
    dsa_prefill_backend: str
    dsa_decode_backend: str
    kv_bytes_per_token: int
    kv_bytes_per_token_detail: dict          # attention/indexer (per layer, layers, bytes), draft, total
    kv_pool_tokens_per_rank: int
    kv_pool_gib_per_rank: float              # as SGLang's startup log prints it
    mamba_slots_per_dp: int | None           # None: the model has no mamba state
    mamba_slots_source: str | None           # how the slot count was chosen (auto, --max-mamba-cache-size, ...)
    mamba_slot_bytes: dict | None            # conv, ssm, total, layers
    mamba_state_slots_per_request: int | None
    mamba_running_requests_cap: int | None
    max_running_requests_requested: int | None
    max_running_requests_per_dp: int         # what each DP rank's scheduler runs at most
    binding_limit: str                       # request | dp_split | kv | mamba (dsaops.concurrency)
    kv_running_requests_cap: int
    context_length: int
    prefill_chunk_tokens: int | None         # --chunked-prefill-size: the target's bound, fitted to the slack (None: SGLang's)
    parallel: Parallel
    memory: Memory
    sglang_args: list[str]                   # the cluster-wide launch flags (dsaops.launch_args.cluster_args)
    warnings: list[str]                      # what to change, one sentence each
    assumptions: list[str]                   # what the figures rest on

    def to_json(self) -> dict:
        """The contract as one JSON-ready dict."""
        return asdict(self)


def make_plan(req: PlanRequest) -> Plan:
    """The plan for `req`; raises UserError (one line: what to change) where SGLang would refuse or
    the numbers do not add up."""
    plan_input.check(req)
    if req.mm_feature_transport == "cuda_ipc" and req.nodes > 1:
        raise UserError(f"SGLang refuses this launch at startup: {CUDA_IPC_ONE_NODE} (use --mm-feature-transport cpu)")
    target = targets.get(req.target)
    # a ModelConfigError, here or in the sizing below, is a UserError already
    model = (model_geometry.load_config_file(req.model_config) if req.model_config
             else model_geometry.load_preset("glm-5.3-flash" if req.model is None else req.model))
    par = _parallelism(req)
    hip = target.vendor == "amd"
    try:
        kv_dtype = kv_layout.normalize_kv_dtype(req.kv_cache_dtype)
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        kv_layout.check_backend_names(req.dsa_prefill_backend, req.dsa_decode_backend)
    except kv_layout.BackendRefused as e:
        raise UserError(str(e)) from None
    sm_major = int(target.compute_capability.split(".")[0] or 0)
    backends = kv_layout.resolve_backends(kv_dtype, req.dsa_prefill_backend, req.dsa_decode_backend, hip=hip,
                                          sm_major=sm_major, architecture=model.architecture)
    nope_q8 = kv_layout.q8_raw_nope(backends, kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim)
    skipped = kv_layout.skips_backend_check(kv_dtype, hip=hip, sm_major=sm_major, architecture=model.architecture)
    try:
        kv_layout.check_backends(kv_dtype, backends, hip=hip, q8_prefill=target.has("q8_prefill"), nope_q8=nope_q8,
                                 skipped=skipped)
    except kv_layout.BackendRefused as e:
        raise UserError(f"SGLang refuses this launch at startup: {e}") from None
    layout = kv_layout.kv_layout(kv_dtype, backends, hip=hip, nope_q8=nope_q8, fp8_dtype=target.fp8_dtype)
    try:
        kv_layout.check_rows(backends, layout)
    except kv_layout.BackendRefused as e:
        raise UserError(f"dsaops refuses this launch: {e}") from None

    scratch_tokens = _adaptive_scratch_tokens(req, par)
    pre_load, free, source, assumptions = _free_memory(req, target, model, par)
    running = req.max_running_requests
    if running is None and req.speculative_num_draft_tokens:
        running = concurrency.SPEC_DEFAULT_RUNNING_REQUESTS
    slots_per_req = _mamba_slots_per_request(req)
    cell = model.kv_bytes_per_token(layout, with_draft=bool(req.speculative_num_draft_tokens))
    rest = kv_budget.rest_memory_gib(pre_load_free_gib=round(pre_load, 3), free_after_weights_gib=round(free, 3),
                                     mem_fraction_static=req.mem_fraction_static, multimodal=model.multimodal,
                                     mm_feature_transport=req.mm_feature_transport)
    try:
        slot, mamba, kv_gib, tokens = _pools(req, model, par, rest, cell["total"], slots_per_req, running,
                                             scratch_tokens)
    except kv_budget.NotEnoughMemory as e:
        raise UserError(str(e)) from None

    context = req.context_length or model.context_length
    conc = concurrency.resolve(requested=running, attn_dp_size=par.attn_dp_size,
                               token_capacity=tokens, context_len=context,
                               max_mamba_cache_size=mamba.slots_per_dp if mamba else None,
                               mamba_slots=slots_per_req if mamba else None)
    if conc.effective_per_dp <= 0:  # resolve_max_num_reqs refuses to start
        raise UserError(f"the mamba state cache ({mamba.slots_per_dp} slots per DP rank, {slots_per_req} a request) is "
                        "too small to serve any request: raise --max-mamba-cache-size or --mem-fraction-static")
    memory = Memory(gpu_memory_gib=req.gpu_memory_gib, reserved_gib=target.reserved_memory_gib,
                    pre_load_free_gib=round(pre_load, 3), free_after_weights_gib=round(free, 3),
                    free_after_weights_source=source,
                    slack_gib=round(pre_load * (1 - req.mem_fraction_static), 3),
                    rest_gib=round(rest, 3), mamba_pool_gib=round(mamba.bytes / kv_budget.GIB, 3) if mamba else 0.0,
                    kv_budget_gib=round(kv_gib, 3),
                    verify_scratch_gib=round(mamba.unbudgeted / kv_budget.GIB, 3) if mamba else 0.0)
    chunk = (kv_budget.prefill_chunk(target.chunked_prefill_size, memory.activation_room_gib)
             if target.chunked_prefill_size else None)
    spec = launch_args.ClusterSpec(
        tp_size=par.tp_size, dp_size=par.dp_size, attn_dp_size=par.attn_dp_size, nnodes=req.nodes,
        kv_cache_dtype=kv_dtype, dsa_prefill_backend=backends.prefill, dsa_decode_backend=backends.decode,
        mem_fraction_static=req.mem_fraction_static, context_length=req.context_length,
        max_running_requests=req.max_running_requests, max_mamba_cache_size=req.max_mamba_cache_size,
        mamba_full_memory_ratio=req.mamba_full_memory_ratio, mamba_ssm_dtype=req.mamba_ssm_dtype,
        speculative_num_draft_tokens=req.speculative_num_draft_tokens, speculative_adaptive=req.speculative_adaptive,
        chunked_prefill_size=chunk, mm_feature_transport=req.mm_feature_transport)
    return Plan(
        model=model.name, target=target.name,
        kv_layout=layout, kv_cache_dtype=kv_dtype,
        kv_storage_dtype="bfloat16" if layout == "bf16" else target.fp8_dtype,
        dsa_prefill_backend=backends.prefill, dsa_decode_backend=backends.decode,
        kv_bytes_per_token=cell["total"], kv_bytes_per_token_detail=cell,
        kv_pool_tokens_per_rank=tokens,
        kv_pool_gib_per_rank=round(model.kv_pool_bytes(tokens, layout) / kv_budget.GIB, 2),
        mamba_slots_per_dp=mamba.slots_per_dp if mamba else None,
        mamba_slots_source=mamba.source if mamba else None,
        mamba_slot_bytes=slot if mamba else None,
        mamba_state_slots_per_request=slots_per_req if mamba else None,
        mamba_running_requests_cap=conc.mamba_cap,
        max_running_requests_requested=req.max_running_requests,
        max_running_requests_per_dp=conc.effective_per_dp,
        binding_limit=conc.binding,
        kv_running_requests_cap=conc.kv_cap,
        context_length=context,
        prefill_chunk_tokens=chunk,
        parallel=par, memory=memory,
        sglang_args=launch_args.cluster_args(spec),
        warnings=_warnings(req, par, conc, tokens, context, backends, mamba, slots_per_req)
        + _prefill_warnings(target, chunk, memory) + _scratch_warnings(memory),
        assumptions=assumptions + ([DRAFT_NOTE] if req.speculative_num_draft_tokens else [])
        + ([_scratch_note(req, scratch_tokens, memory)] if memory.verify_scratch_gib else []),
    )


def _pools(req: PlanRequest, model, par: Parallel, rest_gib: float, cell_bytes: int, slots_per_req: int,
           running: int | None, scratch_tokens: int | None):
    """The mamba state pool first, then the KV pool from what is left (_profile_available_bytes);
    `running` is --max-running-requests as SGLang resolves it, `scratch_tokens` the draft tokens the
    pool keeps a verify scratch for (_adaptive_scratch_tokens)."""
    slot = model.mamba_slot_bytes(par.attn_tp_size, ssm_bytes=4 if req.mamba_ssm_dtype == "float32" else 2)
    mamba = None
    if model.linear_layers:
        mamba = kv_budget.mamba_pool(
            rest_gib, slot_bytes=slot["total"], attn_dp_size=par.attn_dp_size, slots_per_request=slots_per_req,
            max_mamba_cache_size=req.max_mamba_cache_size, max_running_requests=running,
            disable_radix_cache=req.disable_radix_cache,
            full_memory_ratio=req.mamba_full_memory_ratio or kv_budget.MAMBA_FULL_MEMORY_RATIO,
            draft_tokens=req.speculative_num_draft_tokens, scratch_tokens=scratch_tokens)
    kv_gib = rest_gib - (mamba.bytes / kv_budget.GIB if mamba else 0)
    if kv_gib <= 0:
        raise kv_budget.NotEnoughMemory(f"loaded weights leave no GPU memory for the KV cache under "
                                        f"--mem-fraction-static={req.mem_fraction_static}: raise it")
    tokens = kv_budget.kv_pool_tokens(kv_gib * kv_budget.GIB, cell_bytes=cell_bytes, page_tokens=model.page_tokens)
    return slot, mamba, kv_gib, tokens


def _adaptive_scratch_tokens(req: PlanRequest, par: Parallel) -> int | None:
    """The draft tokens the mamba pool keeps a verify scratch for under --speculative-adaptive: the largest
    candidate step + 1 (spec_info.py resolve_max_speculative_num_draft_tokens), while SGLang budgets the pools
    for the count it starts with; None without the switch. UserError where SGLang turns the switch off (it then
    does nothing) or stops at startup."""
    if not req.speculative_adaptive:
        return None
    if not req.speculative_num_draft_tokens:
        raise UserError("--speculative-adaptive without --speculative-num-draft-tokens starts no speculative decoding: "
                        "add --speculative-num-draft-tokens 4 (MTP), or drop the flag")
    if par.attn_dp_size > 1:
        raise UserError(f"SGLang turns --speculative-adaptive off under attention DP (size {par.attn_dp_size}: its step "
                        "choices are not kept alike across DP ranks) and runs the static steps; drop it")
    if req.speculative_num_draft_tokens - 1 not in ADAPTIVE_STEPS:
        draft = req.speculative_num_draft_tokens
        raise UserError(f"SGLang stops at startup: --speculative-adaptive starts at {draft - 1} draft steps "
                        f"(--speculative-num-draft-tokens {draft} less 1), not among its candidate steps "
                        f"{', '.join(map(str, ADAPTIVE_STEPS))}; give --speculative-num-draft-tokens "
                        f"{', '.join(str(s + 1) for s in ADAPTIVE_STEPS if s)}")
    return max(ADAPTIVE_STEPS) + 1


def _parallelism(req: PlanRequest) -> Parallel:
    # parallel_hook.py handle_deprecated_dp_attention: `--dp-size N --enable-dp-attention`
    # means attn_dp_size = N, dp_size = 1, unless --attn-dp-size is wider than 1.
    attn_dp, dp = req.attn_dp_size or 1, req.dp_size
    if req.enable_dp_attention and attn_dp == 1:
        attn_dp, dp = req.dp_size, 1
    if attn_dp < 1 or req.tp_size % attn_dp:
        raise UserError(f"the attention-DP size ({attn_dp}) must divide --tp-size ({req.tp_size})")
    gpus = req.nodes * req.gpus_per_node
    if req.tp_size * dp != gpus:
        raise UserError(f"{req.nodes} node(s) x {req.gpus_per_node} GPU(s) = {gpus} GPUs, but tp-size {req.tp_size} "
                        f"x dp-size {dp} replicas needs {req.tp_size * dp}: make them agree")
    return Parallel(gpus=gpus, tp_size=req.tp_size, dp_size=dp, attn_dp_size=attn_dp,
                    attn_tp_size=req.tp_size // attn_dp)


def _free_memory(req: PlanRequest, target, model, par: Parallel) -> tuple[float, float, str, list[str]]:
    """Free GPU memory before and after the weights load, where the second figure came from, and
    what it assumes."""
    pre = req.gpu_memory_gib - target.reserved_memory_gib
    assumptions = [(f"free memory before weights: --gpu-memory-gib {req.gpu_memory_gib:g} less {target.name}'s "
                    f"reserved_memory_gib {target.reserved_memory_gib:g} (dsaops/targets.toml)")]
    if req.free_memory_gib is not None:
        free, source = req.free_memory_gib, "--free-memory-gib"
    else:
        weights = req.weights_gib if req.weights_gib is not None else model.checkpoint_gib
        if weights is None:
            raise UserError("the model has no checkpoint size: pass --free-memory-gib (the `avail mem=` of SGLang's "
                            "`Load weight end` log line) or --weights-gib")
        free = pre - weights / par.tp_size
        source = "--weights-gib" if req.weights_gib is not None else "preset estimate"
        what = "--weights-gib" if req.weights_gib is not None else f"the preset's estimate ({model.checkpoint_gib_basis})"
        assumptions.append(f"free memory after weights ASSUMED: {pre:.1f} - {weights:g} GiB / tp {par.tp_size} = "
                           f"{free:.1f} GiB per GPU from {what}; for an exact plan pass --free-memory-gib with the "
                           "`avail mem=` of SGLang's `Load weight end` log line")
    if free <= 0 or free > pre:
        raise UserError(f"free memory after weights comes to {free:.1f} GiB per GPU (of {pre:.1f} before weights): "
                        "check --gpu-memory-gib, --weights-gib and --tp-size")
    return pre, free, source, assumptions


def _mamba_slots_per_request(req: PlanRequest) -> int:
    """overrides.py _mamba_radix_cache_resolution: `auto` keeps the extra buffer unless overlap
    scheduling is off (GLM-5.3-Flash pages are 64 tokens, so it stays on); no_buffer turns
    overlap off. Then kv_cache_configurator.py _calculate_mamba_ratio."""
    strategy = req.mamba_radix_cache_strategy
    if strategy == "auto":
        strategy = "extra_buffer"
    overlap = not req.disable_overlap_schedule and strategy != "no_buffer"
    try:
        return concurrency.mamba_slots_per_request(
            disable_radix_cache=req.disable_radix_cache, extra_buffer=strategy.startswith("extra_buffer"),
            overlap=overlap, lazy=strategy == "extra_buffer_lazy", skip_decode_lock=req.skip_decode_lock)
    except ValueError as e:
        raise UserError(str(e)) from None


def _warnings(req: PlanRequest, par: Parallel, conc, tokens, context, backends, mamba, slots_per_req) -> list[str]:
    out = []
    dp = par.attn_dp_size
    if conc.binding == "dp_split":
        out.append(f"--max-running-requests {conc.requested} is per deployment: SGLang divides it by the "
                   f"attention-DP size {dp}, so each DP rank runs {conc.requested_per_dp} "
                   f"({conc.requested} // {dp}); raise --max-running-requests to {dp} x the per-rank concurrency you want")
    if conc.binding == "kv":
        out.append(f"the KV pool ({tokens} tokens) caps each DP rank at {conc.kv_cap} running requests (tokens // 2); "
                   "raise --mem-fraction-static or use --kv-cache-dtype fp8_e4m3 with tilelang backends")
    if conc.binding == "mamba":
        halve = ", or halve the state with --mamba-ssm-dtype bfloat16" if req.mamba_ssm_dtype == "float32" else ""
        out.append(f"the mamba state cache caps each DP rank at {conc.mamba_cap} running requests "
                   f"(max_mamba_cache_size {mamba.slots_per_dp} // {slots_per_req} state slots per request; SGLang "
                   f"says so only in a WARNING log line): raise --max-mamba-cache-size or --mamba-full-memory-ratio{halve}")
    if req.max_running_requests is None and conc.requested is not None:
        out.append(f"no --max-running-requests: with speculative decoding SGLang sets {conc.requested} for the "
                   "deployment; set --max-running-requests to choose")
    if conc.requested is None:
        out.append(f"no --max-running-requests: SGLang picks {conc.requested_per_dp} per DP rank from the pool and "
                   "context length; set --max-running-requests to choose")
    if context > tokens:
        out.append(f"--context-length {context} is longer than the KV pool ({tokens} tokens per rank): one long "
                   "request cannot be held; lower --context-length or free memory for the KV cache")
    if backends.defaulted:
        out.append(f"DSA backends not given: SGLang picks prefill={backends.prefill}, decode={backends.decode}; "
                   "set --dsa-prefill-backend/--dsa-decode-backend tilelang for the raw fp8 layout")
    return out


def _prefill_warnings(target, chunk: int | None, memory: Memory) -> list[str]:
    if chunk is None:
        return []
    room, need = memory.activation_room_gib, kv_budget.activation_gib(chunk)   # the room is what the chunk was fitted to
    if need > room:
        return [(f"the memory left for activations outside the pools ({room:.2f} GiB a GPU) is less than SGLang's own "
                 f"activation estimate for a {chunk}-token prefill chunk ({need:.2f} GiB): "
                 "a long prompt can exhaust memory; lower --mem-fraction-static")]
    if chunk < target.chunked_prefill_size:
        return [(f"prefill chunks lowered from {target.name}'s {target.chunked_prefill_size} to {chunk} tokens "
                f"(--chunked-prefill-size) to fit SGLang's activation estimate in the {room:.2f} GiB left for "
                "activations outside the pools; lower --mem-fraction-static to keep longer chunks")]
    return []


def _scratch_note(req: PlanRequest, scratch_tokens: int, memory: Memory) -> str:
    return (f"--speculative-adaptive: SGLang sizes the pools for the {req.speculative_num_draft_tokens} draft tokens it "
            f"starts with, but the mamba pool keeps its verify scratch for {scratch_tokens} (the largest candidate step "
            f"+ 1): about {memory.verify_scratch_gib:.2f} GiB a GPU beyond the pools (a whole state slot a draft token, "
            f"as SGLang's budget prices it), taken here from the {memory.slack_gib:.2f} GiB left outside them")


def _scratch_warnings(memory: Memory) -> list[str]:
    if memory.activation_room_gib > 0:
        return []
    return [(f"--speculative-adaptive's verify scratch beyond the pools (about {memory.verify_scratch_gib:.2f} GiB a "
             f"GPU) takes all of the {memory.slack_gib:.2f} GiB left outside them: lower --mem-fraction-static, or "
             "drop --speculative-adaptive")]


def render(p: Plan) -> str:
    c, m, par = p.kv_bytes_per_token_detail, p.memory, p.parallel
    lines = [
        (f"dsaops plan: {p.model} on {p.target}, {par.gpus} GPUs: tp {par.tp_size}, "
         f"attention-DP {par.attn_dp_size} (attention TP {par.attn_tp_size}), replicas {par.dp_size}"),
        (f"KV layout        {p.kv_layout} ({p.kv_storage_dtype}), prefill={p.dsa_prefill_backend} "
         f"decode={p.dsa_decode_backend}"),
        (f"KV bytes/token   {p.kv_bytes_per_token:,} = attention {c['attention_layers']} x {c['attention_per_layer']} "
         f"= {c['attention']:,} + DSA indexer {c['indexer_layers']} x {c['indexer_per_layer']} = {c['indexer']:,}"
         + (f" + MTP draft {c['draft']:,}" if c["draft"] else "")),
        (f"memory per GPU   {m.free_after_weights_gib:.2f} GiB free after weights ({m.free_after_weights_source})"
         f" - slack {m.slack_gib:.2f} = {m.rest_gib:.2f} GiB for mamba + KV"),
        (f"KV pool          {p.kv_pool_tokens_per_rank:,} tokens per rank ({p.kv_pool_gib_per_rank:.2f} GiB as "
         "SGLang logs it)"),
    ]
    if p.mamba_slots_per_dp is not None:
        s = p.mamba_slot_bytes
        lines.append(f"mamba state      {p.mamba_slots_per_dp} slots per DP rank ({p.mamba_slots_source}), "
                     f"{s['total'] / (1 << 20):.2f} MiB a slot (conv {s['conv'] / (1 << 20):.2f} + ssm "
                     f"{s['ssm'] / (1 << 20):.2f}, {s['layers']} KDA layers), {m.mamba_pool_gib:.2f} GiB; "
                     f"{p.mamba_state_slots_per_request} slots a request -> cap {p.mamba_running_requests_cap}")
    lines.append(f"running requests {p.max_running_requests_per_dp} per DP rank (requested "
                 f"{p.max_running_requests_requested or 'default'}; binding: {p.binding_limit})")
    if p.prefill_chunk_tokens:
        room = (f"{m.activation_room_gib:.2f} GiB the verify scratch leaves of the {m.slack_gib:.2f} GiB slack"
                if m.verify_scratch_gib else f"{m.slack_gib:.2f} GiB slack")
        lines.append(f"prefill chunks   {p.prefill_chunk_tokens:,} tokens at most ({p.target}'s bound; SGLang's "
                     f"activation estimate {kv_budget.activation_gib(p.prefill_chunk_tokens):.2f} GiB of the {room})")
    lines += [f"WARNING: {w}" for w in p.warnings]
    lines += [f"note: {a}" for a in p.assumptions]
    lines.append("sglang args: " + " ".join(p.sglang_args))
    return "\n".join(lines)
