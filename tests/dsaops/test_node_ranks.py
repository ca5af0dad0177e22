"""dsaops.node_ranks: the scheduler ranks one node runs, as SGLang 0.5.23 starts them (its own
_calculate_rank_ranges runs here, lifted from the wheel), from the launch arguments the image gets."""
import subprocess
import sys
import types

import pytest

from dsaops.node_ranks import OPTIONS, BadArguments, main, ranks_per_node
from tests.support import sglang_definitions


@pytest.mark.parametrize(("argv", "ranks"), [
    ([], 1),
    (["--model-path", "/m", "--tp", "8"], 8),                                  # an abbreviation, as SGLang reads it
    (["--tp-size", "2", "--nnodes", "2", "--node-rank", "1"], 1),              # two Sparks
    (["--tp-size=16", "--nnodes=2"], 8),
    (["--tp", "8", "--attn-dp-size", "8"], 8),                                  # attention DP adds no process
    (["--tp", "8", "--dp-size", "8", "--enable-dp-attention"], 8),              # its deprecated spelling
    (["--tp", "4", "--dp-size", "2"], 8),                                       # two replicas of TP 4
    (["--tp", "4", "--pp-size", "2", "--nnodes", "2"], 4),                      # a stage a node
    (["--tp", "8", "--pp-size", "2"], 16),
    (["--tensor-parallel-size", "2", "--data-parallel-size", "2", "--trust-remote-code"], 4),
])
def test_ranks_per_node(argv, ranks):
    assert ranks_per_node(argv) == ranks


@pytest.mark.parametrize(("argv", "message"), [
    (["--tp", "x"], "invalid int value"),
    (["--tp", "0"], "--tp-size must be >= 1"),
    (["--tp", "3", "--nnodes", "2"], "--tp-size 3 does not split over 2 nodes"),
])
def test_arguments_sglang_would_refuse_are_refused(argv, message):
    with pytest.raises(BadArguments, match=message):
        ranks_per_node(argv)


@pytest.mark.parametrize(("tp", "pp", "nnodes"), [(1, 1, 1), (8, 1, 1), (2, 1, 2), (16, 1, 2), (4, 2, 2), (8, 2, 1),
                                                 (4, 4, 2), (8, 1, 4), (2, 2, 4)])
def test_the_count_is_sglangs(tp, pp, nnodes):
    engine = sglang_definitions.source_file("srt/entrypoints/engine.py")
    parallel = types.SimpleNamespace(tp_size=tp, pp_size=pp, nnodes=nnodes)
    ns = sglang_definitions.lift(engine, ["_calculate_rank_ranges"], {"get_parallel": lambda: parallel,
                                                                       "Tuple": tuple})
    for node_rank in range(nnodes):
        pp_ranks, tp_ranks, _, _ = ns["_calculate_rank_ranges"](node_rank)
        assert ranks_per_node(["--tp", str(tp), "--pp-size", str(pp), "--nnodes", str(nnodes)]) == \
            len(pp_ranks) * len(tp_ranks)


def test_the_option_spellings_are_sglangs():
    fields = sglang_definitions.source_file("srt/arg_groups/fields/parallel.py").read_text()
    for dest, flags in OPTIONS.items():
        assert f"    {dest}: A[" in fields
        for alias in flags[1:]:
            assert f'aliases=["{alias}"]' in fields, alias
    assert '"--enable-dp-attention",' in sglang_definitions.source_file("srt/server_args.py").read_text()


def test_the_module_runs_as_the_entrypoint_calls_it():
    run = subprocess.run([sys.executable, "-m", "dsaops.node_ranks", "--", "--tp", "2", "--nnodes", "2"],
                         capture_output=True, text=True, check=False)
    assert (run.returncode, run.stdout) == (0, "1\n")
    run = subprocess.run([sys.executable, "-m", "dsaops.node_ranks", "--", "--tp", "0"], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 2 and run.stderr == "dsaops.node_ranks: --tp-size must be >= 1, got 0\n"


@pytest.mark.parametrize(("text", "ranks"), [("tp-size: 8\ndp-size: 8\nenable-dp-attention: false\n", 64),
                                            ("tp-size: 8\ndp-size: 8\nenable-dp-attention: true\n", 8)])
def test_the_config_file_counts(tmp_path, capsys, text, ranks):
    """The entrypoint's call: SGLang reads the --config YAML's keys as options."""
    path = tmp_path / "sglang.yaml"
    path.write_text(text)
    assert main(["--", "--model-path", "/m", "--config", str(path)]) == 0
    assert capsys.readouterr().out == f"{ranks}\n"
