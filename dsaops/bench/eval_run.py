"""`bench eval`: ask each problem, run the answer's code in the sandbox, score pass@1, and
compare with a recorded reference run problem by problem.

A problem ends in one status: passed, failed (its tests failed or it defined nothing),
timeout or memory (the sandbox stopped it), no_answer (the model still thought at
--max-tokens), unanswered (the server failed: HTTP error, refused, or no reply in --timeout).
pass@1 counts every status but passed as a miss; unanswered problems make the run exit 1.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dsaops.bench import humaneval, paired, sandbox
from dsaops.cli_args import write
from dsaops.errors import UserError
from dsaops.plan_input import read_json

RECORD_FORMAT = 1


@dataclass(frozen=True)
class Result:
    task_id: str
    status: str
    detail: str
    seconds: float


def run(problems: list[dict], *, server_url: str, model: str, api_key: str | None, concurrency: int,
        max_tokens: int, timeout: float, exec_timeout: float, exec_memory_mb: int, progress) -> list[Result]:
    progress(f"{len(problems)} problems, {concurrency} at a time; generated code runs sandboxed "
             f"({sandbox.isolation()}, {exec_timeout:g} s, {exec_memory_mb} MiB)")
    done = []

    def one(problem: dict) -> Result:
        result = _solve(problem, server_url=server_url, model=model, api_key=api_key, max_tokens=max_tokens,
                        timeout=timeout, exec_timeout=exec_timeout, exec_memory_mb=exec_memory_mb)
        done.append(result)
        progress(f"[{len(done)}/{len(problems)}] {result.task_id}: {result.status.upper()} "
                 f"({result.seconds:.1f} s){': ' + result.detail if result.status != 'passed' else ''}")
        return result

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, problems))


def _solve(problem: dict, *, server_url, model, api_key, max_tokens, timeout, exec_timeout, exec_memory_mb) -> Result:
    from dsaops import verify_probes as vp

    started = time.monotonic()
    try:
        answer = vp.chat(server_url, model, humaneval.ask(problem), max_tokens=max_tokens, timeout=timeout,
                         api_key=api_key)
    except vp.ProbeError as e:
        status = "no_answer" if e.status == "fail" else "unanswered"
        return Result(problem["task_id"], status, e.detail, round(time.monotonic() - started, 2))
    code = humaneval.code_of(answer, problem["entry_point"])
    outcome = sandbox.run_python(humaneval.program(problem, code), timeout=exec_timeout, memory_mb=exec_memory_mb)
    return Result(problem["task_id"], outcome.status, outcome.detail, round(time.monotonic() - started, 2))


def as_record(results: list[Result], *, task: str, server_url: str, model: str, max_tokens: int) -> dict:
    passed = sum(r.status == "passed" for r in results)
    return {"format": RECORD_FORMAT, "task": task, "prompt": humaneval.PROMPT_VERSION, "server_url": server_url,
            "model": model, "max_tokens": max_tokens, "temperature": 0, "n": len(results), "passed": passed,
            "pass_at_1": round(passed / len(results), 4) if results else 0.0,
            "problems": {r.task_id: {"status": r.status, "detail": r.detail[:200]} for r in results}}


def write_record(path: str, record: dict) -> None:
    write("--record", path, (json.dumps(record, indent=1) + "\n").encode())


def read_record(path: str, task: str) -> dict:
    fix = "record one with --record FILE"
    record = read_json(path, "the reference", fix=fix)
    try:
        statuses = {k: v["status"] for k, v in record["problems"].items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise UserError(f"the reference {path} has no problem statuses ({type(e).__name__}: {e}); {fix}") from None
    if record.get("task") != task:
        raise UserError(f"the reference {path} is a {record.get('task')!r} run, not {task!r}")
    return record | {"statuses": statuses}


def report(record: dict, reference: dict | None) -> dict:
    counts: dict[str, int] = {}
    for p in record["problems"].values():
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    out = {"run": {k: v for k, v in record.items() if k != "problems"}, "statuses": counts,
           "unanswered": counts.get("unanswered", 0), "failures": {k: v for k, v in record["problems"].items()
                                                                   if v["status"] != "passed"},
           "comparison": compare(record, reference) if reference else None}
    return out


def compare(record: dict, reference: dict) -> dict:
    """Current minus reference on the problems both answered, paired."""
    common = [t for t in record["problems"] if t in reference["statuses"]]
    notes = []
    if len(common) < max(len(record["problems"]), len(reference["statuses"])):
        notes.append(f"compared on the {len(common)} problems both runs hold (this run {len(record['problems'])}, "
                     f"the reference {len(reference['statuses'])})")
    for key in ("prompt", "max_tokens"):
        if reference.get(key) != record.get(key):
            notes.append(f"the reference ran with {key} {reference.get(key)!r}, this run with {record.get(key)!r}")
    if not common:
        return {"n": 0, "notes": notes + ["no problem in common: nothing to compare"]}
    ref = [reference["statuses"][t] == "passed" for t in common]
    cur = [record["problems"][t]["status"] == "passed" for t in common]
    lost = [t for t, r, c in zip(common, ref, cur) if r and not c]
    gained = [t for t, r, c in zip(common, ref, cur) if c and not r]
    low, high = paired.difference_ci(ref, cur)
    diff = (sum(cur) - sum(ref)) / len(common)
    beyond = low > 0 or high < 0
    return {"n": len(common), "reference_model": reference.get("model"), "reference_url": reference.get("server_url"),
            "reference_pass_at_1": round(sum(ref) / len(common), 4), "pass_at_1": round(sum(cur) / len(common), 4),
            "difference_points": round(100 * diff, 2), "ci95_points": [round(100 * low, 2), round(100 * high, 2)],
            "mcnemar_p": round(paired.mcnemar_p(len(lost), len(gained)), 4), "lost": lost, "gained": gained,
            "verdict": "beyond noise" if beyond else "within noise", "notes": notes}


def table(rep: dict) -> str:
    run = rep["run"]
    lines = [(f"{run['task']}: pass@1 {100 * run['pass_at_1']:.1f}% ({run['passed']}/{run['n']}) "
              f"from {run['model']} at {run['server_url']}"),
             "statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(rep["statuses"].items()))]
    for task_id, p in list(rep["failures"].items())[:20]:
        lines.append(f"  {task_id}: {p['status']}: {p['detail'][:100]}")
    if len(rep["failures"]) > 20:
        lines.append(f"  ... {len(rep['failures']) - 20} more (--json lists all)")
    c = rep["comparison"]
    if c and c["n"]:
        lines.append(f"against the reference ({c['reference_model']} at {c['reference_url']}), on {c['n']} problems: "
                     f"{100 * c['reference_pass_at_1']:.1f}% -> {100 * c['pass_at_1']:.1f}%, "
                     f"{c['difference_points']:+.1f} points (95% CI {c['ci95_points'][0]:+.1f} to "
                     f"{c['ci95_points'][1]:+.1f}, paired bootstrap); lost {len(c['lost'])}, gained {len(c['gained'])}, "
                     f"McNemar p={c['mcnemar_p']:.3g}: {c['verdict'].upper()}")
    if c:
        lines += [f"note: {n}" for n in c["notes"]]
    if rep["unanswered"]:
        lines.append(f"FAILED: {rep['unanswered']} problem(s) unanswered by the server (counted as misses)")
    return "\n".join(lines)
