"""A chat client for OpenAI-compatible endpoints over httpx: how memcli.llm calls OpenAI, Ollama,
llama.cpp's server, LM Studio and vLLM without importing litellm.

Importing it costs what httpx costs (~0.1 CPU s; a streamed call in a fresh process 0.18 CPU s,
against 0.68 through the `openai` SDK and ~3 through litellm: benchmarks/first_reply.py). It
speaks `POST <base>/chat/completions`, whole or streamed as server-sent events, and nothing else;
memcli.llm builds the request body and turns the errors below into ProviderErrors. The error
classes carry the names and `status_code` the OpenAI SDK's do, so that one mapping serves both
paths.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx


class ClientError(Exception):
    """A call to an OpenAI-compatible endpoint failed; `status_code` is the HTTP status (None
    when no response came)."""

    status_code: int | None = None


class APIConnectionError(ClientError):
    """The endpoint could not be reached, or the connection broke."""


class APITimeoutError(ClientError):
    """The endpoint did not answer within the timeout."""


class APIStatusError(ClientError):
    """The endpoint answered with an HTTP error status."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class APIError(ClientError):
    """A streamed reply carried an error instead of a chunk."""


class MissingKey(ClientError):
    """No API key for an endpoint that needs one (OpenAI's own)."""


class BadResponse(ClientError):
    """A 200 response whose body is not the JSON of a chat completion."""


#: The most a whole reply (or one line of a streamed one) may hold: far above any chat
#: completion; a server sending more is broken.
MAX_BODY = 32 * 2**20


@dataclass(frozen=True)
class Endpoint:
    """Where to send a chat request: the base URL (ending in `/v1` as the servers document it),
    the key (None: no Authorization header), the timeout in seconds (for connecting and for each
    read: a streamed reply may last longer, as long as it keeps coming) and extra headers."""

    base: str
    api_key: str | None
    timeout: float
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base.rstrip("/") + "/chat/completions"

    def request_headers(self) -> dict[str, str]:
        out = {"Accept": "application/json"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out | self.headers


def complete(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion (the response's JSON) for a request body; raises a ClientError."""
    with _client(endpoint) as client, _transport_errors():
        with client.stream(
            "POST", endpoint.url, json=body, headers=endpoint.request_headers()
        ) as response:
            text = _bounded_body(response)
        if response.status_code >= 400:
            raise _status_error(response, text)
        try:
            data = json.loads(text)
        except ValueError:
            raise BadResponse(f"the reply is not JSON: {text[:200]!r}") from None
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise BadResponse(f"the reply is not a chat completion: {text[:200]!r}")
        return data


def stream(
    endpoint: Endpoint,
    body: dict[str, Any],
    on_open: Callable[[Callable[[], None]], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """The chunks (parsed JSON) of a streamed chat completion, as they arrive. `on_open(close)`
    is called once the connection is open, with a function that shuts its socket down from any
    thread: the reading thread then wakes up and the stream ends (with an APIConnectionError,
    which the caller who closed it ignores)."""
    with _client(endpoint) as client, _transport_errors():
        with client.stream(
            "POST", endpoint.url, json=body | {"stream": True}, headers=endpoint.request_headers()
        ) as response:
            if on_open is not None:
                on_open(_closer(response))
            if response.status_code >= 400:
                raise _status_error(response, _bounded_body(response))
            yield from _events(response)


@contextmanager
def _transport_errors() -> Iterator[None]:
    """httpx's errors of the connection as this module's: a timeout, or a connection error (a
    refused or broken connection, a URL httpx cannot use)."""
    try:
        yield
    except httpx.TimeoutException:
        raise APITimeoutError("Request timed out.") from None
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        raise APIConnectionError(f"Connection error. {exc}".strip()) from None


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream's `data:` lines, up to `[DONE]`; lines
    that are not data (comments, `event:` names, a body that is not a stream) are skipped."""
    for line in _lines(response):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            payload = json.loads(data)
        except ValueError:
            continue
        if not isinstance(payload, dict):
            continue
        if payload.get("error"):
            raise APIError(_error_text(payload))
        yield payload


def _client(endpoint: Endpoint) -> httpx.Client:
    # A plain-HTTP endpoint (a local server) never uses TLS: no certificate store is loaded for it.
    plain = endpoint.base.startswith("http://")
    return httpx.Client(timeout=httpx.Timeout(endpoint.timeout), verify=not plain)


def _closer(response: httpx.Response) -> Callable[[], None]:
    """Shut the response's socket down (wakes a read blocked on it), else close the response."""
    network = response.extensions.get("network_stream")
    sock = network.get_extra_info("socket") if network is not None else None
    if sock is not None:
        return lambda: sock.shutdown(socket.SHUT_RDWR)
    return response.close


def _bounded_body(response: httpx.Response) -> str:
    """The response's body as text, read up to MAX_BODY bytes (more is a BadResponse)."""
    data = bytearray()
    for piece in response.iter_bytes():
        data += piece
        if len(data) > MAX_BODY:
            raise BadResponse(f"the reply is larger than {MAX_BODY // 2**20} MiB")
    return data.decode("utf-8", "replace")


def _lines(response: httpx.Response) -> Iterator[str]:
    """The lines of a streamed body as they arrive, each at most MAX_BODY bytes."""
    buffer = b""
    for piece in response.iter_bytes():
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
        if len(buffer) > MAX_BODY:
            raise BadResponse(f"a line of the reply is longer than {MAX_BODY // 2**20} MiB")
    if buffer:
        yield buffer.rstrip(b"\r").decode("utf-8", "replace")


def _status_error(response: httpx.Response, body: str) -> APIStatusError:
    try:
        text = _error_text(json.loads(body))
    except ValueError:
        text = body.strip()[:300] or response.reason_phrase
    return APIStatusError(text, response.status_code)  # the status shows in the ProviderError


def _error_text(payload: Any) -> str:
    """The message of an error body: OpenAI's `{"error": {"message": ...}}`, Ollama's
    `{"error": "..."}`, or another server's `message` / `detail`."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        for key in ("message", "detail"):
            if payload.get(key):
                return str(payload[key])
    return json.dumps(payload)[:300]
