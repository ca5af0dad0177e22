"""What a server's extra arguments and environment set of a `dsaops plan`, read as SGLang 0.5.23 reads them.

The playbooks launch SGLang with sglang_server_extra_args after the flags dsaops writes, so they
win (dsaops.launch_args), and with sglang_server_extra_env in its environment; the preflight plans
with what they set (the dsaops_plan_extras and dsaops_plan filters). The arguments are parsed against
SGLang's own flags (dsaops.sglang_cli), which refuses what stops SGLang's parser at startup (a flag it
has not got, a prefix of several, a value missing or extra) and gives each flag's last value by the
flag's first name, whatever prefix, alias or `--flag=value` spelled it. The planner reads, of those:
the `dsaops plan` options named as SGLang first names a flag, each value by the option's own type and
choices; the speculative flags, which give the draft tokens SGLang runs with (draft_tokens); and the
flags dsaops writes from an inventory variable (OWNED), refused: other roles read that variable too
(the fence, the probes, the host-memory gate, the selftest). The values of other flags are left to SGLang.
--speculative-adaptive is planned with SGLang's default candidate steps, and refused where SGLang turns it off
and runs the static steps, as other speculative flags SGLang ignores are (under attention DP, which the
inventory sets, dsaops.plan refuses it).
"""
from __future__ import annotations

import argparse
import functools

from dsaops import plan, sglang_cli
from dsaops.errors import UserError
from dsaops.plan_input import shown

# The flags dsaops writes (dsaops.launch_args, from the playbooks), by what the inventory sets them with; as every
# flag here, by SGLang's first name for it
OWNED = {
    "--model-path": "dsaops_model_path", "--revision": "dsaops_model_revision", "--host": "dsaops_server_listen_host",
    "--port": "dsaops_server_port",
    "--tp-size": "dsaops_tp_size", "--attn-dp-size": "dsaops_attn_dp_size", "--enable-dp-attention": "dsaops_attn_dp_size",
    "--ep-size": "dsaops_ep_size", "--nnodes": "the dsaops_cluster group", "--node-rank": "the dsaops_workers group",
    "--dist-init-addr": "dsaops_cluster_address and dsaops_dist_init_port", "--nccl-port": "dsaops_dist_init_port",
    "--kv-cache-dtype": "dsaops_kv_cache_dtype", "--dsa-prefill-backend": "dsaops_dsa_prefill_backend",
    "--dsa-decode-backend": "dsaops_dsa_decode_backend", "--mem-fraction-static": "dsaops_mem_fraction_static",
    "--max-running-requests": "dsaops_max_running_requests",
}
# Not `dsaops plan` options: with --speculative-num-draft-tokens they decide the draft tokens SGLang runs with
# (arg_groups/speculative_hook.py), which the plan takes (draft_tokens); each read by its SGLang type
SPECULATIVE = {"--speculative-algorithm": str.upper, "--speculative-num-steps": int, "--speculative-eagle-topk": int}
MTP = ("EAGLE", "NEXTN")   # the model's NextN layers as the EAGLE draft (_resolve_speculative_algorithm_alias)
AUTO_DRAFT_TOKENS = 4      # _auto_choose_speculative_params for every DSA model: 3 steps, top-k 1, 4 draft tokens
ADAPTIVE = (*MTP, "EAGLE3")   # what SGLang keeps --speculative-adaptive on for (EAGLE, EAGLE3; NEXTN is EAGLE)
# SGLang switches that turn --speculative-adaptive off (speculative/adaptive_spec_params.py
# adaptive_unsupported_reason: their workers do not adapt); not planned otherwise
ADAPTIVE_OFF = ("--enable-multi-layer-eagle", "--enable-two-batch-overlap", "--enable-pdmux")
# A JSON file inside the server's container (_load_adaptive_config): its candidate steps would replace the
# default ones the plan sizes by
ADAPTIVE_CONFIG = "--speculative-adaptive-config"
# SGLang's environment switch (srt/environ.py, an EnvBool): the `dsaops plan` switch it amounts to
ENV = {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "--skip-decode-lock"}
ENV_TRUE, ENV_FALSE = ("true", "1", "yes", "y"), ("false", "0", "no", "n")   # EnvBool.parse, lowercased


@functools.cache
def _plan_options() -> dict[str, argparse.Action]:
    """The `dsaops plan` parser's actions, by option string."""
    sub = argparse.ArgumentParser().add_subparsers()
    plan.add_parser(sub)
    return sub.choices["plan"]._option_string_actions


def _value(action: argparse.Action, flag: str, text: str):
    """`text` as the `dsaops plan` option reads it: its type, then its choices."""
    try:
        value = action.type(text) if action.type else text
    except argparse.ArgumentTypeError as e:
        raise UserError(f"sglang_server_extra_args: {flag} {e}; fix the value or drop the flag") from None
    except ValueError:
        raise UserError(f"sglang_server_extra_args: {flag} takes a number, got {shown(text)}; fix the value or "
                        "drop the flag") from None
    if action.choices is not None and value not in action.choices:
        raise UserError(f"sglang_server_extra_args: {flag} {shown(text)} is not one `dsaops plan` plans: give one of "
                        f"{', '.join(action.choices)}, or drop the flag")
    return value


def draft_tokens(speculative: dict[str, object], given: int | None, adaptive: bool = False) -> int | None:
    """The draft tokens a step SGLang 0.5.23 starts with for the SPECULATIVE and ADAPTIVE_OFF flags given,
    --speculative-num-draft-tokens (`given`) and --speculative-adaptive, as _init_adaptive_speculative_params and
    _handle_eagle_family resolve them for MTP; None without speculative decoding. UserError for what SGLang stops
    on at startup, a count only SGLang would know, or --speculative-adaptive where SGLang turns it off."""
    algorithm = speculative.get("--speculative-algorithm")
    steps, topk = speculative.get("--speculative-num-steps"), speculative.get("--speculative-eagle-topk")
    if adaptive:
        return _adaptive_draft_tokens(speculative, algorithm, steps, topk)
    if algorithm is None:
        if given is not None:
            raise UserError("sglang_server_extra_args: --speculative-num-draft-tokens without --speculative-algorithm "
                            "starts no speculative decoding; add --speculative-algorithm NEXTN (MTP), or drop the flag")
        return None
    if algorithm not in MTP:   # DFLASH, NGRAM, ...: the count given, else one SGLang finds (a draft's config)
        if given is None:
            raise UserError(f"sglang_server_extra_args: --speculative-algorithm {shown(algorithm)} without "
                            "--speculative-num-draft-tokens leaves the draft tokens to SGLang, and the plan sizes the "
                            "mamba state's scratch by them; give the count (DFLASH: its block size)")
        return given
    if steps is None:      # SGLang then chooses all three, and asserts that none is given
        if topk is not None or given is not None:
            raise UserError("sglang_server_extra_args: --speculative-eagle-topk or --speculative-num-draft-tokens "
                            "without --speculative-num-steps stops SGLang at startup; give --speculative-num-steps "
                            "too, or none of the three")
        return AUTO_DRAFT_TOKENS
    if topk is None:       # compared with numbers before anything defaults it
        raise UserError("sglang_server_extra_args: --speculative-num-steps without --speculative-eagle-topk stops "
                        "SGLang at startup; give --speculative-eagle-topk (1: a chain of steps + 1 draft tokens)")
    if topk == 1:          # SGLang sets the draft tokens to steps + 1, whatever was given
        return steps + 1
    if given is None:
        raise UserError("sglang_server_extra_args: --speculative-eagle-topk above 1 needs --speculative-num-draft-tokens, "
                        "the draft tree's tokens a step, which the plan sizes the draft's state by; give it")
    return given


def _adaptive_draft_tokens(speculative: dict[str, object], algorithm, steps, topk) -> int:
    """_maybe_disable_adaptive, refused where it turns the switch off, then _init_adaptive_speculative_params: top-k
    1, the middle candidate step unless steps are given, steps + 1 draft tokens whatever else was given."""
    if algorithm is None:
        raise UserError("sglang_server_extra_args: --speculative-adaptive without --speculative-algorithm starts no "
                        "speculative decoding; add --speculative-algorithm NEXTN (MTP), or drop the flag")
    if algorithm not in ADAPTIVE:
        off = f"for --speculative-algorithm {shown(algorithm)} (it adapts EAGLE's draft steps only)"
    elif topk not in (None, 1):
        off = f"with --speculative-eagle-topk {topk} (it adapts a top-k 1 chain only)"
    else:
        off = next((f"with {flag}" for flag in ADAPTIVE_OFF if flag in speculative), None)
    if off:
        raise UserError(f"sglang_server_extra_args: SGLang turns --speculative-adaptive off {off} and runs the static "
                        "steps; drop it")
    candidates = plan.ADAPTIVE_STEPS
    steps = candidates[len(candidates) // 2] if steps is None else steps
    if steps not in candidates:
        raise UserError(f"sglang_server_extra_args: --speculative-num-steps {steps} is not among --speculative-adaptive's "
                        f"candidate steps ({', '.join(map(str, candidates))}), which stops SGLang at startup; give one "
                        "of them, or drop --speculative-adaptive")
    return steps + 1


def read(args, env=None) -> dict[str, object]:
    """{`dsaops plan` option or ENV name: value} for what `args` (sglang_server_extra_args) and `env`
    (sglang_server_extra_env) set that the planner models, the last of a flag given twice, as SGLang
    takes it; UserError in one line for a value SGLang or the planner would refuse, or an OWNED flag."""
    settings: dict[str, object] = {}
    speculative: dict[str, object] = {}
    for flag, (spelling, value) in sglang_cli.parse([str(a) for a in args]).items():
        if flag in OWNED:
            raise UserError(f"sglang_server_extra_args: {spelling} is written from {OWNED[flag]}, which other roles "
                            "read too; set that in the inventory and drop the flag")
        if flag == ADAPTIVE_CONFIG:
            raise UserError(f"sglang_server_extra_args: {spelling} names a file inside the server's container, which "
                            "the plan cannot read (its candidate steps set the draft tokens SGLang sizes by); drop it "
                            "to run SGLang's default candidate steps, which the plan models")
        if flag in ADAPTIVE_OFF:
            speculative[flag] = True
        elif flag in SPECULATIVE:
            speculative[flag] = SPECULATIVE[flag](value)   # SGLang's parser has refused a step or top-k not whole
        elif flag in _plan_options():
            settings[flag] = value if value is True else _value(_plan_options()[flag], flag, value)
    adaptive = settings.get("--speculative-adaptive", False)
    if speculative or "--speculative-num-draft-tokens" in settings or adaptive:
        draft = draft_tokens(speculative, settings.pop("--speculative-num-draft-tokens", None), adaptive)
        if draft is not None:
            settings["--speculative-num-draft-tokens"] = draft
    for name, value in (env or {}).items():
        if name in ENV:
            word = str(value).lower()   # as the server script renders it: True is 'True'
            if word not in ENV_TRUE + ENV_FALSE:
                raise UserError(f"sglang_server_extra_env: {name}={shown(str(value))} is neither true "
                                f"({', '.join(ENV_TRUE)}) nor false ({', '.join(ENV_FALSE)}); write 1 or 0")
            if word in ENV_TRUE:   # false is SGLang's default
                settings[name] = True
    return settings


def request_fields(settings: dict[str, object]) -> dict[str, object]:
    """The dsaops.plan.PlanRequest fields `settings` (what read gives) set."""
    return {_plan_options()[ENV.get(key, key)].dest: value for key, value in settings.items()}
