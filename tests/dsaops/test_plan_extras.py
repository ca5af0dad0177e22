"""The planner reads the server's extra arguments and environment as the pinned SGLang reads them."""
import collections
import contextlib
import dataclasses
import os
import warnings

import pytest

from dsaops import plan, plan_extras, sglang_cli
from dsaops.errors import UserError
from dsaops.launch_args import ClusterSpec, NodeSpec, launch_args
from dsaops.plan import PlanRequest
from tests.support.sglang_cli import cli_aliases, cli_flags, sglang_parser, sglang_reads
from tests.support.sglang_definitions import define, source_file

SKIP = "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"
# the switches adaptive_unsupported_reason turns --speculative-adaptive off for (pinned below), and its config file
TURNS_ADAPTIVE_OFF = ("--enable-multi-layer-eagle", "--enable-two-batch-overlap", "--enable-pdmux")
ADAPTIVE_CONFIG = "--speculative-adaptive-config"
# the `dsaops plan` options read from the extras: those named as SGLang first names a flag, but the inventory's
PLANNED = {option for option in plan_extras._plan_options()
           if option in cli_flags() and option not in cli_aliases()} - set(plan_extras.OWNED)
MODELLED = PLANNED | set(plan_extras.OWNED) | set(plan_extras.SPECULATIVE) | set(TURNS_ADAPTIVE_OFF) | {ADAPTIVE_CONFIG}


def test_sglang_parses_with_argparses_abbreviations():
    source = source_file("srt/server_args.py").read_text()
    assert 'argparse.ArgumentParser(prog="sglang serve")' in source and "allow_abbrev" not in source


def test_every_flag_the_planner_models_is_one_sglang_action_by_its_first_name():
    """The planner reads each flag by the name SGLang's parser lists first (its aliases are the same action's other
    option strings, so the last given wins whichever spelled it); each is one action of its own dest, and a switch
    the planner reads as on is a store_true there."""
    sglang = {action.option_strings[0]: action for action in sglang_parser()._actions}
    dests = collections.Counter(action.dest for action in sglang_parser()._actions)
    for flag in MODELLED:
        assert flag in sglang and dests[sglang[flag].dest] == 1, flag
    for flag in PLANNED:
        assert (plan_extras._plan_options()[flag].nargs == 0) == (sglang[flag].nargs == 0), flag
    switches = {flag for flag in MODELLED if sglang[flag].nargs == 0}
    assert len(switches) > 5 and all(sglang_reads([flag]) == {flag: True} for flag in switches)
    # the planner reads a switch given as on: a BooleanOptionalAction's --no- spelling would turn it off in SGLang
    assert not [flag for flag in switches if any(s.startswith("--no-") for s in sglang[flag].option_strings)]


def test_every_plan_option_sglang_takes_is_read_from_the_extra_arguments():
    """A flag added to `dsaops plan` that SGLang also takes is planned from the extras too, or this fails: the planner
    reads it under SGLang's first name for it. `--model` is a preset to the planner, the model path to SGLang."""
    options = plan_extras._plan_options()
    assert {option for option in options if option in cli_aliases()} == {"--model"}
    speculative = {"--speculative-num-draft-tokens": ["--speculative-algorithm", "DFLASH"],   # as given: not MTP's
                   "--speculative-adaptive": ["--speculative-algorithm", "NEXTN"]}
    taken = {option for option in options if option in cli_flags()} - {"--model"} - set(plan_extras.OWNED)
    for option in taken:
        value = [] if options[option].nargs == 0 else [options[option].choices[0] if options[option].choices else "2"]
        assert option in plan_extras.read([*speculative.get(option, []), option, *value]), option
    assert len(taken) > 10


def test_every_flag_dsaops_writes_from_the_inventory_is_refused_in_the_extra_arguments():
    """A flag launch_args gains from an inventory variable is refused in the extras too, or this fails; what the
    rest come from: the plan or the targets table, the weights role, the monitoring role, the secrets file."""
    spec = ClusterSpec(tp_size=8, kv_cache_dtype="fp8_e4m3", dsa_prefill_backend="tilelang", dsa_decode_backend="tilelang",
                       nnodes=2, attn_dp_size=8, ep_size=8, mem_fraction_static=0.8, max_running_requests=64,
                       chunked_prefill_size=4096, served_model_name="glm", enable_metrics=True)
    node = NodeSpec(model_path="/m", host="0.0.0.0", port=30000, node_rank=1, dist_init_addr="10.0.0.1:25000",
                    config_file="/c.yaml", model_revision="v1")
    single = dataclasses.replace(spec, nnodes=1, nccl_port=25000)
    written = {word for word in launch_args(spec, node) + launch_args(single, node) if word.startswith("--")}
    assert written - set(plan_extras.OWNED) == {"--chunked-prefill-size", "--served-model-name", "--enable-metrics",
                                                 "--config"}
    assert set(plan_extras.OWNED) - written == {"--enable-dp-attention"}   # the deprecated spelling of --attn-dp-size


def test_the_environment_switch_reads_as_sglangs_envbool():
    environ = source_file("srt/environ.py").read_text()
    assert f"{SKIP} = EnvBool(False)" in environ
    namespace = {"contextmanager": contextlib.contextmanager, "os": os, "warnings": warnings}
    define("srt/environ.py", "EnvField", namespace)
    env_bool = define("srt/environ.py", "EnvBool", namespace)(False)
    for word in ("1", "true", "True", "YES", "y", "0", "false", "No", "n", "2", "on", " 1", ""):
        try:
            sglang = env_bool.parse(word)
        except ValueError:
            with pytest.raises(UserError, match=f"^sglang_server_extra_env: {SKIP}=.* is neither true"):
                plan_extras.read([], {SKIP: word})
            continue
        assert plan_extras.read([], {SKIP: word}) == ({SKIP: True} if sglang else {}), word
    assert plan_extras.read([], {SKIP: True}) == {SKIP: True}   # YAML's true, rendered True
    assert plan_extras.read([], {"SGLANG_OTHER": "1"}) == {}


def _as_sglang(argv: list[str]) -> dict[str, object]:
    """What SGLang's own parser gives the planner's options for argv."""
    return {flag: value for flag, value in sglang_reads(argv).items() if flag in PLANNED}


@pytest.mark.parametrize("argv", [
    ["--context-length", "8192"], ["--context-length=8192"], ["--context-l", "8192"], ["--context-len=8192"],
    ["--data-parallel-size", "8", "--dp", "4"], ["--dp-size=4", "--data-parallel-size=8"],
    ["--disable-r", "--trust-remote-code", "--chat-template", "x.jinja"],
    ["--dp", "8"], ["--mm-f=cuda_ipc"],
    ["--speculative-num-d=2", "--max-m", "16", "--speculative-al", "NEXTN", "--speculative-num-s=1", "--speculative-ea=1"],
    ["--disable-overlap-schedule", "--mamba-radix-cache-strategy", "no_buffer", "--speculative-num-d", "3",
     "--speculative-algorithm=eagle", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1"],
    ["--enable-dp-attention-local-control-broadcast", "--max-mamba-cache-size", "64", "--mamba-f", "0.5"],
    ["--chat-template", "-a b", "--mamba-s", "bfloat16"],
    ["--speculative-adaptive", "--speculative-al", "NEXTN", "--speculative-num-s=5", "--speculative-num-d", "6"],
    ["--mamba-full-memory-ratio= 0.5"], ["--mamba-f=0.5 ", "--context-length", "8192"],   # float() takes the spaces
])
def test_both_spellings_and_abbreviations_read_as_sglang_reads_them(argv):
    read = plan_extras.read(argv)
    assert read and {flag: str(value) for flag, value in read.items() if value is not True} == \
        {flag: str(value) for flag, value in _as_sglang(argv).items() if value is not True}
    assert {flag for flag, value in read.items() if value is True} == \
        {flag for flag, value in _as_sglang(argv).items() if value is True}


@pytest.mark.parametrize("argv", [
    ["--trust-remote-code", "--chat-template", "x.jinja"],
    ["--enable-dp-attention-local-control-broadcast", "--model-impl", "x", "--ep-dispatch-algorithm", "lp"],  # not OWNED's
])
def test_flags_the_planner_does_not_model_are_left_to_sglang(argv):
    assert plan_extras.read(argv) == {}


def test_every_prefix_of_a_modelled_flag_is_read_as_sglang_reads_it_or_refused_as_it_refuses():
    """Every prefix of every spelling of a modelled flag, from `--` and one letter, with a value it takes: where
    SGLang's parser takes it, it is read as the flag SGLang reads it as, under the spelling it matched; where SGLang
    stops on it (shared with other flags; or another flag's own name, a switch, given a word), so does the preflight,
    in one line."""
    actions = {action.option_strings[0]: action for action in sglang_parser()._actions}
    read = ambiguous = 0
    for flag in MODELLED:
        action = actions[flag]
        value = [] if action.nargs == 0 else [str(action.choices[0]) if action.choices else "1"]
        for spelling in action.option_strings:
            for end in range(3, len(spelling) + 1):
                argv = [spelling[:end], *value]
                try:
                    sglang = sglang_reads(argv)
                except SystemExit:
                    with pytest.raises(UserError, match="^sglang_server_extra_args: SGLang 0.5.23 would stop at "
                                                        "startup[^\n]*; (fix the flag or drop it|drop it or give it "
                                                        "its flag)$"):
                        plan_extras.read(["--trust-remote-code", *argv])
                    if argv[0] not in cli_flags():
                        with pytest.raises(UserError, match=f"^sglang_server_extra_args: SGLang 0.5.23 would stop at "
                                                            f"startup: ambiguous option: {argv[0]}(=1)? could match "
                                                            "--[a-z0-9-]+, .*; fix the flag or drop it$"):
                            plan_extras.read(["--trust-remote-code", f"{argv[0]}=1"])
                        ambiguous += 1
                    continue
                given = sglang_cli.parse(argv)
                assert set(given) == set(sglang), argv
                if list(given) == [flag]:   # under the spelling matched: the prefix where it is one (--ep, --model)
                    assert given[flag].spelling == (argv[0] if argv[0] in action.option_strings else spelling), argv
                    read += 1
    assert read > 300 and ambiguous > 200
    assert plan_extras.read(["--context-l", "8192"]) == {"--context-length": 8192}
    assert plan_extras.read(["--context-length", "128k"]) == {"--context-length": 128_000}   # SGLang reads sizes
    assert plan_extras.read(["--context-length", "8Ki"]) == {"--context-length": 8192}
    # int() reads these for SGLang; the planner's own type takes ASCII digits alone, so it gets the number
    assert plan_extras.read(["--max-mamba-cache-size", "+1_000", "--dp-size= 4"]) == {"--max-mamba-cache-size": 1000,
                                                                                      "--dp-size": 4}


def test_the_last_given_wins_and_maps_to_the_plan_request():
    settings = plan_extras.read(["--context-length", "8192", "--context-length=4096", "--disable-radix-cache",
                                 "--mm-feature-transport", "cuda_ipc", "--data-parallel-size", "4"], {SKIP: "1"})
    assert settings == {"--context-length": 4096, "--disable-radix-cache": True, "--mm-feature-transport": "cuda_ipc",
                        "--dp-size": 4, SKIP: True}
    request = PlanRequest(target="sm_90", nodes=1, gpus_per_node=8, tp_size=8, kv_cache_dtype="fp8_e4m3",
                          mem_fraction_static=0.8, gpu_memory_gib=96, max_running_requests=240)
    planned = dataclasses.replace(request, **plan_extras.request_fields(settings))
    assert (planned.context_length, planned.disable_radix_cache, planned.mm_feature_transport, planned.dp_size,
            planned.skip_decode_lock) == (4096, True, "cuda_ipc", 4, True)


@pytest.mark.parametrize("argv, says", [
    (["--context-length", "3Gi"], "--context-length must be a whole number from 1 to 2147483647, got '3221225472'"),
    (["--context-l=-5"], "--context-length must be a whole number from 1 to 2147483647, got '-5'"),
    (["--context-length", "-5"], "--context-length must be a whole number"),     # a negative number is a value
    (["--context-length"], "SGLang 0.5.23 would stop at startup: argument --context-length: expected one argument"),
    (["--context-length", "--trust-remote-code"], "argument --context-length: expected one argument"),
    (["--mamba-full-memory-ratio=x"], "argument --mamba-full-memory-ratio: invalid float value: 'x'"),
    (["--disable-radix-cache=1"], "argument --disable-radix-cache: ignored explicit argument '1'"),
    (["--mm-feature-transport", "cuda_vmm"], ("--mm-feature-transport 'cuda_vmm' is not one `dsaops plan` plans: "
                                              "give one of cpu, cuda_ipc")),
    (["--context-length", "abc", "--context-length", "8192"], "argument --context-length: 'abc' is not a whole number"),
    (["--mamba-ssm-dtype", "fp8"], "invalid choice: 'fp8' (choose from 'float32', 'bfloat16', 'float16')"),
    (["--tp", "8"], "--tp-size is written from dsaops_tp_size, which other roles read too; set that in the inventory"),
    (["--tensor-parallel-size=8"], "--tensor-parallel-size is written from dsaops_tp_size"),
    (["--max-r=8"], "--max-running-requests is written from dsaops_max_running_requests"),
    (["--mem", "0.7"], "--mem-fraction-static is written from dsaops_mem_fraction_static"),
    (["--kv-cache-dtype", "bf16"], "--kv-cache-dtype is written from dsaops_kv_cache_dtype"),
    (["--model", "/x"], "--model is written from dsaops_model_path"),
    (["--ep", "8"], "--ep is written from dsaops_ep_size"),
    (["--host=0.0.0.0"], "--host is written from dsaops_server_listen_host"),
    (["--po", "8000"], "--port is written from dsaops_server_port"),
    (["--nccl-init-addr", "h:1"], "--nccl-init-addr is written from dsaops_cluster_address and dsaops_dist_init_port"),
    (["--enable-dp-attention"], "--enable-dp-attention is written from dsaops_attn_dp_size"),
])
def test_a_bad_value_is_refused_in_one_line(argv, says):
    with pytest.raises(UserError) as refused:
        plan_extras.read(["--trust-remote-code", *argv])
    assert str(refused.value).startswith("sglang_server_extra_args: ") and says in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("argv, says", [
    (["--tp-size=2 "], "--tp-size is written from dsaops_tp_size"),   # int() takes '2 ': SGLang runs TP 2
    (["--speculative-adaptive", "--speculative-algorithm", "NEXTN",
      "--speculative-adaptive-c=/models/adaptive steps.json"],
     "--speculative-adaptive-config names a file inside the server's container"),
])
def test_a_flag_whose_value_holds_a_space_is_read_as_the_flag(argv, says):
    """argparse takes `--flag=value` for the flag whatever the value holds (a word with a space is a value only where
    no flag is named before an `=`): SGLang starts with it, and the preflight reads it, refusing these."""
    flag = says.split()[0]
    assert flag in sglang_reads(argv)
    with pytest.raises(UserError, match=f"^sglang_server_extra_args: {says}"):
        plan_extras.read(argv)


def test_mtp_draft_tokens_resolve_as_sglangs_handle_eagle_family():
    """The pinned hooks the resolution follows, run where they are plain Python: NEXTN is EAGLE (no draft model
    given), and with no steps given SGLang chooses AUTO_DRAFT_TOKENS for every model dsaops plans; the assertion that
    nothing else comes without the steps, and top-k 1 making the draft tokens steps + 1, as the hook states them."""
    import ast
    import json
    from pathlib import Path
    from types import SimpleNamespace
    from typing import Optional

    alias = define("srt/arg_groups/speculative_hook.py", "_resolve_speculative_algorithm_alias",
                   {"Optional": Optional})
    assert {name: alias(name, None) for name in ("NEXTN", "EAGLE", "EAGLE3")} == {"NEXTN": "EAGLE", "EAGLE": "EAGLE",
                                                                                   "EAGLE3": "EAGLE3"}
    auto = define("srt/arg_groups/speculative_hook.py", "_auto_choose_speculative_params",
                  {"resolving_view": lambda args: args, "ServerArgs": object})
    models = Path(plan_extras.__file__).parent / "models"
    archs = {arch for path in models.glob("*.json") for arch in json.loads(path.read_text())["architectures"]}
    assert archs and {auto(SimpleNamespace(speculative_algorithm="EAGLE"), arch) for arch in archs} == \
        {(3, 1, plan_extras.AUTO_DRAFT_TOKENS)}

    hook = next(n for n in ast.walk(ast.parse(source_file("srt/arg_groups/speculative_hook.py").read_text()))
                if isinstance(n, ast.FunctionDef) and n.name == "_handle_eagle_family")
    branches = {ast.unparse(n.test): n.body for n in ast.walk(hook) if isinstance(n, ast.If)}
    unsteered = branches["not cfg.speculative_adaptive and cfg.speculative_num_steps is None"]
    assert ast.unparse(unsteered[0]) == \
        "assert cfg.speculative_eagle_topk is None and cfg.speculative_num_draft_tokens is None"
    chain = branches["cfg.speculative_eagle_topk == 1 and cfg.speculative_num_draft_tokens != cfg.speculative_num_steps + 1"]
    assert "speculative_num_draft_tokens=cfg.speculative_num_steps + 1" in ast.unparse(chain)
    assert "cfg.speculative_eagle_topk > 1 and view.page_size > 1 and (view.attention_backend not in " \
        "_PAGE_TREE_SPEC_BACKENDS)" in branches   # top-k unset is compared with a number: a TypeError


@pytest.mark.parametrize("argv, draft", [
    (["--speculative-algorithm", "nextn"], plan_extras.AUTO_DRAFT_TOKENS),
    (["--speculative-algorithm=EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"], 4),
    (["--speculative-al", "NEXTN", "--speculative-num-s", "1", "--speculative-ea", "1", "--speculative-num-d", "4"],
     2),   # top-k 1: steps + 1, whatever was given
    (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2", "--speculative-eagle-topk", "4",
      "--speculative-num-draft-tokens", "8"], 8),
    (["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"], None),   # no algorithm: no speculative decoding
    (["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "6"], 6),   # as given: not MTP's rules
])
def test_the_draft_tokens_are_those_sglang_runs_with(argv, draft):
    assert plan_extras.read(argv).get("--speculative-num-draft-tokens") == draft


@pytest.mark.parametrize("argv, says", [
    (["--speculative-num-draft-tokens", "4"], "without --speculative-algorithm starts no speculative decoding"),
    (["--speculative-algorithm", "dflash"], "--speculative-algorithm 'DFLASH' without --speculative-num-draft-tokens"),
    (["--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "4"],
     "without --speculative-num-steps stops SGLang at startup"),
    (["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"], "without --speculative-eagle-topk stops"),
    (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2"],
     "--speculative-eagle-topk above 1 needs --speculative-num-draft-tokens"),
    (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "x"], "argument --speculative-num-steps: invalid int value: 'x'"),
])
def test_speculative_decoding_sglang_stops_on_or_the_plan_does_not_size_is_refused(argv, says):
    with pytest.raises(UserError, match="^sglang_server_extra_args: ") as refused:
        plan_extras.read(argv)
    assert says in str(refused.value)


@pytest.mark.parametrize("draft", [2, 4, 6])
def test_the_mtp_flags_dsaops_writes_start_the_draft_tokens_planned(draft):
    """`dsaops plan`'s command line for N draft tokens gives SGLang the steps and top-k with them (without, it stops
    on its assertion) and resolves to N again."""
    spec = ClusterSpec(tp_size=1, kv_cache_dtype="fp8_e4m3", speculative_num_draft_tokens=draft)
    node = NodeSpec(model_path="/m", host="127.0.0.1", port=30000, node_rank=0, dist_init_addr="")
    argv = launch_args(spec, node)
    assert argv[argv.index("--speculative-num-steps") + 1] == str(draft - 1)
    assert plan_extras.read(argv[argv.index("--speculative-num-draft-tokens"):]) == {"--speculative-num-draft-tokens": draft}


ADAPTIVE_PARAMS = "srt/speculative/adaptive_spec_params.py"


def _sglang_adaptive(monkeypatch):
    """The pinned hooks, run where they are plain Python: _init_adaptive_speculative_params over a record whose
    declared values it reads back, adaptive_unsupported_reason on an in-tree platform, and NEXTN's alias; the
    candidate steps are DEFAULT_ADAPTIVE_CONFIG's, as resolve_candidate_steps_from_config reads them."""
    import json
    from types import SimpleNamespace
    from typing import Optional

    from tests.support.sglang_definitions import fake_modules, lift

    config = lift(source_file(ADAPTIVE_PARAMS), ["DEFAULT_ADAPTIVE_CONFIG", "_load_adaptive_config",
                                                 "resolve_candidate_steps_from_config"], {"json": json})
    fake_modules(monkeypatch, {"sglang.srt.speculative.adaptive_spec_params": config,
                               "sglang.srt.arg_groups.model_override_base": {"ep_scale_joiner_of": lambda cfg: False}})
    identity = {"resolving_view": lambda args: args, "resolved_view": lambda args: args}
    init = define("srt/arg_groups/speculative_hook.py", "_init_adaptive_speculative_params",
                  {**identity, "declare_resolution": lambda args, _by, **values: vars(args).update(values)})
    reason = define(ADAPTIVE_PARAMS, "adaptive_unsupported_reason", {
        **identity, "attn_dp_enabled_of": define("srt/runtime_context.py", "attn_dp_enabled_of", {}),
        "SpeculativeAlgorithm": SimpleNamespace(from_string=lambda name: SimpleNamespace(
            get_platform_worker_cls=lambda: None))})   # dsaops' targets are CUDA and ROCm, in SGLang's tree
    alias = define("srt/arg_groups/speculative_hook.py", "_resolve_speculative_algorithm_alias",
                   {"Optional": Optional})
    return config["resolve_candidate_steps_from_config"], init, reason, alias


def test_the_adaptive_candidate_steps_are_sglangs_default_configs(monkeypatch):
    """SGLang's pools and steps come from every batch-size tier's candidate steps together; the hook that reads them
    runs before the EAGLE family's (whose auto choice it skips) and only turns the switch off where unsupported."""
    import ast

    candidates, *_ = _sglang_adaptive(monkeypatch)
    assert candidates() == list(plan.ADAPTIVE_STEPS)
    hook = next(n for n in ast.walk(ast.parse(source_file("srt/arg_groups/speculative_hook.py").read_text()))
                if isinstance(n, ast.FunctionDef) and n.name == "handle_speculative_decoding")
    adaptive = next(n for n in hook.body if isinstance(n, ast.If) and ast.unparse(n.test) == "cfg.speculative_adaptive")
    assert [ast.unparse(n) for n in adaptive.body] == [
        "_maybe_disable_adaptive(server_args)",
        "if cfg.speculative_adaptive:\n    _init_adaptive_speculative_params(server_args)"]
    assert hook.body.index(adaptive) < next(i for i, n in enumerate(hook.body) if "handle_server_args" in ast.unparse(n))
    reason = next(n for n in ast.walk(ast.parse(source_file(ADAPTIVE_PARAMS).read_text()))
                  if isinstance(n, ast.FunctionDef) and n.name == "adaptive_unsupported_reason")
    switches = {"--" + n.attr.replace("_", "-") for n in ast.walk(reason)
                if isinstance(n, ast.Attribute) and n.attr.startswith("enable_")}
    assert switches == set(TURNS_ADAPTIVE_OFF) == set(plan_extras.ADAPTIVE_OFF)


@pytest.mark.parametrize("steps", [None, *range(9)])
@pytest.mark.parametrize("topk", [None, 1])
@pytest.mark.parametrize("given", [None, 2, 6])
def test_adaptive_draft_tokens_are_what_sglang_starts_with(monkeypatch, steps, topk, given):
    """The pinned _init_adaptive_speculative_params, then top-k 1's steps + 1: the count SGLang budgets the pools for,
    or its startup error, for every steps, top-k and count the extras can give with the switch."""
    from types import SimpleNamespace

    _, init, _, _ = _sglang_adaptive(monkeypatch)
    record = SimpleNamespace(speculative_adaptive_config=None, speculative_num_steps=steps, speculative_eagle_topk=topk,
                             speculative_num_draft_tokens=given)
    argv = ["--speculative-adaptive", "--speculative-algorithm", "NEXTN"]
    for flag, value in (("--speculative-num-steps", steps), ("--speculative-eagle-topk", topk),
                        ("--speculative-num-draft-tokens", given)):
        argv += [flag, str(value)] if value is not None else []
    try:
        init(record)
    except ValueError:
        with pytest.raises(UserError, match=f"^sglang_server_extra_args: --speculative-num-steps {steps} is not among "
                                            r"--speculative-adaptive's candidate steps \(0, 1, 3, 5, 7\), which stops "
                                            "SGLang at startup; give one of them, or drop --speculative-adaptive$"):
            plan_extras.read(argv)
        return
    assert record.speculative_eagle_topk == 1
    assert plan_extras.read(argv) == {"--speculative-adaptive": True,
                                      "--speculative-num-draft-tokens": record.speculative_num_steps + 1}


@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE", "EAGLE3", "DFLASH", "NGRAM", "STANDALONE"])
@pytest.mark.parametrize("topk", [None, 1, 2])
@pytest.mark.parametrize("switch", [None, *TURNS_ADAPTIVE_OFF])
def test_adaptive_is_refused_where_sglang_turns_it_off(monkeypatch, algorithm, topk, switch):
    """adaptive_unsupported_reason (pinned) for what the extras set: where it gives a reason SGLang warns and runs the
    static steps, and the extras reader refuses the switch; attention DP, the inventory's, is the plan's to refuse."""
    from types import SimpleNamespace

    _, _, reason, alias = _sglang_adaptive(monkeypatch)
    record = SimpleNamespace(speculative_algorithm=alias(algorithm, None), speculative_eagle_topk=topk, attn_dp_size=1,
                             **{f"enable_{flag[len('--enable-'):].replace('-', '_')}": flag == switch
                                for flag in TURNS_ADAPTIVE_OFF})
    argv = ["--speculative-adaptive", "--speculative-algorithm", algorithm, "--speculative-num-steps", "3",
            "--speculative-num-draft-tokens", "4", *(["--speculative-eagle-topk", str(topk)] if topk else []),
            *([switch] if switch else [])]
    if reason(record) is None:
        assert plan_extras.read(argv) == {"--speculative-adaptive": True, "--speculative-num-draft-tokens": 4}
    else:
        with pytest.raises(UserError, match="^sglang_server_extra_args: SGLang turns --speculative-adaptive off "
                                            r"(for|with) .* and runs the static steps; drop it$"):
            plan_extras.read(argv)
    assert reason(SimpleNamespace(**{**vars(record), "attn_dp_size": 8})) is not None
    assert reason(SimpleNamespace(**{**vars(record), "speculative_algorithm": None})) is not None


@pytest.mark.parametrize("argv, draft", [
    (["--speculative-adaptive", "--speculative-algorithm", "nextn"], 4),   # the middle candidate step, 3
    (["--speculative-adaptive", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "7"], 8),  # top-k: 1
    (["--speculative-adaptive", "--speculative-algorithm=EAGLE", "--speculative-eagle-topk", "1"], 4),
    (["--speculative-adaptive", "--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "6"], 4),
    (["--speculative-al", "NEXTN", "--speculative-num-s", "1", "--speculative-ea", "1", "--speculative-adaptive"], 2),
])
def test_adaptive_draft_tokens(argv, draft):
    assert plan_extras.read(argv) == {"--speculative-adaptive": True, "--speculative-num-draft-tokens": draft}


@pytest.mark.parametrize("argv, draft", [
    (["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1"], 3),
    (["--speculative-algorithm", "NEXTN", "--enable-two-batch-overlap", "--enable-pdmux"], 4),
    (["--enable-multi-layer-eagle"], None),
])
def test_without_the_switch_the_draft_tokens_are_the_static_ones(argv, draft):
    """Negative control: steps outside the candidates, and the switches that turn adaptive off, change nothing."""
    assert plan_extras.read(argv).get("--speculative-num-draft-tokens") == draft
    assert "--speculative-adaptive" not in plan_extras.read(argv)


@pytest.mark.parametrize("argv, says", [
    (["--speculative-adaptive"], "--speculative-adaptive without --speculative-algorithm starts no speculative decoding"),
    (["--speculative-adaptive", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "4"],
     "--speculative-num-steps 4 is not among --speculative-adaptive's candidate steps (0, 1, 3, 5, 7)"),
    (["--speculative-adaptive", "--speculative-algorithm", "NEXTN", "--speculative-adaptive-config", "/c/a.json"],
     "--speculative-adaptive-config names a file inside the server's container, which the plan cannot read"),
    (["--speculative-adaptive-=/c/a.json"], "drop it to run SGLang's default candidate steps, which the plan models"),
    (["--speculative-algorithm", "NEXTN", "--enable-pdmux=1"], "argument --enable-pdmux: ignored explicit argument"),
    (["--speculative-adaptiv", "--speculative-algorithm", "NEXTN"],
     "ambiguous option: --speculative-adaptiv could match --speculative-adaptive, --speculative-adaptive-config"),
])
def test_adaptive_sglang_stops_on_or_the_plan_cannot_read_is_refused_in_one_line(argv, says):
    with pytest.raises(UserError, match="^sglang_server_extra_args: ") as refused:
        plan_extras.read(argv)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_the_adaptive_flags_dsaops_writes_start_the_draft_tokens_planned():
    spec = ClusterSpec(tp_size=1, kv_cache_dtype="fp8_e4m3", speculative_num_draft_tokens=6, speculative_adaptive=True)
    argv = launch_args(spec, NodeSpec(model_path="/m", host="127.0.0.1", port=30000))
    assert plan_extras.read(argv[argv.index("--speculative-num-draft-tokens"):]) == {
        "--speculative-num-draft-tokens": 6, "--speculative-adaptive": True}
