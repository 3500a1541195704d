"""A small OpenAI-compatible server on 127.0.0.1 with scripted replies, for tests.

It speaks `POST /v1/chat/completions` (plain and streamed with server-sent events), so the real
litellm client code is exercised. Script replies with `server.script(...)`; each request takes the
next scripted reply, or the default reply when the script is empty. Every request body is kept in
`server.requests` (`tools_offered(i)` and `tool_messages(i)` read what a test checks most), and
`server.events` says in which order requests came and were answered: `("request", i)` when
request `i` arrived, `("reply", i)` once its whole response was written.

A reply is a dict:
- `{"content": "text"}`: a normal answer (streamed in small chunks when the client asks to stream);
- `{"tool_calls": [{"name": "add_fact", "arguments": {"text": "..."}}, ...]}` (with `content` or
  not): a reply that calls tools; `arguments` is an object (sent as its JSON) or the exact text to
  send (bad JSON included); `id` is optional. Streamed as OpenAI streams calls: the id and name
  first, then the arguments in pieces;
- `{"status": 500}` (or 401, 429, ...): an error response with that HTTP status;
- `{"delay": 2.0, ...}`: wait that many seconds before answering (for timeouts); when the client
  closes the connection meanwhile, the time is recorded in `server.disconnects` (no reply);
- `{"raw": "not json"}`: a 200 response whose body is that text;
- `{"content": ..., "chunk_delay": 0.5}`: a slow stream, one chunk every 0.5 s. Meanwhile the
  server watches the connection: when the client closes it, the stream stops and the time is
  recorded in `server.disconnects` (`wait_for_disconnect()` waits for one).
Or a callable taking the request body and returning such a dict.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


class LLMServer:
    def __init__(self, default: Reply | None = None) -> None:
        self.replies: deque[Reply] = deque()
        self.default: Reply = default or {"content": "OK"}
        self._first_default = self.default
        self.requests: list[dict[str, Any]] = []
        self.events: list[tuple[str, int]] = []
        #: Each request's Authorization header (None: none), in the order of `requests`.
        self.authorizations: list[str | None] = []
        #: Each request's path (`/v1/chat/completions`), in the order of `requests`.
        self.paths: list[str] = []
        #: When (time.monotonic()) a client closed a slow stream before its end.
        self.disconnects: list[float] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LLMServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def script(self, *replies: Reply) -> None:
        with self.lock:
            self.replies.extend(replies)

    def reset(self) -> None:
        with self.lock:
            self.default = self._first_default  # (a test that set another leaves no trace)
            self.replies.clear()
            self.requests.clear()
            self.events.clear()
            self.authorizations.clear()
            self.paths.clear()
            self.disconnects.clear()

    def wait_for_disconnect(self, timeout: float = 10) -> float | None:
        """Wait until a client has closed a slow stream; when it did (None: it did not)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if self.disconnects:
                    return self.disconnects[-1]
            time.sleep(0.01)
        return None

    def tools_offered(self, i: int = -1) -> list[str]:
        """The names of the tools request `i` offered."""
        return [t["function"]["name"] for t in self.requests[i].get("tools", [])]

    def tool_messages(self, i: int = -1) -> list[dict[str, Any]]:
        """The tool messages request `i` sent back, each with its `content` parsed as JSON."""
        return [
            {**m, "content": json.loads(m["content"])}
            for m in self.requests[i]["messages"]
            if m["role"] == "tool"
        ]

    def _next(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            index = len(self.requests)
            self.requests.append(body)
            self.events.append(("request", index))
            reply = self.replies.popleft() if self.replies else self.default
        return index, reply(body) if callable(reply) else reply

    def _answered(self, index: int) -> None:
        with self.lock:
            self.events.append(("reply", index))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._send(
                    200, {"object": "list", "data": [{"id": "test-model", "object": "model"}]}
                )

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    server.authorizations.append(self.headers.get("Authorization"))
                    server.paths.append(self.path)
                index, reply = server._next(body)
                try:
                    self._answer(body, reply)
                finally:
                    server._answered(index)

            def _answer(self, body: dict[str, Any], reply: dict[str, Any]) -> None:
                if reply.get("delay") and self._client_left(float(reply["delay"])):
                    self._record_disconnect()  # it gave up waiting (a timeout): no reply
                    return
                status = int(reply.get("status", 200))
                if status != 200:
                    self._send(
                        status,
                        {
                            "error": {
                                "message": reply.get("message", f"scripted {status}"),
                                "type": "error",
                            }
                        },
                    )
                    return
                if "raw" in reply:
                    self._send_text(200, str(reply["raw"]))
                    return
                content = str(reply.get("content", ""))
                calls = _tool_calls(reply.get("tool_calls") or [])
                if body.get("stream"):
                    self._stream(body, content, float(reply.get("chunk_delay", 0.0)), calls)
                else:
                    self._send(200, _completion(body, content, calls))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                self._send_text(status, json.dumps(payload), "application/json")

            def _send_text(self, status: int, text: str, kind: str = "application/json") -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(
                self,
                body: dict[str, Any],
                content: str,
                chunk_delay: float,
                calls: list[dict[str, Any]],
            ) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                pieces = [content[i : i + 8] for i in range(0, len(content), 8)] or [""]
                try:
                    for i, piece in enumerate(pieces):
                        delta: dict[str, Any] = {"content": piece}
                        if i == 0:
                            delta["role"] = "assistant"
                        self._event(_chunk(body, delta, None))
                        if chunk_delay and self._client_left(chunk_delay):
                            self._record_disconnect()
                            return
                    for index, call in enumerate(calls):
                        head = {"name": call["function"]["name"], "arguments": ""}
                        first = {"index": index, "id": call["id"], "type": "function"}
                        self._event(_chunk(body, {"tool_calls": [{**first, "function": head}]}))
                        text = call["function"]["arguments"]
                        half = len(text) // 2
                        for part in (text[:half], text[half:]):
                            if part:
                                more = {"index": index, "function": {"arguments": part}}
                                self._event(_chunk(body, {"tool_calls": [more]}))
                    self._event(_chunk(body, {}, "tool_calls" if calls else "stop"))
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    if chunk_delay:
                        self._record_disconnect()
                self.close_connection = True

            def _client_left(self, wait: float) -> bool:
                """Wait `wait` seconds, or less if the client closes the connection (True)."""
                readable, _, _ = select.select([self.connection], [], [], wait)
                if not readable:
                    return False
                try:
                    return self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def _record_disconnect(self) -> None:
                with server.lock:
                    server.disconnects.append(time.monotonic())
                self.close_connection = True

            def _event(self, payload: dict[str, Any]) -> None:
                self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
                self.wfile.flush()

        return Handler


def _tool_calls(scripted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Scripted tool calls in OpenAI's format."""
    out = []
    for i, call in enumerate(scripted):
        arguments = call.get("arguments", {})
        out.append(
            {
                "id": call.get("id", f"call_{i}"),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    return out


def _completion(
    body: dict[str, Any], content: str, calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "test-model"),
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content or (None if calls else ""),
                    **({"tool_calls": calls} if calls else {}),
                },
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _chunk(
    body: dict[str, Any], delta: dict[str, Any], finish: str | None = None
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "test-model"),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
