"""SGLang's own load generator, `sglang.benchmark.serving` (bench_serving), one concurrency level
at a time through its own command line.

It ships with the pinned SGLang wheel, so the serving image has it offline; its random-ids
dataset needs only the model's tokenizer. One child process serves a whole sweep (importing
SGLang takes seconds): it reads each level's arguments as a JSON line, runs the generator's
`cli_main` on them and marks the level done. The child has its own session and is killed with
its group when a level runs past its wall limit (the generator has no duration limit of its own
and waits hours on a silent server). The API key reaches it as OPENAI_API_KEY in its environment.
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
from typing import Self

from dsaops import pins
from dsaops.bench import bounded
from dsaops.verify_probes import printable

MODULE = "sglang.benchmark.serving"
INSTALL_HINT = ("SGLang's load generator (sglang.benchmark.serving) is not importable here: run `dsaops bench "
                "serve` in the dsaops serving image (`docker exec` into the server's container), or "
                f"pip install '{pins.requirement('sglang')}'")
# Result keys read from its --output-file JSON line; tests/dsaops pins each to the wheel.
RESULT_KEYS = ("completed", "duration", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
               "output_throughput", "request_throughput", "errors")

# The child: one level per stdin line, through the generator's own argument parsing; then
# "<output file>.done" says how the level ended and what its first failed request said (a level
# whose every request failed ends in the generator's own IndexError, a percentile of nothing).
_DRIVER = """\
import json, os, sys, traceback
from sglang.benchmark import serving
errors = []
def recorded(request):
    async def run(*args, **kwargs):
        output = await request(*args, **kwargs)
        if not output.success and not errors and (output.error or "").strip():
            errors.append(output.error)
        return output
    return run
for name, request in list(serving.ASYNC_REQUEST_FUNCS.items()):
    serving.ASYNC_REQUEST_FUNCS[name] = recorded(request)
for line in sys.stdin:
    argv = json.loads(line)
    sys.argv, status = ["sglang.benchmark.serving", *argv], "ok"
    errors.clear()
    try:
        serving.cli_main()
    except SystemExit as e:
        status = f"exit status {e.code}"
    except Exception as e:
        traceback.print_exc()
        status = f"{type(e).__name__}: {e}"
    sys.stdout.flush()
    done = argv[argv.index("--output-file") + 1] + ".done"
    with open(done + ".tmp", "w") as f:
        json.dump({"status": status, "errors": errors}, f)
    os.replace(done + ".tmp", done)
"""


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


def arguments(*, server_url: str, model: str, tokenizer: str, concurrency: int, requests: int, input_len: int,
              output_len: int, output_file: str) -> list[str]:
    return ["--backend", "sglang-oai", "--base-url", server_url.rstrip("/"), "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "random-ids", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "1", "--num-prompts", str(requests),
            "--max-concurrency", str(concurrency), "--request-rate", "inf", "--ready-check-timeout-sec", "0",
            "--output-file", output_file, "--output-details", "--disable-tqdm"]


class Generator:
    """The generator's child process for one sweep; its output goes to `log` (a file object)."""

    def __init__(self, *, api_key: str | None, log, **level_args):
        self.api_key, self.log, self.level_args = api_key, log, level_args

    def __enter__(self) -> Self:
        env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "API_KEY")}
        env.setdefault("HF_HUB_OFFLINE", "1")   # a tokenizer folder or the local cache, never a download mid-sweep
        if self.api_key:
            env["OPENAI_API_KEY"] = self.api_key
        self.folder = tempfile.TemporaryDirectory(prefix="dsaops-bench-")
        self.proc = subprocess.Popen([sys.executable, "-c", _DRIVER], stdin=subprocess.PIPE, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env, text=True, start_new_session=True)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:   # interrupted (Ctrl-C), the child may be mid-level: no wait for it to finish
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        bounded.kill_group(self.proc)
        self.folder.cleanup()

    def level(self, *, concurrency: int, requests: int, timeout: float) -> Level:
        """`requests` prompts with at most `concurrency` in flight, within `timeout` seconds."""
        out = Path(self.folder.name) / f"level-{concurrency}.jsonl"
        done = Path(f"{out}.done")
        argv = arguments(concurrency=concurrency, requests=requests, output_file=str(out), **self.level_args)
        started = time.monotonic()
        try:
            self.proc.stdin.write(json.dumps(argv) + "\n")
            self.proc.stdin.flush()
        except OSError:
            raise LevelFailed(f"the load generator exited with {self.proc.poll()}") from None
        while not done.exists():
            if self.proc.poll() is not None:
                raise LevelFailed(f"the load generator exited with {self.proc.returncode}")
            if time.monotonic() - started > timeout:
                bounded.kill_group(self.proc)
                raise LevelFailed(f"no result within {timeout:g} s (the server answered too slowly or not at all); "
                                  "the run was stopped")
            time.sleep(0.1)
        ended = json.loads(done.read_text())
        if ended["status"] != "ok" or not out.is_file():
            if ended["errors"]:
                raise LevelFailed(f"requests failed: {_last_line(ended['errors'][0])}")
            raise LevelFailed(f"the load generator failed: {_last_line(ended['status'])}")
        return _level(concurrency, requests, json.loads(out.read_text().splitlines()[-1]))


def _last_line(text: str) -> str:
    """A traceback's last line, which names what failed, escaped: an HTTP error's is the server's body."""
    return printable(text.strip().splitlines()[-1][:300])


def _level(concurrency: int, requests: int, result: dict) -> Level:
    errors = [_last_line(e) for e in result.get("errors") or [] if e and e.strip()]
    if any(result.get(k) is None for k in RESULT_KEYS if k != "errors"):
        raise LevelFailed(f"no request succeeded: {errors[0] if errors else 'the generator measured nothing'}")
    return Level(concurrency, requests, int(result["completed"]), float(result["duration"]),
                 float(result["median_ttft_ms"]), float(result["p99_ttft_ms"]), float(result["median_tpot_ms"]),
                 float(result["p99_tpot_ms"]), float(result["output_throughput"]),
                 float(result["request_throughput"]), errors[0] if errors else None)
