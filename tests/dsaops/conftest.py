"""The core package's test parts: a copy of the pinned wheel with the dsaops patch series
applied (`dsaops patches apply`, made once per session: the planner and the boot gate describe
the patched image); and bench's: the stand-in OpenAI server as a real process, the pinned
wheel's load generator on PYTHONPATH, and a small real tokenizer (the generator's prompts)."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from dsaops.sglang_patches.series import load

from dsaops.cli import main
from tests.dsaops import sglang_bench
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.sglang_wheel import sparse_copy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def patched_root(tmp_path_factory):
    """The files the series touches, patched (the tests here read no other SGLang file from it)."""
    root = sparse_copy(tmp_path_factory.mktemp("patched-sglang"), load())
    assert main(["patches", "apply", "--sglang-root", str(root)]) == 0
    return root


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def standin(tmp_path):
    """start(**options) -> URL of a stand-in server; every one is stopped after the test."""
    procs = []

    def start(*, max_running=4, token_latency=0.005, answers=None, server_info=None, api_key=None, stall=False,
              fail_after=None):
        port = free_port()
        argv = [sys.executable, "-m", "tests.dsaops.standin_openai", "--port", str(port), "--max-running", str(max_running),
                "--token-latency", str(token_latency)]
        for flag, value in (("--answers", answers), ("--server-info", server_info)):
            if value is not None:
                path = tmp_path / f"{flag[2:]}-{port}.json"
                path.write_text(json.dumps(value))
                argv += [flag, str(path)]
        if api_key is not None:
            path = tmp_path / f"key-{port}"
            path.write_text(api_key)
            argv += ["--api-key-file", str(path)]
        if stall:
            argv.append("--stall")
        if fail_after is not None:
            argv += ["--fail-after", str(fail_after)]
        procs.append(subprocess.Popen(argv, cwd=REPO))     # -m: the repository root on its path
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _healthy(url), timeout=15), "the stand-in server did not start"
        return url

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def generator_path(tmp_path_factory) -> str:
    return str(sglang_bench.lay_out(tmp_path_factory.mktemp("sglang-bench")))


@pytest.fixture
def with_generator(generator_path, monkeypatch):
    """The load generator importable here (sys.path) and in the children dsaops starts (PYTHONPATH)."""
    monkeypatch.syspath_prepend(generator_path)
    monkeypatch.setenv("PYTHONPATH", generator_path)
    return generator_path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    """A word-level tokenizer saved as a Hugging Face tokenizer folder (tokenizer.json and config)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
             "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform",
             "victor", "whiskey", "xray", "yankee", "zulu"]
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(str(folder))
    return str(folder)
