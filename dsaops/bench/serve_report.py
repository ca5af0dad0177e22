"""`bench serve`'s report: the per-level table with the knee and the caps marked, the caps'
sources, and every disagreement between the sweep, the server and the plan."""
from __future__ import annotations

from dataclasses import asdict

from dsaops.bench import knee as kneemod

COLUMNS = ("concurrency", "requests", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
           "output tok/s", "req/s", "")


def build(sweep, caps: dict, settings: dict) -> dict:
    """Everything the table, the JSON and the plot show, computed once."""
    levels = [lv.concurrency for lv in sweep.levels]
    throughput = [lv.output_tok_s for lv in sweep.levels]
    knee = kneemod.find(levels, throughput) if len(levels) > 1 else None   # growth needs two levels
    return {
        "settings": settings,
        "levels": [asdict(lv) for lv in sweep.levels],
        "knee": asdict(knee) if knee else None,
        "caps": {name: (asdict(cap) if cap else None) for name, cap in caps.items()},
        "disagreements": kneemod.findings(levels, knee, caps) if knee else [],
        "failure": sweep.failure,
    }


def _marks(concurrency: int, report: dict) -> str:
    marks = []
    knee = report["knee"]
    if knee and knee["level"] == concurrency:
        marks.append("<- knee")
    for name, cap in report["caps"].items():
        if cap and cap["total"] == concurrency:
            marks.append(f"<- {name} cap")
    return " ".join(marks)


def table(report: dict) -> str:
    rows = [COLUMNS]
    for lv in report["levels"]:
        rows.append((str(lv["concurrency"]), f"{lv['completed']}/{lv['requests']}", f"{lv['ttft_p50_ms']:.1f}",
                     f"{lv['ttft_p99_ms']:.1f}", f"{lv['tpot_p50_ms']:.2f}", f"{lv['tpot_p99_ms']:.2f}",
                     f"{lv['output_tok_s']:.1f}", f"{lv['requests_s']:.2f}", _marks(lv["concurrency"], report)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i < len(COLUMNS) - 1 else c for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    knee = report["knee"]
    if knee and knee["level"] is not None:
        lines.append(f"knee: throughput stops growing at concurrency {knee['level']} "
                     f"(the running-request cap lies in {knee['low'] + 1}..{knee['high']})")
    elif knee:
        lines.append(f"knee: not reached; throughput still grew at concurrency {knee['low']}: extend --concurrency")
    elif report["levels"]:
        lines.append("knee: one level measured; sweep two or more (--concurrency) to find it")
    for name, cap in report["caps"].items():
        if cap:
            lines.append(f"{name} cap: {cap['total']} running requests, binding {cap['binding'] or 'unknown'} "
                         f"(from {cap['source']})")
        else:
            lines.append(f"{name} cap: unknown")
    lines += [f"DISAGREE: {d}" for d in report["disagreements"]]
    if knee and not report["disagreements"]:
        lines.append("agree: the knee matches every cap named")
    if report["failure"]:
        lines.append(f"FAILED: {report['failure']}")
    return "\n".join(lines)
