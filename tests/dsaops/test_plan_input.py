"""`dsaops plan` on bad input: exit 2 and one line that names the flag or config key, never a traceback.

A table of bad values (every number flag with nan, inf, -inf, 1e308, 0, -1 and a word; choices and
names; model configs of every broken shape, each key the sizing reads out of range or of the wrong
type, and geometry SGLang refuses), then a seeded fuzz over the whole argument space.
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsaops import model_geometry, plan_input
from dsaops.cli import main
from dsaops.errors import UserError
from dsaops.plan import PlanRequest, make_plan

BASE = {"--target": "sm_90", "--nodes": "1", "--gpus-per-node": "8", "--tp-size": "8", "--kv-cache-dtype": "fp8_e4m3",
        "--dsa-prefill-backend": "tilelang", "--dsa-decode-backend": "tilelang", "--mem-fraction-static": "0.8",
        "--gpu-memory-gib": "140", "--free-memory-gib": "89.5", "--context-length": "32768"}
FLOATS = ["--mem-fraction-static", "--gpu-memory-gib", "--free-memory-gib", "--weights-gib", "--mamba-full-memory-ratio"]
INTS = ["--nodes", "--gpus-per-node", "--tp-size", "--dp-size", "--attn-dp-size", "--context-length",
        "--max-running-requests", "--max-mamba-cache-size", "--speculative-num-draft-tokens"]
PRESET = json.loads((model_geometry.MODELS_DIR / "glm-5.3-flash.json").read_text())


def argv(**changes) -> list[str]:
    """BASE with flags set (`--flag=value`, so that '-inf' is a value) or removed (None)."""
    flags = {**BASE, **{k: v for k, v in changes.items()}}
    return [f"{k}={v}" for k, v in flags.items() if v is not None]


def run(args: list[str]) -> tuple[int, str, str]:
    """`dsaops plan ARGS` in this process: an exception other than argparse's exit fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["plan", *args])
        except SystemExit as e:   # argparse: a value of the wrong type or not among the choices
            code = e.code
    return code, out.getvalue(), err.getvalue()


def config(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return str(path)


def preset(**changes) -> dict:
    """The GLM-5.3-Flash preset as a user's config.json, with keys changed (None: removed)."""
    raw = {k: v for k, v in PRESET.items() if k != "_dsaops"}
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not None}


# --- numbers: refused by the plan's own checks (one line) or by argparse (not a number at all) ---------------
NUMBER_CASES = []
for flag in FLOATS:
    for value in ("nan", "inf", "-inf", "1e308", "0", "-1"):
        NUMBER_CASES.append((flag, value, flag))
    NUMBER_CASES.append((flag, "abc", f"argument {flag}"))
CHOICE_CASES = [("--target", "sm_100", "valid targets"), ("--model", "nope", "presets: glm-5.3-flash"),
                ("--model", "../../etc/passwd", "presets: glm-5.3-flash"),
                ("--kv-cache-dtype", "fp16", "argument --kv-cache-dtype"),
                ("--mamba-ssm-dtype", "int8", "argument --mamba-ssm-dtype"),
                ("--mamba-radix-cache-strategy", "lru", "argument --mamba-radix-cache-strategy")]


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("flag, value, names", NUMBER_CASES + CHOICE_CASES)
def test_a_bad_flag_is_one_line(flag, value, names):
    changes = {flag: value}
    if flag == "--weights-gib":
        changes["--free-memory-gib"] = None   # it wins over --weights-gib
    code, out, err = run(argv(**changes))
    assert code == 2 and not out and "Traceback" not in err
    if names.startswith("argument "):   # argparse's own line (the usage or a --help hint around it)
        assert sum(names in line and ("invalid" in line) for line in err.splitlines()) == 1, err
    else:
        line = one_line(err)
        assert line.startswith("dsaops plan: ") and names in line, line
        assert any(word in line for word in ("must", "pass", "valid", "presets")), line


# int() took an Arabic-Indic digit, '1_000' and ' 7 ': each made a plan (3 requests, 1000 slots, 7 requests);
# 0 is refused, not read as 1
COUNT_CASES = [(flag, value) for flag in INTS for value in ("0", "-1", str(2**31), "abc", "1.5")] + [
    ("--nodes", "\u0661"), ("--gpus-per-node", "\u0668"), ("--max-running-requests", "\u0663"),
    ("--tp-size", "\u0668"), ("--context-length", "32_768"), ("--max-mamba-cache-size", "1_000"),
    ("--dp-size", " 1"), ("--max-running-requests", " 7 "), ("--speculative-num-draft-tokens", "2 "),
    ("--attn-dp-size", "1" + "0" * 12), ("--speculative-num-draft-tokens", "1")]   # MTP drafts N - 1 steps


@pytest.mark.parametrize("flag, value", COUNT_CASES)
def test_a_count_takes_ascii_digits_only(flag, value):
    code, out, err = run(argv(**{"--max-running-requests": "64", flag: value}))
    least = 2 if flag == "--speculative-num-draft-tokens" else 1
    says = f"dsaops plan: argument {flag}: must be a whole number from {least} to 2147483647, got {value!r}"
    if flag == "--context-length" and not value.isdigit():   # it takes SGLang's sizes too (test_plan.py)
        says += " (or one with SGLang's suffix: 128k, 128Ki)"
    assert code == 2 and not out and err.splitlines() == [says, "see `dsaops plan --help`"], (out, err)


# --- model configs: every broken shape, each key out of range or mistyped, geometry SGLang refuses ----------
CONFIG_CASES = {
    # name: (content, what the one line must say)
    "a JSON list": ([PRESET], "holds a JSON list, not an object"),
    "JSON null": (None, "holds a JSON NoneType"),
    "a JSON string": ("config", "holds a JSON str"),
    "a number": (7, "holds a JSON int"),
    "empty": (b"", "is not JSON"),
    "not JSON": (b"num_hidden_layers: 45\n", "is not JSON"),
    "not UTF-8": (b'{"model_type": "\xff"}', "is not UTF-8 text"),
    "nested 100k deep": (b"[" * 100_000 + b"]" * 100_000, "is not JSON"),
    "a 5000-digit number": (b'{"num_hidden_layers": ' + b"9" * 5000 + b"}", "is not JSON"),
    "over 1 MiB": (b"{" + b" " * (1 << 20) + b"}", "larger than 1 MiB"),
    "no index_topk (not DSA)": (preset(index_topk=None), "has no 'index_topk'"),
    "index_topk a word": (preset(index_topk="2048"), "'index_topk' must be a whole number"),
    "layers 0": (preset(num_hidden_layers=0), "'num_hidden_layers' must be positive, not 0"),
    "layers -1": (preset(num_hidden_layers=-1), "'num_hidden_layers' must be positive, not -1"),
    "layers a word": (preset(num_hidden_layers="45"), "'num_hidden_layers' must be a whole number"),
    "layers 1.5": (preset(num_hidden_layers=1.5), "'num_hidden_layers' must be a whole number"),
    "layers true": (preset(num_hidden_layers=True), "'num_hidden_layers' must be a whole number"),
    "layers NaN": (b'{"index_topk": 2048, "num_hidden_layers": NaN}', "'num_hidden_layers' must be a whole number"),
    "layers 1e308": (preset(num_hidden_layers=1e308), "'num_hidden_layers' must be a whole number"),
    "layers 10**12": (preset(num_hidden_layers=10**12), "'num_hidden_layers' must be at most 65536"),
    "kv_lora_rank 0": (preset(kv_lora_rank=0), "'kv_lora_rank' must be positive"),
    "kv_lora_rank -512": (preset(kv_lora_rank=-512), "'kv_lora_rank' must be positive"),
    "qk_rope_head_dim -1": (preset(qk_rope_head_dim=-1), "'qk_rope_head_dim' must be at least 0"),
    "index_head_dim 0": (preset(index_head_dim=0), "'index_head_dim' must be positive"),
    "index_head_dim 64": (preset(index_head_dim=64), "'index_head_dim' is 64: SGLang's DSA KV pool takes 128 only"),
    "index_kpool 0": (preset(index_kpool=0), "'index_kpool' must be positive"),
    "max_position_embeddings 0": (preset(max_position_embeddings=0), "'max_position_embeddings' must be positive"),
    "nextn layers -1": (preset(num_nextn_predict_layers=-1), "'num_nextn_predict_layers' must be at least 0"),
    "linear heads 0": (preset(linear_num_heads=0), "'linear_num_heads' must be positive"),
    "linear head dim 0": (preset(linear_head_dim=0), "'linear_head_dim' must be positive"),
    "conv kernel 0": (preset(linear_conv_kernel_dim=0), "'linear_conv_kernel_dim' must be positive"),
    "linear heads 7 over tp 8": (preset(linear_num_heads=7), "7 linear-attention heads do not split"),
    "every layer linear": (preset(linear_attn_config={"kda_layers": list(range(45))}),
                           "makes all 45 layers linear attention"),
    "kda layer 45 of 45": (preset(linear_attn_config={"kda_layers": [0, 45]}), "entry must be at most 44"),
    "kda layer twice": (preset(linear_attn_config={"kda_layers": [0, 0]}), "names a layer twice"),
    "kda layers a word": (preset(linear_attn_config={"kda_layers": "0,1"}), "must be a list of layer numbers"),
    "linear_attn_config a list": (preset(linear_attn_config=[0, 1]), "'linear_attn_config' must be an object"),
    "linear_attn_config heads 0": (preset(linear_attn_config={"num_heads": 0}),
                                   "'linear_attn_config.num_heads' must be positive"),
    "layer_types too short": (preset(layer_types=["linear_attention"] * 3), "has 3 entries for 45 layers"),
    "layer_types a number": (preset(layer_types=5), "'layer_types' must be a list of names"),
    "architectures a name": (preset(architectures="Glm5NextForConditionalGeneration"),
                             "'architectures' must be a list of names"),
    "architectures of numbers": (preset(architectures=[1]), "'architectures' must be a list of names"),
    "text_config a list": ({"architectures": ["X"], "text_config": []}, "'text_config' must be an object"),
    "_dsaops a list": ({**preset(), "_dsaops": []}, "'_dsaops' must be an object"),
    "checkpoint NaN": ({**preset(), "_dsaops": {"checkpoint_gib": float("nan")}}, "checkpoint_gib' must be a finite"),
    "index_topk_freq 0": (preset(index_topk_freq=0), "'index_topk_freq' must be positive"),
    "cli_factor -1": (preset(cli_factor=-1), "'cli_factor' must be positive"),
    "index_skip_topk_offset 0": (preset(index_skip_topk_offset=0), "'index_skip_topk_offset' must be positive"),
    "index_topk_pattern a list": (preset(index_topk_pattern=["F"]), "'index_topk_pattern' must be a string"),
    "scaled fp8 over kv_lora_rank 500": (preset(kv_lora_rank=500), "needs kv_lora_rank a multiple of 128"),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_a_broken_model_config_is_one_line(tmp_path, case):
    content, says = CONFIG_CASES[case]
    changes = {"--model-config": config(tmp_path, "config.json", content)}
    if case.startswith("scaled fp8"):   # SGLang's defaults on SM90 with fp8 KV: the scaled layout
        changes.update({"--dsa-prefill-backend": None, "--dsa-decode-backend": None})
    code, out, err = run(argv(**changes))
    line = one_line(err)
    assert code == 2 and not out and says in line, line


@pytest.mark.parametrize("path, says", [
    (".", "is a directory: pass the model's config.json"),
    ("/dev/zero", "larger than 1 MiB"),
    ("missing.json", "cannot read model config missing.json: No such file or directory"),
])
def test_a_model_config_that_is_no_file(tmp_path, monkeypatch, path, says):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(argv(**{"--model-config": path}))
    assert code == 2 and says in one_line(err)


def test_the_table_covers_the_reported_classes():
    """At least the 53 bad inputs the classes were reported with, every number flag with each non-finite value."""
    assert len(NUMBER_CASES) + len(CHOICE_CASES) + len(CONFIG_CASES) + 3 >= 53
    for flag in FLOATS:
        assert {v for f, v, _ in NUMBER_CASES if f == flag} >= {"nan", "inf", "-inf", "1e308", "0", "-1", "abc"}


def test_no_traceback_reaches_the_console(tmp_path):
    """The console script itself, on inputs that used to raise: one line on stderr, exit 2."""
    for args in (argv(**{"--gpu-memory-gib": "nan"}), argv(**{"--model-config": "/dev/zero"}),
                 argv(**{"--model-config": config(tmp_path, "list.json", [])})):
        done = subprocess.run([sys.executable, "-m", "dsaops", "plan", *args], capture_output=True, text=True,
                              check=False)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("field, value, says", [
    ("attn_dp_size", 0, "--attn-dp-size must be positive"),
    ("tp_size", "8", "--tp-size must be a whole number, not '8'"),
    ("nodes", True, "--nodes must be a whole number"),
    ("mem_fraction_static", "0.8", "--mem-fraction-static must be between 0 and 1"),
    ("gpu_memory_gib", None, "--gpu-memory-gib is required"),
    ("weights_gib", float("inf"), "--weights-gib must be a finite number"),
    ("mamba_radix_cache_strategy", "lru", "--mamba-radix-cache-strategy must be one of auto"),
    ("skip_decode_lock", "yes", "--skip-decode-lock is a switch"),
    ("target", 90, "--target must be a name"),
])
def test_python_callers_get_the_same_refusals(field, value, says):
    """The playbook's filter builds PlanRequest from inventory values: the same checks, as UserError."""
    fields = {"target": "sm_90", "nodes": 1, "gpus_per_node": 8, "tp_size": 8, "kv_cache_dtype": "fp8_e4m3",
              "mem_fraction_static": 0.8, "gpu_memory_gib": 140.0, "free_memory_gib": 89.5,
              "dsa_prefill_backend": "tilelang", "dsa_decode_backend": "tilelang"}
    assert make_plan(PlanRequest(**fields)).kv_layout == "raw_fp8"
    with pytest.raises(UserError, match=says):
        make_plan(PlanRequest(**{**fields, field: value}))


# --- fuzz: any arguments end in a plan (exit 0) or one line (exit 2) ---------------------------------------
WILD_NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                         st.sampled_from(["0", "-1", "1e308", "-inf", "nan", "1e-300"]), st.integers(-3, 2**40).map(str))
WILD_SIZES = st.integers(-2, 2**33).map(str)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=8)
CONFIG_KEYS = ["num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim", "index_head_dim", "index_topk", "index_kpool",
               "max_position_embeddings", "num_nextn_predict_layers", "linear_num_heads", "linear_head_dim",
               "linear_conv_kernel_dim", "linear_attn_config", "layer_types", "indexer_types", "cli_factor",
               "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset", "architectures", "text_config",
               "_dsaops"]


@st.composite
def plan_arguments(draw, folder):
    """A launch that mostly adds up (so that the arithmetic is reached), each value wild one time in eight."""
    def value(sane, wild):
        return draw(wild if draw(st.integers(0, 7)) == 7 else sane)

    nodes, gpus = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4, 8]))
    target = draw(st.sampled_from(["sm_90", "sm_121", "gfx942"]))
    memory = draw(st.sampled_from([80, 119, 140, 192]))
    backends = ["tilelang", "flashmla_sparse", "flashmla_kv", "trtllm"] + (["triton"] if target == "gfx942" else [])
    args = {"--target": target, "--kv-cache-dtype": draw(st.sampled_from(["bf16", "bfloat16", "fp8_e4m3"])),
            "--nodes": value(st.just(str(nodes)), WILD_SIZES),
            "--gpus-per-node": value(st.just(str(gpus)), WILD_SIZES),
            "--tp-size": value(st.just(str(nodes * gpus)), WILD_SIZES),
            "--mem-fraction-static": value(st.floats(0.7, 0.95).map(repr), WILD_NUMBERS),
            "--gpu-memory-gib": value(st.just(str(memory)), WILD_NUMBERS)}
    optional = {"--attn-dp-size": st.sampled_from([d for d in (1, 2, 4, 8) if nodes * gpus % d == 0]).map(str),
                "--context-length": st.integers(1, 2**20).map(str),
                "--max-running-requests": st.integers(1, 4096).map(str),
                "--max-mamba-cache-size": st.integers(1, 2000).map(str),
                "--free-memory-gib": st.floats(0.4, 0.8).map(lambda f: repr(f * memory)),
                "--weights-gib": st.floats(1, 800).map(repr),
                "--mamba-full-memory-ratio": st.floats(0.01, 10).map(repr),
                "--dsa-prefill-backend": st.sampled_from(backends + ["flashmla_sparse_q8"]),
                "--dsa-decode-backend": st.sampled_from(backends + ["fa3"])}
    for flag, sane in optional.items():
        if draw(st.booleans()):
            wild = WILD_NUMBERS if "gib" in flag or "ratio" in flag else WILD_SIZES
            args[flag] = value(sane, sane if "backend" in flag else wild)
    if "--max-running-requests" in args and draw(st.booleans()):   # MTP sizes its scratch from it
        args["--speculative-num-draft-tokens"] = value(st.integers(1, 8).map(str), WILD_SIZES)
    args["--mamba-ssm-dtype"] = draw(st.sampled_from(plan_input.MAMBA_SSM_DTYPES))
    args["--mamba-radix-cache-strategy"] = draw(st.sampled_from(plan_input.MAMBA_RADIX_CACHE_STRATEGIES))
    if draw(st.integers(0, 3)) == 0:   # the preset's keys as a config.json, up to three of them set to any JSON
        raw = preset(**draw(st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON, max_size=3)))
        path = folder / "config.json"
        path.write_text(json.dumps(raw))
        args["--model-config"] = str(path)
    switches = draw(st.lists(st.sampled_from(["--enable-dp-attention", "--disable-radix-cache",
                                              "--disable-overlap-schedule", "--skip-decode-lock", "--json"]),
                             unique=True))
    return [f"{k}={v}" for k, v in args.items()] + switches


def test_any_arguments_end_in_a_plan_or_one_line(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    outcomes = []

    @settings(max_examples=400, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(plan_arguments(folder))
    def check(args):
        code, out, err = run(args)
        assert code in (0, 2), (args, code, err)
        if code == 0:
            assert out and not err, args
        else:   # the plan's one line, or argparse's and the usage hint
            lines = err.splitlines()
            assert not out and lines[0].startswith("dsaops plan: ") and lines[1:] in ([], ["see `dsaops plan --help`"]), (
                args, err)
        outcomes.append(code)

    check()
    # both sides of the space are reached: plans made and inputs refused
    assert outcomes.count(0) >= 40 and outcomes.count(2) >= 40, (outcomes.count(0), outcomes.count(2))


def test_a_fifo_without_a_writer_is_read_as_empty_not_waited_on(tmp_path):
    """A verdict, plan or model config path that is a FIFO nobody writes: one error, no wait."""
    import os
    import threading

    fifo = tmp_path / "verdict.json"
    os.mkfifo(fifo)
    raised = []
    reader = threading.Thread(target=lambda: raised.append(pytest.raises(UserError, plan_input.read_json, fifo,
                                                                         "selftest verdict", fix="run it again")),
                              daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "read_json waited on the FIFO for a writer"
    assert "is not JSON" in str(raised[0].value)
