"""The API keys through SGLang's own code: the config file the playbooks mount (`--config`), SGLang's
config merger and auth middleware from the pinned wheel, and patch 0007's redaction of both keys.

SGLang's parser is stood in by an argparse parser with the pinned wheel's own flag names (the real
one is built from ~60 modules); the merger (srt/utils/server_args_config_parser.py) and the middleware
(srt/utils/auth.py, "lightweight so it can be used in unit tests") are SGLang's files, loaded as they
are, on a real Starlette app whose routes and auth levels are read from the pinned http_server.py.
"""
from __future__ import annotations

import ast
import asyncio
import copy
import dataclasses
import json
import pickle
from types import SimpleNamespace

import msgspec
import pytest
import yaml

from tests.support.sglang_definitions import lift, parse_server_args, sglang_module, source_file

CORE = "sglang/srt/sampling/watermarking/core.py"
API_KEY = "the-api-key-0123456789abcdefghij"
ADMIN_KEY = "the-admin-key-0123456789abcdefgh"


def config_file(tmp_path):
    """What the sglang_server role writes (templates/sglang-secrets.yaml.j2): the two keys, YAML."""
    path = tmp_path / "sglang-secrets.yaml"
    path.write_text(yaml.safe_dump({"api-key": API_KEY, "admin-api-key": ADMIN_KEY}))
    return path


def test_the_keys_reach_sglang_only_through_the_config_file(tmp_path):
    argv = ["--model-path", "/models/GLM-5.3-Flash", "--port", "30000", "--config", str(config_file(tmp_path))]
    args, merged = parse_server_args(argv)
    assert (args.api_key, args.admin_api_key) == (API_KEY, ADMIN_KEY)
    assert API_KEY not in " ".join(argv) and ADMIN_KEY not in " ".join(argv)   # the command line `ps` shows
    assert API_KEY in merged        # SGLang's launch_command is the merged list: the patch must redact it


def redaction(root):
    """redact_watermark_secrets and redact_watermark_command_line out of `root`'s core.py."""
    class WatermarkServerConfig(msgspec.Struct):   # config.py's; no value here is one
        pass
    ns = lift(root / CORE, ["WatermarkRequestConfig"], {"msgspec": msgspec, "Optional": None})
    names = ["WATERMARK_SECRET_FIELD_NAMES", "WATERMARK_CONTAINER_FIELD_NAMES", "_SCALAR_TYPES",
             "redact_watermark_secrets", "redact_watermark_command_line"]
    source = (root / CORE).read_text()
    names = [n for n in ("API_KEY_FIELD_NAMES", "SECRET_FLAGS") if f"\n{n} = " in source] + names
    ns = lift(root / CORE, names, {**ns, "copy": copy, "dataclasses": dataclasses, "msgspec": msgspec,
                                   "WatermarkServerConfig": WatermarkServerConfig})
    return ns["redact_watermark_secrets"], ns["redact_watermark_command_line"]


def server_info(root, tmp_path) -> str:
    """/server_info as http_server.server_info builds it (build_server_info: the resolved fields, whose names
    are ServerArgs' field names, launch_command, scheduler info), redacted by `root`'s core.py, as JSON."""
    secrets, command_line = redaction(root)
    args, merged = parse_server_args(["--model-path", "/models/x", "--config", str(config_file(tmp_path))])
    info = {**vars(args), "launch_command": command_line(merged, None), "max_total_num_tokens": 4922240,
            "internal_states": [{"memory_usage": {"token_capacity": 4922240}}], "version": "x.y.z"}
    return json.dumps(secrets(info))


def test_patched_server_info_carries_neither_key(patched_root, tmp_path):
    body = server_info(patched_root, tmp_path)
    assert API_KEY not in body and ADMIN_KEY not in body
    info = json.loads(body)
    assert info["api_key"] == info["admin_api_key"] == "<redacted>"
    assert "--api-key <redacted>" in info["launch_command"] and "--admin-api-key <redacted>" in info["launch_command"]
    assert info["model_path"] == "/models/x" and info["internal_states"][0]["memory_usage"]["token_capacity"] == 4922240
    _, command_line = redaction(patched_root)
    assert command_line(["--api-key=abc", "--watermark-config", "w", "--port", "1"], None) == \
        "--api-key=<redacted> --watermark-config <redacted> --port 1"


def test_patched_launch_command_redacts_abbreviated_key_flags(patched_root):
    """`sglang serve`'s parser takes any unambiguous prefix of a flag (argparse's allow_abbrev), so
    `--api-ke K` sets the API key: launch_command must not show K either."""
    argv = ["--model-path", "/models/x", "--api-ke", API_KEY, f"--admin-api={ADMIN_KEY}"]
    args, _ = parse_server_args(argv)
    assert (args.api_key, args.admin_api_key) == (API_KEY, ADMIN_KEY)
    _, command_line = redaction(patched_root)
    assert command_line(argv, None) == "--model-path /models/x --api-ke <redacted> --admin-api=<redacted>"


def test_pristine_server_info_gives_both_keys_away(pristine_root, tmp_path):
    """Control: 0.5.23 as shipped returns both keys, in the fields and in launch_command."""
    body = server_info(pristine_root, tmp_path)
    assert json.loads(body)["api_key"] == API_KEY and f"--admin-api-key {ADMIN_KEY}" in body


def test_patched_server_args_repr_hides_both_keys(patched_root, pristine_root):
    fields = [SimpleNamespace(name=name) for name in ("api_key", "admin_api_key", "port")]
    args = SimpleNamespace(api_key=API_KEY, admin_api_key=ADMIN_KEY, port=30000)
    for root, hidden in ((patched_root, True), (pristine_root, False)):
        ns = lift(root / "sglang/srt/server_args.py", ["ServerArgs.__repr__"], {"record_fields": lambda cls: fields})
        text = ns["__repr__"](args)
        assert (API_KEY in text) is not hidden and (ADMIN_KEY in text) is not hidden and "port=30000" in text


class DumpedServerArgs(SimpleNamespace):
    """ServerArgs as a dump sees it: the fields as attributes, resolved_dict() their values."""
    def resolved_dict(self):
        return dict(vars(self))


@pytest.mark.parametrize("watermark", [False, True])
def test_patched_dumps_carry_neither_key(patched_root, pristine_root, tmp_path, watermark):
    """The server_args entry of a request or crash dump (TokenizerManager._server_args_for_dump), pickled
    as _dump_data_to_file does; 0.5.23 carries both keys, pickling ServerArgs whole unless watermarking is on."""
    args, _ = parse_server_args(["--model-path", "/models/x", "--config", str(config_file(tmp_path))])
    features = SimpleNamespace(features=SimpleNamespace(enable_watermark=watermark))
    for root, hidden in ((patched_root, True), (pristine_root, False)):
        ns = lift(root / "sglang/srt/managers/tokenizer_manager.py", ["TokenizerManager._server_args_for_dump"],
                  {"get_exec": lambda: features, "redact_watermark_secrets": redaction(root)[0]})
        dumped = ns["_server_args_for_dump"](SimpleNamespace(server_args=DumpedServerArgs(**vars(args))))
        body = pickle.dumps({"server_args": dumped})
        assert (API_KEY.encode() in body) is not hidden and (ADMIN_KEY.encode() in body) is not hidden, root
        assert b"/models/x" in body


# ---------------------------------------------------------------- SGLang's auth middleware

def routes():
    """{path: auth level name or None} of the pinned http_server.py's endpoints (decorators read from the source)."""
    tree = ast.parse(source_file("srt/entrypoints/http_server.py").read_text())
    found = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        level, paths = None, []
        for d in node.decorator_list:
            if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "auth_level":
                level = d.args[0].attr
            elif (isinstance(d, ast.Call) and getattr(getattr(d.func, "value", None), "id", "") == "app" and d.args
                  and isinstance(d.args[0], ast.Constant)):
                paths.append(ast.literal_eval(d.args[0]))
        found.update({path: level for path in paths})
    return found


def app_with_sglang_auth(api_key, admin_api_key):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    auth = sglang_module("srt/utils/auth.py")
    table = routes()

    def endpoint(level):
        async def answer(request):
            return PlainTextResponse("ok")
        return auth.auth_level(auth.AuthLevel[level])(answer) if level else answer

    app = Starlette(routes=[Route(path, endpoint(level), methods=["GET", "POST"]) for path, level in table.items()]
                    + [Route("/metrics", endpoint(None))])        # SGLang mounts prometheus_client's app there
    auth.add_api_key_middleware(app, api_key=api_key, admin_api_key=admin_api_key)
    return app, table


def request(app, method: str, path: str, key: str | None = None) -> int:
    """One HTTP request through the ASGI app: the status code."""
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
             "client": ("10.0.0.9", 50000), "server": ("10.0.0.1", 30000)}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def test_sglang_refuses_requests_without_the_key_and_admits_them_with_it(tmp_path):
    args, _ = parse_server_args(["--model-path", "/models/x", "--config", str(config_file(tmp_path))])
    app, table = app_with_sglang_auth(args.api_key, args.admin_api_key)
    assert table["/generate"] is None and table["/v1/chat/completions"] is None          # NORMAL
    assert table["/update_weights_from_disk"] == "ADMIN_OPTIONAL"
    for path in ("/generate", "/v1/chat/completions", "/server_info", "/v1/models"):
        assert request(app, "POST", path) == 401, path
        assert request(app, "POST", path, ADMIN_KEY) == 401, path      # the admin key is not the API key
        assert request(app, "POST", path, API_KEY) == 200, path
    for path in ("/update_weights_from_disk", "/flush_cache"):
        assert request(app, "POST", path) == 401, path
        assert request(app, "POST", path, API_KEY) == 401, path        # with both keys set, admin needs admin's
        assert request(app, "POST", path, ADMIN_KEY) == 200, path
    for path in ("/health", "/health_generate", "/metrics"):             # health checks and Prometheus need no key
        assert request(app, "GET", path) == 200, path


def test_without_keys_sglang_lets_anyone_in():
    """Control: what a deployment without keys gave the network (SGLang adds no middleware then)."""
    app, _ = app_with_sglang_auth(None, None)
    assert request(app, "POST", "/generate") == 200 and request(app, "POST", "/update_weights_from_disk") == 200


@pytest.mark.parametrize("key", [API_KEY, "wrong-key"])
def test_a_wrong_key_is_refused(key):
    app, _ = app_with_sglang_auth(API_KEY, ADMIN_KEY)
    assert request(app, "POST", "/generate", key) == (200 if key == API_KEY else 401)
