"""`memcli mcp` fuzzed over stdio (Hypothesis): arbitrary JSON-RPC lines sent to one real server
process (valid-shaped calls of every tool `tools/list` names with arbitrary argument values,
malformed JSON, deep nesting, huge strings, wrong types for id/method/params, batch arrays).
The server never exits, never prints a traceback, answers every request that has an id exactly
once, forgets nothing without `confirm: true`, and never shows or changes another user's data."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import no_blocks  # noqa: F401 (a fixture)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("mcp")

from memcli.store import facts as fact_store  # noqa: E402
from memcli.store.sqlite import SQLiteStore  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_blocks")  # no model loads: search runs lexical

#: bo's text: no reply to ana may hold it.
CANARY = "zebracanary"
BO_CHAT = [
    {"role": "user", "content": f"My {CANARY} password hint is the blue door."},
    {"role": "assistant", "content": f"Noted: the {CANARY} hint."},
]
ANA_CHAT = [
    {"role": "user", "content": "My dog is called Biscuit."},
    {"role": "assistant", "content": "Biscuit is a fine name."},
]
INIT = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "fuzz", "version": "0"},
}
WAIT = 30  # seconds for a reply before the test fails (the server hangs or lost a request)


class Server:
    """`memcli --db DB mcp --user USER` with its stdout read into a queue (each line parsed as
    JSON: anything else there is a failure) and its stderr kept."""

    def __init__(self, db: Path, user: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memcli", "--db", str(db), "mcp", "--user", user],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.replies: queue.Queue[Any] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.seen: dict[Any, int] = {}  # reply ids, with how many replies each had
        self.nulls = 0
        self.issued: set[Any] = set()
        self._next = 10**9  # ids no garbage line is likely to hold
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        self.request("initialize", INIT)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            self.stdout.append(line)
            try:
                self.replies.put(json.loads(line))
            except ValueError:
                self.replies.put(("not json", line))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode("utf-8", "replace"))

    def new_id(self, as_text: bool = False) -> int | str:
        self._next += 1
        ident = f"r-{self._next}" if as_text else self._next
        self.issued.add(ident)
        return ident

    def send_line(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def send(self, message: Any) -> None:
        self.send_line(json.dumps(message).encode())

    def collect(self, ids: set[Any]) -> dict[Any, Any]:
        """The replies to `ids` (each request's one reply), reading until all have come."""
        got: dict[Any, Any] = {}
        while not ids <= got.keys():
            try:
                reply = self.replies.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(
                    f"no reply to {ids - got.keys()}; the server "
                    + ("ended" if self.proc.poll() is not None else "is still running")
                    + "\n"
                    + "".join(self.stderr)[-3000:]
                ) from None
            assert isinstance(reply, dict), reply  # every stdout line is a JSON-RPC object
            assert reply.get("jsonrpc") == "2.0", reply
            assert ("result" in reply) != ("error" in reply), reply
            ident = reply.get("id")
            if ident is None:
                self.nulls += 1
                continue
            if ident not in self.issued:  # an id in a garbage line: no request of ours
                continue
            self.seen[ident] = self.seen.get(ident, 0) + 1
            assert self.seen[ident] == 1, f"a second reply to request {ident!r}: {reply}"
            got[ident] = reply
        return got

    def request(self, method: str, params: Any = None) -> Any:
        ident = self.new_id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return self.collect({ident})[ident]

    def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        return self.request("tools/call", {"name": tool, "arguments": arguments})["result"]

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=WAIT)


def peak_memory(pid: int) -> int | None:
    """A process's peak resident memory in bytes (Linux's VmHWM), None where unknown."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


# -- what is sent ----------------------------------------------------------------------------

#: Values that mean something to the tools: ana's and bo's session ids, small fact ids (bo's
#: facts among them), the modes, texts near the bounds.
MEANINGFUL = st.sampled_from(
    ["s1", "bo-s", "", "hybrid", "lexical", "vector", 1, 2, 3, 4, 0, -1, 2**63, True, False, None]
)
TEXT = st.text(max_size=40) | st.sampled_from(["x" * 2001, "\ud800", "</memory>", "2024-01-01"])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT | MEANINGFUL
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "bot", 3])},
    optional={"content": TEXT | JSON, "name": JSON, "tool_call_id": JSON, "metadata": JSON},
)


def arguments(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Any subset of a tool's parameters (each any value, or a message list for `messages`),
    sometimes with a parameter it does not take."""
    values = {
        name: (st.lists(MESSAGE, max_size=3) | JSON) if name == "messages" else JSON
        for name in schema.get("properties", {})
    }
    return st.fixed_dictionaries({}, optional={**values, "unknown": JSON})


def deep(depth: int, opening: str) -> str:
    closing = {"[": "]", "{": "}"}[opening]
    inner = '{"a": ' if opening == "{" else "["
    return (
        '{"jsonrpc": "2.0", "id": ID, "method": "tools/list", "params": '
        + inner * depth
        + "1"
        + closing * depth
        + "}"
    )


@st.composite
def lines(draw: st.DrawFn, tools: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
    """One to four things to send: (kind, payload). A payload holding ID gets a fresh id."""
    names = sorted(tools)

    def one(kind: str) -> tuple[str, Any]:
        if kind == "call":
            name = draw(st.sampled_from(names))
            args = draw(arguments(tools[name]))
            return "request", {"method": "tools/call", "params": {"name": name, "arguments": args}}
        if kind == "method":
            method = draw(
                st.sampled_from(
                    [
                        "tools/list",
                        "resources/list",
                        "resources/templates/list",
                        "resources/read",
                        "prompts/list",
                        "ping",
                        "initialize",
                        "no/such/method",
                        "tools/call",
                    ]
                )
            )
            params = draw(
                st.none()
                | JSON
                | st.fixed_dictionaries(
                    {
                        "uri": st.sampled_from(
                            [
                                "memcli://sessions",
                                "memcli://sessions/s1",
                                "memcli://sessions/bo-s",
                                "memcli://x",
                            ]
                        )
                        | JSON
                    }
                )
                | st.fixed_dictionaries({"name": JSON, "arguments": JSON})
            )
            message: dict[str, Any] = {"method": method}
            if params is not None:
                message["params"] = params
            return "request", message
        if kind == "wrong":  # a valid id, the other fields of the wrong type
            message = {"method": draw(JSON | st.sampled_from(["tools/call", "ping"]))}
            if draw(st.booleans()):
                message["params"] = draw(JSON)
            if draw(st.booleans()):
                message["jsonrpc"] = draw(JSON)
            return "request", message
        if kind == "bad id":
            bad = draw(
                st.none()
                | st.booleans()
                | st.floats(allow_nan=False)
                | st.lists(SCALARS, max_size=2)
                | st.dictionaries(st.text(max_size=3), SCALARS, max_size=2)
            )
            return "raw", json.dumps({"jsonrpc": "2.0", "id": bad, "method": "tools/list"})
        if kind == "notification":
            return "raw", json.dumps({"jsonrpc": "2.0", "method": draw(JSON), "params": draw(JSON)})
        if kind == "garbage":
            text = draw(
                st.text(max_size=60)
                | st.sampled_from(
                    [
                        '{"jsonrpc": "2.0", "id": 7, "method": "ping"',
                        "[",
                        "{}",
                        "[]",
                        "null",
                        '{"id": "g", "method": "ping", "params": {"x": NaN}}',
                        '"\\ud800"',
                    ]
                )
            )
            return "raw", text.replace("\n", " ").replace("\r", " ")
        if kind == "deep":
            return "deep", deep(draw(st.integers(1, 3000)), draw(st.sampled_from("[{")))
        if kind == "huge":
            size = draw(st.sampled_from([100_000, 1_000_000, 3_000_000]))
            name = draw(st.sampled_from(names))
            keys = sorted(tools[name].get("properties", {})) or ["x"]
            args = {draw(st.sampled_from(keys)): "y" * size}
            return "request", {"method": "tools/call", "params": {"name": name, "arguments": args}}
        assert kind == "batch"
        return "batch", [
            {"method": "tools/list"},
            {
                "method": "tools/call",
                "params": {"name": draw(st.sampled_from(names)), "arguments": {}},
            },
        ][: draw(st.integers(0, 2))]

    kinds = st.sampled_from(
        [
            "call",
            "call",
            "call",
            "method",
            "wrong",
            "bad id",
            "notification",
            "garbage",
            "deep",
            "huge",
            "batch",
        ]
    )
    return [one(draw(kinds)) for _ in range(draw(st.integers(1, 4)))]


# -- the test ----------------------------------------------------------------------------------


def test_mcp_over_stdio_survives_fuzzed_requests(tmp_path: Path) -> None:
    db = tmp_path / "fuzz.db"
    bo = Server(db, "bo")
    bo.call("put_messages", {"messages": BO_CHAT, "session": "bo-s"})
    for text in (f"Bo's {CANARY} is under the mat", f"Bo keeps a {CANARY} diary"):
        assert not bo.call("add_fact", {"text": text})["isError"]
    assert bo.close() == 0
    store = SQLiteStore(db)
    bo_facts = sorted(f.text for f in fact_store.list_facts(store, None, "user:bo"))
    bo_messages = [m.content for m in store.iter_messages("bo-s")]
    store.close()

    server = Server(db, "ana")
    tools = {t["name"]: t["inputSchema"] for t in server.request("tools/list")["result"]["tools"]}
    assert "forget_user" in tools and "put_messages" in tools

    def seed() -> None:
        result = server.call("put_messages", {"messages": ANA_CHAT, "session": "s1"})
        assert not result["isError"], result

    def ana_count() -> int | None:
        result = server.call("read_session", {"session": "s1", "limit": 200})
        if result["isError"]:
            return None
        return len(result["structuredContent"]["messages"])

    seed()

    @settings(
        max_examples=100,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(lines(tools))
    def run(sent: list[tuple[str, Any]]) -> None:
        before = ana_count()
        assert before is not None and before >= len(ANA_CHAT)
        expected: set[Any] = set()
        confirmed = False
        for kind, payload in sent:
            if kind == "request":
                ident = server.new_id(as_text=len(expected) % 2 == 1)
                expected.add(ident)
                server.send({"jsonrpc": "2.0", "id": ident, **payload})
                params = payload.get("params")
                if (
                    payload.get("method") == "tools/call"
                    and isinstance(params, dict)
                    and params.get("name") == "forget_user"
                    and isinstance(params.get("arguments"), dict)
                    and params["arguments"].get("confirm") is True
                    and set(params["arguments"]) == {"confirm"}
                ):
                    confirmed = True
            elif kind == "deep":
                ident = server.new_id()
                expected.add(ident)  # under the depth bound: a reply with its id
                if payload.count("[") + payload.count("{") > 64:
                    expected.discard(ident)  # over it: an error with id null
                server.send_line(payload.replace("ID", str(ident)).encode())
            elif kind == "batch":
                server.send([{"jsonrpc": "2.0", "id": server.new_id(), **m} for m in payload])
            else:
                server.send_line(payload.encode("utf-8", "surrogatepass"))
        sentinel = server.new_id()
        server.send({"jsonrpc": "2.0", "id": sentinel, "method": "ping"})
        server.collect(expected | {sentinel})
        assert server.proc.poll() is None, "".join(server.stderr)
        assert "Traceback" not in "".join(server.stderr), "".join(server.stderr)
        after = ana_count()
        if confirmed:  # forgotten (and maybe stored again by a later call of the same example)
            if after is None:
                seed()
        else:
            assert after is not None and after >= before, (before, after)
        assert not any(CANARY in line for line in server.stdout)

    try:
        run()
        peak = peak_memory(server.proc.pid)
    finally:
        code = server.close()
    assert peak is None or peak < 1024**3, f"the server's peak memory: {peak:,} bytes"
    assert code == 0
    assert "Traceback" not in "".join(server.stderr)
    assert not any(CANARY in line for line in server.stdout)
    store = SQLiteStore(db)
    assert sorted(f.text for f in fact_store.list_facts(store, None, "user:bo")) == bo_facts
    assert [m.content for m in store.iter_messages("bo-s")] == bo_messages
    store.close()


def test_a_request_of_the_wrong_shape_gets_an_error_with_its_id(tmp_path: Path) -> None:
    """Found by the fuzz test: valid JSON with a number or string id whose other fields are of
    the wrong type (params a list or a number, method a number, jsonrpc "1.0") got its error
    reply with id null, so a client waiting for its id waited for ever."""
    server = Server(tmp_path / "shape.db", "ana")
    ids = [server.new_id(), server.new_id(as_text=True), server.new_id(), server.new_id()]
    odd = [
        {"jsonrpc": "2.0", "method": "tools/list", "params": [1]},
        {"jsonrpc": "2.0", "method": "ping", "params": 3},
        {"jsonrpc": "2.0", "method": 4},
        {"jsonrpc": "1.0", "method": "ping"},
    ]
    for ident, message in zip(ids, odd, strict=True):
        server.send({"id": ident, **message})
    replies = server.collect(set(ids))
    assert server.close() == 0
    assert all(replies[i]["error"]["code"] == -32700 for i in ids)
    assert server.nulls == 0
