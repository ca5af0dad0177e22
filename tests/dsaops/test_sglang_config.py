"""dsaops.sglang_config: the launch arguments with SGLang's --config YAML merged in, compared with what
the pinned SGLang's own merger (srt/utils/server_args_config_parser.py) makes of the same files."""
import pytest
import yaml

from dsaops.sglang_config import Merged, merged, unread_config
from tests.support.sglang_definitions import parse_server_args

FLAGS = ("--model-path", "--api-key", "--host", "--port", "--served-model-name", "--json-model-override-args")


def write(tmp_path, text, name="sglang.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, argv", [
    ("port: 8000\nhost: 10.0.0.5\napi-key: k\n", ["--model-path", "/m", "--config", "{}"]),
    ("port: 8000\n", ["--model-path", "/m", "--config", "{}", "--port", "30000"]),      # the command line last
    ("por: 8000\nserved-model-name: [a]\n", ["--config", "{}", "--model-path", "/m"]),
    ("json-model-override-args: {a: 1}\nhost: '::1'\n", ["--model-path", "/m", "--config", "{}"]),
    ("", ["--model-path", "/m", "--config", "{}"]),
    ("port: 8000\n", ["--model-path", "/m", "--config={}"]),                            # not read by SGLang
])
def test_the_merge_is_sglangs(tmp_path, text, argv):
    path = write(tmp_path, text)
    argv = [arg.format(path) for arg in argv]
    ours = merged(argv)
    assert ours.args == parse_server_args(argv, FLAGS)[1]
    assert ours.config == (path if "--config" in argv else None)
    assert ours.args[ours.from_config:] == [arg for arg in argv if ours.config is None or arg not in ("--config", path)]


@pytest.mark.parametrize("name, text, argv", [
    ("sglang.txt", "port: 8000\n", ["--config", "{}"]),
    ("sglang.yaml", "port: [8000\n", ["--config", "{}"]),
    ("sglang.yaml", "- port\n", ["--config", "{}"]),
    ("sglang.yaml", "port: 8000\n", ["--config", "{}", "--config", "{}"]),
    ("sglang.yaml", "port: 8000\n", ["--config", "{}x"]),
    ("sglang.yaml", "port: 8000\n", ["--model-path", "/m", "--config"]),
])
def test_a_file_sglang_refuses_is_left_out(tmp_path, name, text, argv):
    """SGLang stops on these with its own message; the arguments stay as they are."""
    argv = [arg.format(write(tmp_path, text, name)) for arg in argv]
    with pytest.raises((ValueError, yaml.YAMLError)):
        parse_server_args(argv, FLAGS)
    assert merged(argv) == Merged(argv)


@pytest.mark.parametrize("argv", [["--config={}"], ["--conf", "{}"], ["--confi={}"]])
def test_a_config_spelling_sglang_takes_but_does_not_read_is_named(tmp_path, argv):
    """SGLang parses these as --config and applies none of the file: its API key stays unset."""
    argv = [arg.format(write(tmp_path, "api-key: k\n")) for arg in argv]
    assert parse_server_args(argv, FLAGS)[0].api_key is None
    assert unread_config(["--model-path", "/m", *argv]) == argv[0]


@pytest.mark.parametrize("argv", [["--config", "f.yaml"], ["--model-path", "/m"], ["--context-length", "8"]])
def test_a_config_sglang_reads_is_not_named(argv):
    assert unread_config(argv) is None
