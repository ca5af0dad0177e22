"""The sweep as a PNG: output throughput and TTFT p50 against concurrency, with the knee and
the named caps as vertical lines. matplotlib is the `bench` extra."""
from __future__ import annotations

import io

from dsaops.cli_args import write as write_file
from dsaops.errors import UserError

INSTALL_HINT = "--plot needs matplotlib: pip install 'dsaops[bench]'"


def check() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(INSTALL_HINT) from None


def write(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [lv["concurrency"] for lv in report["levels"]]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    ax.plot(levels, [lv["output_tok_s"] for lv in report["levels"]], "o-", color="tab:blue", label="output tok/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ttft = ax.twinx()
    ttft.plot(levels, [lv["ttft_p50_ms"] for lv in report["levels"]], "s--", color="tab:gray", label="TTFT p50 ms")
    ttft.set_ylabel("TTFT p50 (ms)")
    knee = report["knee"]
    if knee and knee["level"] is not None:
        ax.axvline(knee["level"], color="tab:red", label=f"knee {knee['level']}")
    for (name, cap), color in zip(report["caps"].items(), ("tab:green", "tab:orange", "tab:purple")):
        if cap:
            ax.axvline(cap["total"], color=color, linestyle=":",
                       label=f"{name} cap {cap['total']} ({cap['binding'] or '?'})")
    lines = ax.get_legend_handles_labels()
    more = ttft.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="lower right", fontsize=8)
    ax.set_title("dsaops bench serve" + (": the caps disagree (see the report)" if report["disagreements"] else ""))
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png")   # a PNG whatever the name ends in: savefig guesses from the suffix
    plt.close(fig)
    write_file("--plot", path, image.getvalue())
