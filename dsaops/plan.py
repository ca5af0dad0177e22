"""`dsaops plan`: KV layout, pool sizes and what caps concurrency, before a launch.

SGLang 0.5.23 tells these only in its startup log, minutes into a launch. The plan
replays its sizing (dsaops.model_geometry, dsaops.kv_layout, dsaops.kv_budget) and its
request limit (dsaops.concurrency.resolve). The one input that cannot be known ahead is the
GPU memory left after the weights load: give it with --free-memory-gib (the `avail mem=` of
SGLang's `Load weight end` log line), or --weights-gib; otherwise the model preset's
checkpoint estimate and the target's reserved memory stand in, and the output says so.
"""
from __future__ import annotations

import json

from dsaops.errors import UserError

DRAFT_NOTE = ("speculative decoding is sized as MTP (NextN layers as the EAGLE draft: their KV and the mamba "
              "scratch per draft token); a DFLASH drafter's own KV is not counted")


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="KV pool, mamba slots and concurrency caps for a launch, before launching",
                       description=__doc__.splitlines()[0])
    m = p.add_mutually_exclusive_group()
    m.add_argument("--model", default=None, help="a model preset (default glm-5.3-flash)")
    m.add_argument("--model-config", help="the model's config.json instead of a preset")
    p.add_argument("--target", required=True, help="sm_90 | sm_121 | gfx942 (see `dsaops targets`)")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--tp-size", type=int, required=True)
    p.add_argument("--dp-size", type=int, default=1, help="data-parallel replicas (with --enable-dp-attention: "
                   "the attention-DP size, SGLang's deprecated spelling)")
    p.add_argument("--enable-dp-attention", action="store_true", help="deprecated: use --attn-dp-size")
    p.add_argument("--attn-dp-size", type=int, default=None, help="attention-DP groups inside the TP group")
    p.add_argument("--kv-cache-dtype", required=True, choices=["bf16", "bfloat16", "fp8_e4m3"])
    p.add_argument("--dsa-prefill-backend", help="default: what SGLang picks for the target and KV dtype")
    p.add_argument("--dsa-decode-backend")
    p.add_argument("--mem-fraction-static", type=float, required=True)
    p.add_argument("--gpu-memory-gib", type=float, required=True, help="memory of one GPU (GB10: what the GPU may use)")
    p.add_argument("--free-memory-gib", type=float, help="free memory per GPU after weights: the `avail mem=` "
                   "of SGLang's `Load weight end` log line, the smallest across ranks (most exact)")
    p.add_argument("--weights-gib", type=float, help="checkpoint size, all ranks together (default: the preset's)")
    p.add_argument("--context-length", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-mamba-cache-size", type=int, help="mamba state slots, all DP ranks together")
    p.add_argument("--mamba-ssm-dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--mamba-full-memory-ratio", type=float)
    p.add_argument("--mamba-radix-cache-strategy", default="auto",
                   choices=["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"])
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--skip-decode-lock", action="store_true", help="as with SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK=1")
    p.add_argument("--speculative-num-draft-tokens", type=int, help="MTP (NextN) speculative decoding")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    plan = make_plan(args)
    print(json.dumps(plan, indent=2) if args.json else render(plan))
    return 0


def make_plan(args) -> dict:
    from dsaops import concurrency, kv_budget, kv_layout, model_geometry, targets
    target = targets.get(args.target)
    try:
        model = (model_geometry.load_config_file(args.model_config) if args.model_config
                 else model_geometry.load_preset(args.model or "glm-5.3-flash"))
    except model_geometry.ModelConfigError as e:
        raise UserError(str(e)) from None
    par = _parallelism(args)
    hip = target.vendor == "amd"
    kv_dtype = kv_layout.normalize_kv_dtype(args.kv_cache_dtype)
    backends = kv_layout.resolve_backends(kv_dtype, args.dsa_prefill_backend, args.dsa_decode_backend, hip=hip,
                                          sm_major=int(target.compute_capability.split(".")[0] or 0))
    nope_q8 = kv_layout.q8_raw_nope(backends, kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim)
    try:
        kv_layout.check_backends(kv_dtype, backends, hip=hip, q8_prefill=target.has("q8_prefill"), nope_q8=nope_q8)
    except kv_layout.BackendRefused as e:
        raise UserError(f"SGLang refuses this launch at startup: {e}") from None
    layout = kv_layout.kv_layout(kv_dtype, backends, hip=hip, nope_q8=nope_q8)
    if not 0 < args.mem_fraction_static < 1:
        raise UserError("--mem-fraction-static must be between 0 and 1 (SGLang's default is about 0.8-0.9)")
    for flag in ("gpu_memory_gib", "context_length", "max_running_requests", "max_mamba_cache_size",
                 "mamba_full_memory_ratio", "speculative_num_draft_tokens", "weights_gib"):
        if (value := getattr(args, flag)) is not None and value <= 0:
            raise UserError(f"--{flag.replace('_', '-')} must be positive, not {value:g}")

    memory, assumptions = _memory(args, target, model, par)
    slots_per_req = _mamba_slots_per_request(args)
    cell = model.kv_bytes_per_token(layout, with_draft=bool(args.speculative_num_draft_tokens))
    rest = kv_budget.rest_memory_gib(pre_load_free_gib=memory["pre_load_free_gib"],
                                     free_after_weights_gib=memory["free_after_weights_gib"],
                                     mem_fraction_static=args.mem_fraction_static, multimodal=model.multimodal)
    try:
        slot, mamba, kv_gib, tokens = _pools(args, model, par, rest, cell["total"], slots_per_req)
    except (kv_budget.NotEnoughMemory, model_geometry.ModelConfigError) as e:
        raise UserError(str(e)) from None

    context = args.context_length or model.context_length
    conc = concurrency.resolve(requested=args.max_running_requests, attn_dp_size=par["attn_dp_size"],
                               token_capacity=tokens, context_len=context,
                               max_mamba_cache_size=mamba.slots_per_dp if mamba else None,
                               mamba_slots=slots_per_req if mamba else None)
    if conc.effective_per_dp <= 0:  # resolve_max_num_reqs refuses to start
        raise UserError(f"the mamba state cache ({mamba.slots_per_dp} slots per DP rank, {slots_per_req} a request) is "
                        "too small to serve any request: raise --max-mamba-cache-size or --mem-fraction-static")
    memory.update(rest_gib=round(rest, 3), mamba_pool_gib=round(mamba.bytes / kv_budget.GIB, 3) if mamba else 0.0,
                  kv_budget_gib=round(kv_gib, 3))
    return {
        "model": model.name, "target": target.name,
        "kv_layout": layout, "kv_cache_dtype": kv_dtype,
        "kv_storage_dtype": "bfloat16" if layout == "bf16" else target.fp8_dtype,
        "dsa_prefill_backend": backends.prefill, "dsa_decode_backend": backends.decode,
        "kv_bytes_per_token": cell["total"], "kv_bytes_per_token_detail": cell,
        "kv_pool_tokens_per_rank": tokens,
        "kv_pool_gib_per_rank": round(model.kv_pool_bytes(tokens, layout) / kv_budget.GIB, 2),
        "mamba_slots_per_dp": mamba.slots_per_dp if mamba else None,
        "mamba_slots_source": mamba.source if mamba else None,
        "mamba_slot_bytes": slot if mamba else None,
        "mamba_state_slots_per_request": slots_per_req if mamba else None,
        "mamba_running_requests_cap": conc.mamba_cap,
        "max_running_requests_requested": args.max_running_requests,
        "max_running_requests_per_dp": conc.effective_per_dp,
        "binding_limit": conc.binding,
        "kv_running_requests_cap": conc.kv_cap,
        "context_length": context,
        "parallel": par, "memory": memory,
        "sglang_args": _sglang_args(args, par, kv_dtype, backends),
        "warnings": _warnings(args, par, conc, tokens, context, backends, mamba, slots_per_req),
        "assumptions": assumptions + ([DRAFT_NOTE] if args.speculative_num_draft_tokens else []),
    }


def _pools(args, model, par, rest_gib: float, cell_bytes: int, slots_per_req: int):
    """The mamba state pool first, then the KV pool from what is left (_profile_available_bytes)."""
    from dsaops import kv_budget

    slot = model.mamba_slot_bytes(par["attn_tp_size"], ssm_bytes=4 if args.mamba_ssm_dtype == "float32" else 2)
    mamba = None
    if model.linear_layers:
        mamba = kv_budget.mamba_pool(
            rest_gib, slot_bytes=slot["total"], attn_dp_size=par["attn_dp_size"], slots_per_request=slots_per_req,
            max_mamba_cache_size=args.max_mamba_cache_size, max_running_requests=args.max_running_requests,
            disable_radix_cache=args.disable_radix_cache,
            full_memory_ratio=args.mamba_full_memory_ratio or kv_budget.MAMBA_FULL_MEMORY_RATIO,
            draft_tokens=args.speculative_num_draft_tokens)
    kv_gib = rest_gib - (mamba.bytes / kv_budget.GIB if mamba else 0)
    if kv_gib <= 0:
        raise kv_budget.NotEnoughMemory(f"loaded weights leave no GPU memory for the KV cache under "
                                        f"--mem-fraction-static={args.mem_fraction_static}: raise it")
    tokens = kv_budget.kv_pool_tokens(kv_gib * kv_budget.GIB, cell_bytes=cell_bytes, page_tokens=model.page_tokens)
    return slot, mamba, kv_gib, tokens


def _parallelism(args) -> dict:
    for flag in ("nodes", "gpus_per_node", "tp_size", "dp_size"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 1")
    # parallel_hook.py handle_deprecated_dp_attention: `--dp-size N --enable-dp-attention`
    # means attn_dp_size = N, dp_size = 1.
    attn_dp, dp = args.attn_dp_size or 1, args.dp_size
    if args.enable_dp_attention and args.attn_dp_size is None:
        attn_dp, dp = args.dp_size, 1
    if attn_dp < 1 or args.tp_size % attn_dp:
        raise UserError(f"the attention-DP size ({attn_dp}) must divide --tp-size ({args.tp_size})")
    gpus = args.nodes * args.gpus_per_node
    if args.tp_size * dp != gpus:
        raise UserError(f"{args.nodes} node(s) x {args.gpus_per_node} GPU(s) = {gpus} GPUs, but tp-size {args.tp_size} "
                        f"x dp-size {dp} replicas needs {args.tp_size * dp}: make them agree")
    return {"gpus": gpus, "tp_size": args.tp_size, "dp_size": dp, "attn_dp_size": attn_dp,
            "attn_tp_size": args.tp_size // attn_dp}


def _memory(args, target, model, par) -> tuple[dict, list[str]]:
    pre = args.gpu_memory_gib - target.reserved_memory_gib
    assumptions = [(f"free memory before weights: --gpu-memory-gib {args.gpu_memory_gib:g} less {target.name}'s "
                    f"reserved_memory_gib {target.reserved_memory_gib:g} (dsaops/targets.toml)")]
    if args.free_memory_gib is not None:
        free, source = args.free_memory_gib, "--free-memory-gib"
    else:
        weights = args.weights_gib if args.weights_gib is not None else model.checkpoint_gib
        if weights is None:
            raise UserError("the model has no checkpoint size: pass --free-memory-gib (the `avail mem=` of SGLang's "
                            "`Load weight end` log line) or --weights-gib")
        per_gpu = weights / par["tp_size"]
        free, source = pre - per_gpu, "--weights-gib" if args.weights_gib is not None else "preset estimate"
        what = "--weights-gib" if args.weights_gib is not None else f"the preset's estimate ({model.checkpoint_gib_basis})"
        assumptions.append(f"free memory after weights ASSUMED: {pre:.1f} - {weights:g} GiB / tp {par['tp_size']} = "
                           f"{free:.1f} GiB per GPU from {what}; for an exact plan pass --free-memory-gib with the "
                           "`avail mem=` of SGLang's `Load weight end` log line")
    if free <= 0 or free > pre:
        raise UserError(f"free memory after weights comes to {free:.1f} GiB per GPU (of {pre:.1f} before weights): "
                        "check --gpu-memory-gib, --weights-gib and --tp-size")
    return {"gpu_memory_gib": args.gpu_memory_gib, "reserved_gib": target.reserved_memory_gib,
            "pre_load_free_gib": round(pre, 3), "free_after_weights_gib": round(free, 3),
            "free_after_weights_source": source,
            "slack_gib": round(pre * (1 - args.mem_fraction_static), 3)}, assumptions


def _mamba_slots_per_request(args) -> int:
    """overrides.py _mamba_radix_cache_resolution: `auto` keeps the extra buffer unless overlap
    scheduling is off (GLM-5.3-Flash pages are 64 tokens, so it stays on); no_buffer turns
    overlap off. Then kv_cache_configurator.py _calculate_mamba_ratio."""
    from dsaops.concurrency import mamba_slots_per_request

    strategy = args.mamba_radix_cache_strategy
    if strategy == "auto":
        strategy = "extra_buffer"
    overlap = not args.disable_overlap_schedule and strategy != "no_buffer"
    try:
        return mamba_slots_per_request(disable_radix_cache=args.disable_radix_cache,
                                       extra_buffer=strategy.startswith("extra_buffer"), overlap=overlap,
                                       lazy=strategy == "extra_buffer_lazy", skip_decode_lock=args.skip_decode_lock)
    except ValueError as e:
        raise UserError(str(e)) from None


def _warnings(args, par, conc, tokens, context, backends, mamba, slots_per_req) -> list[str]:
    out = []
    dp = par["attn_dp_size"]
    if conc.binding == "dp_split":
        out.append(f"--max-running-requests {conc.requested} is per deployment: SGLang divides it by the "
                   f"attention-DP size {dp}, so each DP rank runs {conc.requested_per_dp} "
                   f"({conc.requested} // {dp}); raise --max-running-requests to {dp} x the per-rank concurrency you want")
    if conc.binding == "kv":
        out.append(f"the KV pool ({tokens} tokens) caps each DP rank at {conc.kv_cap} running requests (tokens // 2); "
                   "raise --mem-fraction-static or use --kv-cache-dtype fp8_e4m3 with tilelang backends")
    if conc.binding == "mamba":
        halve = ", or halve the state with --mamba-ssm-dtype bfloat16" if args.mamba_ssm_dtype == "float32" else ""
        out.append(f"the mamba state cache caps each DP rank at {conc.mamba_cap} running requests "
                   f"(max_mamba_cache_size {mamba.slots_per_dp} // {slots_per_req} state slots per request; SGLang "
                   f"says so only in a WARNING log line): raise --max-mamba-cache-size or --mamba-full-memory-ratio{halve}")
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


def _sglang_args(args, par, kv_dtype, backends) -> list[str]:
    """The launch flags this plan describes, in 0.5.23's spelling (--attn-dp-size)."""
    out = ["--tp-size", str(par["tp_size"])]
    if par["dp_size"] > 1:
        out += ["--dp-size", str(par["dp_size"])]
    if par["attn_dp_size"] > 1:
        out += ["--attn-dp-size", str(par["attn_dp_size"])]
    if args.nodes > 1:
        out += ["--nnodes", str(args.nodes)]
    out += ["--kv-cache-dtype", kv_dtype if kv_dtype == "fp8_e4m3" else "bfloat16",
            "--dsa-prefill-backend", backends.prefill, "--dsa-decode-backend", backends.decode,
            "--mem-fraction-static", f"{args.mem_fraction_static:g}"]
    for flag in ("context_length", "max_running_requests", "max_mamba_cache_size", "mamba_full_memory_ratio",
                 "speculative_num_draft_tokens"):
        if (value := getattr(args, flag)) is not None:
            out += ["--" + flag.replace("_", "-"), f"{value:g}" if isinstance(value, float) else str(value)]
    if args.mamba_ssm_dtype != "float32":
        out += ["--mamba-ssm-dtype", args.mamba_ssm_dtype]
    if args.speculative_num_draft_tokens:
        out += ["--speculative-algorithm", "EAGLE"]
    return out


def render(p: dict) -> str:
    c, m = p["kv_bytes_per_token_detail"], p["memory"]
    par = p["parallel"]
    lines = [
        (f"dsaops plan: {p['model']} on {p['target']}, {par['gpus']} GPUs: tp {par['tp_size']}, "
         f"attention-DP {par['attn_dp_size']} (attention TP {par['attn_tp_size']}), replicas {par['dp_size']}"),
        (f"KV layout        {p['kv_layout']} ({p['kv_storage_dtype']}), prefill={p['dsa_prefill_backend']} "
         f"decode={p['dsa_decode_backend']}"),
        (f"KV bytes/token   {p['kv_bytes_per_token']:,} = attention {c['attention_layers']} x {c['attention_per_layer']} "
         f"= {c['attention']:,} + DSA indexer {c['indexer_layers']} x {c['indexer_per_layer']} = {c['indexer']:,}"
         + (f" + MTP draft {c['draft']:,}" if c["draft"] else "")),
        (f"memory per GPU   {m['free_after_weights_gib']:.2f} GiB free after weights ({m['free_after_weights_source']})"
         f" - slack {m['slack_gib']:.2f} = {m['rest_gib']:.2f} GiB for mamba + KV"),
        (f"KV pool          {p['kv_pool_tokens_per_rank']:,} tokens per rank ({p['kv_pool_gib_per_rank']:.2f} GiB as "
         "SGLang logs it)"),
    ]
    if p["mamba_slots_per_dp"] is not None:
        s = p["mamba_slot_bytes"]
        lines.append(f"mamba state      {p['mamba_slots_per_dp']} slots per DP rank ({p['mamba_slots_source']}), "
                     f"{s['total'] / (1 << 20):.2f} MiB a slot (conv {s['conv'] / (1 << 20):.2f} + ssm "
                     f"{s['ssm'] / (1 << 20):.2f}, {s['layers']} KDA layers), {m['mamba_pool_gib']:.2f} GiB; "
                     f"{p['mamba_state_slots_per_request']} slots a request -> cap {p['mamba_running_requests_cap']}")
    lines.append(f"running requests {p['max_running_requests_per_dp']} per DP rank (requested "
                 f"{p['max_running_requests_requested'] or 'default'}; binding: {p['binding_limit']})")
    lines += [f"WARNING: {w}" for w in p["warnings"]]
    lines += [f"note: {a}" for a in p["assumptions"]]
    lines.append("sglang args: " + " ".join(p["sglang_args"]))
    return "\n".join(lines)

