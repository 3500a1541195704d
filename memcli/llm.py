"""The only module that touches litellm (always inside functions: importing it takes seconds).

`complete()` returns a whole reply, `stream()` yields a reply's text as it arrives (and, when the
request offers tools, the tool calls the reply makes). Every litellm error becomes a ProviderError
whose `kind` says what went wrong (unreachable, timeout, auth, rate_limit, server, bad_request,
error) and whose hint says what to do.
"""

from __future__ import annotations

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


def load_litellm() -> Any:
    """Import litellm offline: its price table is read from the wheel, not fetched."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


def warm_up(config: LLMConfig | None = None) -> None:
    """Import litellm and what its first call imports lazily (the OpenAI client's resources, the
    HTTP transport, a tokenizer: ~2 s), so that a chat's first message starts at once. Sends
    nothing; a module missing from another litellm version is skipped."""
    import importlib

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
    if model.startswith("openai/") or "/" not in model:
        return os.environ.get("OPENAI_API_KEY")
    return None


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
    litellm = load_litellm()
    kwargs = _kwargs(config, messages)
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if schema is not None:
        name, body = schema
        kwargs["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": body, "strict": True},
        }
    try:
        response = litellm.completion(**kwargs)
        content = response.choices[0].message.content
    except ProviderError:
        raise
    except Exception as exc:
        raise provider_error(exc, config) from None
    return content or ""


def supports_schema(config: LLMConfig) -> bool:
    """Whether the model answers in a given JSON schema (structured output), as litellm's model
    table says: True for OpenAI's recent models, False for a model it does not know (most names
    a local server is asked for). Read from the table alone: no request is sent."""
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
    litellm = load_litellm()
    kwargs = _kwargs(config, messages)
    if tools:
        kwargs["tools"] = list(tools)
        if choice is not None:
            kwargs["tool_choice"] = choice
    calls: dict[int, dict[str, Any]] = {}  # index -> the call's id, name and argument pieces
    try:
        response = litellm.completion(stream=True, **kwargs)
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
            if text:
                yield text
            for part in getattr(delta, "tool_calls", None) or []:
                _gather(calls, part)
    except ProviderError:
        raise
    except GeneratorExit:
        raise
    except Exception as exc:
        if hangup is not None and hangup.is_set:
            return  # the connection was closed on purpose
        raise provider_error(exc, config) from None
    if hangup is not None and hangup.is_set:
        return
    for i in sorted(calls):
        call = calls[i]
        if call["name"]:
            yield ToolCall(call["id"] or f"call_{i}", call["name"], "".join(call["arguments"]))


def _gather(calls: dict[int, dict[str, Any]], part: Any) -> None:
    """Add a streamed piece of a tool call (OpenAI sends the id and name first, then the
    arguments' text in pieces, each with the call's index) to the calls gathered so far."""
    index = getattr(part, "index", None) or 0
    call = calls.setdefault(index, {"id": None, "name": "", "arguments": []})
    if getattr(part, "id", None):
        call["id"] = part.id
    function = getattr(part, "function", None)
    if function is not None:
        if getattr(function, "name", None):
            call["name"] += function.name
        if getattr(function, "arguments", None):
            call["arguments"].append(function.arguments)


def supports_tools(config: LLMConfig) -> bool | None:
    """Whether the model takes tools (function calling), as litellm's model table says; None when
    the table does not say (a model it does not know, a local server's): then only a call tells.
    Read from the table alone: no request is sent."""
    table = load_litellm().model_cost
    name = config.model
    entry = table.get(name) or (table.get(name.split("/", 1)[1]) if "/" in name else None)
    value = (entry or {}).get("supports_function_calling")
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
    """Turn a litellm (or httpx, or openai) exception into a ProviderError with advice. No
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
    elif name in ("BadRequestError", "UnprocessableEntityError") or status == 400:
        kind, hint = (
            "bad_request",
            "The provider rejected the request; check the model name and settings",
        )
    elif (
        isinstance(status, int)
        and status >= 500
        or name in ("InternalServerError", "ServiceUnavailableError")
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
