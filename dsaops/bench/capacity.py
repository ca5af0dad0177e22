"""How many requests the deployment runs at once, and what binds that number.

Three accounts, each optional: the server's own (/server_info of SGLang 0.5.23: the resolved
arguments at the top level, one `internal_states[]` entry per DP rank with the scheduler's
`effective_max_running_requests_per_dp`), the exporter's (`dsa_max_running_requests{scope=
"effective"}` and `dsa_concurrency_capped{by=…}` = 1, which knows the mamba cap from the log on a
pristine server), and the plan's (`dsaops plan --json`). Binding limits use dsaops.concurrency's
vocabulary: request, dp_split, kv, mamba.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dsaops import concurrency, fetch, plan_input
from dsaops.cli_args import digits
from dsaops.errors import UserError

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
EXPOSITION_MOST = 16 << 20   # a head node exporter's /metrics is tens of KiB
RANKS_MOST = 1 << 16   # DP ranks of a deployment: far above any cluster; the cap keeps a list entry each
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Cap:
    """Running requests the whole deployment admits at once, and what binds it."""
    total: int
    per_dp: list[int]
    binding: str | None        # one of concurrency.BINDING_LIMITS, or None when unknown
    source: str                # where the figures come from, for the report


def from_server_info(info: dict) -> Cap:
    """The scheduler's own cap per DP rank; the binding replayed with dsaops.concurrency.resolve.

    Pristine 0.5.23 does not publish the mamba figures: when the scheduler runs fewer requests than
    the request and the KV pool allow, the mamba state cache is what cut it (resolve_max_num_reqs
    caps by nothing else), and the source says it was inferred."""
    states = info.get("internal_states")
    if not isinstance(states, list) or not states:
        raise ValueError("no internal_states")
    per_dp, bindings, inferred = [], [], False
    for state in states:
        effective = plan_input.whole(state["effective_max_running_requests_per_dp"],
                                     "effective_max_running_requests_per_dp", error=ValueError)
        usage = state.get("memory_usage") or {}
        size, slots = state.get("max_mamba_cache_size"), state.get("mamba_state_slots_per_request")
        res = concurrency.resolve(
            requested=info.get("max_running_requests"), attn_dp_size=int(info.get("attn_dp_size") or 1),
            token_capacity=int(usage.get("token_capacity") or info["max_total_num_tokens"]),
            context_len=int(info.get("context_length") or 1),
            max_mamba_cache_size=size if size is not None and slots else None, mamba_slots=slots)
        binding = res.binding
        if effective < res.effective_per_dp and res.mamba_cap is None:
            binding, inferred = "mamba", True
        per_dp.append(effective)
        bindings.append(binding)
    source = "/server_info" + (" (mamba inferred: fewer than the request and the KV pool allow)" if inferred else "")
    return Cap(sum(per_dp), per_dp, _most_common(bindings), source)


def from_exporter_metrics(text: str) -> Cap | None:
    """The head node exporter's per-DP-rank series; None when it has none (a worker node's)."""
    effective: dict[str, int] = {}
    capped: list[str] = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        if m["name"] == "dsa_max_running_requests" and labels.get("scope") == "effective":
            rank = labels.get("dp_rank", "")
            effective[rank] = _requests(m["value"], rank)
        elif m["name"] == "dsa_concurrency_capped" and float(m["value"]) == 1:
            capped.append("request" if labels.get("by") == "none" else labels.get("by", ""))
    if not effective:
        return None
    per_dp = [effective[k] for k in sorted(effective, key=_rank_order)]
    return Cap(sum(per_dp), per_dp, _most_common(capped), "exporter")


def from_plan(path: str) -> Cap:
    """`max_running_requests_per_dp` x attention-DP ranks x replicas, and `binding_limit`."""
    fix = "give the output of `dsaops plan ... --json`"
    plan = plan_input.read_json(path, "--plan", fix=fix)
    par = plan.get("parallel", {})
    if not isinstance(par, dict):
        raise UserError(f"--plan {path}: \"parallel\" is not an object; {fix}")
    per_dp = plan_input.whole(plan.get("max_running_requests_per_dp"), f"--plan {path}: max_running_requests_per_dp")
    ranks = (plan_input.whole(par.get("attn_dp_size", 1), f"--plan {path}: parallel.attn_dp_size", most=RANKS_MOST)
             * plan_input.whole(par.get("dp_size", 1), f"--plan {path}: parallel.dp_size", most=RANKS_MOST))
    if ranks > RANKS_MOST:
        raise UserError(f"--plan {path}: {ranks} DP ranks (attn_dp_size x dp_size) are more than {RANKS_MOST}; {fix}")
    binding = plan.get("binding_limit")
    if binding not in concurrency.BINDING_LIMITS:
        raise UserError(f"--plan {path}: binding_limit {plan_input.shown(binding)} is not one of "
                        f"{', '.join(concurrency.BINDING_LIMITS)}; {fix}")
    return Cap(per_dp * ranks, [per_dp] * ranks, binding, f"plan ({per_dp} per DP rank x {ranks})")


def _rank_order(rank: str) -> int:
    """A dp_rank label's place: by number, one that is not a number first."""
    number = digits(rank)
    return -1 if number is None else number


def _requests(value: str, rank: str) -> int:
    """A dsa_max_running_requests sample's value; ValueError for +Inf, NaN, a fraction or a negative."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number == int(number) and 0 <= number <= plan_input.INT_MOST):
        raise ValueError(f"dsa_max_running_requests of dp_rank {plan_input.shown(rank)} is {plan_input.shown(value)}, "
                         "not a number of requests")
    return int(number)


def read_exporter(url: str, timeout: float) -> Cap | None:
    """The exporter's cap; ValueError when it cannot say."""
    from dsaops.verify_probes import failure

    try:
        status, text = fetch.request(url.rstrip("/") + "/metrics", deadline_s=timeout, max_bytes=EXPOSITION_MOST)
    except fetch.FetchError as e:
        raise ValueError(failure(e)) from None
    if status != 200:
        raise ValueError(f"/metrics answered HTTP {status}: not a dsaops exporter")
    return from_exporter_metrics(text.decode(errors="replace"))


def _most_common(values: list[str]) -> str | None:
    values = [v for v in values if v in concurrency.BINDING_LIMITS]
    return max(set(values), key=values.count) if values else None
