"""The library API around Memory: `search` over the home's model, the provider shapes of what
`get()` returns (`openai_messages`, `anthropic_messages`), and `aopen`, which opens a Memory
without holding up the event loop."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import memcli
from memcli import Memory, Message, SQLiteStore, StaticBlock, UsageError
from memcli.search import SearchResult

#: How long a test waits for something that should happen at once (a safety net, not a measure).
PATIENCE_S = 30.0


# -- search ---------------------------------------------------------------------------------------


def _fill(db: Path, **kwargs: Any) -> tuple[Memory, Memory]:
    ana = Memory.from_defaults(session_id="ana-1", user_id="ana", db=str(db), **kwargs)
    ana.put_messages(
        [
            Message(
                "user",
                "We adopted a puppy last spring, a beagle called Rex.",
                timestamp=datetime(2023, 5, 1, tzinfo=UTC),
            ),
            Message(
                "assistant",
                "Congratulations on the new family member!",
                timestamp=datetime(2023, 5, 1, tzinfo=UTC),
            ),
            Message(
                "user",
                "My sister moved to Lisbon for her job.",
                timestamp=datetime(2024, 2, 1, tzinfo=UTC),
            ),
        ]
    )
    Memory.from_defaults(session_id="ana-2", user_id="ana", db=str(db)).put(
        Message("user", "I started learning the cello.", timestamp=datetime(2024, 3, 1, tzinfo=UTC))
    )
    bo = Memory.from_defaults(session_id="bo-1", user_id="bo", db=str(db))
    bo.put(Message("user", "Our dog, a young beagle, chews everything."))
    return ana, bo


def _texts(result: SearchResult) -> list[str]:
    return [m.content for hit in result.hits for m in hit.messages if m.id in hit.message_ids]


def test_search_finds_the_users_messages_by_meaning_with_the_homes_model(
    tmp_path: Path, isolated: Path, minilm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ana, bo = _fill(tmp_path / "m.db")
    result = ana.search("Which pet does she have?", k=2, mode="vector")
    assert isinstance(result, SearchResult)
    assert "beagle called Rex" in result.hits[0].text
    # The user's every session, never another user's.
    assert {h.session_id for h in ana.search("beagle dog", k=10).hits} <= {"ana-1", "ana-2"}
    assert {h.session_id for h in bo.search("beagle dog", k=10).hits} == {"bo-1"}
    assert ana.search("cello", mode="lexical").hits[0].session_id == "ana-2"
    assert ana.search("cello", mode="lexical", session_only=True).hits == []
    # The home's model (its `models` folder, the CLI's export): nothing exported into the cwd.
    assert ana.retriever().embedder.name == memcli.OnnxEmbedder(isolated / "models").name
    assert not (tmp_path / "models").exists()


def test_search_takes_a_time_range_and_checks_its_arguments(tmp_path: Path, minilm: Any) -> None:
    ana, _ = _fill(tmp_path / "m.db")
    since = datetime(2024, 1, 1)  # no zone: UTC, as a Message's timestamp
    found = ana.search("beagle sister Lisbon puppy", k=10, mode="lexical", since=since)
    assert found.hits and all("Rex" not in h.text for h in found.hits)
    found = ana.search("beagle sister Lisbon puppy", k=10, mode="lexical", until=since)
    assert found.hits and all("Lisbon" not in h.text for h in found.hits)
    with pytest.raises(UsageError, match="k must be"):
        ana.search("dog", k=0)
    with pytest.raises(UsageError, match="unknown search mode"):
        ana.search("dog", mode="semantic")


def test_search_uses_the_home_it_is_given(tmp_path: Path, onnx_models: Path, minilm: Any) -> None:
    home = tmp_path / "elsewhere"
    home.mkdir()
    (home / "models").symlink_to(onnx_models, target_is_directory=True)
    ana, _ = _fill(tmp_path / "m.db", home=home)
    assert ana.home == home
    assert "Rex" in ana.search("a dog", k=1, mode="vector").hits[0].text


def test_asearch_is_search(tmp_path: Path, minilm: Any) -> None:
    ana, _ = _fill(tmp_path / "m.db")

    async def both() -> tuple[SearchResult, SearchResult]:
        return await ana.asearch("puppy", k=3), ana.search("puppy", k=3)

    got, expected = asyncio.run(both())
    assert [h.message_ids for h in got.hits] == [h.message_ids for h in expected.hits]


# -- provider messages ----------------------------------------------------------------------------


def _call(call_id: str, name: str = "weather", arguments: str = '{"city": "Porto"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_turns() -> list[Message]:
    return [
        Message("system", "Be terse."),
        Message.from_dict({"role": "user", "content": "Weather and time?", "weight": 1}),
        Message.from_dict(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("call_1"), _call("c2", "time", "{}")],
            }
        ),
        Message.from_dict({"role": "tool", "content": "print(1)", "name": "python"}),  # no call
        Message.from_dict({"role": "tool", "content": "Sunny", "tool_call_id": "call_1"}),
        Message("assistant", "Sunny in Porto.", name="Ana Silva", metadata={"mood": "glad"}),
        Message("user", "Thanks"),
        Message("user", "Bye"),
    ]


def _valid_openai(messages: list[dict[str, Any]]) -> None:
    """What OpenAI's API checks of tool turns: every tool message answers a call of the assistant
    message before its run of tool messages, and every call is answered."""
    allowed = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
    open_calls: set[str] = set()
    for m in messages:
        assert set(m) <= allowed, m
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls
            open_calls.discard(m["tool_call_id"])
            continue
        assert not open_calls, f"calls left unanswered: {open_calls}"
        open_calls = {c["id"] for c in m.get("tool_calls", [])}
    assert not open_calls


def test_openai_messages_keep_answered_calls_and_say_the_rest_in_text() -> None:
    out = memcli.openai_messages(_tool_turns())
    _valid_openai(out)
    assert out == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather and time?"},  # no `weight`
        {"role": "assistant", "content": "[called time({})]", "tool_calls": [_call("call_1")]},
        {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Tool result (python):\nprint(1)"},
        {"role": "assistant", "content": "Ana Silva: Sunny in Porto."},  # a name OpenAI refuses
        {"role": "user", "content": "Thanks"},
        {"role": "user", "content": "Bye"},
    ]


@pytest.mark.parametrize(
    "messages",
    [
        [Message.from_dict({"role": "tool", "content": "42", "tool_call_id": "nowhere"})],
        [Message.from_dict({"role": "assistant", "content": None, "tool_calls": [_call("a")]})],
        [  # the answer comes after a user message: too late
            Message.from_dict({"role": "assistant", "content": "", "tool_calls": [_call("a")]}),
            Message("user", "hm?"),
            Message.from_dict({"role": "tool", "content": "42", "tool_call_id": "a"}),
        ],
        [  # a call without an id, and one of another type
            Message.from_dict(
                {"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}
            ),
            Message.from_dict(
                {"role": "assistant", "content": "", "tool_calls": [{"id": "b", "type": "code"}]}
            ),
            Message.from_dict({"role": "tool", "content": "42", "tool_call_id": "b"}),
        ],
        [  # answered twice: the second answer is text
            Message.from_dict({"role": "assistant", "content": None, "tool_calls": [_call("a")]}),
            Message.from_dict({"role": "tool", "content": "1", "tool_call_id": "a"}),
            Message.from_dict({"role": "tool", "content": "2", "tool_call_id": "a"}),
        ],
    ],
)
def test_openai_messages_never_leave_an_orphan(messages: list[Message]) -> None:
    out = memcli.openai_messages(messages)
    _valid_openai(out)
    assert all(isinstance(m["content"], str) or m.get("tool_calls") for m in out)
    assert len(out) == len(messages)


def test_developer_role_and_valid_names_are_kept() -> None:
    developer = Message.from_dict({"role": "developer", "content": "Answer in French."})
    out = memcli.openai_messages([developer, Message("user", "Hi", name="ana_s")])
    assert out == [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Hi", "name": "ana_s"},
    ]


def test_anthropic_messages_fold_system_and_alternate() -> None:
    system, out = memcli.anthropic_messages(_tool_turns())
    assert system == "Be terse."
    assert out == [
        {"role": "user", "content": "Weather and time?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "[called time({})]"},
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Porto"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": [{"type": "text", "text": "Sunny"}],
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Tool result (python):\nprint(1)"},
                {"type": "text", "text": "Ana Silva: Sunny in Porto."},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "text", "text": "Thanks"}, {"type": "text", "text": "Bye"}],
        },
    ]
    roles = [m["role"] for m in out]
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))


def test_anthropic_messages_say_calls_it_refuses_in_text() -> None:
    messages = [
        Message("user", "go"),
        Message.from_dict(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("a.1"), _call("b", "f", "[1]")],
            }
        ),
        Message.from_dict({"role": "tool", "content": "one", "tool_call_id": "a.1"}),
        Message.from_dict({"role": "tool", "content": "", "tool_call_id": "b"}),
        Message("user", "and?"),
    ]
    _, out = memcli.anthropic_messages(messages)
    assert out == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": '[called weather({"city": "Porto"})]'},
                {"type": "text", "text": "[called f([1])]"},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Tool result:\none"},
                {"type": "text", "text": "Tool result:\n"},
                {"type": "text", "text": "and?"},
            ],
        },
    ]


def test_provider_messages_of_what_get_returns(tmp_path: Path) -> None:
    memory = Memory.from_defaults(
        session_id="s",
        db=str(tmp_path / "m.db"),
        memory_blocks=[StaticBlock(name="core", content="Ana is vegetarian.")],
    )
    memory.put_messages([Message("user", "Hi"), Message("assistant", "Hello", metadata={"a": 1})])
    got = memory.get()
    out = memcli.openai_messages(got)
    assert [m["role"] for m in out] == ["system", "user", "assistant"]
    assert "Ana is vegetarian." in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": "Hello"}
    system, rest = memcli.anthropic_messages(got)
    assert "Ana is vegetarian." in system
    assert rest == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


# -- aopen ----------------------------------------------------------------------------------------


def test_aopen_opens_the_store_and_the_session_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop keeps running while the database is opened: a task of the loop's lets the
    connect go on (a connect in the loop's thread would wait for it in vain), and the session is
    read and created in another thread too."""
    import memcli.store.pool

    threads: dict[str, int] = {}
    ticked = threading.Event()
    real_open = memcli.store.pool.acquire
    real_get = SQLiteStore.sessions_named

    def slow_open(*args: Any, **kwargs: Any) -> Any:
        threads["open"] = threading.get_ident()
        assert ticked.wait(PATIENCE_S), "the event loop stood still while the store opened"
        return real_open(*args, **kwargs)

    def sessions_named(self: SQLiteStore, name: str, user_id: str | None = None) -> Any:
        threads.setdefault("read", threading.get_ident())
        return real_get(self, name, user_id)

    monkeypatch.setattr(memcli.store.pool, "acquire", slow_open)
    monkeypatch.setattr(SQLiteStore, "sessions_named", sessions_named)

    async def main() -> tuple[Memory, int]:
        async def heartbeat() -> None:
            for _ in range(3):
                await asyncio.sleep(0)
            ticked.set()

        beat = asyncio.create_task(heartbeat())
        memory = await Memory.aopen(session_id="s", user_id="ana", db=str(tmp_path / "m.db"))
        await beat
        return memory, threading.get_ident()

    memory, loop_thread = asyncio.run(main())
    assert memory.user_id == "ana" and memory.session().user_id == "ana"
    assert threads["open"] != loop_thread and threads["read"] != loop_thread


def test_aopen_with_a_store_reads_in_the_stores_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    Memory.from_defaults(session_id="s", user_id="ana", db=store, token_limit=500)
    names: list[str] = []
    real_get = SQLiteStore.sessions_named

    def sessions_named(self: SQLiteStore, name: str, user_id: str | None = None) -> Any:
        names.append(threading.current_thread().name)
        return real_get(self, name, user_id)

    monkeypatch.setattr(SQLiteStore, "sessions_named", sessions_named)
    memory = asyncio.run(Memory.aopen(session_id="s", db=store))
    assert memory.user_id == "ana" and memory.budget.token_limit == 500
    assert names and all(n.startswith("memcli-store") for n in names)
