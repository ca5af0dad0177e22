"""SGLang's own load generator, `python -m sglang.benchmark.serving` (bench_serving), one
concurrency level per run.

It ships with the pinned SGLang wheel, so the serving image has it offline; its random-ids
dataset needs only the model's tokenizer. Each run is a child process in its own session,
killed with its group at the wall limit (the generator has no duration limit of its own and
waits hours on a silent server). The API key reaches it as OPENAI_API_KEY in its environment.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dsaops import pins
from dsaops.bench import bounded

MODULE = "sglang.benchmark.serving"
INSTALL_HINT = ("SGLang's load generator (sglang.benchmark.serving) is not importable here: run `dsaops bench "
                "serve` in the dsaops serving image (`docker exec` into the server's container), or "
                f"pip install '{pins.requirement('sglang')}'")
# Result keys read from its --output-file JSON line; tests/dsaops pins each to the wheel.
RESULT_KEYS = ("completed", "duration", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
               "output_throughput", "request_throughput", "errors")


class LevelFailed(Exception):
    """A level produced no result: the generator failed, or ran past its wall limit."""


@dataclass(frozen=True)
class Level:
    concurrency: int
    requests: int              # sent
    completed: int
    seconds: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    output_tok_s: float
    requests_s: float
    first_error: str | None


def available() -> bool:
    """Whether SGLang's benchmark module is there, without importing SGLang (seconds of imports)."""
    spec = importlib.util.find_spec("sglang")
    return bool(spec and spec.submodule_search_locations and any(
        (Path(p) / "benchmark" / "serving.py").is_file() for p in spec.submodule_search_locations))


def command(*, server_url: str, model: str, tokenizer: str, concurrency: int, requests: int, input_len: int,
            output_len: int, output_file: str) -> list[str]:
    return [sys.executable, "-m", MODULE, "--backend", "sglang-oai", "--base-url", server_url.rstrip("/"),
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random-ids",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "1", "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
            "--request-rate", "inf", "--ready-check-timeout-sec", "0", "--output-file", output_file,
            "--output-details", "--disable-tqdm"]


def run_level(*, concurrency: int, requests: int, timeout: float, api_key: str | None, log, **kw) -> Level:
    """One level: `requests` prompts with at most `concurrency` in flight, within `timeout` seconds.
    The generator's own output goes to `log` (a file object)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "API_KEY")}
    env["HF_HUB_OFFLINE"] = env.get("HF_HUB_OFFLINE", "1")  # a tokenizer folder, never a download mid-sweep
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    with tempfile.TemporaryDirectory(prefix="dsaops-bench-") as tmp:
        out = Path(tmp) / "level.jsonl"
        cmd = command(concurrency=concurrency, requests=requests, output_file=str(out), **kw)
        started = time.monotonic()
        rc = bounded.run(cmd, timeout, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        if rc is None:
            raise LevelFailed(f"no result within {timeout:g} s (the server answered too slowly or not at all); "
                              "the run was stopped")
        if rc != 0 or not out.is_file():
            raise LevelFailed(f"the load generator exited with {rc} after {time.monotonic() - started:.0f} s")
        result = json.loads(out.read_text().splitlines()[-1])
    errors = [e.strip().splitlines()[-1][:300] for e in result.get("errors") or [] if e and e.strip()]
    if any(result.get(k) is None for k in RESULT_KEYS if k != "errors"):
        raise LevelFailed(f"no request succeeded: {errors[0] if errors else 'the generator measured nothing'}")
    return Level(concurrency, requests, int(result["completed"]), float(result["duration"]),
                 float(result["median_ttft_ms"]), float(result["p99_ttft_ms"]), float(result["median_tpot_ms"]),
                 float(result["p99_tpot_ms"]), float(result["output_throughput"]),
                 float(result["request_throughput"]), errors[0] if errors else None)

