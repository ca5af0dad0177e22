"""What bench serve takes from the pinned SGLang wheel, found in the wheel: the load generator's
flags and result keys, and the /server_info keys the cap is read from. A bump that changes one
fails here."""
from __future__ import annotations

import re

import pytest

from dsaops.bench import generator
from tests.support.sglang_wheel import sglang_source

SERVING = "benchmark/serving.py"


@pytest.fixture(scope="module")
def serving() -> str:
    return (sglang_source() / "sglang" / SERVING).read_text()


def _flags() -> list[str]:
    argv = generator.arguments(server_url="http://h:1", model="m", tokenizer="t", concurrency=1, requests=2,
                               input_len=3, output_len=4, output_file="f")
    return [a for a in argv if a.startswith("--")]


@pytest.mark.parametrize("flag", _flags())
def test_each_flag_is_the_generators(serving, flag):
    assert f'"{flag}"' in serving, f"sglang 0.5.23 {SERVING} has no {flag}"


def test_its_command_line_is_cli_main_over_sys_argv(serving):
    """The driver runs one level per call of cli_main, with sys.argv set to that level's arguments."""
    main = serving[serving.index("\ndef cli_main():"):]
    assert "args = parser.parse_args()\n" in main and "run_benchmark(args)" in main
    assert 'if __name__ == "__main__":\n    cli_main()' in serving


def test_the_module_path_and_backend(serving):
    assert (sglang_source() / "sglang" / (generator.MODULE.split(".", 1)[1].replace(".", "/") + ".py")).is_file()
    assert '"sglang-oai": "/v1/completions"' in serving           # the OpenAI-compatible completions API
    assert '"random-ids": RandomDataset' in (sglang_source() / "sglang/benchmark/datasets/__init__.py").read_text()
    assert 'random_sample=(args.dataset_name == "random")' in (
        sglang_source() / "sglang/benchmark/datasets/random.py").read_text()  # random-ids downloads nothing
    assert 'os.environ.get("OPENAI_API_KEY")' in serving and '"Authorization": f"Bearer {openai_api_key}"' in serving


@pytest.mark.parametrize("key", [k for k in generator.RESULT_KEYS if k != "errors"])
def test_each_result_key_is_written(serving, key):
    assert re.search(rf'"{key}": (metrics\.|benchmark_duration)', serving), f"{SERVING} no longer writes {key!r}"


def test_per_request_errors_are_in_the_details(serving):
    assert '"errors": [output.error for output in outputs]' in serving
    assert "result_for_dump = result | result_details" in serving


def test_the_driver_sees_each_requests_outcome(serving):
    """The driver wraps the request functions to keep a failed request's error: benchmark() looks its
    function up in ASYNC_REQUEST_FUNCS on each run, and each output says whether it succeeded and why not."""
    assert "        request_func = ASYNC_REQUEST_FUNCS[backend]\n" in serving
    output = serving[serving.index("\nclass RequestFuncOutput:"):]
    output = output[:output.index("\n\n\n")]
    assert "    success: bool = False\n" in output and '    error: str = ""\n' in output


def test_server_info_keys_the_cap_reads():
    """Besides the exporter's keys (tests/healthchecks/test_contract.py): the tokenizer's folder."""
    fields = (sglang_source() / "sglang/srt/arg_groups/fields").glob("*.py")
    text = "\n".join(f.read_text() for f in fields)
    for key in ("tokenizer_path", "model_path", "dp_size"):
        assert re.search(rf"^    {key}: ", text, re.MULTILINE), f"/server_info has no {key!r} in 0.5.23"


def test_negative_control_a_flag_it_lacks_is_caught(serving):
    assert '"--duration"' not in serving   # why the sweep sizes levels by request count and a wall limit
