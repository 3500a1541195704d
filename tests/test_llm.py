"""memcli.llm on both of its paths, against the loopback server: OpenAI-compatible models through
memcli.openai_client (httpx, no litellm) and the other providers through litellm. Each behaviour
is checked on both, and the two must agree (the same requests, replies, error kinds and hints)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from memcli import llm as llm_module
from memcli.credentials import MASK
from memcli.errors import ProviderError
from memcli.llm import (
    Hangup,
    LLMConfig,
    ToolCall,
    complete,
    refuses_tools,
    stream,
    supports_schema,
    supports_tools,
)

HI = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "add_fact",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}
#: An extra setting only litellm knows (litellm's own retry count, 0 as memcli sets it anyway):
#: a config with it goes through litellm, the same model without it through the light client.
LITELLM_ONLY = {"num_retries": 0}


@pytest.fixture(params=["light", "litellm"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on both paths. On the light one, importing litellm fails the test."""
    if request.param == "light":

        def no_litellm() -> Any:
            raise AssertionError("the OpenAI-compatible path imported litellm")

        monkeypatch.setattr(llm_module, "load_litellm", no_litellm)
    return str(request.param)


def config(server: Any, path: str, model: str = "openai/test", **options: Any) -> LLMConfig:
    extra = dict(options.pop("extra", {}))
    if path == "litellm":
        extra |= LITELLM_ONLY
    return LLMConfig(model, api_base=server.api_base, extra=extra, **options)


def test_a_streamed_reply_arrives_in_pieces(llm: Any, path: str) -> None:
    llm.script({"content": "Hello there, nice to meet you."})
    pieces = list(stream(config(llm, path, timeout=30), HI))
    assert len(pieces) > 1 and "".join(str(p) for p in pieces) == "Hello there, nice to meet you."
    (request,) = llm.requests
    assert request["stream"] is True and request["model"] == "test"
    assert request["messages"] == HI
    assert llm.paths == ["/v1/chat/completions"]


def test_the_key_sent_to_a_local_server(
    llm: Any, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key: "not-needed" (local servers take any); OPENAI_API_KEY when set; the config's first."""
    list(stream(config(llm, path, timeout=30), HI))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    complete(config(llm, path, timeout=30), HI)
    complete(config(llm, path, timeout=30, api_key="sk-given"), HI)
    assert llm.authorizations == ["Bearer not-needed", "Bearer sk-from-env", "Bearer sk-given"]


def test_a_whole_reply_with_max_tokens_and_a_schema(llm: Any, path: str) -> None:
    llm.script({"content": '{"facts": []}'})
    schema = {"type": "object", "properties": {"facts": {"type": "array"}}}
    reply = complete(
        config(llm, path, timeout=30, extra={"temperature": 0.2}),
        HI,
        max_tokens=64,
        schema=("facts", schema),
    )
    assert reply == '{"facts": []}'
    (request,) = llm.requests
    assert request["max_tokens"] == 64 and request["temperature"] == 0.2
    assert request["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "facts", "schema": schema, "strict": True},
    }
    assert "stream" not in request


def test_streamed_tool_calls_are_gathered_after_the_text(llm: Any, path: str) -> None:
    llm.script(
        {
            "content": "Noted.",
            "tool_calls": [
                {"name": "add_fact", "arguments": {"text": "Ana lives in Porto"}},
                {"id": "call_x", "name": "add_fact", "arguments": '{"text": "bad'},
            ],
        }
    )
    out = list(stream(config(llm, path, timeout=30), HI, tools=[TOOL], choice="auto"))
    assert "".join(p for p in out if isinstance(p, str)) == "Noted."
    assert [p for p in out if isinstance(p, ToolCall)] == [
        ToolCall("call_0", "add_fact", json.dumps({"text": "Ana lives in Porto"})),
        ToolCall("call_x", "add_fact", '{"text": "bad'),
    ]
    assert llm.requests[0]["tools"] == [TOOL] and llm.requests[0]["tool_choice"] == "auto"


def test_hanging_up_closes_the_connection_at_once(llm: Any, path: str) -> None:
    llm.script({"content": "x" * 400, "chunk_delay": 1.0})  # 50 chunks: 50 s if not closed
    hangup = Hangup()
    got: list[Any] = []

    def read() -> None:
        got.extend(stream(config(llm, path, timeout=600), HI, hangup=hangup))

    reader = threading.Thread(target=read)
    reader.start()
    while not got and reader.is_alive():
        time.sleep(0.01)
    hangup()
    reader.join(120)
    assert not reader.is_alive()  # the read woke up although the server was silent
    assert llm.wait_for_disconnect(120) is not None  # and the server saw the client leave
    assert 0 < len(got) < 50


def test_hanging_up_before_the_connection_opens_sends_nothing_back(llm: Any, path: str) -> None:
    hangup = Hangup()
    hangup()
    assert list(stream(config(llm, path, timeout=30), HI, hangup=hangup)) == []


def test_a_timeout_is_an_error_and_the_connection_is_closed(llm: Any, path: str) -> None:
    llm.script({"delay": 120}, {"delay": 120})
    for call in (lambda c: list(stream(c, HI)), lambda c: complete(c, HI)):
        with pytest.raises(ProviderError) as caught:
            call(config(llm, path, timeout=1))
        assert caught.value.kind == "timeout"
        assert caught.value.hint == (
            f"{llm.api_base} did not answer within 1 s; try again or raise [llm] timeout"
        )
    assert llm.wait_for_disconnect(120) is not None


ERRORS = [
    (400, "bad_request", "The provider rejected the request; check the model name and settings"),
    (401, "auth", "The provider refused the key; set the provider's API key variable"),
    (403, "auth", "The provider refused the key; set the provider's API key variable"),
    (404, "not_found", "Model 'openai/test' was not found; check --model"),
    (422, "bad_request", "The provider rejected the request; check the model name and settings"),
    (429, "rate_limit", "The provider is rate limiting; wait a moment and retry"),
    (500, "server", "The provider failed (server error); retry in a moment"),
    (503, "server", "The provider failed (server error); retry in a moment"),
]


@pytest.mark.parametrize(("status", "kind", "hint"), ERRORS)
def test_http_errors_keep_their_kind_status_and_advice(
    llm: Any, path: str, status: int, kind: str, hint: str
) -> None:
    said = f"no luck for sk-secret-123 at {status}"
    llm.script(*[{"status": status, "message": said}] * 2)
    for call in (lambda c: list(stream(c, HI)), lambda c: complete(c, HI)):
        with pytest.raises(ProviderError) as caught:
            call(config(llm, path, timeout=30, api_key="sk-secret-123"))
        error = caught.value
        assert (error.kind, error.status) == (kind, status)
        assert error.hint is not None and error.hint.startswith(hint)
        assert f"no luck for {MASK} at {status}" in error.message  # the key masked
        assert "sk-secret-123" not in error.message + str(error.hint)


def test_a_server_that_refuses_tools_is_recognised(llm: Any, path: str) -> None:
    llm.script({"status": 400, "message": "registry.ollama.ai/x does not support tools"})
    with pytest.raises(ProviderError) as caught:
        list(stream(config(llm, path, timeout=30), HI, tools=[TOOL]))
    assert refuses_tools(caught.value)


def test_an_unreachable_server_is_said_so(path: str) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://user:pw@127.0.0.1:{port}/v1"
    extra = LITELLM_ONLY if path == "litellm" else {}
    for call in (lambda c: list(stream(c, HI)), lambda c: complete(c, HI)):
        with pytest.raises(ProviderError) as caught:
            call(LLMConfig("openai/test", api_base=base, timeout=30, extra=extra))
        assert caught.value.kind == "unreachable"
        assert caught.value.hint == (
            f"Cannot reach http://user:{MASK}@127.0.0.1:{port}/v1; check that the server runs"
            " and --api-base is right"
        )


def test_openai_without_a_key_is_refused_before_any_request(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    extra = LITELLM_ONLY if path == "litellm" else {}
    for call in (lambda c: list(stream(c, HI)), lambda c: complete(c, HI)):
        with pytest.raises(ProviderError) as caught:
            call(LLMConfig("openai/gpt-4o-mini", timeout=5, extra=extra))
        assert caught.value.kind == "auth"
        assert caught.value.hint is not None and caught.value.hint.startswith(
            "No API key for this provider"
        )


def test_ollama_models_use_its_openai_compatible_api(llm: Any) -> None:
    """`ollama/` and `ollama_chat/` go to `<api_base>/v1/chat/completions` (Ollama's OpenAI API)
    with the model's own name, and send no key unless one is given."""
    root = llm.api_base.removesuffix("/v1")
    for model in ("ollama_chat/llama3.2", "ollama/llama3.2"):
        for base in (root, root + "/", root + "/v1"):
            assert "".join(map(str, stream(LLMConfig(model, api_base=base), HI))) == "OK"
    assert set(llm.paths) == {"/v1/chat/completions"}
    assert {r["model"] for r in llm.requests} == {"llama3.2"}
    assert set(llm.authorizations) == {None}


def test_the_route_of_each_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which models skip litellm: OpenAI-compatible ones, unless a setting only litellm knows."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    light = ["openai/gpt-4o-mini", "gpt-4o-mini", "ollama/qwen", "ollama_chat/qwen"]
    heavy = ["anthropic/claude-3-5-haiku-latest", "gemini/gemini-1.5-flash", "claude-3-haiku"]
    assert all(llm_module._route(LLMConfig(m)) is not None for m in light)
    assert all(llm_module._route(LLMConfig(m)) is None for m in heavy)
    assert llm_module._route(LLMConfig("openai/x", extra={"drop_params": True})) is None


CAPABILITY_MODELS = [
    "gpt-4o-mini",
    "openai/gpt-4o-mini",
    "openai/gpt-4o",
    "gpt-3.5-turbo",
    "openai/test",
    "test",
    "ollama/llama3.1",
    "ollama_chat/llama3.2",
    "ollama/mistral",
    "anthropic/claude-3-5-haiku-latest",
]


def test_capabilities_agree_with_litellm_and_skip_it_for_openai_compatible_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import litellm  # noqa: F401 (what the answers must equal)

    expected = {
        m: (
            bool(llm_module.load_litellm().supports_response_schema(model=m)),
            _litellm_supports_tools(m),
        )
        for m in CAPABILITY_MODELS
    }

    def no_litellm() -> Any:
        raise AssertionError("imported litellm")

    monkeypatch.setattr(llm_module, "load_litellm", no_litellm)
    for model in CAPABILITY_MODELS:
        if llm_module._route(LLMConfig(model)) is None:
            continue
        got = (supports_schema(LLMConfig(model)), supports_tools(LLMConfig(model)))
        assert got == expected[model], model
    assert expected["gpt-4o-mini"] == (True, True) and expected["openai/test"] == (False, None)


def _litellm_supports_tools(model: str) -> bool | None:
    """What the table in litellm's memory says (memcli's rule: the entry, else the bare name's)."""
    table = llm_module.load_litellm().model_cost
    entry = table.get(model) or (table.get(model.split("/", 1)[1]) if "/" in model else None)
    value = (entry or {}).get("supports_function_calling")
    return value if isinstance(value, bool) else None


def test_loading_litellm_leaves_the_environment_as_it_was(tmp_path: Any) -> None:
    """A fresh process: litellm reads its price table from the wheel (it would try the network
    otherwise, and log that it failed), and the environment after the import is the one before."""
    script = (
        "import os, json\n"
        "before = dict(os.environ)\n"
        "from memcli.llm import load_litellm\n"
        "litellm = load_litellm()\n"
        "from litellm.litellm_core_utils.get_model_cost_map import get_model_cost_map_source_info\n"
        "print(json.dumps([dict(os.environ) == before, get_model_cost_map_source_info()['is_env_forced']]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_")}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, True]
    assert "fetch" not in proc.stderr


def test_a_reply_that_is_not_json(llm: Any, path: str) -> None:
    """A whole reply: a server error; a stream with no data lines: an empty reply, as before."""
    llm.script({"raw": "not json"}, {"raw": "not json"})
    with pytest.raises(ProviderError) as caught:
        complete(config(llm, path, timeout=30), HI)
    assert caught.value.kind == "server"
    assert list(stream(config(llm, path, timeout=30), HI)) == []


@pytest.mark.parametrize("base", ["localhost:1234", "http://999.1.1.1:1/v1", "ftp://x/v1"])
def test_an_endpoint_that_is_no_http_url_is_unreachable(base: str) -> None:
    with pytest.raises(ProviderError) as caught:
        complete(LLMConfig("openai/test", api_base=base, timeout=30), HI)
    assert caught.value.kind == "unreachable"


def test_warming_up_an_openai_compatible_model_loads_no_litellm(
    llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memcli.llm import warm_up

    def no_litellm() -> Any:
        raise AssertionError("imported litellm")

    monkeypatch.setattr(llm_module, "load_litellm", no_litellm)
    warm_up(LLMConfig("openai/test", api_base=llm.api_base))
    warm_up(LLMConfig("ollama_chat/llama3.2"))
    assert "memcli.openai_client" in sys.modules
    assert llm.requests == []  # nothing sent
    with pytest.raises(AssertionError, match="imported litellm"):
        warm_up(LLMConfig("anthropic/claude-3-5-haiku-latest"))
