"""Acceptance probes against an OpenAI-compatible endpoint (stdlib only).

Two kinds: temperature-0 answers on a fixed prompt set (each checked against its expected
answer and, with a reference, against the recorded answer), and needle-in-a-haystack
recall at a few depths with the needle at the beginning, middle and end. Every probe has
its own timeout, over its whole request (dsaops.fetch: connect to the reply's last byte, at
most MAX_REPLY bytes of it), and ends in one status: pass, fail (a wrong answer), timeout or
error (HTTP error, dropped or refused connection, unreadable or oversized reply).
"""
from __future__ import annotations

import http.client
import json
import random
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from dsaops import fetch
from dsaops.api_key import headers as api_key_headers
from dsaops.plan_input import parse_json

# (id, prompt, expected answer). The first three are the parity prompts of the 8xH20 report.
PROMPTS = (
    ("capital-zh", "中国的首都是哪里?只回答城市名。", "北京"),
    ("add-zh", "2+3等于几?只回答数字。", "5"),
    ("compare-zh", "9.11和9.8哪个大?只回答数字。", "9.8"),
    ("capital-en", "What is the capital of France? Answer with the city name only.", "Paris"),
    ("reverse-en", "Write the word 'needle' backwards. Answer with the reversed word only.", "eldeen"),
)
NIAH_POSITIONS = ("begin", "middle", "end")
NIAH_QUESTION = "What is the secret passphrase mentioned in the text above? Answer with the passphrase only."
CHARS_PER_TOKEN = 4        # English filler: depth in tokens is approximate
HEARTBEAT_S = 15          # progress lines while a long probe waits
# the most of a reply read: a whole 128k-token context of answer and reasoning (~12 bytes a token as
# JSON) is ~3 MiB, and bench reads /server_info through here too, which the exporter caps at 8 MiB
MAX_REPLY = 16 << 20
# what a failed request says, by the failure's cause; the first match wins (InvalidURL is an
# HTTPException, RemoteDisconnected a ConnectionError and an HTTPException)
_FAILURES = (
    ((ValueError, http.client.InvalidURL), "bad URL"),                    # scheme, port, host, a space
    (ConnectionRefusedError, "cannot connect"),
    ((ConnectionError, http.client.IncompleteRead), "connection dropped"),
    (http.client.HTTPException, "not an HTTP answer"),                    # e.g. SSH's banner
    (TimeoutError, "no answer in time"),
    (OSError, "cannot connect"),                                          # no such host, no route
)

_SUBJECTS = ("The harbour master", "A quiet librarian", "The old engineer", "Our neighbour", "The river pilot",
             "A travelling painter", "The night baker", "The station clerk", "A patient gardener", "The ferry cook")
_VERBS = ("counted", "repaired", "painted", "described", "carried", "measured", "sorted", "borrowed", "noticed", "wrapped")
_OBJECTS = ("seven wooden crates", "the brass compass", "a map of the valley", "twelve clay bowls", "the spare lantern",
            "a basket of pears", "the broken clock", "three blue ribbons", "the heavy ledger", "a pair of boots")
_PLACES = ("before dawn", "near the old mill", "after the market closed", "beside the canal", "during the long rain",
           "under the bridge", "at the edge of town", "in the cold cellar", "on the upper deck", "by the north gate")
_NEEDLE_WORDS = ("amber", "cobalt", "falcon", "juniper", "lantern", "meadow", "orchid", "quartz", "saffron", "tundra")


@dataclass
class ProbeResult:
    name: str
    kind: str                 # answer | niah
    status: str               # pass | fail | timeout | error
    detail: str
    seconds: float
    answer: str | None = None
    expected: str | None = None
    extra: dict = field(default_factory=dict)


class ProbeError(Exception):
    """The request did not produce an answer: `status` is timeout, error, or fail (no answer in the budget)."""

    def __init__(self, status: str, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


# ---------------------------------------------------------------- HTTP client

def printable(text: str) -> str:
    """`text` with each control or other unprintable character escaped as repr writes it: a server's
    words reach the terminal, where ESC [ ... would recolour, move or retitle it."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def failure(e: fetch.FetchError) -> str:
    """A failed request in words, by its cause (_FAILURES), escaped; the cap's own words without one."""
    what = next((what for kinds, what in _FAILURES if isinstance(e.__cause__, kinds)), None)
    return printable(f"{what}: {type(e.__cause__).__name__}: {e.__cause__}" if what else str(e))


def _request(url: str, payload: dict | None, timeout: float, api_key: str | None = None) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    headers = ({"Content-Type": "application/json"} if data else {}) | api_key_headers(api_key)
    try:
        status, body = fetch.request(url, deadline_s=timeout, max_bytes=MAX_REPLY, headers=headers, data=data)
    except fetch.FetchError as e:
        if isinstance(e.__cause__, TimeoutError):
            raise ProbeError("timeout", f"no answer within {timeout:g} s") from None
        raise ProbeError("error", failure(e)) from None
    if not 200 <= status < 300:
        raise ProbeError("error", f"HTTP {status}: {printable(body[:300].decode(errors='replace').strip())}")
    try:
        return parse_json(body)
    except ValueError:
        raise ProbeError("error", f"unreadable reply: {body[:200]!r}") from None


def get_json(url: str, timeout: float, api_key: str | None = None) -> dict:
    """GET a JSON document; ProbeError when there is none."""
    return _request(url, None, timeout, api_key)


def server_model(server_url: str, timeout: float, api_key: str | None = None) -> str:
    """The first model the server lists (/v1/models)."""
    reply = get_json(server_url.rstrip("/") + "/v1/models", timeout, api_key)
    try:
        model = reply["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise ProbeError("error", f"/v1/models lists no model: {str(reply)[:200]}") from None
    if not isinstance(model, str) or not model or not model.isprintable():
        raise ProbeError("error", f"/v1/models names its first model {str(model)[:200]!r}, not a printable id; "
                                  "pass --model")
    return model


def chat(server_url: str, model: str, prompt: str, *, max_tokens: int, timeout: float,
         api_key: str | None = None) -> str:
    """The final answer of one temperature-0 chat completion (after any </think>)."""
    reply = _request(server_url.rstrip("/") + "/v1/chat/completions",
                     {"model": model, "messages": [{"role": "user", "content": prompt}],
                      "temperature": 0, "max_tokens": max_tokens}, timeout, api_key)
    try:
        choice = reply["choices"][0]
        content = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ProbeError("error", f"reply has no choices[0].message: {str(reply)[:200]}") from None
    if not isinstance(content, str):
        raise ProbeError("error", f"choices[0].message.content is not text: {str(content)[:200]}")
    answer = content.rsplit("</think>", 1)[-1].strip()
    if not answer and choice.get("finish_reason") == "length":
        # a reasoning model (--reasoning-parser) still thinking: content is empty, reasoning_content is not
        raise ProbeError("fail", f"no answer within {max_tokens} tokens (still thinking): raise --max-tokens")
    return answer


# ---------------------------------------------------------------- checks

def normalize(text: str) -> str:
    return text.strip().strip("。.!！ \n\"'“”").casefold()


def matches(answer: str, expected: str) -> bool:
    """The expected answer as a whole ASCII token (9.8 not inside 9.85, 5 not in 15); CJK as a substring."""
    pattern = r"(?<![0-9a-z.])" + re.escape(expected.casefold()) + r"(?![0-9a-z])"
    return re.search(pattern, answer.casefold()) is not None


def haystack(depth_tokens: int, position: str) -> tuple[str, str]:
    """A deterministic prompt of about depth_tokens tokens with the needle at `position`."""
    rng = random.Random(f"dsaops-niah-{depth_tokens}-{position}")
    passphrase = f"{rng.choice(_NEEDLE_WORDS)}-{rng.randrange(1000, 10000)}"
    needle = f"The secret passphrase is {passphrase}."
    budget = max(depth_tokens * CHARS_PER_TOKEN - len(needle) - len(NIAH_QUESTION), 0)
    sentences, size = [], 0
    while size < budget:
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_PLACES)}."
        sentences.append(s)
        size += len(s) + 1
    at = {"begin": 0, "middle": len(sentences) // 2, "end": len(sentences)}[position]
    sentences.insert(at, needle)
    return " ".join(sentences) + "\n\n" + NIAH_QUESTION, passphrase


# ---------------------------------------------------------------- running

def _timed(name: str, kind: str, timeout: float, progress, fn) -> ProbeResult:
    """Run one probe with a heartbeat on long waits; fn() -> (status, detail, answer, expected)."""
    start = time.monotonic()
    done = threading.Event()

    def heartbeat():
        while not done.wait(HEARTBEAT_S):
            progress(f"    ... {name}: waiting {time.monotonic() - start:.0f} s of {timeout:g} s")

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        status, detail, answer, expected = fn()
    except ProbeError as e:
        status, detail, answer, expected = e.status, e.detail, None, None
    finally:
        done.set()
    return ProbeResult(name, kind, status, detail, round(time.monotonic() - start, 2), answer, expected)


def answer_probe(server_url, model, probe_id, prompt, expected, *, reference: dict | None, max_tokens, timeout,
                 progress, api_key: str | None = None) -> ProbeResult:
    def fn():
        answer = chat(server_url, model, prompt, max_tokens=max_tokens, timeout=timeout, api_key=api_key)
        if not matches(answer, expected):
            return "fail", f"expected {expected!r}", answer, expected
        if reference is not None:
            recorded = reference.get(probe_id)
            if recorded is None:
                return "fail", "no recorded answer in the reference", answer, expected
            if normalize(answer) != normalize(recorded):
                return "fail", f"differs from the reference {recorded!r}", answer, recorded
            return "pass", "matches the reference", answer, recorded
        return "pass", "expected answer", answer, expected
    return _timed(probe_id, "answer", timeout, progress, fn)


def niah_probe(server_url, model, depth, position, *, max_tokens, timeout, progress,
               api_key: str | None = None) -> ProbeResult:
    prompt, passphrase = haystack(depth, position)

    def fn():
        answer = chat(server_url, model, prompt, max_tokens=max_tokens, timeout=timeout, api_key=api_key)
        if passphrase.casefold() not in answer.casefold():
            return "fail", "needle not recalled", answer, passphrase
        return "pass", "needle recalled", answer, passphrase
    result = _timed(f"niah-{depth}-{position}", "niah", timeout, progress, fn)
    result.extra = {"depth_tokens": depth, "position": position, "prompt_chars": len(prompt)}
    return result


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def summary_table(results: list[ProbeResult]) -> str:
    rows = [("probe", "status", "seconds", "detail")]
    rows += [(r.name, r.status.upper(), f"{r.seconds:.1f}", r.detail + (f" (answer {r.answer[:60]!r})"
             if r.status == "fail" and r.answer is not None else "")) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}  {d}" for a, b, c, d in rows]
    passed = sum(r.status == "pass" for r in results)
    lines.append(f"{passed}/{len(results)} probes passed")
    return "\n".join(lines)


def as_dicts(results: list[ProbeResult]) -> list[dict]:
    return [asdict(r) for r in results]
