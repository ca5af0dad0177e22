"""`dsaops bench serve` against the stand-in OpenAI server (at most 4 requests at once, 4 ms a
token), with the pinned wheel's load generator: the knee at 4 within one sweep step, caps that
disagree flagged, caps that agree not; a silent server stopped in bounded time; bad input exit 2."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from dsaops import pins
from dsaops.bench import cli, generator, plot, serve_report
from dsaops.bench import sweep as sweep_mod
from dsaops.cli import main
from tests.dsaops.raw_http import answering, http_response
from tests.support.polling import wait_for
from tests.support.ports import free_port

CAP = 4
LEVELS = [1, 2, 4, 8, 16]
LOAD = ["--input-len", "16", "--output-len", "32", "--duration", "1", "--concurrency", ",".join(map(str, LEVELS))]


def server_info(tokenizer: str) -> dict:
    """SGLang 0.5.23's /server_info for GLM-5.3-Flash with attention-DP 2, --max-running-requests 16, and
    a mamba state cache that holds 2 requests per DP rank (pristine: no mamba fields)."""
    state = {"effective_max_running_requests_per_dp": 2, "memory_usage": {"token_capacity": 400_000, "kvcache": 30.0}}
    return {"max_running_requests": 16, "attn_dp_size": 2, "dp_size": 1, "context_length": 32768,
            "max_total_num_tokens": 400_000, "tokenizer_path": tokenizer, "model_path": tokenizer,
            "internal_states": [dict(state), dict(state)]}


def plan(tmp_path, per_dp: int, binding: str):
    path = tmp_path / f"plan-{per_dp}-{binding}.json"
    path.write_text(json.dumps({"max_running_requests_per_dp": per_dp, "binding_limit": binding,
                                "parallel": {"attn_dp_size": 2, "dp_size": 1}}))
    return str(path)


@pytest.fixture
def exporter(tmp_path):
    """The real dsaops exporter on the stand-in, its log saying the mamba cache caps each rank at 2
    (the two lines SGLang 0.5.23 logs; the exporter's contract tests pin their wording)."""
    procs = []

    def start(server_url: str) -> str:
        log = tmp_path / "sglang.log"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write_text(f"[{stamp} DP0 TP0 EP0] Mamba Cache is allocated. max_mamba_cache_size: 10, conv_state size: "
                       "0.14GB, ssm_state size: 4.00GB \n"
                       f"[{stamp} DP0 TP0 EP0] max_running_requests is capped to 2 by the mamba state cache "
                       "(max_mamba_cache_size=10, 5 state slots per request). To raise it: increase "
                       "--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with "
                       "--mamba-ssm-dtype bfloat16.\n")
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "dsaops", "exporter", "--server-url", server_url,
                                       "--log-file", str(log), "--listen", f"127.0.0.1:{port}", "--interval", "1"]))
        url = f"http://127.0.0.1:{port}"

        def says_mamba():
            try:
                return _capped_by(url) == "mamba"
            except OSError:
                return False
        assert wait_for(says_mamba, timeout=30), "the exporter never reported the mamba cap"
        return url

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _capped_by(url: str) -> str | None:
    with urllib.request.urlopen(url + "/metrics", timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("dsa_concurrency_capped{") and line.endswith(" 1.0"):
                return line.split('by="')[1].split('"')[0]
    return None


def sweep(capsys, argv) -> tuple[int, dict, str]:
    rc = main(["bench", "serve", *argv, "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_knee_at_the_cap_and_a_plan_that_says_otherwise_is_flagged(standin, exporter, with_generator, tokenizer_dir,
                                                                   tmp_path, capsys):
    url = standin(max_running=CAP, token_latency=0.004, server_info=server_info(tokenizer_dir))
    png = tmp_path / "sweep.png"
    rc, report, err = sweep(capsys, ["--server-url", url, "--exporter-url", exporter(url), *LOAD,
                                     "--plan", plan(tmp_path, 16, "dp_split"), "--plot", str(png)])
    assert rc == 0, err
    assert [lv["concurrency"] for lv in report["levels"]] == LEVELS
    assert all(lv["completed"] == lv["requests"] for lv in report["levels"])
    knee = report["knee"]["level"]
    assert knee in (2, 4, 8), f"the knee is {knee}, not within one step of {CAP}: {report['levels']}"
    server = report["caps"]["server"]
    assert (server["total"], server["binding"]) == (CAP, "mamba")
    assert "binding from the exporter" in server["source"]
    flagged = "\n".join(report["disagreements"])
    # against the knee: 32, beyond the widest bracket a knee the test allows gives (at 8: up to 16)
    assert "the plan names 32 running requests (dp_split)" in flagged
    assert "the plan names 32 running requests, the server runs 4" in flagged
    assert "the plan says dp_split binds, the server's figures say mamba" in flagged
    assert "the server names" not in flagged                                     # the server's cap agrees
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "[5/5] concurrency 16" in err


@pytest.mark.parametrize("name", ["sweep.txt", "sweep"])
def test_the_plot_is_a_png_at_the_path_given(tmp_path, name):
    """matplotlib took the format from the name: sweep.txt was a ValueError traceback after the whole
    sweep, and a name without a suffix got .png appended, not the file the run said it wrote."""
    levels = [generator.Level(c, 8, 8, 1.0, 5.0, 9.0, 2.0, 3.0, 100.0 * c, 8.0, None) for c in (1, 2)]
    report = serve_report.build(sweep_mod.Sweep(levels), {"server": None}, {})
    plot_path = tmp_path / name
    plot.write(report, str(plot_path))
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_negative_control_a_plan_that_agrees_is_not_flagged(standin, with_generator, tokenizer_dir, tmp_path, capsys):
    url = standin(max_running=CAP, token_latency=0.004, server_info=server_info(tokenizer_dir))
    rc = main(["bench", "serve", "--server-url", url, *LOAD, "--plan", plan(tmp_path, 2, "mamba")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "DISAGREE" not in out
    assert "agree: the knee matches every cap named" in out
    assert "server cap: 4 running requests, binding mamba (from /server_info (mamba inferred" in out
    assert "plan cap: 4 running requests, binding mamba" in out
    assert "<- knee" in out


def test_a_server_that_never_answers_is_stopped_in_bounded_time(standin, with_generator, tokenizer_dir, capsys):
    url = standin(stall=True)
    started = time.monotonic()
    rc = main(["bench", "serve", "--server-url", url, "--tokenizer", tokenizer_dir, "--concurrency", "1,2,4",
               "--duration", "1", "--timeout", "8", "--input-len", "8", "--output-len", "8"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert time.monotonic() - started < 30
    assert "FAILED: concurrency 1: no result within 8 s" in out
    assert "[2/3]" not in err                 # the sweep stops at the first silent level
    assert "server cap: unknown" in out       # no /server_info on this server: said, not guessed


def test_ctrl_c_mid_level_stops_at_once_and_leaves_nothing(standin, with_generator, tokenizer_dir, tmp_path):
    """Ctrl-C waited 10 s on the generator child, busy in its level, before killing it."""
    url = standin(stall=True)
    proc = subprocess.Popen([sys.executable, "-m", "dsaops", "bench", "serve", "--server-url", url, "--tokenizer",
                             tokenizer_dir, "--concurrency", "1", "--input-len", "8", "--output-len", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    while "[1/1] concurrency 1" not in proc.stderr.readline():   # the level has started
        assert proc.poll() is None
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - interrupted < 5
    assert proc.returncode == 130 and "Traceback" not in err and out == ""
    assert list(tmp_path.iterdir()) == []     # the generator's folder and the log are gone


def test_max_requests_caps_every_level(standin, with_generator, tokenizer_dir, capsys):
    """Every level sent at least two requests a slot, past --max-requests: 16 at level 8 here. The
    default levels (to twice the server's cap of 4) that cannot keep that are left out, and said so."""
    url = standin(max_running=CAP, token_latency=0.001, server_info=server_info(tokenizer_dir))
    rc, report, err = sweep(capsys, ["--server-url", url, "--max-requests", "4", "--duration", "1",
                                     "--input-len", "8", "--output-len", "4"])
    assert rc == 0, err
    assert [(lv["concurrency"], lv["requests"]) for lv in report["levels"]] == [(1, 2), (2, 4)]
    assert "concurrency 4, 8 left out: two requests a slot would pass --max-requests 4\n" in err


@pytest.mark.parametrize("answered, level", [(1, 1), (3, 2)])
def test_a_level_whose_requests_all_fail_names_their_error(standin, with_generator, tokenizer_dir, capsys, answered,
                                                           level):
    """The server falls over after `answered` requests. When the generator's warmup request was
    answered, it stopped on an IndexError (a percentile of no latencies), else on a ValueError
    holding the request's whole traceback: the report named those instead of the requests' error."""
    url = standin(fail_after=answered, token_latency=0.001)
    rc = main(["bench", "serve", "--server-url", url, "--tokenizer", tokenizer_dir, "--concurrency", "1,2",
               "--duration", "1", "--max-requests", "4", "--input-len", "8", "--output-len", "4"])
    out, err = capsys.readouterr()
    assert rc == 1, err
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    says = "requests failed: aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected"
    assert failed == [f"FAILED: concurrency {level}: {says}"], out


def test_the_api_key_comes_from_a_file(standin, with_generator, tokenizer_dir, tmp_path, capsys):
    url = standin(api_key="s3cret", token_latency=0.001)
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    rc = main(["bench", "serve", "--server-url", url, "--api-key-file", str(key), "--tokenizer", tokenizer_dir,
               "--concurrency", "1", "--duration", "1", "--input-len", "8", "--output-len", "4"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "1  " in out and "2/2" in out
    key.write_text("wrong")
    assert main(["bench", "serve", "--server-url", url, "--api-key-file", str(key), "--tokenizer",
                 tokenizer_dir]) == 2
    assert "HTTP 401" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--server-url", "http://127.0.0.1:{dead}"], "/v1/models: cannot connect"),
    (["--server-url", "{url}", "--concurrency", "1,two"], "--concurrency takes comma-separated whole numbers"),
    (["--server-url", "{url}", "--concurrency", "4,2"], "must rise without repeats"),
    (["--server-url", "{url}", "--concurrency", "0,1"], "must be 1 or more"),
    (["--server-url", "{url}", "--api-key-file", "/nonexistent/key"], "--api-key-file /nonexistent/key: No such file"),
    (["--server-url", "{url}", "--plan", "/nonexistent/plan.json"], "cannot read --plan /nonexistent/plan.json"),
    (["--server-url", "{url}", "--plot", "/nonexistent/sweep.png"], "--plot /nonexistent/sweep.png: cannot write"),
    (["--server-url", "{url}"], "needs the model's tokenizer: pass --tokenizer"),
    (["--server-url", "{url}", "--concurrency", "1,4", "--max-requests", "7"],
     "--concurrency 4 sends at least 8 requests (two a slot), over --max-requests 7"),
    (["--server-url", "{url}", "--max-requests", "1"], "--max-requests 1 runs no level"),
])
def test_bad_input_is_one_line_and_exit_2(standin, with_generator, argv, message, capsys):
    url = standin()
    argv = [a.format(url=url, dead=free_port()) for a in argv]
    assert main(["bench", "serve", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    errors = [line for line in err.splitlines() if line.startswith("dsaops bench:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err


@pytest.mark.parametrize("response, says", [
    (http_response("200 OK", b'dsa_max_running_requests{dp_rank="0",scope="effective"} +Inf\n'),
     "dsa_max_running_requests of dp_rank '0' is '+Inf', not a number of requests: using /server_info alone"),
    (b"\x1b[2J\r\n", "not an HTTP answer: BadStatusLine: \\x1b[2J\\r\\n: using /server_info alone"),
])
def test_an_exporter_that_says_no_cap_leaves_the_servers(standin, with_generator, tokenizer_dir, capsys, response,
                                                         says):
    """+Inf from an exporter was an OverflowError traceback, a non-HTTP answer an HTTPException one."""
    rc = main(["bench", "serve", "--server-url", standin(), "--exporter-url", answering(response), "--tokenizer",
               tokenizer_dir, "--concurrency", "1", "--duration", "1", "--input-len", "8", "--output-len", "4"])
    err = capsys.readouterr().err
    assert rc == 0 and says in err and "\x1b" not in err, err


@pytest.mark.parametrize("argv, says", [
    (["--server-url", "localhost:30000"], "is not an http(s) URL"),
    (["--server-url", "http://h:1", "--exporter-url", "h:9860"], "--exporter-url: 'h:9860' is not an http(s) URL"),
    (["--server-url", "http://[::1"], "Invalid IPv6 URL"),
    (["--server-url", "http://h:1", "--duration", "0"], "--duration: must be a positive number of seconds"),
    (["--server-url", "http://h:1", "--timeout", "nan"], "--timeout: must be a positive number of seconds"),
])
def test_bad_arguments_are_refused_before_the_sweep(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "serve", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.startswith("dsaops bench serve: argument ") and says in err.splitlines()[0], err


@pytest.mark.parametrize("content, says", [
    ("[" * 100_000, "is not JSON (it nests deeper than the parser follows)"),
    ('{"max_running_requests_per_dp": 1e400, "binding_limit": "kv"}', "max_running_requests_per_dp must be a whole"),
    ('{"max_running_requests_per_dp": "4", "binding_limit": "kv"}', "max_running_requests_per_dp must be a whole"),
    ('{"max_running_requests_per_dp": true, "binding_limit": "kv"}', "max_running_requests_per_dp must be a whole"),
    ('{"max_running_requests_per_dp": 4, "binding_limit": "kv", "parallel": {"attn_dp_size": -2}}',
     "parallel.attn_dp_size must be positive, not -2"),
    ('{"max_running_requests_per_dp": 4, "binding_limit": "kv", "parallel": {"attn_dp_size": 1000000000000}}',
     "parallel.attn_dp_size must be at most 65536"),
    ('{"max_running_requests_per_dp": 4, "binding_limit": "kv", "parallel": {"attn_dp_size": 4096, "dp_size": 4096}}',
     "16777216 DP ranks (attn_dp_size x dp_size) are more than 65536"),
    ('{"max_running_requests_per_dp": 4, "binding_limit": "kv", "parallel": [1]}', '"parallel" is not an object'),
    ('{"max_running_requests_per_dp": 4, "binding_limit": ["kv"]}', "binding_limit ['kv'] is not one of request"),
])
def test_a_plan_that_is_not_one_is_refused_before_the_sweep(tmp_path, capsys, content, says):
    """These were tracebacks (RecursionError, OverflowError, a MemoryError building a list of 10**12
    ranks) or were taken as numbers (a string, true)."""
    path = tmp_path / "plan.json"
    path.write_text(content)
    assert main(["bench", "serve", "--server-url", f"http://127.0.0.1:{free_port()}", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsaops bench: --plan {path}") and says in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("state", [{"effective_max_running_requests_per_dp": "Infinity"},
                                   {"effective_max_running_requests_per_dp": -3},
                                   {"effective_max_running_requests_per_dp": 2, "memory_usage": {"token_capacity": "1e999"}}])
def test_a_server_info_count_that_is_no_count_leaves_the_cap_unknown(capsys, state):
    """Infinity was an OverflowError traceback; -3 was taken as the cap, and the default sweep was level 1 alone."""
    body = json.dumps(server_info("/tok") | {"internal_states": [state]}).replace('"Infinity"', "Infinity")
    _, cap = cli.server_cap(answering(http_response("200 OK", body.replace('"1e999"', "1e999").encode())), None, None)
    assert cap is None and "/server_info is not SGLang" in capsys.readouterr().err


def test_without_the_load_generator_it_says_how_to_get_it(standin, tokenizer_dir, capsys):
    """No sglang importable (the test environment's own): one line that says where it is."""
    assert main(["bench", "serve", "--server-url", standin(), "--tokenizer", tokenizer_dir]) == 2
    err = capsys.readouterr().err
    assert "serving image" in err and f"pip install '{pins.requirement('sglang')}'" in err and len(err.strip().splitlines()) == 1


def test_a_servers_error_text_reaches_the_terminal_escaped():
    """SGLang's generator keeps a refused request's reason and body as its error; the body is the
    server's, and ESC ] 0 ; ... BEL would retitle the terminal."""
    with pytest.raises(generator.LevelFailed) as failed:
        generator._level(1, 1, {"errors": ["Bad Request: \x1b]0;owned\x07\x1b[2J"]})
    assert str(failed.value) == "no request succeeded: Bad Request: \\x1b]0;owned\\x07\\x1b[2J"
