"""`dsaops verify` against a small OpenAI-compatible server on 127.0.0.1 that answers right,
answers wrong, times out, drops the connection or errors, each on the probes a test picks."""
import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from dsaops import verify_probes as vp
from dsaops.cli import main
from tests.dsaops.json_http import JsonHandler
from tests.dsaops.raw_http import answering, http_response
from tests.support.ports import free_port

EXPECTED = {prompt: expected for _, prompt, expected in vp.PROMPTS}
NEEDLE = re.compile(r"The secret passphrase is (\S+)\.")


class _Handler(JsonHandler):
    @property
    def api_key(self):
        return self.server.key

    def do_GET(self):
        if self.refused():
            return
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "glm-test", "object": "model"}]})
        else:
            self.send_json(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.refused():
            return
        assert body["temperature"] == 0
        prompt = body["messages"][0]["content"]
        self.server.prompts.append(prompt)
        action = self.server.behave(prompt)
        if action == "drop":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if isinstance(action, float):           # a server that takes longer than the probe's timeout
            time.sleep(action)
            action = "right"
        if isinstance(action, int):
            self.send_json(action, {"object": "error", "message": "prompt too long for this server"})
            return
        if action == "think":    # SGLang with --reasoning-parser, stopped by max_tokens mid-thought
            message, finish = {"role": "assistant", "content": None, "reasoning_content": "Let me see..."}, "length"
        else:
            message = {"role": "assistant", "content": right_answer(prompt) if action == "right" else action}
            finish = "stop"
        self.send_json(200, {"choices": [{"index": 0, "message": message, "finish_reason": finish}]})


def right_answer(prompt: str) -> str:
    if prompt in EXPECTED:
        return f"<think>the user wants a short answer</think>{EXPECTED[prompt]}"
    return NEEDLE.search(prompt).group(1)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # dropped connections are the point of some tests


@pytest.fixture
def server():
    """serve(behave) -> base URL; behave(prompt) returns 'right', 'drop', an answer, a delay (float) or an HTTP code."""
    started = []

    def serve(behave=lambda prompt: "right"):
        srv = _Server(("127.0.0.1", 0), _Handler)
        srv.behave, srv.prompts, srv.key = behave, [], None
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", srv
    yield serve
    for srv in started:
        srv.shutdown()
        srv.server_close()


def verify(url, capsys, *extra) -> tuple[int, dict, str]:
    code = main(["verify", "--server-url", url, "--niah-depths", "256,1024", "--timeout", "5", "--json", *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def statuses(report) -> dict:
    return {p["name"]: p["status"] for p in report["probes"]}


def test_right_answers_pass(server, capsys):
    url, srv = server()
    code, report, err = verify(url, capsys)
    assert code == 0 and report["passed"] and report["model"] == "glm-test"
    assert set(statuses(report).values()) == {"pass"} and len(report["probes"]) == len(vp.PROMPTS) + 6
    assert "[1/11] answer capital-zh" in err and "needle at middle of ~1024 tokens" in err
    assert all(p["answer"] == p["expected"] for p in report["probes"])   # </think> stripped
    assert len(srv.prompts) == 11 and srv.prompts[-1] == vp.haystack(1024, "end")[0]


def test_the_api_key_comes_from_a_file(server, capsys, tmp_path):
    url, srv = server()
    srv.key = "k3y-from-the-inventory-secrets"
    code, report, _ = verify(url, capsys)
    assert code == 1 and report["probes"][0]["detail"].startswith("/v1/models: HTTP 401")
    key = tmp_path / "api-key"
    key.write_text(srv.key + "\n")
    code, report, _ = verify(url, capsys, "--api-key-file", str(key))
    assert code == 0 and set(statuses(report).values()) == {"pass"}
    assert main(["verify", "--server-url", url, "--api-key-file", str(tmp_path / "none")]) == 2
    assert "--api-key-file" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["k" * 100_000, None])
def test_a_key_file_past_any_key_is_refused_before_any_probe(server, capsys, tmp_path, content):
    """The whole file was read: 100,000 characters went out as the key, /dev/zero was read until memory ran out."""
    url, srv = server()
    path = "/dev/zero" if content is None else tmp_path / "api-key"
    if content is not None:
        path.write_text(content)
    assert main(["verify", "--server-url", url, "--api-key-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"dsaops verify: --api-key-file {path} holds more than 4096 characters: give the file that holds "
                   "the server's API key alone\n") and srv.prompts == []


@pytest.mark.timeout(10)
def test_a_key_fifo_without_a_writer_is_refused_instead_of_waiting(server, capsys, tmp_path):
    """Opening it waited for a writer that never came: the command hung before any probe."""
    url, srv = server()
    path = tmp_path / "api-key"
    os.mkfifo(path)
    assert main(["verify", "--server-url", url, "--api-key-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"dsaops verify: --api-key-file {path} is empty: write the server's API key in it\n" and srv.prompts == []


def test_a_key_that_no_header_carries_is_refused_before_any_probe(server, capsys, tmp_path):
    """A key beyond printable ASCII went out to every probe, each failing as a 'bad URL' (exit 1)."""
    url, srv = server()
    path = tmp_path / "api-key"
    path.write_text("\u201ck3y-from-the-inventory-secrets\u201d\n")
    assert main(["verify", "--server-url", url, "--api-key-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"dsaops verify: --api-key-file {path} holds a character other than printable ASCII: write the "
                   "server's API key alone\n") and srv.prompts == []


def test_wrong_answers_fail_and_only_those(server, capsys):
    def behave(prompt):
        if prompt == "2+3等于几?只回答数字。":
            return "15"                                   # contains 5, still wrong
        if prompt == vp.haystack(1024, "middle")[0]:
            return "I could not find a passphrase."
        return "right"
    url, _ = server(behave)
    code, report, _ = verify(url, capsys)
    s = statuses(report)
    assert code == 1 and not report["passed"]
    assert s.pop("add-zh") == "fail" and s.pop("niah-1024-middle") == "fail"
    assert set(s.values()) == {"pass"}


def test_timeout_is_reported_as_timeout(server, capsys, monkeypatch):
    monkeypatch.setattr(vp, "HEARTBEAT_S", 0.2)
    url, _ = server(lambda prompt: 1.5 if "France" in prompt else "right")
    code = main(["verify", "--server-url", url, "--niah-depths", "", "--timeout", "0.8", "--json"])
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert code == 1 and statuses(report)["capital-en"] == "timeout"
    assert [p["status"] for p in report["probes"] if p["name"] != "capital-en"] == ["pass"] * (len(vp.PROMPTS) - 1)
    assert "capital-en: waiting" in out.err                          # progress while a probe waits


def test_dropped_connection_and_http_error_are_errors(server, capsys):
    url, _ = server(lambda prompt: "drop" if "9.11" in prompt else (400 if NEEDLE.search(prompt) else "right"))
    code, report, _ = verify(url, capsys, "--niah-depths", "256")
    by_name = {p["name"]: p for p in report["probes"]}
    assert code == 1
    assert by_name["compare-zh"]["status"] == "error" and "connection" in by_name["compare-zh"]["detail"]
    assert {by_name[f"niah-256-{pos}"]["status"] for pos in vp.NIAH_POSITIONS} == {"error"}
    assert "HTTP 400" in by_name["niah-256-begin"]["detail"]
    assert by_name["capital-zh"]["status"] == "pass"


def test_a_reply_whose_content_is_not_text_is_an_error(server, capsys):
    """content as a list of parts (a wrong shape for SGLang's chat reply) was an AttributeError traceback."""
    url, _ = server(lambda prompt: [{"type": "text", "text": "5"}] if "2+3" in prompt else "right")
    code, report, _ = verify(url, capsys, "--niah-depths", "")
    probe = {p["name"]: p for p in report["probes"]}["add-zh"]
    assert code == 1 and probe["status"] == "error" and "content" in probe["detail"]
    assert statuses(report)["capital-zh"] == "pass"


def test_an_answer_cut_off_while_thinking_says_so(server, capsys):
    url, _ = server(lambda prompt: "think" if "backwards" in prompt else "right")
    code, report, _ = verify(url, capsys, "--niah-depths", "", "--max-tokens", "64")
    probe = {p["name"]: p for p in report["probes"]}["reverse-en"]
    assert code == 1 and probe["status"] == "fail" and "within 64 tokens" in probe["detail"]


def test_no_server_is_an_error_not_a_hang(capsys):
    code, report, _ = verify(f"http://127.0.0.1:{free_port()}", capsys)   # a port nobody listens on
    assert code == 1 and statuses(report) == {"server": "error"}


def test_a_server_that_is_not_http_is_an_error(capsys):
    """e.g. --server-url at the SSH port: a banner where a status line should be."""
    code, report, _ = verify(answering(b"SSH-2.0-OpenSSH_9.6\r\n"), capsys)
    assert code == 1 and statuses(report) == {"server": "error"}
    assert "not an HTTP answer" in report["probes"][0]["detail"]


@pytest.mark.parametrize("response, says", [
    (b"\x1b]0;pwned\x07\x1b[2J\r\n", "not an HTTP answer: BadStatusLine: \\x1b]0;pwned\\x07\\x1b[2J"),
    (http_response("500 Oops", "\x1b[2J\x9b31m gone".encode()), "HTTP 500: \\x1b[2J\\x9b31m gone"),
    (http_response("200 OK", b"[" * 100_000), "unreadable reply: b'[[[["),
    (http_response("200 OK", json.dumps({"data": [{"id": "\x1b[2Jglm"}]}).encode()), "not a printable id; pass --model"),
])
def test_what_a_server_says_reaches_the_terminal_escaped(capsys, response, says):
    """A terminal escape in a reply used to be printed as is (a server could clear or retitle the screen);
    a reply nested past the parser's limit was a RecursionError traceback."""
    assert main(["verify", "--server-url", answering(response), "--niah-depths", ""]) == 1
    out, err = capsys.readouterr()
    assert says in out and not any(c in out + err for c in "\x1b\x07\x9b"), out + err


def test_a_reply_past_the_size_cap_is_an_error_not_all_of_memory(capsys):
    """The whole reply was read into memory: a server that streams a body without end grew verify without end."""
    def flood(conn):
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
        for _ in range(256):  # MiB: without end as far as verify reads, and an end for a client without a cap
            conn.sendall(b"[" * (1 << 20))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, report, _ = verify(answering(flood), capsys, "--niah-depths", "")
    assert code == 1 and statuses(report) == {"server": "error"}
    assert report["probes"][0]["detail"].endswith(f"/v1/models: answer over the {16 << 20}-byte cap")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 64 << 10  # KiB


@pytest.mark.parametrize("at_once", [0, len(http_response("200 OK", b""))], ids=["status line and headers", "body"])
def test_a_reply_dripped_a_byte_at_a_time_times_out_by_the_probe_timeout(capsys, at_once):
    """Each byte came well within the socket's timeout, so a dripped reply held a probe as long as the server
    dripped, whatever --timeout said."""
    response = http_response("200 OK", b" " * 40)

    def drip(conn):
        conn.sendall(response[:at_once])
        for byte in response[at_once:]:
            time.sleep(0.1)
            conn.sendall(bytes([byte]))
    start = time.monotonic()
    code, report, _ = verify(answering(drip), capsys, "--niah-depths", "", "--timeout", "1")
    assert code == 1 and statuses(report) == {"server": "timeout"} and time.monotonic() - start < 2


def test_control_characters_in_an_answer_are_escaped_in_the_json_and_the_record(server, capsys, tmp_path):
    """ensure_ascii=False escaped C0 only: C1's CSI (\\x9b) and U+2028 went to the terminal, or the record, raw."""
    answer = "Paris \x1b[2J\x9b2J\u2028."
    url, _ = server(lambda prompt: answer if "France" in prompt else "right")
    ref = tmp_path / "reference.json"
    code = main(["verify", "--server-url", url, "--niah-depths", "", "--json", "--record", str(ref)])
    out = capsys.readouterr().out
    for text in (out, ref.read_text()):
        assert not any(c in text for c in "\x1b\x9b\u2028"), text
    assert code == 0 and {p["name"]: p["answer"] for p in json.loads(out)["probes"]}["capital-en"] == answer
    assert json.loads(ref.read_text())["answers"]["capital-en"] == answer


def test_record_then_compare_with_the_reference(server, capsys, tmp_path):
    ref = tmp_path / "reference.json"
    url, _ = server()
    assert verify(url, capsys, "--niah-depths", "", "--record", str(ref))[0] == 0
    assert json.loads(ref.read_text())["answers"]["capital-zh"] == "北京"
    # "北京市" still names the capital, but it is not what the reference recorded at temperature 0
    url2, _ = server(lambda p: "北京市" if "首都" in p else "right")
    code, report, _ = verify(url2, capsys, "--niah-depths", "", "--reference", str(ref))
    by_name = {p["name"]: p for p in report["probes"]}
    assert code == 1 and by_name["capital-zh"]["detail"].startswith("differs from the reference")
    assert verify(url, capsys, "--niah-depths", "", "--reference", str(ref))[0] == 0


def test_a_run_that_left_a_question_unanswered_records_nothing(server, capsys, tmp_path):
    """A dropped request left its answer out of the record, which replaced the good one: a later run on a
    healthy server then failed that probe for want of a recorded answer."""
    ref = tmp_path / "reference.json"
    ref.write_text('{"answers": {}}\n')
    url, _ = server(lambda prompt: "drop" if "9.11" in prompt else "right")
    code, _, err = verify(url, capsys, "--niah-depths", "", "--record", str(ref))
    assert code == 1 and f"not recorded to {ref}: no answer to compare-zh" in err
    assert ref.read_text() == '{"answers": {}}\n'


# /proc: os.access says yes to root there, where no file can be made
@pytest.mark.parametrize("record", ["{tmp}", "{tmp}/nodir/ref.json", "/proc/dsaops-ref.json"])
def test_an_unwritable_record_is_refused_before_any_probe(server, capsys, tmp_path, record):
    url, srv = server()
    record = record.format(tmp=tmp_path)
    assert main(["verify", "--server-url", url, "--niah-depths", "", "--record", record]) == 2
    err = capsys.readouterr().err
    assert err == f"dsaops verify: --record {record}: cannot write there; give a file in a folder you may write to\n"
    assert srv.prompts == []


def test_a_record_that_cannot_be_written_keeps_the_old_one(server, tmp_path):
    """A file-size limit below the record's size stands in for a full disk (Python ignores SIGXFSZ: the write
    raises EFBIG). It used to truncate the old reference first, then end in a traceback."""
    url, _ = server()
    ref = tmp_path / "reference.json"
    ref.write_text('{"answers": {}}\n')

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))
    done = subprocess.run([sys.executable, "-m", "dsaops", "verify", "--server-url", url, "--niah-depths", "",
                           "--record", str(ref)], capture_output=True, text=True, preexec_fn=small_files, check=False)
    errors = [line for line in done.stderr.splitlines() if line.startswith("dsaops verify:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert errors == [(f"dsaops verify: --record {ref}: cannot write {tmp_path}/.reference.json.dsaops-new: "
                       "File too large (EFBIG); nothing was changed")]
    assert ref.read_text() == '{"answers": {}}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["reference.json"]


def test_a_record_that_is_no_file_is_refused_before_any_probe(server, capsys, tmp_path):
    """The record is renamed into place: over a pipe (/dev/stdout in a shell pipeline) it would replace it."""
    url, srv = server()
    record = str(tmp_path / "pipe")
    os.mkfifo(record)
    assert main(["verify", "--server-url", url, "--niah-depths", "", "--record", record]) == 2
    assert "cannot write there" in capsys.readouterr().err and srv.prompts == []


def test_bad_reference_and_depths_say_what_to_change(tmp_path, capsys):
    (tmp_path / "r.json").write_text("{}")
    assert main(["verify", "--server-url", "http://127.0.0.1:9", "--reference", str(tmp_path / "r.json")]) == 2
    assert "--record" in capsys.readouterr().err
    assert main(["verify", "--server-url", "http://127.0.0.1:9", "--niah-depths", "16k"]) == 2
    assert "comma-separated" in capsys.readouterr().err


@pytest.mark.parametrize("content, says", [
    ("[" * 100_000, "is not JSON (it nests deeper than the parser follows): record one with --record FILE"),
    ('{"answers": {"capital-zh": 5}}', "has no \"answers\" object of probe names to answer strings"),
    ('{"answers": ["北京"]}', "has no \"answers\" object of probe names to answer strings"),
])
def test_a_reference_that_is_not_one_is_refused_before_any_probe(server, capsys, tmp_path, content, says):
    """A nesting past the parser's limit was a RecursionError traceback; an answer that is no string was an
    AttributeError in the probe, after the run."""
    url, srv = server()
    (tmp_path / "r.json").write_text(content)
    assert main(["verify", "--server-url", url, "--niah-depths", "", "--reference", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsaops verify: the reference {tmp_path / 'r.json'} ") and says in err, err
    assert len(err.splitlines()) == 1 and srv.prompts == []


def test_a_depth_past_the_bound_is_refused_before_any_probe(server, capsys):
    """A depth is a prompt built in memory: 10**11 tokens asked for 400 GB before the server could refuse it."""
    from dsaops.verify import MAX_NIAH_DEPTH

    url, srv = server()
    assert main(["verify", "--server-url", url, "--niah-depths", f"64,{10**11}"]) == 2
    assert capsys.readouterr().err == (f"dsaops verify: each --niah-depths value must be at most {MAX_NIAH_DEPTH} "
                                       f"tokens, got {10**11}\n")
    assert srv.prompts == []


@pytest.mark.parametrize("argv, says", [
    (["--niah-depths", "\u0666\u0664"], "--niah-depths takes comma-separated whole numbers"),   # int() reads 64
    (["--niah-depths", "64", "--timeout", "1000000", "--niah-timeout-per-ktok", "1000000"],
     "comes to 1064000 s, more than 1000000; lower one of them"),
])
def test_numbers_that_int_or_a_socket_cannot_take_are_refused_before_any_probe(server, capsys, argv, says):
    """A socket timeout past time_t (16777216 tokens at these timeouts) was an OverflowError traceback after
    the answer probes had run."""
    url, srv = server()
    assert main(["verify", "--server-url", url, *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.splitlines()) == 1 and srv.prompts == [], err


def refused(capsys, *argv) -> str:
    """The one error line of an argument that argparse refuses (exit 2, no traceback)."""
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err, err
    return err.splitlines()[0]


@pytest.mark.parametrize("url, says", [
    ("HEAD", "is not an http(s) URL with a host"),
    ("http://127.0.0.1:abc", "is not a valid URL (Port could not be cast"),
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://[::1", "is not a valid URL (Invalid IPv6 URL)"),
    ("http://a..b:30000", "empty or too long label"),
    ("http://127.0.0.1:30000/a b", "space or control character"),
])
def test_a_malformed_server_url_is_refused_before_any_probe(capsys, url, says):
    line = refused(capsys, "verify", "--server-url", url, "--niah-depths", "")
    assert line.startswith("dsaops verify: argument --server-url:") and says in line and "http://HEAD:30000" in line


@pytest.mark.parametrize("flag, value", [
    ("--timeout", "-1"), ("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "1e12"), ("--timeout", "0"),
    ("--timeout", "soon"), ("--niah-timeout-per-ktok", "-1000000"), ("--niah-timeout-per-ktok", "nan"),
])
def test_seconds_must_be_positive_and_finite(server, capsys, flag, value):
    url, srv = server()
    line = refused(capsys, "verify", "--server-url", url, "--niah-depths", "64", flag, value)
    assert line == f"dsaops verify: argument {flag}: must be a positive number of seconds up to 1000000, got {value}"
    assert srv.prompts == []                                          # refused before any probe ran


@pytest.mark.parametrize("url", ["HEAD/v1/models", "http://a..b:1/v1/models", "{listener}/a b"])
def test_a_url_http_client_cannot_use_is_a_probe_error(url):
    with pytest.raises(vp.ProbeError, match="bad URL"):  # the path is checked once connected: someone listens
        vp.get_json(url.format(listener=answering(b"")), timeout=1)


@pytest.mark.parametrize("depth", [256, 16384])
def test_haystack_is_deterministic_and_about_depth_tokens(depth):
    for position in vp.NIAH_POSITIONS:
        prompt, passphrase = vp.haystack(depth, position)
        assert (prompt, passphrase) == vp.haystack(depth, position)
        assert abs(len(prompt) / vp.CHARS_PER_TOKEN - depth) < 0.02 * depth + 20
        where = prompt.index(passphrase) / len(prompt)
        assert {"begin": where < 0.05, "middle": 0.4 < where < 0.6, "end": where > 0.9}[position]
    assert len({vp.haystack(depth, p)[1] for p in vp.NIAH_POSITIONS}) == 3


def test_answer_matching_is_strict_about_tokens():
    assert vp.matches("The answer is 9.8.", "9.8") and not vp.matches("9.85", "9.8")
    assert vp.matches("5", "5") and not vp.matches("15", "5") and not vp.matches("2.5", "5")
    assert vp.matches("北京", "北京") and vp.matches("paris", "Paris")
