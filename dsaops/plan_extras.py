"""What a server's extra arguments and environment set of a `dsaops plan`, read as SGLang 0.5.23 reads them.

The playbooks launch SGLang with sglang_server_extra_args after the flags dsaops writes, so they
win (dsaops.launch_args), and with sglang_server_extra_env in its environment; the preflight plans
with what they set (the dsaops_plan_extras and dsaops_plan filters). SGLang parses with argparse's
defaults (srt/server_args.py prepare_server_args): `--flag value`, `--flag=value`, and any prefix
that names one flag alone. The arguments are first parsed against SGLang's own flags (dsaops.sglang_cli),
which refuses what stops SGLang's parser at startup (a flag it has not got, a prefix of several, a value
missing or extra). Each value of a flag the planner models is then read by the `dsaops plan` option's own
type and choices; the speculative flags give the draft tokens SGLang runs with (draft_tokens); the values
of other flags are left to SGLang. A flag dsaops writes from an inventory variable is refused: other
roles read that variable too (the fence, the probes, the host-memory gate, the selftest).
--speculative-adaptive is planned with SGLang's default candidate steps, and refused where SGLang turns it off
and runs the static steps, as other speculative flags SGLang ignores are (under attention DP, which the
inventory sets, dsaops.plan refuses it).
"""
from __future__ import annotations

import argparse
import functools
import re

from dsaops import plan, sglang_cli
from dsaops.errors import UserError
from dsaops.plan_input import shown

# SGLang's spellings of the options `dsaops plan` models (srt/arg_groups/fields/*.py; --enable-dp-attention:
# server_args.py), each with the shortest prefix its argparse takes for that flag alone
FLAGS = {
    "--tp-size": "--tp", "--tensor-parallel-size": "--te", "--dp-size": "--dp", "--data-parallel-size": "--da",
    "--attn-dp-size": "--attn-d", "--attention-data-parallel-size": "--attention-d",
    "--enable-dp-attention": "--enable-dp-attention",     # also a prefix of --enable-dp-attention-local-control-broadcast
    "--kv-cache-dtype": "--kv-cac", "--dsa-prefill-backend": "--dsa-pr", "--dsa-decode-backend": "--dsa-d",
    "--mem-fraction-static": "--mem", "--context-length": "--context-l", "--max-running-requests": "--max-r",
    "--max-mamba-cache-size": "--max-m", "--mamba-ssm-dtype": "--mamba-s", "--mamba-full-memory-ratio": "--mamba-f",
    "--mamba-radix-cache-strategy": "--mamba-r", "--disable-radix-cache": "--disable-r",
    "--disable-overlap-schedule": "--disable-ov", "--mm-feature-transport": "--mm-f",
    "--speculative-num-draft-tokens": "--speculative-num-d", "--speculative-algorithm": "--speculative-al",
    "--speculative-num-steps": "--speculative-num-s", "--speculative-eagle-topk": "--speculative-ea",
    "--speculative-adaptive": "--speculative-adaptive",   # also a prefix of --speculative-adaptive-config
    "--speculative-adaptive-config": "--speculative-adaptive-", "--enable-multi-layer-eagle": "--enable-multi-",
    "--enable-two-batch-overlap": "--enable-tw", "--enable-pdmux": "--enable-pdm",
    "--model-path": "--model-p", "--model": "--model", "--host": "--ho", "--port": "--po", "--ep-size": "--ep-s",
    "--expert-parallel-size": "--expert-p", "--ep": "--ep", "--nnodes": "--nn", "--node-rank": "--nod",
    "--dist-init-addr": "--dist-i", "--nccl-init-addr": "--nccl-i", "--nccl-port": "--nccl-p",
}
# SGLang's other names for them (srt/arg_groups/fields/*.py aliases)
ALIASES = {"--tensor-parallel-size": "--tp-size", "--data-parallel-size": "--dp-size",
           "--attention-data-parallel-size": "--attn-dp-size", "--model": "--model-path",
           "--expert-parallel-size": "--ep-size", "--ep": "--ep-size", "--nccl-init-addr": "--dist-init-addr"}
# The flags dsaops writes (dsaops.launch_args, from the playbooks), by what the inventory sets them with
OWNED = {
    "--model-path": "dsaops_model_path", "--host": "dsaops_server_listen_host", "--port": "dsaops_server_port",
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
# argparse's _negative_number_matcher: such a word is a value, not a flag (SGLang has no flag like it)
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@functools.cache
def _plan_options() -> dict[str, argparse.Action]:
    """The `dsaops plan` parser's actions, by option string."""
    sub = argparse.ArgumentParser().add_subparsers()
    plan.add_parser(sub)
    return sub.choices["plan"]._option_string_actions


def _flag(name: str) -> str | None:
    """The `dsaops plan` option SGLang's argparse reads `name` as; None for any other flag, or a prefix it
    refuses as ambiguous."""
    spelling = next((flag for flag, least in FLAGS.items() if flag.startswith(name) and name.startswith(least)), None)
    return ALIASES.get(spelling, spelling)


def _is_flag(word: str) -> bool:
    """Whether argparse takes `word` for an option rather than a value (_parse_optional)."""
    return word.startswith("-") and len(word) > 1 and not _NEGATIVE_NUMBER.match(word) and " " not in word


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
    args = [str(a) for a in args]
    sglang_cli.check(args)   # from here on every flag is SGLang's, whole or a prefix of one alone, with its value
    settings: dict[str, object] = {}
    speculative: dict[str, object] = {}
    for at, word in enumerate(args):
        name, eq, text = word.partition("=")
        if not (_is_flag(word) and name.startswith("--")):
            continue
        flag = _flag(name)
        if flag is None:
            continue
        if flag in OWNED:
            raise UserError(f"sglang_server_extra_args: {name} is written from {OWNED[flag]}, which other roles read "
                            "too; set that in the inventory and drop the flag")
        if flag == ADAPTIVE_CONFIG:
            raise UserError(f"sglang_server_extra_args: {name} names a file inside the server's container, which the "
                            "plan cannot read (its candidate steps set the draft tokens SGLang sizes by); drop it to "
                            "run SGLang's default candidate steps, which the plan models")
        action = _plan_options().get(flag)
        if flag in ADAPTIVE_OFF or (action is not None and action.nargs == 0):      # a switch
            (speculative if flag in ADAPTIVE_OFF else settings)[flag] = True
            continue
        if not eq:
            text = args[at + 1]
        if flag in SPECULATIVE:
            speculative[flag] = SPECULATIVE[flag](text)   # sglang_cli.check has refused a step or top-k not whole
        else:
            settings[flag] = _value(action, flag, text)
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
