"""The server's own account: /server_info (head node), polled in the background.

Pristine 0.5.23 gives the resolved arguments at the top level and, per DP rank,
`internal_states[]` with `effective_max_running_requests_per_dp` and `memory_usage`
(`token_capacity`, `kvcache` in GiB). The observability patch adds per DP rank
`max_mamba_cache_size`, `mamba_state_slots_per_request` and `mamba_running_requests_cap`;
without them the mamba figures come from the log. Worker nodes (node rank >= 1) have no
/server_info: there a 404 falls back to their dummy /health.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from dsaops.healthchecks.logparse import GIB, LogState
from dsaops.healthchecks.loop import BackgroundLoop
from dsaops.healthchecks.metrics import ErrorCounts, Families

from dsaops import concurrency
from dsaops.errors import UserError

# Keys read from /server_info; the contract test finds each in the pinned wheel.
TOP_KEYS = ("max_running_requests", "attn_dp_size", "context_length", "kv_cache_dtype",
            "dsa_prefill_backend", "dsa_decode_backend", "max_total_num_tokens", "internal_states")
STATE_KEYS = ("effective_max_running_requests_per_dp", "memory_usage", "token_capacity", "kvcache")
PATCH_KEYS = ("max_mamba_cache_size", "mamba_state_slots_per_request", "mamba_running_requests_cap")


def get_json(url: str, timeout: float):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


class ServerInfoPoller(BackgroundLoop):
    def __init__(self, server_url: str, errors: ErrorCounts, interval: float = 5.0, timeout: float = 3.0):
        super().__init__("server_info", errors, interval)
        self.url, self.timeout = server_url.rstrip("/"), timeout
        self.up = False
        self.info: dict | None = None

    def step(self) -> bool:
        self.poll()
        return False

    def poll(self) -> None:
        try:
            info = get_json(self.url + "/server_info", self.timeout)
            if not isinstance(info, dict) or not isinstance(info.get("internal_states"), list):
                raise TypeError("not the /server_info shape")
            self.up, self.info = True, info
        except urllib.error.HTTPError as e:
            self.info = None
            self.up = e.code == 404 and self._worker_health()
            if not self.up:
                self.errors.inc("server_info")
        except (OSError, ValueError, TypeError):  # refused, timed out, truncated or foreign JSON
            self.up, self.info = False, None
            self.errors.inc("server_info")

    def _worker_health(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=self.timeout) as r:
                return r.status == 200
        except OSError:
            return False


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
                     nope_q8=(prefill, decode) == (Q8_PREFILL, "tilelang"))


def read_plan(path: str) -> int:
    """`kv_pool_tokens_per_rank` from `dsaops plan --json` output."""
    try:
        with open(path) as f:
            value = json.load(f)["kv_pool_tokens_per_rank"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--plan {path}: cannot read kv_pool_tokens_per_rank ({e}); "
                        "give the output of `dsaops plan ... --json`") from e
    if not isinstance(value, int) or value <= 0:
        raise UserError(f"--plan {path}: kv_pool_tokens_per_rank must be a positive integer, got {value!r}")
    return value


class ServerInfoCollector:
    """Server up, KV capacity and dtype/layout, max_running_requests, the mamba cache, what
    binds concurrency (dsaops.concurrency.resolve), and the planned pool size."""

    def __init__(self, poller: ServerInfoPoller, log: LogState | None, families: Families,
                 planned_tokens: int | None = None):
        self.poller, self.log, self.f, self.planned = poller, log, families, planned_tokens

    def collect(self):
        f = self.f
        up = f.gauge("dsa_server_up", "1 when the server answered /server_info (worker node: its /health)")
        up.add(1 if self.poller.up else 0)
        out = [up.family]
        if self.planned is not None:
            out.append(f.gauge("dsa_kv_pool_planned_tokens", "KV pool tokens per rank the plan expects "
                               "(dsaops plan --json: kv_pool_tokens_per_rank)").add(self.planned).family)
        info = self.poller.info
        log_kv = self._log_snapshot()
        out.append(self._kv_info(info, log_kv[0]).family)
        if info is not None:
            try:
                out.extend(self._per_dp(info, log_kv))
            except (TypeError, ValueError, KeyError, AttributeError):  # JSON of the right outline, wrong insides
                self.poller.errors.inc("server_info")
        else:
            out.extend(self._mamba_from_log(log_kv))
        return out

    def _log_snapshot(self):
        if self.log is None:
            return {}, {}, {}
        with self.log.lock:
            return dict(self.log.kv), dict(self.log.mamba_slots), dict(self.log.mamba_cap)

    def _kv_info(self, info: dict | None, log_kv: dict):
        fam = self.f.gauge("dsa_kv_cache_info", "KV cache dtype and row layout (bf16|raw_fp8|scaled_fp8), always 1",
                           ("dtype", "layout"))
        dtype = next(iter(log_kv.values()))[0] if log_kv else None  # the pool's real dtype, e.g. torch.float8_e4m3fn
        if info is not None and (dtype is None or info.get("kv_cache_dtype") not in (None, "auto")):
            dtype = dtype or str(info.get("kv_cache_dtype"))
        if dtype is not None:
            prefill = info.get("dsa_prefill_backend") if info else None
            decode = info.get("dsa_decode_backend") if info else None
            fam.add(1, dtype.removeprefix("torch."), layout_of(dtype, prefill, decode))
        return fam

    def _mamba_families(self):
        labels = ("rank", "dp_rank")  # `dp_rank` from /server_info, `rank` from the log; the other is empty
        return (self.f.gauge("dsa_mamba_cache_slots", "Mamba state cache slots (max_mamba_cache_size)", labels),
                self.f.gauge("dsa_mamba_slots_per_request", "Mamba state slots each running request holds", labels),
                self.f.gauge("dsa_mamba_running_requests_cap", "Running requests the mamba state cache allows", labels))

    def _mamba_from_log(self, log_kv):
        slots, per_req, cap = self._mamba_families()
        _, log_slots, log_cap = log_kv
        for rank, n in sorted(log_slots.items()):
            slots.add(n, rank, "")
        for rank, (c, _, ratio) in sorted(log_cap.items()):
            per_req.add(ratio, rank, "")
            cap.add(c, rank, "")
        return [slots.family, per_req.family, cap.family]

    def _per_dp(self, info: dict, log_kv):
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
        patched = any(k in s for s in info["internal_states"] for k in PATCH_KEYS)
        for dp, state in enumerate(info["internal_states"]):
            d = str(dp)
            usage = state.get("memory_usage") or {}
            tokens = int(usage.get("token_capacity") or info["max_total_num_tokens"])
            capacity.add(tokens, d)
            if usage.get("kvcache") is not None:
                kv_bytes.add(float(usage["kvcache"]) * GIB, d)
            if patched:
                size, ratio = state.get("max_mamba_cache_size"), state.get("mamba_state_slots_per_request")
                for fam, key in ((slots, "max_mamba_cache_size"), (per_req, "mamba_state_slots_per_request"),
                                 (cap, "mamba_running_requests_cap")):
                    if state.get(key) is not None:
                        fam.add(state[key], "", d)
            else:
                size = _for_dp(log_slots, dp)
                ratio = (_for_dp(log_cap, dp) or (None, None, None))[2]
            res = concurrency.resolve(
                requested=info.get("max_running_requests"), attn_dp_size=int(info.get("attn_dp_size") or 1),
                token_capacity=tokens, context_len=int(info.get("context_length") or info.get("max_req_input_len") or 1),
                max_mamba_cache_size=size if size is not None and ratio else None, mamba_slots=ratio)
            mrr.add(res.requested_per_dp, "requested", d)
            mrr.add(state.get("effective_max_running_requests_per_dp", res.effective_per_dp), "effective", d)
            for by in concurrency.BINDING_LIMITS:
                capped.add(1 if res.binding == by else 0, "none" if by == "request" else by, d)
        mamba = [slots.family, per_req.family, cap.family] if patched else self._mamba_from_log(log_kv)
        return [capacity.family, kv_bytes.family, mrr.family, capped.family, *mamba]


def _for_dp(by_rank: dict, dp: int):
    """The log's value for DP rank `dp` (a rank label with `DP<dp>`), else any rank's: the
    ranks of one server share their configuration."""
    for rank, value in by_rank.items():
        if f"DP{dp}" in rank.split("_"):
            return value
    return next(iter(by_rank.values()), None)
