"""The server's own account: /server_info (head node), polled in the background.

Pristine 0.5.23 gives the resolved arguments at the top level and, per DP rank,
`internal_states[]`: every resolved server argument again (`resolved_server_args_dict`, so
`max_mamba_cache_size` is there on any server, as the global argument), plus
`effective_max_running_requests_per_dp` and `memory_usage` (`token_capacity`, `kvcache` in
GiB). The observability patch adds per DP rank `mamba_state_slots_per_request` and
`mamba_running_requests_cap` and turns `max_mamba_cache_size` into the per-rank value: its
own two keys, never `max_mamba_cache_size`, tell a patched server. Without them the mamba
figures come from the log. Worker nodes (node rank >= 1) have no /server_info: there a 404
falls back to their dummy /health.

An answer is read with a total deadline and a size cap (`fetch`), and turned into typed
values field by field: a field of the wrong type, out of range or not finite (1e999) is
counted and left out, and only the series it feeds go missing.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from dsaops.healthchecks.logparse import GIB, MAX_COUNT, LogState
from dsaops.healthchecks.loop import BackgroundLoop
from dsaops.healthchecks.metrics import ErrorCounts, Families

from dsaops import concurrency, fetch, plan_input
from dsaops.api_key import headers
from dsaops.errors import UserError

# Keys read from /server_info; the contract test finds each in the pinned wheel.
TOP_KEYS = ("max_running_requests", "attn_dp_size", "context_length", "kv_cache_dtype",
            "dsa_prefill_backend", "dsa_decode_backend", "max_total_num_tokens", "internal_states")
STATE_KEYS = ("effective_max_running_requests_per_dp", "memory_usage", "token_capacity", "kvcache")
# What the observability patch adds per DP rank; the first two exist only where it is applied.
PATCH_KEYS = ("mamba_state_slots_per_request", "mamba_running_requests_cap", "max_mamba_cache_size")
PATCH_MARKERS = PATCH_KEYS[:2]

MAX_BYTES = 8 << 20   # 8 MiB: 256 DP ranks of every server argument fit several times over
MAX_DP_RANKS = 1024
MAX_TEXT = 128        # dtype and backend names


@dataclass(frozen=True)
class DpState:
    token_capacity: int | None
    kvcache_gib: float | None
    effective: int | None
    mamba: dict[str, int]   # the patch's fields (per DP rank); empty when pristine


@dataclass(frozen=True)
class ServerInfo:
    max_running_requests: int | None
    attn_dp_size: int
    context_length: int | None
    kv_cache_dtype: str | None
    prefill: str | None
    decode: str | None
    max_total_num_tokens: int | None
    states: tuple[DpState, ...]
    patched: bool


class _Reader:
    """Typed reads of one answer; a present but unusable field is counted (once per answer)."""

    def __init__(self):
        self.bad: list[str] = []

    def count(self, d: dict, key: str, low: int = 0, high: int = MAX_COUNT) -> int | None:
        v = d.get(key)
        if v is None:
            return None
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            self.bad.append(key)
            return None
        return v

    def number(self, d: dict, key: str) -> float | None:
        v = d.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v < MAX_COUNT:
            self.bad.append(key)
            return None
        return float(v)

    def text(self, d: dict, key: str) -> str | None:
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, str) or not 0 < len(v) <= MAX_TEXT or not v.isprintable():
            self.bad.append(key)
            return None
        return v


def parse(raw) -> tuple[ServerInfo, list[str]]:
    """A /server_info answer -> (typed values, the keys that were present but unusable).
    TypeError when the answer is not /server_info's outline at all."""
    if not isinstance(raw, dict) or not isinstance(raw.get("internal_states"), list):
        raise TypeError("not the /server_info shape (an object with an internal_states list)")
    r = _Reader()
    states, patched = [], False
    listed = raw["internal_states"]
    if len(listed) > MAX_DP_RANKS:
        r.bad.append("internal_states")
        listed = listed[:MAX_DP_RANKS]
    for s in listed:
        if not isinstance(s, dict):
            r.bad.append("internal_states[]")
            s = {}
        usage = s.get("memory_usage")
        if usage is not None and not isinstance(usage, dict):
            r.bad.append("memory_usage")
            usage = None
        usage = usage or {}
        marked = any(k in s for k in PATCH_MARKERS)
        patched |= marked
        mamba = {k: v for k in PATCH_KEYS if (v := r.count(s, k)) is not None} if marked else {}
        states.append(DpState(r.count(usage, "token_capacity"), r.number(usage, "kvcache"),
                              r.count(s, "effective_max_running_requests_per_dp"), mamba))
    info = ServerInfo(
        max_running_requests=r.count(raw, "max_running_requests", 1),
        attn_dp_size=r.count(raw, "attn_dp_size", 1, MAX_DP_RANKS) or 1,
        context_length=r.count(raw, "context_length", 1) or r.count(raw, "max_req_input_len", 1),
        kv_cache_dtype=r.text(raw, "kv_cache_dtype"), prefill=r.text(raw, "dsa_prefill_backend"),
        decode=r.text(raw, "dsa_decode_backend"), max_total_num_tokens=r.count(raw, "max_total_num_tokens"),
        states=tuple(states), patched=patched)
    return info, r.bad


class ServerInfoPoller(BackgroundLoop):
    def __init__(self, server_url: str, errors: ErrorCounts, interval: float = 5.0, timeout: float = 3.0,
                 max_bytes: int = MAX_BYTES, api_key: str | None = None):
        super().__init__("server_info", errors, interval)
        self.url, self.timeout, self.max_bytes = server_url.rstrip("/"), timeout, max_bytes
        self.headers = headers(api_key)
        self.up = False
        self.info: ServerInfo | None = None

    def step(self) -> bool:
        self.poll()
        return False

    def _get(self, path: str) -> tuple[int, bytes]:
        return fetch.request(self.url + path, deadline_s=self.timeout, max_bytes=self.max_bytes, headers=self.headers)

    def poll(self) -> None:
        try:
            status, body = self._get("/server_info")
            if status == 404:  # a worker node: its dummy /health says whether the server is there
                self.info = None
                self.up = self._get("/health")[0] == 200
                if not self.up:
                    self.errors.report("server_info", f"{self.url}/health did not answer 200")
                return
            if status in (401, 403):
                raise fetch.FetchError(f"/server_info answered {status}: give the exporter the server's API key "
                                       "(--api-key-file)")
            if status != 200:
                raise fetch.FetchError(f"/server_info answered {status}")
            info, bad = parse(json.loads(body))
        except Exception as e:  # noqa: BLE001 (refused, timed out, too big, not HTTP, not JSON, 200k deep, …)
            self.up, self.info = False, None
            self.errors.report("server_info", f"{self.url}/server_info unusable", e)
            return
        if bad:
            self.errors.report("server_info", f"/server_info fields of the wrong type or range: {', '.join(bad[:8])}")
        self.up, self.info = True, info


def layout_of(dtype: str, prefill: str | None, decode: str | None) -> str:
    """The pool's row layout by dsaops.kv_layout's rule (bf16 | raw_fp8 | scaled_fp8), from the
    running server's dtype and DSA backends; `unknown` without the backends (a worker node has no
    /server_info), `other` for a dtype that is neither bf16 nor fp8."""
    from dsaops.kv_layout import Q8_PREFILL, Backends, kv_layout

    if "bf16" in dtype or "bfloat16" in dtype:
        return "bf16"
    if "fp8" not in dtype and "float8" not in dtype:
        return "other"
    if prefill is None or decode is None:
        return "unknown"
    # A running server passed SGLang's (patched) checks: triton and aiter DSA backends run on ROCm
    # only, and q8 prefill with tilelang decode is admitted only over the raw NoPE pool.
    hip = "fnuz" in dtype or bool({prefill, decode} & {"triton", "aiter"})
    return kv_layout("fp8_e4m3", Backends(prefill, decode, defaulted=False), hip=hip,
                     nope_q8=(prefill, decode) == (Q8_PREFILL, "tilelang"),
                     fp8_dtype="float8_e4m3fnuz" if "fnuz" in dtype else "float8_e4m3fn")


@dataclass(frozen=True)
class PlanFigures:
    """What the exporter takes from `dsaops plan --json`."""
    kv_pool_tokens_per_rank: int | None  # None: no --plan
    binding_limit: str | None            # None: no --plan, or a plan without the key (exported as no series)


NO_PLAN = PlanFigures(None, None)


def read_plan(path: str) -> PlanFigures:
    """`kv_pool_tokens_per_rank` and `binding_limit` from `dsaops plan --json` output."""
    fix = "give the output of `dsaops plan ... --json`"
    plan = plan_input.read_json(path, "--plan", fix=fix)
    if "kv_pool_tokens_per_rank" not in plan:
        raise UserError(f"--plan {path}: no kv_pool_tokens_per_rank; {fix}")
    value = plan["kv_pool_tokens_per_rank"]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:  # JSON true is a Python int
        raise UserError(f"--plan {path}: kv_pool_tokens_per_rank must be a positive integer, got {value!r}")
    binding = plan.get("binding_limit")
    if "binding_limit" in plan and binding not in concurrency.BINDING_LIMITS:
        raise UserError(f"--plan {path}: binding_limit must be one of {', '.join(concurrency.BINDING_LIMITS)}, "
                        f"got {binding!r}; {fix}")
    return PlanFigures(value, binding)


def by_label(binding: str) -> str:
    """The `by` label of a binding limit: `none` where the request itself binds."""
    return "none" if binding == "request" else binding


class ServerInfoCollector:
    """Server up, KV capacity and dtype/layout, max_running_requests, the mamba cache, what
    binds concurrency (dsaops.concurrency.resolve), and the planned pool size and binding."""

    def __init__(self, poller: ServerInfoPoller, log: LogState | None, families: Families, plan: PlanFigures = NO_PLAN):
        self.poller, self.log, self.f, self.plan = poller, log, families, plan

    def collect(self):
        f = self.f
        up = f.gauge("dsa_server_up", "1 when the server answered /server_info (worker node: its /health)")
        up.add(1 if self.poller.up else 0)
        out = [up.family]
        if self.plan.kv_pool_tokens_per_rank is not None:
            out.append(f.gauge("dsa_kv_pool_planned_tokens", "KV pool tokens per rank the plan expects "
                               "(dsaops plan --json: kv_pool_tokens_per_rank)")
                       .add(self.plan.kv_pool_tokens_per_rank).family)
        if self.plan.binding_limit is not None:
            planned = f.gauge("dsa_concurrency_planned_binding", "1 on what the plan expects to bind the running "
                              "requests (dsaops plan --json: binding_limit; none: the request itself)", ("by",))
            for by in concurrency.BINDING_LIMITS:
                planned.add(1 if by == self.plan.binding_limit else 0, by_label(by))
            out.append(planned.family)
        info = self.poller.info
        log_kv = self._log_snapshot()
        out.append(self._kv_info(info, log_kv[0]).family)
        out.extend(self._per_dp(info, log_kv) if info is not None else self._mamba_from_log(log_kv))
        return out

    def _log_snapshot(self):
        if self.log is None:
            return {}, {}, {}
        with self.log.lock:
            return dict(self.log.kv), dict(self.log.mamba_slots), dict(self.log.mamba_cap)

    def _kv_info(self, info: ServerInfo | None, log_kv: dict):
        fam = self.f.gauge("dsa_kv_cache_info", "KV cache dtype and row layout (bf16|raw_fp8|scaled_fp8), always 1",
                           ("dtype", "layout"))
        dtype = next(iter(log_kv.values()))[0] if log_kv else None  # the pool's real dtype, e.g. torch.float8_e4m3fn
        if dtype is None and info is not None and info.kv_cache_dtype not in (None, "auto"):
            dtype = info.kv_cache_dtype
        if dtype is not None:
            prefill, decode = (info.prefill, info.decode) if info else (None, None)
            fam.add(1, dtype.removeprefix("torch."), layout_of(dtype, prefill, decode))
        return fam

    def _mamba_families(self):
        labels = ("rank", "dp_rank")  # `dp_rank` from /server_info, `rank` from the log; the other is empty
        return (self.f.gauge("dsa_mamba_cache_slots", "Mamba state cache slots (max_mamba_cache_size)", labels),
                self.f.gauge("dsa_mamba_slots_per_request", "Mamba state slots each running request holds", labels),
                self.f.gauge("dsa_mamba_running_requests_cap", "Running requests the mamba state cache allows", labels))

    def _mamba_from_log(self, log_kv, families=None):
        """The log's mamba figures, into `families` (new ones when not given)."""
        slots, per_req, cap = families or self._mamba_families()
        _, log_slots, log_cap = log_kv
        for rank, n in sorted(log_slots.items()):
            slots.add(n, rank, "")
        for rank, (c, _, ratio) in sorted(log_cap.items()):
            per_req.add(ratio, rank, "")
            cap.add(c, rank, "")
        return [slots.family, per_req.family, cap.family]

    def _per_dp(self, info: ServerInfo, log_kv):
        f = self.f
        capacity = f.gauge("dsa_kv_token_capacity", "KV pool tokens per DP rank (/server_info token_capacity)",
                           ("dp_rank",))
        kv_bytes = f.gauge("dsa_kv_cache_size_bytes", "KV cache bytes per DP rank (/server_info memory_usage.kvcache)",
                           ("dp_rank",))
        mrr = f.gauge("dsa_max_running_requests", "max_running_requests per DP rank: as requested (after the "
                      "attention-DP split) and as the scheduler runs it", ("scope", "dp_rank"))
        capped = f.gauge("dsa_concurrency_capped", "1 on what binds the running requests (none: the request itself)",
                         ("by", "dp_rank"))
        slots, per_req, cap = self._mamba_families()
        _, log_slots, log_cap = log_kv
        for dp, state in enumerate(info.states):
            d = str(dp)
            tokens = state.token_capacity or info.max_total_num_tokens
            if tokens is not None:
                capacity.add(tokens, d)
            if state.kvcache_gib is not None:
                kv_bytes.add(state.kvcache_gib * GIB, d)
            if info.patched:
                for fam, key in ((slots, "max_mamba_cache_size"), (per_req, "mamba_state_slots_per_request"),
                                 (cap, "mamba_running_requests_cap")):
                    if key in state.mamba:
                        fam.add(state.mamba[key], "", d)
                size, ratio = state.mamba.get("max_mamba_cache_size"), state.mamba.get("mamba_state_slots_per_request")
            else:
                size = _for_dp(log_slots, dp)
                ratio = (_for_dp(log_cap, dp) or (None, None, None))[2]
            if tokens is None:
                continue  # nothing to weigh the request against
            res = concurrency.resolve(
                requested=info.max_running_requests, attn_dp_size=info.attn_dp_size, token_capacity=tokens,
                context_len=info.context_length or 1,
                max_mamba_cache_size=size if size is not None and ratio else None, mamba_slots=ratio)
            mrr.add(res.requested_per_dp, "requested", d)
            mrr.add(state.effective if state.effective is not None else res.effective_per_dp, "effective", d)
            for by in concurrency.BINDING_LIMITS:
                capped.add(1 if res.binding == by else 0, by_label(by), d)
        mamba = [slots.family, per_req.family, cap.family] if info.patched else self._mamba_from_log(
            log_kv, (slots, per_req, cap))
        return [capacity.family, kv_bytes.family, mrr.family, capped.family, *mamba]


def _for_dp(by_rank: dict, dp: int):
    """The log's value for DP rank `dp` (a rank label with `DP<dp>`), else any rank's: the
    ranks of one server share their configuration."""
    for rank, value in by_rank.items():
        if f"DP{dp}" in rank.split("_"):
            return value
    return next(iter(by_rank.values()), None)
