"""`memcli mcp --http`: the bearer-token check in front of the MCP server's streamable HTTP
app at `/mcp` (`memcli.cli.mcp.serve_http` builds and runs them), and the bounds every request
is checked against before it is parsed (stdio's lines too).

Every request carries `Authorization: Bearer TOKEN` (`memcli mcp token add --user NAME`); the
token decides the user, and the request's tools act as that user (one AgentTools per user, all
on the one store connection, their calls serialised by one lock). No token, or one that is not
stored: 401, and nothing reaches the tools. A request body is bounded before it is parsed (size
and nesting depth, as on stdio). The server is stateless: each request stands alone, so that no
session of the SDK outlives its request or is shared between users.
"""

from __future__ import annotations

import json
import threading
from contextvars import ContextVar
from typing import Any

from memcli.errors import MemcliError, StoreError

#: The longest request line (stdio) or body (HTTP) read, and the deepest nesting of its JSON:
#: over either, an error reply and no parse (a line nested 10,000 deep once ended the process).
MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_REQUEST_DEPTH = 64

#: JSON-RPC's codes for a request that could not be parsed, and for one that is not a request.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
#: JSON-RPC's code for a server's own failure (the database unreachable).
INTERNAL_ERROR = -32603


#: The user the current request acts as (set by `Bearer` for the request's handling).
_user: ContextVar[str | None] = ContextVar("memcli_mcp_user", default=None)


def request_user() -> str | None:
    """The user the request being handled acts as (its token's), or None outside one."""
    return _user.get()


def request_problem(text: str | bytes) -> tuple[int, str] | None:
    """Why a request (one JSON-RPC message) is refused before the SDK parses it: (code,
    message) when it is nested deeper than MAX_REQUEST_DEPTH (counted without parsing) or its
    `id` is neither a number nor a string (it gets an error with id null); None otherwise
    (including text that is not JSON: the SDK's parse error answers it)."""
    import re

    body = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    depth = 0
    # (a string is read once, to its end if it never closes: a pattern that gave up on an
    # unclosed string would start again at each quote inside it, in time growing as its square)
    for token in re.finditer(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', body):
        char = token.group()
        if char in ("[", "{"):
            depth += 1
            if depth > MAX_REQUEST_DEPTH:
                return PARSE_ERROR, f"the request is nested more than {MAX_REQUEST_DEPTH} deep"
        elif char in ("]", "}"):
            depth -= 1
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(request, dict) and "id" in request:
        ident = request["id"]
        if isinstance(ident, bool) or not isinstance(ident, int | str | None):
            return INVALID_REQUEST, "Invalid request: id must be a number or a string"
    return None


class Bearer:
    """ASGI middleware: an HTTP request without a stored bearer token gets 401; one with a
    token runs as its user (`_user`), its body checked first (`request_problem`)."""

    def __init__(self, app: Any, store: Any, lock: threading.Lock) -> None:
        self.app = app
        self.store = store
        self.lock = lock

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: the SDK's session manager starts and stops
            await self.app(scope, receive, send)
            return
        import anyio.to_thread

        token = _bearer(scope)
        try:
            user = await anyio.to_thread.run_sync(self._user_of, token) if token else None
        except MemcliError as exc:  # (the database cannot be read even on a new connection)
            text = exc.message + (f". {exc.hint}" if exc.hint else "")
            await _reply(send, 503, _rpc_error(INTERNAL_ERROR, text))
            return
        if user is None:
            await _reply(
                send,
                401,
                {
                    "error": "invalid_token",
                    "error_description": "a bearer token of this server is required"
                    if token is None
                    else "the bearer token is not one of this server's",
                },
                [(b"www-authenticate", b'Bearer realm="memcli"')],
            )
            return
        body, receive = await _read_body(receive)
        if body is not None and len(body) > MAX_REQUEST_BYTES:
            await _reply(send, 413, _rpc_error(PARSE_ERROR, "the request is too large"))
            return
        problem = request_problem(body) if body else None
        if problem is not None:
            await _reply(send, 400, _rpc_error(*problem))
            return
        marker = _user.set(user)
        try:
            await self.app(scope, receive, send)
        finally:
            _user.reset(marker)

    def _user_of(self, token: str) -> str | None:
        """The token's user. A lookup that meets a connection the server closed (a PostgreSQL
        restart) is asked once more, on the new connection the store makes: it reads only."""
        from memcli.store.tokens import token_user

        with self.lock:
            try:
                return token_user(self.store, token)
            except StoreError:
                return token_user(self.store, token)


def _bearer(scope: Any) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


async def _read_body(receive: Any) -> tuple[bytes | None, Any]:
    """The request's body (read no further than MAX_REQUEST_BYTES + 1 bytes), and a `receive`
    that hands it on as it came."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None, receive
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        more = message.get("more_body", False)
        if size > MAX_REQUEST_BYTES:
            return b"".join(chunks), receive
    body = b"".join(chunks)
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def _rpc_error(code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


async def _reply(
    send: Any,
    status: int,
    data: dict[str, Any],
    headers: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
) -> None:
    body = json.dumps(data).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
