"""`dsaops verify`: after a deploy, check that the server answers right; `verify boot-gate`:
check that a wrong fp8 launch is refused.

`dsaops verify --server-url URL [--reference FILE | --record FILE] [--niah-depths ...] [--json]`
runs the probes of dsaops.verify_probes (progress on stderr, a table or JSON on stdout) and
exits 1 when any probe fails, times out or errors. `dsaops verify boot-gate --image IMAGE`
(or `--command "..."`) runs dsaops.boot_gate.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from dsaops.cli_args import MAX_SECONDS, http_url, seconds, whole_numbers, whole_up_to, writable, write
from dsaops.errors import UserError
from dsaops.plan_input import INT_MOST

DEFAULT_NIAH_DEPTHS = "16384,49152,131072"


# A needle's prompt is built in memory, ~4 characters a token (verify_probes.haystack): 64 MB at this
# bound, past every model's context (a server refuses a longer prompt anyway)
MAX_NIAH_DEPTH = 1 << 24


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="acceptance probes against a server; `verify boot-gate` for the fp8 refusal",
                       usage="%(prog)s --server-url URL [options]\n       %(prog)s boot-gate (--image IMAGE | "
                             "--command COMMAND) [options]",
                       description="After a deploy, ask the server fixed questions at temperature 0 and run "
                                   "needle-in-a-haystack recall probes; exit 1 if any probe fails, times out or "
                                   "errors. `dsaops verify boot-gate` checks that a wrong fp8 launch is refused.")
    p.add_argument("--server-url", type=http_url, help="e.g. http://HEAD:30000 (any OpenAI-compatible endpoint)")
    p.add_argument("--api-key-file", help="a file holding the server's API key (never on the command line; "
                   "the playbooks keep it beside the inventory: <inventory>.secrets/api-key)")
    p.add_argument("--model", help="model id to ask for (default: the first of /v1/models)")
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--reference", help="compare answers with this recorded reference (JSON)")
    ref.add_argument("--record", help="write this run's answers as a reference (JSON; not when a question "
                     "went unanswered)")
    p.add_argument("--niah-depths", default=DEFAULT_NIAH_DEPTHS,
                   help=f"needle depths in approximate tokens, comma-separated; '' for none (default {DEFAULT_NIAH_DEPTHS})")
    p.add_argument("--max-tokens", type=whole_up_to(INT_MOST), default=2048, help="per answer (reasoning models think first)")
    p.add_argument("--timeout", type=seconds, default=180.0, help="seconds per answer probe")
    p.add_argument("--niah-timeout-per-ktok", type=seconds, default=4.0,
                   help="needle probes get --timeout plus this many seconds per 1000 tokens of depth")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=run)
    # prog: else boot-gate's would be built from the usage above
    gate_sub = p.add_subparsers(dest="verify_command", metavar="boot-gate", prog=p.prog)
    g = gate_sub.add_parser("boot-gate", help="a launch with fp8 KV, tilelang prefill and flashmla_sparse decode "
                            "must be refused at startup",
                            description="Launch the image (or --command) with fp8 KV, tilelang prefill and "
                                        "flashmla_sparse decode; pass only when SGLang refuses it at startup with its "
                                        "message. A launch that starts serving or keeps running fails, and is killed.")
    how = g.add_mutually_exclusive_group(required=True)
    how.add_argument("--image", help="docker run this image with the gate flags (needs a GPU host)")
    # its own dest: `command` is the subcommand's name, which error lines print
    how.add_argument("--command", dest="launch_command", metavar="COMMAND",
                     help="any launch command (a shell string) that should be refused")
    g.add_argument("--model-path", default="zai-org/GLM-5.3-Flash", help="with --image: the model to launch")
    g.add_argument("--docker-arg", action="append", default=[], help="with --image: extra `docker run` argument "
                   "(repeat), e.g. --docker-arg=-v --docker-arg=/models:/models")
    g.add_argument("--sglang-arg", action="append", default=[], help="with --image: extra launch_server argument")
    g.add_argument("--timeout", type=seconds, default=600.0, help="seconds the refusal may take (model config download, imports)")
    g.add_argument("--expect", default=None, help="the refusal text to look for (default: SGLang's)")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=run_boot_gate)


def run(args) -> int:
    from dsaops import api_key
    from dsaops import verify_probes as vp

    if not args.server_url:
        raise UserError("--server-url is required (or use `dsaops verify boot-gate`)")
    depths = _depths(args.niah_depths)
    longest = args.timeout + max(depths, default=0) / 1000 * args.niah_timeout_per_ktok
    if longest > MAX_SECONDS:  # a socket timeout past time_t is an OverflowError mid-run
        raise UserError(f"--timeout plus --niah-timeout-per-ktok per 1000 tokens of the deepest needle comes to "
                        f"{longest:.0f} s, more than {MAX_SECONDS}; lower one of them")
    reference = _read_reference(args.reference) if args.reference else None
    if args.record:
        writable("--record", args.record)
    key = api_key.read(args.api_key_file)
    model, results = run_probes(args.server_url, model=args.model, niah_depths=depths, reference=reference, api_key=key,
                                max_tokens=args.max_tokens, timeout=args.timeout,
                                niah_timeout_per_ktok=args.niah_timeout_per_ktok, progress=vp.stderr_progress)
    if args.record and model is not None:
        unanswered = [r.name for r in results if r.kind == "answer" and r.answer is None]
        # a reference short of an answer would fail that probe on every later run: keep the one there
        if unanswered:
            vp.stderr_progress(f"not recorded to {args.record}: no answer to {', '.join(unanswered)}")
        else:
            _write_reference(args.record, args.server_url, model, results)
            vp.stderr_progress(f"reference written to {args.record}")
    return _report(args, model, results)


def run_probes(server_url: str, *, model: str | None = None, niah_depths: Sequence[int] = (), reference: dict | None = None,
               max_tokens: int = 2048, timeout: float = 180.0, niah_timeout_per_ktok: float = 4.0,
               progress=lambda line: None, api_key: str | None = None) -> tuple[str | None, list]:
    """Every answer probe, then the needle probes at each depth and position: (the model asked, one
    verify_probes.ProbeResult each). Without an answer from /v1/models: (None, [that failure])."""
    from dsaops import verify_probes as vp

    results: list[vp.ProbeResult] = []
    try:
        model = model or vp.server_model(server_url, timeout=min(timeout, 30), api_key=api_key)
    except vp.ProbeError as e:
        return None, [vp.ProbeResult("server", "server", e.status, f"/v1/models: {e.detail}", 0.0)]
    total = len(vp.PROMPTS) + len(niah_depths) * len(vp.NIAH_POSITIONS)
    step = 0
    for probe_id, prompt, expected in vp.PROMPTS:
        step += 1
        progress(f"[{step}/{total}] answer {probe_id}")
        results.append(vp.answer_probe(server_url, model, probe_id, prompt, expected, reference=reference,
                                       max_tokens=max_tokens, timeout=timeout, progress=progress, api_key=api_key))
        _progress_done(progress, results[-1])
    for depth in niah_depths:
        for position in vp.NIAH_POSITIONS:
            step += 1
            probe_timeout = timeout + depth / 1000 * niah_timeout_per_ktok
            progress(f"[{step}/{total}] needle at {position} of ~{depth} tokens (timeout {probe_timeout:.0f} s)")
            results.append(vp.niah_probe(server_url, model, depth, position, max_tokens=max_tokens,
                                         timeout=probe_timeout, progress=progress, api_key=api_key))
            _progress_done(progress, results[-1])
    return model, results


def _progress_done(progress, r) -> None:
    progress(f"    {r.status.upper()} in {r.seconds:.1f} s: {r.detail}")


def _report(args, model, results) -> int:
    from dsaops import verify_probes as vp

    passed = all(r.status == "pass" for r in results)
    if args.json:  # ASCII, json's default: an answer's C1 controls (CSI) and U+2028 come out escaped, not raw
        print(json.dumps({"server_url": args.server_url, "model": model, "passed": passed,
                          "probes": vp.as_dicts(results)}, indent=2))
    else:
        print(vp.summary_table(results))
    return 0 if passed else 1


def _depths(text: str) -> list[int]:
    depths = whole_numbers(text, "--niah-depths", DEFAULT_NIAH_DEPTHS)
    if any(d < 64 for d in depths):
        raise UserError("each --niah-depths value must be at least 64 tokens")
    if any(d > MAX_NIAH_DEPTH for d in depths):
        raise UserError(f"each --niah-depths value must be at most {MAX_NIAH_DEPTH} tokens, got {max(depths)}")
    return depths


def _read_reference(path: str) -> dict[str, str]:
    from dsaops.plan_input import read_json

    fix = "record one with --record FILE"
    answers = read_json(path, "the reference", fix=fix).get("answers")
    if not isinstance(answers, dict) or not all(isinstance(a, str) for a in answers.values()):
        raise UserError(f"the reference {path} has no \"answers\" object of probe names to answer strings; {fix}")
    return answers


def _write_reference(path: str, server_url: str, model: str, results) -> None:
    answers = {r.name: r.answer for r in results if r.kind == "answer" and r.answer is not None}
    text = json.dumps({"server_url": server_url, "model": model, "answers": answers}, indent=2)
    write("--record", path, (text + "\n").encode())


def run_boot_gate(args) -> int:
    import os
    import shutil
    import subprocess

    from dsaops import boot_gate

    cleanup = None
    if args.image:
        if not shutil.which("docker"):
            raise UserError("--image needs the docker CLI on this host (a GPU host with the image); "
                            "or pass the launch as --command")
        name = f"dsaops-boot-gate-{os.getpid()}"
        command = boot_gate.docker_command(args.image, model_path=args.model_path, name=name,
                                           docker_args=args.docker_arg, sglang_args=args.sglang_arg)

        def cleanup():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    else:
        if not args.launch_command.strip():
            raise UserError("--command is empty: give the launch command that should be refused")
        command = args.launch_command
    print(f"boot gate: {boot_gate.describe(command)}", file=sys.stderr, flush=True)
    progress = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    result = boot_gate.run_gate(command, timeout=args.timeout, progress=progress, cleanup=cleanup,
                                expect=args.expect or boot_gate.MIXED_TILELANG_REFUSAL)
    if args.image and result.exit_code == boot_gate.DOCKER_RUN_FAILED and not result.passed:
        said = [line for line in result.tail if line.startswith("docker: ")] or result.tail or ["no output"]
        raise UserError(f"docker could not start the gate's container (exit code {result.exit_code}: {said[-1]}); "
                        "run the gate where a Docker engine runs, with the image and a GPU")
    if args.json:
        print(json.dumps({"passed": result.passed, "detail": result.detail, "seconds": result.seconds,
                          "exit_code": result.exit_code, "tail": result.tail}, indent=2))
    else:
        print(f"boot gate {'PASS' if result.passed else 'FAIL'}: {result.detail} ({result.seconds:.1f} s)")
        if not result.passed and result.tail:
            print("last lines:\n  " + "\n  ".join(result.tail[-8:]))
    return 0 if result.passed else 1
