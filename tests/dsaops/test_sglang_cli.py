"""dsaops.sglang_cli stops where the pinned SGLang's own launch_server parser stops, and nowhere else."""
import argparse
import contextlib
import io

import pytest

from dsaops import sglang_cli
from dsaops.errors import UserError
from dsaops.launch_args import ClusterSpec, NodeSpec, launch_args
from tests.support.sglang_cli import flag_table, sglang_parser, sglang_reads, table_text, type_name

MODEL = ["--model-path", "/models/glm"]   # required by SGLang's parser; dsaops always writes it


class Stopped(Exception):
    pass


def sglang_stops(argv: list[str]) -> bool:
    """Whether SGLang's parser (prepare_server_args') stops on argv after the model path, help included."""
    parser = sglang_parser()

    def error(message):
        raise Stopped(message)

    parser.error = error
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(MODEL + argv)
    except (Stopped, SystemExit):
        return True
    finally:
        del parser.error
    return False


def refused(argv: list[str]) -> bool:
    try:
        sglang_cli.parse(argv)
    except UserError as e:
        assert "\n" not in str(e) and str(e).startswith("sglang_server_extra_args: ")
        return True
    return False


def test_the_table_is_the_pinned_sglangs_parser():
    assert sglang_cli.TABLE.read_text() == table_text(flag_table()), (
        "dsaops/sglang_flags.json differs from the pinned SGLang's parser: "
        "python -m tests.support.sglang_cli > dsaops/sglang_flags.json")


def test_every_flag_alone_and_with_a_value_is_judged_as_sglang_judges_it():
    """Every option string (switches, one-value flags, lists, optional values, BooleanOptionalAction's --no-
    spellings, aliases) alone, with a number, with a word and with `=1`: never refused where SGLang's parser
    takes it, and refused wherever it stops, but for a value whose type or choices SGLang computes with its
    other functions (json, plugins' parsers), which is left to SGLang."""
    parser = sglang_parser()
    recorded = {name: entry for entry in flag_table()["actions"] for name in entry["names"]}
    unchecked = {name for action in parser._actions for name in action.option_strings
                 if (action.type is not None and not type_name(action))
                 or (action.choices is not None and "choices" not in recorded.get(name, {"choices": 0}))}
    cases = [argv for name in recorded for argv in ([name], [name, "1"], [name, "x"], [name + "=1"])]
    assert len(cases) > 2000 and len(unchecked) < 40
    judged = [(argv, refused(argv), sglang_stops(argv)) for argv in cases]
    assert [argv for argv, no, stops in judged if no and not stops] == []
    assert [argv for argv, no, stops in judged if stops and not no and argv[0].split("=")[0] not in unchecked] == []
    # every kind of refusal occurs: a switch given a word, a value missing, a type, a choice
    assert refused(["--disable-radix-cache", "1"]) and refused(["--context-length"])
    assert refused(["--tp-size", "x"]) and refused(["--tokenizer-mode", "x"])
    assert not refused(["--tp-size", "1"]) and not refused(["--tokenizer-mode", "slow"])


@pytest.mark.parametrize("argv", [
    ["--mem-fraction-statc", "0.9"], ["--context", "8192"], ["--context-length"], ["--disable-radix-cache=1"],
    ["--disable-radix-cache", "1"], ["--", "--context-length", "8192"], ["--tp-size", "2", "--"], ["-x"],
    ["-a b"], ["-h"], ["--hel"], ["--help"], ["--chat-template", "--trust-remote-code"], ["8192"],
    ["--enable-metrics", "--enable-metrics=yes"], ["--no-enable-tf32-matmul=0"], ["--attention-backend", "flashmla_sprase"],
    ["--tp-size", "two"], ["--mem-fraction-static=0,9"],
    ["--context-length", "abc", "--context-length", "8192"], ["--max-total-tokens", "1.5Ki"], ["--context-len", "32K"],
])
def test_what_stops_sglang_is_refused(argv):
    assert sglang_stops(argv) and refused(argv)


@pytest.mark.parametrize("argv", [
    [], ["--max-running-requests", "-5"], ["--chat-template", "-a b"], ["--context-l=8192"], ["--numa-node", "0", "1"],
    ["--lora-paths"], ["--no-enable-tf32-matmul"], ["--tensor-parallel-size", "2", "--tp", "4"],
    ["--trust-remote-code", "--chat-template=x.jinja", "--enable-metrics"],
    ["--context-length", "32k", "--max-prefill-tokens=16Ki"], ["--context-bucket", " 25.6k "],
])
def test_what_sglang_takes_is_not_refused(argv):
    assert not sglang_stops(argv) and not refused(argv)


def test_what_is_given_is_named_as_sglangs_parser_names_it():
    """Every flag alone, with a number, with a word and with `=1`, where SGLang's parser takes it: the flags given, by
    their first option strings, are those SGLang's parser sets (but the two actions of one field, a deprecated
    spelling's)."""
    parser = sglang_parser()
    shared = {name for action in parser._actions for name in action.option_strings
              if sum(other.dest == action.dest for other in parser._actions) > 1}
    cases = [argv for entry in flag_table()["actions"] for name in entry["names"] if name not in shared
             for argv in ([name], [name, "1"], [name, "x"], [name + "=1"])]
    taken = [argv for argv in cases if not sglang_stops(argv)]
    assert len(taken) > 800 and shared == {"--enable-amd-monokernel", "--monokernel-backend"}
    assert [argv for argv in taken if set(sglang_cli.parse(argv)) != set(sglang_reads(argv))] == []


def test_sizes_read_as_sglangs_human_readable_int_reads_them():
    """The flags SGLang types as sizes read as its own function reads them, or are refused where it refuses; what
    the planner gets is the number."""
    sizes = [a for a in sglang_parser()._actions if type_name(a) == "human_readable_int"]
    sglang = sizes[0].type
    assert {a.option_strings[0] for a in sizes} >= {"--context-length", "--max-total-tokens"}
    assert sglang is not sglang_cli.human_readable_int and sglang.__module__.startswith("sglang.")
    for text in ["8192", " 8192 ", "-5", "0", "1_000", "\u0663", "32k", "25.6k", "1.5M", "2G", "1T", "1Ki", "16Mi",
                 "1Gi", "2Ti", "1.5Ki", "1K", "32KB", "k", "1.k", "1e3", "8.0", "abc", "", "0.5k", "1.23456k"]:
        try:
            theirs = sglang(text)
        except argparse.ArgumentTypeError:
            with pytest.raises(argparse.ArgumentTypeError):
                sglang_cli.human_readable_int(text)
            continue
        assert sglang_cli.human_readable_int(text) == theirs, text
    assert sglang_cli.parse(["--context-length", "128k"]) == {"--context-length": ("--context-length", "128000")}


@pytest.mark.parametrize("argv, given", [
    (["--tp-size", "2", "--tensor-parallel-size", "4"], {"--tp-size": ("--tensor-parallel-size", "4")}),
    (["--te=2", "--trust-remote-code", "--tp", "4"], {"--tp-size": ("--tp-size", "4"),
                                                     "--trust-remote-code": ("--trust-remote-code", True)}),
    (["--max-running-requests= 7", "--context-l", "-5"], {"--max-running-requests": ("--max-running-requests", "7"),
                                                          "--context-length": ("--context-length", "-5")}),
    (["--numa-node", "0", "1", "--no-enable-tf32-matmul"], {"--numa-node": ("--numa-node", ["0", "1"]),
                                                            "--enable-tf32-matmul": ("--no-enable-tf32-matmul", True)}),
    ([], {}),
])
def test_each_flag_is_given_by_its_first_name_with_its_last_spelling_and_words(argv, given):
    """The last given wins whichever alias or prefix spelled it, as in SGLang's parser; its words as written, a whole
    number as SGLang reads it."""
    assert sglang_cli.parse(argv) == given
    assert sglang_reads(argv).keys() == given.keys()


def test_a_flag_sglang_has_not_got_is_named_with_the_nearest_it_has():
    with pytest.raises(UserError, match=r"^sglang_server_extra_args: SGLang 0\.5\.23 has no flag --mem-fraction-statc "
                                        r"\(did you mean --mem-fraction-static\?\); fix it or drop it$"):
        sglang_cli.parse(["--mem-fraction-statc=0.9"])
    with pytest.raises(UserError, match=r"makes SGLang print its help and exit instead of serving"):
        sglang_cli.parse(["--trust-remote-code", "-h"])


def test_every_flag_dsaops_writes_is_one_sglang_takes():
    spec = ClusterSpec(tp_size=8, kv_cache_dtype="fp8_e4m3", dsa_prefill_backend="tilelang", dsa_decode_backend="tilelang",
                       nnodes=2, attn_dp_size=8, ep_size=8, mem_fraction_static=0.8, max_running_requests=64,
                       chunked_prefill_size=4096, served_model_name="glm", enable_metrics=True,
                       speculative_num_draft_tokens=4, speculative_adaptive=True, context_length=8192)
    node = NodeSpec(model_path="/m", host="0.0.0.0", port=30000, node_rank=1, dist_init_addr="10.0.0.1:25000",
                    config_file="/c.yaml")
    written = launch_args(spec, node)
    assert "--speculative-adaptive" in written and not refused(written) and not sglang_stops(written)
