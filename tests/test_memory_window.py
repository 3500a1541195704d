"""`get()` serves the active window from memory: it must return exactly what a fresh read returns,
whatever this Memory, another Memory or another process did to the session."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from contextlib import suppress
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from fakes import WordTokenizer, importing_fakes
from hypothesis import given, settings
from hypothesis import strategies as st

from memcli import Budget, Memory, Message, StaticBlock
from memcli.store import open_store
from memcli.store.sqlite import SQLiteStore


class Boom(Exception):
    pass


def exact(messages: list[Message]) -> list[str]:
    """Every field, with its type: Message equality leaves out id, tokens, status and the rest."""
    return [repr(m) for m in messages]


def fresh_get(db: Path | str, session_id: str = "s") -> list[Message]:
    store = open_store(db)
    try:
        return Memory(store, session_id, tokenizer=WordTokenizer()).get()
    finally:
        store.close()


METADATA = [None, {}, {"k": 1}, {"pair": (1, 2), "nested": {"x": [1, "a"]}}, {"é": "ü"}]
TIMESTAMPS = [
    None,
    datetime(2024, 5, 8, 13, 56, tzinfo=UTC),
    datetime(2024, 5, 8, 13, 56, 7, 123456, tzinfo=timezone(timedelta(hours=-5))),
    datetime(2001, 1, 1, 0, 0, 0, 1),  # naive: taken as UTC
]

messages = st.builds(
    Message,
    role=st.sampled_from(["user", "user", "assistant", "system", "tool"]),
    content=st.lists(st.sampled_from(["w", "sun", "tea", "é", "\n"]), max_size=8).map(" ".join),
    name=st.sampled_from([None, "Ana"]),
    metadata=st.sampled_from(METADATA),
    timestamp=st.sampled_from(TIMESTAMPS),
)
calls = st.lists(st.lists(messages, max_size=4), min_size=1, max_size=3)
steps = st.one_of(
    st.tuples(st.just("put"), messages),
    st.tuples(st.just("put_messages"), st.lists(messages, max_size=5)),
    st.tuples(st.just("put_calls"), calls),
    st.tuples(st.just("flush_now")),
    st.tuples(st.just("set"), st.lists(messages, max_size=4)),
    st.tuples(st.just("reset")),
    st.tuples(st.just("other_put"), st.lists(messages, min_size=1, max_size=3)),
    st.tuples(st.just("other_flush")),
    st.tuples(st.just("other_set"), st.lists(messages, max_size=3)),
    st.tuples(st.just("rolled_back"), st.lists(messages, min_size=1, max_size=3)),
    st.tuples(st.just("outer_transaction"), st.lists(messages, min_size=1, max_size=3)),
)


def apply(step: tuple, memory: Memory, other: Memory) -> None:
    kind, *args = step
    if kind == "put":
        memory.put(args[0])
    elif kind == "put_messages":
        memory.put_messages(args[0])
    elif kind == "put_calls":
        memory.put_calls(args[0])
    elif kind == "flush_now":
        memory.flush_now()
    elif kind == "set":
        memory.set(args[0])
    elif kind == "reset":
        memory.reset()
    elif kind == "other_put":
        other.put_messages(args[0])
    elif kind == "other_flush":
        other.flush_now()
    elif kind == "other_set":
        other.set(args[0])
    elif kind == "rolled_back":
        # Puts (and a get) inside a caller's transaction that then fails: none of it happened.
        with suppress(Boom), memory.store.transaction():
            for m in args[0]:
                memory.put(m)
            memory.get()
            raise Boom
    elif kind == "outer_transaction":
        # Puts inside a caller's transaction that commits.
        with memory.store.transaction():
            for m in args[0]:
                memory.put(m)
                memory.get()
    else:  # pragma: no cover
        raise AssertionError(kind)


@settings(max_examples=60, deadline=None)
@given(st.lists(steps, min_size=1, max_size=12), st.booleans())
def test_a_warm_get_equals_a_fresh_read(script: list[tuple], get_between: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "m.db"
        budget = Budget(24, 0.7, 6)
        memory = Memory(SQLiteStore(db), "s", budget=budget, tokenizer=WordTokenizer())
        other = Memory(SQLiteStore(db), "s", tokenizer=WordTokenizer())
        memory.get()
        for step in script:
            apply(step, memory, other)
            if get_between:
                assert exact(memory.get()) == exact(fresh_get(db))
        assert exact(memory.get()) == exact(fresh_get(db))
        assert memory.active_tokens() == sum(m.tokens or 0 for m in fresh_get(db))
        memory.store.close()
        other.store.close()


def test_flushes_from_the_window_held_match_a_fresh_memory(tmp_path: Path) -> None:
    """The same puts on a warm Memory and on one rebuilt from the database before every put
    archive the same messages under the same flush ids."""
    chat = [Message("user" if i % 2 == 0 else "assistant", "w " * (1 + i % 5)) for i in range(40)]
    results = []
    for rebuild in (False, True):
        db = tmp_path / f"{rebuild}.db"
        memory = Memory(SQLiteStore(db), "s", budget=Budget(30, 0.7, 8), tokenizer=WordTokenizer())
        flushes = []
        for m in chat:
            if rebuild:
                memory = Memory(SQLiteStore(db), "s", tokenizer=WordTokenizer())
            memory.get()
            flushes += [(f.id, f.message_ids, f.tokens, f.reason) for f in memory.put(m)]
        results.append((flushes, exact(memory.get())))
    assert results[0] == results[1]
    assert results[0][0], "the budget must flush"


def test_returned_lists_are_the_callers(tmp_path: Path) -> None:
    memory = Memory(SQLiteStore(tmp_path / "m.db"), "s", tokenizer=WordTokenizer())
    memory.put_messages([Message("user", "hi"), Message("assistant", "hello")])
    got = memory.get()
    got.clear()
    memory.context().messages.append(Message("user", "not stored"))
    assert [m.content for m in memory.get()] == ["hi", "hello"]


def test_blocks_see_the_window_held(db: str) -> None:
    block = StaticBlock(content="likes tea")
    memory = Memory(open_store(db), "s", tokenizer=WordTokenizer(), memory_blocks=[block])
    memory.put(Message("system", "be brief"))
    memory.get()
    memory.put(Message("user", "hi"))
    fresh = Memory(open_store(db), "s", tokenizer=WordTokenizer(), memory_blocks=[block])
    assert exact(memory.get()) == exact(fresh.get())
    assert (
        memory.get()[0].content
        == "<memory>\n<core_info>\nlikes tea\n</core_info>\n</memory>\nbe brief"
    )
    assert memory.context().history_tokens == fresh.context().history_tokens == 3


OTHER_PROCESS = textwrap.dedent(
    """
    import sys
    from memcli import Memory, Message
    from fakes import WordTokenizer
    from memcli.store import open_store

    memory = Memory(open_store(sys.argv[1]), "s", tokenizer=WordTokenizer())
    memory.put_messages([Message("user", "from the other process " * 3), Message("assistant", "ok")])
    memory.flush_now()
    """
)


def test_sees_what_another_process_wrote(db: str, tmp_path: Path) -> None:
    memory = Memory(open_store(db), "s", budget=Budget(40, 0.7, 5), tokenizer=WordTokenizer())
    memory.put_messages([Message("user", "first question"), Message("assistant", "first answer")])
    before = memory.get()
    script = tmp_path / "other.py"
    script.write_text(importing_fakes(OTHER_PROCESS))
    subprocess.run([sys.executable, str(script), db], check=True)
    after = memory.get()
    assert exact(after) == exact(fresh_get(db))
    assert [m.content for m in after][-1] == "ok"
    assert before[0].id not in {m.id for m in after}  # the other process flushed it


def test_a_rolled_back_transaction_leaves_nothing_behind(db: str) -> None:
    """Puts inside a caller's transaction that fails, then one write by another Memory: the
    session's version is back to a number this Memory may have seen inside the transaction."""
    for get_inside in (False, True):
        session = f"s{get_inside}"
        memory = Memory(open_store(db), session, tokenizer=WordTokenizer())
        other = Memory(open_store(db), session, tokenizer=WordTokenizer())
        memory.put(Message("user", "kept"))
        memory.get()
        with suppress(Boom), memory.store.transaction():
            memory.put(Message("assistant", "rolled back"))
            if get_inside:
                assert memory.get()[-1].content == "rolled back"
            raise Boom
        other.put(Message("assistant", "from the other"))
        assert [m.content for m in memory.get()] == ["kept", "from the other"]
        assert exact(memory.get()) == exact(fresh_get(db, session))


def test_a_put_that_fails_halfway_leaves_nothing_behind(db: str) -> None:
    memory = Memory(open_store(db), "s", budget=Budget(12, 0.7, 4), tokenizer=WordTokenizer())
    other = Memory(open_store(db), "s", tokenizer=WordTokenizer())
    memory.put(Message("user", "kept"))
    memory.get()

    def progress(n: int) -> None:
        raise Boom  # after the first call was put (and flushed) in memory

    turn = [Message("user", "w w w w"), Message("assistant", "w w w w")]
    with suppress(Boom):
        memory.put_calls([turn, turn], progress=progress)
    assert exact(memory.get()) == exact(fresh_get(db))
    other.put(Message("assistant", "from the other"))
    assert [m.content for m in memory.get()] == ["kept", "from the other"]
    assert memory.store.list_flushes("s") == []
