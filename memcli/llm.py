"""Calls to the model: the only module that touches litellm (always inside functions: importing
it takes seconds).

`complete()` returns a whole reply, `stream()` yields a reply's text as it arrives (and, when the
request offers tools, the tool calls the reply makes). Models that an OpenAI-compatible endpoint
serves (`openai/...` with or without `api_base`, Ollama's `ollama/...` and `ollama_chat/...`,
OpenAI's own names) are called through `memcli.openai_client` (httpx) without importing
litellm; the other providers through litellm, imported then. Every error of either path becomes
a ProviderError whose `kind` says what went wrong (unreachable, timeout, auth, rate_limit,
not_found, server, bad_request, error) and whose hint says what to do.

The environment: litellm's import sees LITELLM_LOCAL_MODEL_COST_MAP set (and the environment is
restored after it); OPENAI_API_KEY is read, at call time, for an OpenAI model whose config has no
key, as litellm and the OpenAI SDK read it. Nothing else is read and nothing is written.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from memcli.errors import ProviderError


@dataclass(frozen=True)
class ToolCall:
    """A function the model called: the call's id, the function's name, and its arguments as the
    JSON text the model wrote (parsed and checked by whoever runs the tool)."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        """The call as OpenAI's chat format writes it in an assistant message's `tool_calls`."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class LLMConfig:
    """Which model to call and how. Extra keyword arguments go to litellm as they are."""

    model: str
    api_base: str | None = None
    api_key: str | None = None
    timeout: float = 60.0
    extra: dict[str, Any] = field(default_factory=dict)


class Hangup:
    """Closes a streamed reply's connection from any thread: pass it to `stream(..., hangup=h)`
    and call `h()` to stop the reply at once. The socket is shut down, so the reading thread wakes
    up (even while the network is silent) and the provider sees the client leave and stops
    generating. Calling it before the connection is open closes the connection as soon as it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []
        self.is_set = False

    def __call__(self) -> None:
        with self._lock:
            self.is_set = True
            closers, self._closers = self._closers, []
        for close in closers:
            _quietly(close)

    def on_hangup(self, close: Callable[[], None]) -> None:
        """Run `close` when hung up (now, if it already is)."""
        with self._lock:
            if not self.is_set:
                self._closers.append(close)
                return
        _quietly(close)


def _quietly(close: Callable[[], None]) -> None:
    try:
        close()
    except Exception:  # a connection already closed, or closing on its own
        pass


def _connection_closer(response: Any) -> Callable[[], None] | None:
    """How to close the HTTP connection a litellm stream reads from, from another thread: shut
    its socket down (httpx, through the OpenAI client's stream); else close the response. None
    when the stream does not show its connection."""
    http = getattr(getattr(response, "completion_stream", None), "response", None)
    if http is None:
        return None
    network = getattr(http, "extensions", {}).get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if sock is not None:
        import socket

        return lambda: sock.shutdown(socket.SHUT_RDWR)
    close = getattr(http, "close", None)
    return close if callable(close) else None


#: litellm reads this when it is imported: its price table then comes from the wheel, not the network.
_LOCAL_COST_MAP = "LITELLM_LOCAL_MODEL_COST_MAP"
_import_lock = threading.Lock()


def load_litellm() -> Any:
    """Import litellm offline: its price table is read from the wheel, not fetched. litellm only
    takes that from its environment variable, read while it is imported: the variable is set for
    the import and the environment restored after it (the host's value, when it has one, wins)."""
    import sys

    with _import_lock:  # one import at a time, so no thread sees a half-imported litellm
        setting = "litellm" not in sys.modules and _LOCAL_COST_MAP not in os.environ
        if setting:
            os.environ[_LOCAL_COST_MAP] = "True"
        try:
            import litellm as module
        finally:
            if setting:
                os.environ.pop(_LOCAL_COST_MAP, None)
    module.suppress_debug_info = True
    module.telemetry = False
    return module


def warm_up(config: LLMConfig | None = None) -> None:
    """Import what the config's first call needs, so that a chat's first message starts at once.
    An OpenAI-compatible model (`openai/...`, Ollama, OpenAI's own names) needs only httpx (~0.1
    s); another provider needs litellm and what its first call imports lazily (the OpenAI
    client's resources, the HTTP transport, a tokenizer: ~3 s). Sends nothing; a module missing
    from another litellm version is skipped."""
    import importlib

    if config is not None and _route(config) is not None:
        importlib.import_module("memcli.openai_client")
        return
    litellm = load_litellm()
    for name in (
        "openai.resources",
        "httpcore",
        "litellm.litellm_core_utils.default_encoding",  # loads tiktoken's cl100k_base
        "litellm.proxy.openai_files_endpoints.common_utils",
    ):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if config is not None:
        # A mocked call (litellm answers it itself) builds the models a real call needs.
        try:
            for _ in litellm.completion(
                stream=True,
                mock_response="ok",
                **_kwargs(config, [{"role": "user", "content": "hi"}]),
            ):
                pass
        except Exception:  # warming up is best effort; the real call reports real errors
            pass


def _kwargs(config: LLMConfig, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": config.model,
        "messages": list(messages),
        "timeout": config.timeout,
        "num_retries": 0,
        "max_retries": 0,
    }
    if config.api_base:
        kwargs["api_base"] = config.api_base
        # OpenAI-compatible local servers take any key; the client refuses to send none.
        kwargs["api_key"] = config.api_key or _env_key_for(config.model) or "not-needed"
    elif config.api_key:
        kwargs["api_key"] = config.api_key
    kwargs.update(config.extra)
    return kwargs


def _env_key_for(model: str) -> str | None:
    """OpenAI's key variable, for an OpenAI model whose config has no key (where litellm and the
    OpenAI SDK read it; docs/python.md says so)."""
    if model.startswith("openai/") or "/" not in model:
        return os.environ.get("OPENAI_API_KEY")
    return None


#: Where the OpenAI-compatible providers listen when the config names no endpoint.
OPENAI_BASE = "https://api.openai.com/v1"
OLLAMA_BASE = "http://localhost:11434"
#: The request fields an extra setting may fill on the OpenAI-compatible path (`extra_headers`
#: and `extra_body` too); a config with any other extra setting goes through litellm, which
#: knows what to do with it.
BODY_FIELDS = frozenset(
    {
        "temperature",
        "top_p",
        "n",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "reasoning_effort",
        "parallel_tool_calls",
        "max_completion_tokens",
        "service_tier",
    }
)


@dataclass(frozen=True)
class _Route:
    """How an OpenAI-compatible model is called without litellm: the endpoint's base URL, the
    model's name in the request, whether the endpoint is OpenAI's own, and extra headers."""

    base: str
    name: str
    is_openai: bool
    headers: dict[str, str]

    def endpoint(self, config: LLMConfig) -> Any:
        """The endpoint of a call (a memcli.openai_client.Endpoint), its key read now: the
        config's; else, for an OpenAI model, OPENAI_API_KEY ("not-needed" for a local server:
        they take any key, and some ask for one); none for Ollama."""
        from memcli.openai_client import Endpoint, MissingKey

        key = config.api_key
        if key is None and self.is_openai_model(config):
            key = _env_key_for(config.model)
            if key is None and config.api_base:
                key = "not-needed"
        if key is None and self.is_openai:  # refused before any request, as the OpenAI SDK does
            raise MissingKey("Missing credentials: no api_key given and OPENAI_API_KEY is not set")
        return Endpoint(self.base, key, config.timeout, self.headers)

    @staticmethod
    def is_openai_model(config: LLMConfig) -> bool:
        return not config.model.startswith(("ollama/", "ollama_chat/"))


def _route(config: LLMConfig) -> _Route | None:
    """The route of a model an OpenAI-compatible endpoint serves: `openai/NAME` (OpenAI, or
    `api_base`: llama.cpp, LM Studio, vLLM), `ollama/NAME` and `ollama_chat/NAME` (Ollama's
    OpenAI-compatible API, `<api_base or localhost:11434>/v1`), and a bare name litellm's model
    table gives to OpenAI (`gpt-4o-mini`). None for the other providers (litellm serves them)
    and for a config whose extra settings litellm alone understands."""
    if any(k not in BODY_FIELDS and k not in ("extra_headers", "extra_body") for k in config.extra):
        return None
    headers = config.extra.get("extra_headers") or {}
    if not isinstance(headers, dict):
        return None
    provider, _, name = config.model.partition("/")
    if not name:
        provider, name = ("openai" if _table_provider(config.model) == "openai" else ""), provider
    if provider == "openai":
        return _Route(config.api_base or OPENAI_BASE, name, config.api_base is None, headers)
    if provider in ("ollama", "ollama_chat"):
        base = (config.api_base or OLLAMA_BASE).rstrip("/")
        return _Route(base if base.endswith("/v1") else base + "/v1", name, False, headers)
    return None


def _body(config: LLMConfig, route: _Route, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The request body of the OpenAI-compatible path (what litellm sends for these models)."""
    body: dict[str, Any] = {"model": route.name, "messages": list(messages)}
    body.update((k, v) for k, v in config.extra.items() if k in BODY_FIELDS)
    more = config.extra.get("extra_body")
    if isinstance(more, dict):
        body.update(more)
    return body


@functools.cache
def _model_table() -> dict[str, Any]:
    """litellm's model table (the price and capability list its wheel ships), read as JSON without
    importing litellm (20 ms against 3 s): the table `litellm.model_cost` holds offline. Empty
    when litellm is not installed."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.find_spec("litellm")
    folders = spec.submodule_search_locations if spec is not None else None
    if not folders:
        return {}
    path = Path(next(iter(folders))) / "model_prices_and_context_window_backup.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def _table_entry(model: str) -> dict[str, Any] | None:
    table = _model_table()
    entry = table.get(model) or (table.get(model.split("/", 1)[1]) if "/" in model else None)
    return entry if isinstance(entry, dict) else None


def _table_provider(model: str) -> str | None:
    entry = _table_entry(model)
    return entry.get("litellm_provider") if entry is not None else None


def complete(
    config: LLMConfig,
    messages: Sequence[dict[str, Any]],
    *,
    max_tokens: int | None = None,
    schema: tuple[str, dict[str, Any]] | None = None,
) -> str:
    """The model's whole reply to these messages (`{"role", "content"}` dicts), within the
    config's timeout (a timed-out call's connection is closed: the server sees the client leave).
    `max_tokens` bounds the reply; `schema`, a (name, JSON schema) pair, asks for a JSON reply of
    that shape (structured output: `response_format`; see `supports_schema`)."""
    options: dict[str, Any] = {}
    if schema is not None:
        name, body = schema
        options["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": body, "strict": True},
        }
    route = _route(config)
    if route is not None:
        return _complete_light(config, route, messages, max_tokens, options)
    litellm = load_litellm()
    kwargs = _kwargs(config, messages) | options
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    try:
        response = litellm.completion(**kwargs)
        content = response.choices[0].message.content
    except ProviderError:
        raise
    except Exception as exc:
        raise provider_error(exc, config) from None
    return content or ""


def _complete_light(
    config: LLMConfig,
    route: _Route,
    messages: Sequence[dict[str, Any]],
    max_tokens: int | None,
    options: dict[str, Any],
) -> str:
    from memcli import openai_client

    body = _body(config, route, messages) | options
    if max_tokens is not None:
        # OpenAI's own API takes max_completion_tokens for every chat model (its reasoning models
        # refuse max_tokens, which litellm renames for them); local servers know max_tokens.
        body["max_completion_tokens" if route.is_openai else "max_tokens"] = max_tokens
    try:
        data = openai_client.complete(route.endpoint(config), body)
        choice = data["choices"][0]
        content = choice["message"].get("content") if isinstance(choice, dict) else None
    except openai_client.ClientError as exc:
        raise provider_error(exc, config) from None
    except (LookupError, TypeError, AttributeError):
        raise provider_error(
            openai_client.BadResponse("the reply has no message in its first choice"), config
        ) from None
    return content if isinstance(content, str) else ""


def supports_schema(config: LLMConfig) -> bool:
    """Whether the model answers in a given JSON schema (structured output), as litellm's model
    table says: True for OpenAI's recent models, False for a model it does not know (most names
    a local server is asked for). Read from the table alone: no request is sent. For the models
    of the OpenAI-compatible path the table is read without importing litellm, when it settles
    the answer (the model's entry says, or there is none)."""
    if _route(config) is not None and not config.model.partition("/")[2].startswith("ft:"):
        entry = _table_entry(config.model)
        if entry is None:
            return False  # litellm cannot place it either
        value = entry.get("supports_response_schema")
        if isinstance(value, bool):
            return value
    try:
        return bool(load_litellm().supports_response_schema(model=config.model))
    except Exception:  # a model name litellm cannot place
        return False


def stream(
    config: LLMConfig,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    choice: str | None = None,
    hangup: Hangup | None = None,
) -> Iterator[str | ToolCall]:
    """The model's reply, piece by piece as it streams in. With `tools` (OpenAI's `tools` of a
    request; `choice` its `tool_choice`: auto, none, required), the functions the reply calls
    come last, one ToolCall each, once the reply ends. `hangup`, called from another thread,
    closes the connection at once: the stream then ends without an error."""
    options: dict[str, Any] = {}
    if tools:
        options["tools"] = list(tools)
        if choice is not None:
            options["tool_choice"] = choice
    route = _route(config)
    if route is not None:
        from memcli import openai_client

        deltas = _light_deltas(config, route, messages, options, hangup)
        errors: tuple[type[Exception], ...] = (openai_client.ClientError,)
    else:
        deltas = _litellm_deltas(config, messages, options, hangup)
        errors = (Exception,)
    calls: dict[int, dict[str, Any]] = {}  # index -> the call's id, name and argument pieces
    try:
        for text, parts in deltas:
            if text:
                yield text
            for part in parts:
                _gather(calls, part)
    except ProviderError:
        raise
    except GeneratorExit:
        raise
    except errors as exc:
        if hangup is not None and hangup.is_set:
            return  # the connection was closed on purpose
        raise provider_error(exc, config) from None
    if hangup is not None and hangup.is_set:
        return
    for i in sorted(calls):
        call = calls[i]
        if call["name"]:
            yield ToolCall(call["id"] or f"call_{i}", call["name"], "".join(call["arguments"]))


#: A streamed chunk's new text (None: none) and its pieces of tool calls, each a dict of the
#: call's index, id, name and a piece of its arguments (the keys a piece has).
Delta = tuple[str | None, list[dict[str, Any]]]


def _light_deltas(
    config: LLMConfig,
    route: _Route,
    messages: Sequence[dict[str, Any]],
    options: dict[str, Any],
    hangup: Hangup | None,
) -> Iterator[Delta]:
    """The deltas of a reply streamed from an OpenAI-compatible endpoint (httpx, no litellm)."""
    from memcli import openai_client

    body = _body(config, route, messages) | options
    on_open = hangup.on_hangup if hangup is not None else None
    for chunk in openai_client.stream(route.endpoint(config), body, on_open):
        if hangup is not None and hangup.is_set:
            return
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            continue
        delta = choices[0].get("delta")
        if not isinstance(delta, dict):
            continue
        text = delta.get("content")
        parts = []
        for part in delta.get("tool_calls") or []:
            if isinstance(part, dict):
                function = part.get("function")
                function = function if isinstance(function, dict) else {}
                parts.append(
                    {
                        "index": part.get("index"),
                        "id": part.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments"),
                    }
                )
        yield (text if isinstance(text, str) else None), parts


def _litellm_deltas(
    config: LLMConfig,
    messages: Sequence[dict[str, Any]],
    options: dict[str, Any],
    hangup: Hangup | None,
) -> Iterator[Delta]:
    """The deltas of a reply streamed through litellm (the providers it alone serves)."""
    litellm = load_litellm()
    response = litellm.completion(stream=True, **(_kwargs(config, messages) | options))
    if hangup is not None:
        close = _connection_closer(response)
        if close is not None:
            hangup.on_hangup(close)
        if hangup.is_set:
            return
    for chunk in response:
        choices = getattr(chunk, "choices", None) or []
        if not choices:
            continue
        delta = getattr(choices[0], "delta", None)
        text = getattr(delta, "content", None) if delta is not None else None
        parts = []
        for part in getattr(delta, "tool_calls", None) or []:
            function = getattr(part, "function", None)
            parts.append(
                {
                    "index": getattr(part, "index", None),
                    "id": getattr(part, "id", None),
                    "name": getattr(function, "name", None),
                    "arguments": getattr(function, "arguments", None),
                }
            )
        yield text, parts


def _gather(calls: dict[int, dict[str, Any]], part: dict[str, Any]) -> None:
    """Add a streamed piece of a tool call (OpenAI sends the id and name first, then the
    arguments' text in pieces, each with the call's index) to the calls gathered so far."""
    index = part["index"] if isinstance(part["index"], int) else 0
    call = calls.setdefault(index, {"id": None, "name": "", "arguments": []})
    if part["id"]:
        call["id"] = part["id"]
    if isinstance(part["name"], str):
        call["name"] += part["name"]
    if isinstance(part["arguments"], str) and part["arguments"]:
        call["arguments"].append(part["arguments"])


def supports_tools(config: LLMConfig) -> bool | None:
    """Whether the model takes tools (function calling), as litellm's model table says; None when
    the table does not say (a model it does not know, a local server's): then only a call tells.
    Read from the table alone (without importing litellm): no request is sent."""
    value = (_table_entry(config.model) or {}).get("supports_function_calling")
    return value if isinstance(value, bool) else None


def refuses_tools(error: ProviderError) -> bool:
    """Whether a call failed because its request offered tools: the server rejected it (HTTP
    400, 404, 422, or a server error such as 501) with a reason that speaks of tools or functions
    (Ollama: "... does not support tools"; vLLM: "auto" tool choice requires ...)."""
    reason = error.message.partition(" failed: ")[2].lower()
    return error.kind in ("bad_request", "not_found", "server") and any(
        word in reason for word in ("tool", "function")
    )


def provider_error(exc: Exception, config: LLMConfig) -> ProviderError:
    """Turn a litellm, `memcli.openai_client` (or httpx, or openai) exception into a ProviderError
    with advice: the same kind and hint on both paths. No
    credential shows in it: URLs are redacted (`memcli.credentials`), the key is masked."""
    from memcli.credentials import MASK, redact_text, redact_url

    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    text = str(exc).split("\n")[0]
    if config.api_key:
        text = text.replace(config.api_key, MASK)
    text = redact_text(text)[:300]
    where = redact_url(config.api_base) if config.api_base else "the provider"
    lowered = text.lower()
    # No key at all: the OpenAI client refuses before any request, and litellm calls that an
    # internal server error (500).
    no_key = "api_key" in lowered and ("missing" in lowered or "must be set" in lowered)
    if (
        name in ("Timeout", "APITimeoutError", "ReadTimeout", "ConnectTimeout")
        or "timed out" in text.lower()
    ):
        kind, hint = (
            "timeout",
            f"{where} did not answer within {config.timeout:g} s; try again or raise [llm] timeout",
        )
    elif (
        name in ("APIConnectionError", "ConnectError", "ConnectionError")
        or "connection error" in text.lower()
    ):
        kind, hint = (
            "unreachable",
            f"Cannot reach {where}; check that the server runs and --api-base is right",
        )
    elif no_key:
        kind, status, hint = (
            "auth",
            None,
            "No API key for this provider: set its key variable (e.g. OPENAI_API_KEY), or point"
            " --api-base at a local server",
        )
    elif name == "AuthenticationError" or status == 401 or status == 403:
        kind, hint = (
            "auth",
            "The provider refused the key; set the provider's API key variable (e.g. OPENAI_API_KEY)",
        )
    elif name == "RateLimitError" or status == 429:
        kind, hint = "rate_limit", "The provider is rate limiting; wait a moment and retry"
    elif name == "NotFoundError" or status == 404:
        kind, hint = "not_found", f"Model {config.model!r} was not found; check --model"
    elif name in ("BadRequestError", "UnprocessableEntityError") or status in (400, 422):
        kind, hint = (
            "bad_request",
            "The provider rejected the request; check the model name and settings",
        )
    elif (
        isinstance(status, int)
        and status >= 500
        or name in ("InternalServerError", "ServiceUnavailableError", "BadResponse")
    ):
        kind, hint = "server", "The provider failed (server error); retry in a moment"
    else:
        kind, hint = "error", "Check the model settings (--model, --api-base) and retry"
    return ProviderError(
        f"LLM call to {config.model} failed: {text}", hint, kind=kind, status=status
    )


PROVIDER_KEY_VARIABLES = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "OPENROUTER_API_KEY",
    "DEEPSEEK_API_KEY",
)
