"""`dsaops bench serve`: a concurrency sweep with SGLang's load generator, its knee next to the
server's and the plan's running-request caps. `dsaops bench eval`: a code-generation eval
(HumanEval) run in a sandbox, compared with a recorded reference run.

Progress goes to stderr; the table, or one JSON object with --json, to stdout. Exit 0 when the
run completed, 1 when a level or a request failed, 2 on bad input.
"""
from __future__ import annotations

import json
import sys
import tempfile

from dsaops import api_key
from dsaops.cli_args import http_url, seconds, whole_numbers, whole_up_to, writable
from dsaops.errors import UserError
from dsaops.plan_input import INT_MOST

DEFAULT_TOP = 256   # the sweep's last level when the server's cap is unknown
EXEC_MEMORY_MOST_MB = 1 << 20   # 1 TiB of address space a solution may use: more than any host has
EVAL_CONCURRENCY_MOST = 1024    # a thread each
count = whole_up_to(INT_MOST)   # tokens, requests, problems


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="load sweep (`bench serve`) and task eval (`bench eval`) against a deployment",
                       description="Measure a deployment: `bench serve` sweeps concurrency with SGLang's load "
                                   "generator and sets its knee beside the running-request caps; `bench eval` scores "
                                   "HumanEval pass@1, the code run sandboxed, against a recorded run.")
    what = p.add_subparsers(dest="bench_command", metavar="serve|eval", required=True)
    s = what.add_parser("serve", help="TTFT, TPOT and throughput per concurrency; the knee against the caps")
    _common(s)
    s.add_argument("--plan", help="`dsaops plan --json` output: its max_running_requests_per_dp and binding_limit")
    s.add_argument("--exporter-url", type=http_url, help="the head node's dsaops exporter, e.g. http://HEAD:9860 (what binds, "
                   "from the log on a pristine server)")
    s.add_argument("--concurrency", help="comma-separated levels, e.g. 1,2,4,8 (default: powers of two up to twice "
                   f"the server's running-request cap, else to {DEFAULT_TOP})")
    s.add_argument("--input-len", type=count, default=1024, help="prompt tokens per request (default 1024)")
    s.add_argument("--output-len", type=count, default=256, help="output tokens per request (default 256)")
    s.add_argument("--duration", type=seconds, default=60.0, help="seconds of load per level, roughly (default 60)")
    s.add_argument("--max-requests", type=count, default=5000,
                   help="requests per level at most (default 5000); a level sends at least two a slot, so "
                        "--concurrency levels above half of it are refused and default ones left out")
    s.add_argument("--timeout", type=seconds, help="seconds a level may take before it is stopped "
                   "(default 3 x --duration + 120)")
    s.add_argument("--tokenizer", help="the model's tokenizer folder (default: /server_info's tokenizer_path, "
                   "a folder or a Hugging Face id in the local cache, as in the server's container)")
    s.add_argument("--plot", help="write a PNG of the sweep here (needs matplotlib: pip install 'dsaops[bench]')")
    s.set_defaults(func=run_serve)
    e = what.add_parser("eval", help="pass@1 on HumanEval, generated code run sandboxed; against a reference run")
    _common(e)
    e.add_argument("--task", required=True, choices=["humaneval"])
    e.add_argument("--limit", type=count, help="the first N problems only")
    ref = e.add_mutually_exclusive_group()
    ref.add_argument("--reference", help="compare with this recorded run (JSON from --record), per problem")
    ref.add_argument("--record", help="write this run here, as a reference for later runs (not when the server "
                     "left a problem unanswered)")
    e.add_argument("--concurrency", type=whole_up_to(EVAL_CONCURRENCY_MOST), default=8, help="requests in flight (default 8)")
    e.add_argument("--max-tokens", type=count, default=4096, help="per answer; reasoning models think first "
                   "(default 4096)")
    e.add_argument("--timeout", type=seconds, default=600.0, help="seconds per answer (default 600)")
    e.add_argument("--exec-timeout", type=seconds, default=10.0, help="seconds a solution's tests may run (default 10)")
    e.add_argument("--exec-memory-mb", type=whole_up_to(EXEC_MEMORY_MOST_MB), default=1024,
                   help="address space a solution may use, in MiB (default 1024)")
    e.set_defaults(func=run_eval)


def _common(p) -> None:
    p.add_argument("--server-url", required=True, type=http_url, help="e.g. http://HEAD:30000 (OpenAI-compatible)")
    p.add_argument("--api-key-file", help="a file holding the server's API key (never on the command line)")
    p.add_argument("--model", help="model id to ask for (default: the first of /v1/models)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def concurrency_levels(text: str, max_requests: int) -> list[int]:
    from dsaops.bench.sweep import PER_SLOT

    levels = whole_numbers(text, "--concurrency", "1,2,4,8")
    if not levels or any(v < 1 for v in levels):
        raise UserError(f"--concurrency levels must be 1 or more, e.g. 1,2,4,8; got {text!r}")
    if levels != sorted(set(levels)):
        raise UserError(f"--concurrency levels must rise without repeats, e.g. 1,2,4,8; got {text!r}")
    if levels[-1] * PER_SLOT > max_requests:
        raise UserError(f"--concurrency {levels[-1]} sends at least {levels[-1] * PER_SLOT} requests (two a slot), "
                        f"over --max-requests {max_requests}: raise --max-requests or leave the level out")
    return levels


def default_levels(cap: int | None) -> list[int]:
    top = 2 * cap if cap else DEFAULT_TOP
    levels = [1]
    while levels[-1] < top:
        levels.append(levels[-1] * 2)
    return levels


def reach(url: str, model: str | None, key: str | None) -> str:
    """The model to ask for; a server that does not answer /v1/models is bad input (exit 2)."""
    from dsaops import verify_probes as vp

    try:
        found = vp.server_model(url, timeout=15, api_key=key)
    except vp.ProbeError as e:
        raise UserError(f"{url}/v1/models: {e.detail}; check --server-url and --api-key-file") from None
    return model or found


def run_serve(args) -> int:
    from dsaops.bench import capacity, generator, plot, serve_report, sweep

    url = args.server_url
    if args.max_requests < sweep.PER_SLOT:
        raise UserError(f"--max-requests {args.max_requests} runs no level: each sends at least two requests a slot; "
                        f"give {sweep.PER_SLOT} or more")
    levels = concurrency_levels(args.concurrency, args.max_requests) if args.concurrency is not None else None
    plan = capacity.from_plan(args.plan) if args.plan else None
    if args.plot:
        plot.check()
        writable("--plot", args.plot)
    key = api_key.read(args.api_key_file)
    if not generator.available():
        raise UserError(generator.INSTALL_HINT)
    model = reach(url, args.model, key)

    info, server = server_cap(url, key, args.exporter_url)
    tokenizer = args.tokenizer or _served_tokenizer(info)
    if not levels:
        default = default_levels(server.total if server else None)
        levels = [c for c in default if c * sweep.PER_SLOT <= args.max_requests]  # rising: a prefix
        if len(levels) < len(default):
            progress(f"concurrency {', '.join(map(str, default[len(levels):]))} left out: two requests a slot "
                     f"would pass --max-requests {args.max_requests}")
    timeout = args.timeout or 3 * args.duration + 120
    settings = {"server_url": url, "model": model, "tokenizer": tokenizer, "input_len": args.input_len,
                "output_len": args.output_len, "duration_s": args.duration, "generator": generator.MODULE}
    progress(f"sweeping {url} ({model}) at concurrency {','.join(map(str, levels))}: {args.input_len} in, "
             f"{args.output_len} out per request")
    with tempfile.NamedTemporaryFile("w+", prefix="dsaops-bench-serve-", suffix=".log") as log:
        with generator.Generator(api_key=key, log=log, server_url=url, model=model, tokenizer=tokenizer,
                                 input_len=args.input_len, output_len=args.output_len) as gen:
            result = sweep.run(levels, gen.level, duration=args.duration, max_requests=args.max_requests,
                               timeout=timeout, progress=progress)
        if result.failure:
            log.seek(0)
            tail = [line.rstrip() for line in log.readlines()[-6:] if line.strip()]
            progress("the load generator's last lines:\n    " + "\n    ".join(tail or ["(none)"]))
    report = serve_report.build(result, {"server": server, "plan": plan}, settings)
    print(json.dumps(report, indent=2) if args.json else serve_report.table(report))
    if args.plot and report["levels"]:
        plot.write(report, args.plot)
        progress(f"plot written to {args.plot}")
    return 1 if result.failure else 0


def server_cap(url: str, key: str | None, exporter_url: str | None):
    """(/server_info as read, or {}; the running-request cap the server reports, or None): the count
    from /server_info, what binds it from the exporter when one answers (it reads the mamba cap from
    the log). Neither is required: what is missing is said on stderr."""
    from dsaops import pins
    from dsaops import verify_probes as vp
    from dsaops.bench import capacity

    info, server = {}, None
    try:
        info = vp.get_json(url + "/server_info", timeout=15, api_key=key)
        server = capacity.from_server_info(info)
    except vp.ProbeError as e:
        progress(f"/server_info: {e.detail}: the server's own cap is unknown")
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:   # Overflow: int() of Infinity
        progress(f"/server_info is not SGLang {pins.SGLANG}'s shape ({type(e).__name__}: {e}): "
                 "the server's own cap is unknown")
    if exporter_url:
        try:
            exported = capacity.read_exporter(exporter_url, timeout=10)
        except ValueError as e:
            exported = None
            progress(f"exporter {exporter_url}: {vp.printable(str(e))}: using /server_info alone")
        if exported and server:
            server = capacity.Cap(server.total, server.per_dp, exported.binding or server.binding,
                                  f"{server.source}; binding from the exporter")
        elif exported:
            server = exported
    return (info if isinstance(info, dict) else {}), server


def _served_tokenizer(info: dict) -> str:
    """What the server loaded its tokenizer from: a folder, or a Hugging Face id that the local cache
    holds (the generator runs with HF_HUB_OFFLINE=1 unless it is set)."""
    named = info.get("tokenizer_path") or info.get("model_path")
    if not isinstance(named, str) or not named:
        raise UserError("the load generator needs the model's tokenizer: pass --tokenizer FOLDER (the model folder)")
    return named


def run_eval(args) -> int:
    from dsaops.bench import eval_run, humaneval

    url = args.server_url
    reference = eval_run.read_record(args.reference, args.task) if args.reference else None
    if args.record:
        writable("--record", args.record)
    problems = humaneval.problems(args.limit)
    key = api_key.read(args.api_key_file)
    model = reach(url, args.model, key)
    run = eval_run.run(problems, server_url=url, model=model, api_key=key, concurrency=args.concurrency,
                       max_tokens=args.max_tokens, timeout=args.timeout, exec_timeout=args.exec_timeout,
                       exec_memory_mb=args.exec_memory_mb, progress=progress)
    record = eval_run.as_record(run, task=args.task, server_url=url, model=model, max_tokens=args.max_tokens)
    report = eval_run.report(record, reference)
    # a reference must score the model: misses the server caused would replace a good one with a false one
    if args.record and report["unanswered"]:
        progress(f"not recorded to {args.record}: {report['unanswered']} problem(s) unanswered by the server")
    elif args.record:
        eval_run.write_record(args.record, record)
        progress(f"run recorded to {args.record}")
    print(json.dumps(report, indent=2) if args.json else eval_run.table(report))
    return 1 if report["unanswered"] else 0
