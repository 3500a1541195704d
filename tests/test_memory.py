"""Memory: the engine's public API, persistence, and what it does where the reference loses data."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fakes import WordTokenizer, importing_fakes

from memcli import Memory, Message, UsageError
from memcli.context import insert_memory, render_memory
from memcli.flush import Budget
from memcli.store import open_store
from memcli.store.sqlite import SQLiteStore


def chat(n: int) -> list[Message]:
    out = []
    for i in range(n):
        out.append(Message("user", f"question number {i} about the weather"))
        out.append(Message("assistant", f"answer number {i} it is sunny"))
    return out


def test_put_returns_flushes_and_archives(db: str) -> None:
    memory = Memory.from_defaults(token_limit=40, token_flush_size=10, db=db)
    flushes = []
    for m in chat(6):
        flushes += memory.put(m)
    assert flushes, "a 40-token budget must flush 12 messages of ~7 tokens"
    archived = memory.get_all(status="archived")
    assert [m.id for m in archived] == [i for f in flushes for i in f.message_ids]
    assert all(f.tokens == sum(m.tokens for m in archived if m.flush_id == f.id) for f in flushes)
    assert memory.active_tokens() <= memory.threshold or len(memory.get_all("active")) <= 2


def test_no_flush_on_get_or_set() -> None:
    memory = Memory.from_defaults(token_limit=20, token_flush_size=5, tokenizer=WordTokenizer())
    memory.set(chat(5))  # 50 words, far over budget
    assert memory.get_all(status="archived") == []
    assert len(memory.get()) == 10
    assert memory.get_all(status="archived") == []


def test_set_keeps_archived_history() -> None:
    memory = Memory.from_defaults(token_limit=20, token_flush_size=5, tokenizer=WordTokenizer())
    memory.put_messages(chat(4))
    archived = memory.get_all(status="archived")
    assert archived
    memory.set([Message("user", "start again")])
    assert [m.content for m in memory.get()] == ["start again"]
    assert [m.id for m in memory.get_all(status="archived")] == [m.id for m in archived]


def test_reset_deletes_messages_and_says_how_many() -> None:
    memory = Memory.from_defaults(token_limit=20, token_flush_size=5, tokenizer=WordTokenizer())
    memory.put_messages(chat(4))
    assert memory.reset() == 8
    assert memory.get_all() == []
    assert memory.store.list_flushes(memory.session_id) == []
    memory.put(Message("user", "hello again"))
    assert len(memory.get()) == 1


def test_persists_across_restart(db: str) -> None:
    first = Memory.from_defaults(session_id="s", token_limit=40, token_flush_size=10, db=db)
    for m in chat(6):
        first.put(m)
    before = [(m.id, m.status, m.flush_id) for m in first.get_all()]
    first.store.close()
    again = Memory(open_store(db), "s")
    assert [(m.id, m.status, m.flush_id) for m in again.get_all()] == before
    assert again.budget.token_limit == 40 and again.budget.flush_size == 10
    again.put(Message("user", "one more"))
    assert again.get_all()[-1].content == "one more"


def test_two_processes_share_a_session(db: str) -> None:
    """A Memory notices what another writer did to the session (its window cache is checked)."""
    a = Memory(open_store(db), "s", budget=None, tokenizer=WordTokenizer())
    b = Memory(open_store(db), "s", tokenizer=WordTokenizer())
    a.put(Message("user", "from a"))
    b.put(Message("assistant", "from b"))
    a.put(Message("user", "from a again"))
    assert [m.content for m in a.get()] == ["from a", "from b", "from a again"]
    assert a.active_tokens() == 7


def test_writers_taking_turns_flush_as_one_writer_and_race_safely(db: str, tmp_path: Path) -> None:
    """Two writers taking turns on a session (two processes, a web app's workers) store and
    flush exactly what one writer does; a put whose window another writer changes between its
    read and its write reads it again and tries once more, then takes the session's lock."""
    budget = Budget(60, 0.7, 15)
    turns = [
        Message("user" if i % 2 == 0 else "assistant", f"turn {i} " + "w " * (i % 5))
        for i in range(80)
    ]
    one = Memory(open_store(tmp_path / "one.db"), "s", budget=budget, tokenizer=WordTokenizer())
    a = Memory(open_store(db), "s", budget=budget, tokenizer=WordTokenizer())
    b = Memory(open_store(db), "s", budget=budget, tokenizer=WordTokenizer())
    for i, message in enumerate(turns):
        expected = one.put(message)
        got = (a if i % 2 == 0 else b).put(message)
        assert [(len(f.message_ids), f.tokens) for f in got] == [
            (len(f.message_ids), f.tokens) for f in expected
        ], i

    def shape(memory: Memory) -> list[tuple[str, str, str]]:
        return [(m.role, m.content, m.status) for m in memory.get_all()]

    assert shape(a) == shape(b) == shape(one)
    assert a.store.check() == []
    # Each put: one miss at most, then at once.
    assert a._writer.contended == b._writer.contended == 0

    # Another writer slips in between a's read of the window and its put.
    sync = a._writer.sync
    slips = {"left": 1}

    def sync_then_another_writer(*args, **kwargs):  # type: ignore[no-untyped-def]
        sync(*args, **kwargs)
        if slips["left"] and not a.store.transaction_depth:
            slips["left"] -= 1
            b.put(Message("assistant", "slipped in"))
            one.put(Message("assistant", "slipped in"))

    a._writer.sync = sync_then_another_writer  # type: ignore[method-assign]
    b.put(Message("assistant", "b first"))
    one.put(Message("assistant", "b first"))
    a.put(Message("user", "a after the slip"))  # miss, read again (b slips), miss, then the lock
    one.put(Message("user", "a after the slip"))
    assert slips["left"] == 0 and a._writer.contended > 0
    for i, message in enumerate(turns[:40]):  # and on: the lock, then at once again
        assert [f.tokens for f in (a if i % 2 == 0 else b).put(message)] == [
            f.tokens for f in one.put(message)
        ]
    assert a._writer.contended == 0
    assert shape(a) == shape(b) == shape(one)
    assert [m.content for m in a.get_all()].count("slipped in") == 1
    assert a.store.check() == []


def test_messages_keep_name_metadata_timestamp() -> None:
    memory = Memory.from_defaults()
    memory.put(Message("user", "hi", name="Ana", metadata={"k": 1}, timestamp=None))
    stored = memory.get_all()[0]
    assert stored.name == "Ana" and stored.metadata == {"k": 1}
    # Tokens: the text plus str(metadata), as the reference counts them.
    assert stored.tokens == memory.tokenizer.count("hi") + memory.tokenizer.count(str({"k": 1}))


def test_flush_size_over_limit_is_an_error() -> None:
    with pytest.raises(UsageError, match="larger than token_limit"):
        Memory.from_defaults(token_limit=100, token_flush_size=200)


def test_default_flush_size_is_ten_percent() -> None:
    assert Memory.from_defaults(token_limit=5000).budget.flush_size == 500


def test_bad_role_and_insert_method() -> None:
    from memcli import InputError

    with pytest.raises(InputError, match="unknown role"):
        Message("robot", "hi")
    with pytest.raises(UsageError, match="insert_method"):
        Memory.from_defaults(insert_method="middle")


def test_get_all_status_filter() -> None:
    memory = Memory.from_defaults()
    with pytest.raises(UsageError):
        memory.get_all(status="deleted")


def test_render_and_insert() -> None:
    text = render_memory([("core_info", "likes tea"), ("facts", "<fact>a</fact>")])
    assert (
        text
        == "<memory>\n<core_info>\nlikes tea\n</core_info>\n<facts>\n<fact>a</fact>\n</facts>\n</memory>"
    )
    history = [Message("user", "q1"), Message("assistant", "a1"), Message("user", "q2")]
    system = insert_memory(history, "MEM", "system")
    assert system[0] == Message("system", "MEM") and system[1:] == history
    with_system = insert_memory([Message("system", "be brief"), *history], "MEM", "system")
    assert with_system[0].content == "MEM\nbe brief"
    user = insert_memory(history, "MEM", "user")
    assert user[2].content == "MEM\nq2" and user[0].content == "q1"
    assert insert_memory([Message("assistant", "x")], "MEM", "user")[-1] == Message("user", "MEM")
    assert insert_memory(history, "", "system") == history


CRASH = textwrap.dedent(
    """
    import os, sys
    from memcli import Memory, Message
    from fakes import WordTokenizer
    from memcli.store.sqlite import SQLiteStore

    point = sys.argv[2]
    store = SQLiteStore(sys.argv[1])
    memory = Memory(store, "s", tokenizer=WordTokenizer())
    original_archive = store.archive
    original_touches = store._apply_touches

    def archive(*args, **kwargs):
        flush_id = original_archive(*args, **kwargs)
        if point == "archive":
            os._exit(3)  # the process dies in the middle of the flush
        return flush_id

    def touches():
        original_touches()
        if point == "commit" and memory._writer.window_tokens < 30:
            os._exit(3)  # dies with everything written but not committed

    store.archive = archive
    store._apply_touches = touches
    memory.put(Message("user", "w " * 30))
    """
)


def _consistent(db: Path) -> tuple[int, int, int]:
    store = SQLiteStore(db)
    info = store.get_session("s")
    assert info is not None
    messages = store.get_messages("s")
    active = [m for m in messages if m.status == "active"]
    archived = [m for m in messages if m.status == "archived"]
    flushes = store.list_flushes("s")
    assert info.active_messages == len(active) and info.archived_messages == len(archived)
    assert info.active_tokens == sum(m.tokens or 0 for m in active)
    assert info.flushes == len(flushes)
    assert sum(f.messages for f in flushes) == len(archived)
    assert all(m.flush_id in {f.id for f in flushes} for m in archived)
    return len(active), len(archived), len(flushes)


@pytest.mark.parametrize("point", ["archive", "commit"])
def test_crash_in_the_middle_of_a_flush(tmp_path: Path, point: str) -> None:
    db = tmp_path / "crash.db"
    memory = Memory(SQLiteStore(db), "s", tokenizer=WordTokenizer(), budget=Budget(40, 0.7, 10))
    memory.put_messages(chat(2))
    before = _consistent(db)
    script = tmp_path / "crash.py"
    script.write_text(importing_fakes(CRASH))
    proc = subprocess.run([sys.executable, str(script), str(db), point], capture_output=True)
    assert proc.returncode == 3, proc.stderr.decode()
    # The crash left the state before the put and its flush: nothing half-written.
    assert _consistent(db) == before
    # And the same put, not interrupted, goes through and flushes.
    memory = Memory(SQLiteStore(db), "s", tokenizer=WordTokenizer())
    memory.put(Message("user", "w " * 30))
    after = _consistent(db)
    assert after[2] > before[2]


# -- budgets: a stored session keeps its own unless rebudget() changes it --------------------------


def test_resuming_without_a_budget_uses_the_stored_one(db: str) -> None:
    Memory.from_defaults(session_id="s", token_limit=40, token_flush_size=10, db=db).store.close()
    again = Memory.from_defaults(session_id="s", db=db)  # no budget given: the stored one
    assert again.budget == Budget(40, 0.7, 10)
    assert Memory.from_defaults(session_id="s", db=db, token_flush_size=10).budget.token_limit == 40
    info = open_store(db).get_session("s")
    assert info is not None and info.token_limit == 40 and info.token_flush_size == 10


def test_opening_a_session_with_another_budget_is_an_error(db: str) -> None:
    Memory(open_store(db), "s", budget=Budget(40, 0.7, 10)).put_messages(chat(2))
    with pytest.raises(UsageError, match=r"'s' has the budget 40 × 0.7 \(flush 10\), not 100"):
        Memory(open_store(db), "s", budget=Budget(100, 0.7, 10))
    with pytest.raises(UsageError, match="rebudget"):
        Memory.from_defaults(session_id="s", db=db, token_limit=100)
    info = open_store(db).get_session("s")
    assert info is not None and info.token_limit == 40  # nothing was stored


def test_rebudget_stores_the_budget_and_flushes_at_once(db: str) -> None:
    memory = Memory(open_store(db), "s", budget=Budget(1000, 0.7, 10), tokenizer=WordTokenizer())
    memory.put_messages(chat(4))
    assert memory.store.list_flushes("s") == []
    flushes = memory.rebudget(Budget(20, 0.5, 5))
    assert len(flushes) == 3  # every turn but the newest, which always stays
    assert [m.content for m in memory.get()] == [m.content for m in chat(4)[-2:]]
    again = Memory(open_store(db), "s", tokenizer=WordTokenizer())
    assert again.budget == Budget(20, 0.5, 5)
    assert len(again.store.list_flushes("s")) == len(flushes)


def test_a_session_opens_as_its_users_and_never_as_another_users(db: str) -> None:
    """A stored session is its user's: opened without a user it is theirs; opened by another
    user, the name is that user's own session (two users may each have `s`), and neither
    sees the other's messages; without a user, a name two users have is ambiguous."""
    Memory.from_defaults(session_id="s", user_id="ana", db=db).put(Message("user", "I am Ana"))
    again = Memory.from_defaults(session_id="s", db=db)
    assert again.user_id == "ana"
    bos = Memory.from_defaults(session_id="s", user_id="bo", db=db)
    assert (bos.session_id, bos.user_id, bos.get_all()) == ("s", "bo", [])
    bos.put(Message("user", "I am Bo"))
    default = Memory(open_store(db), "s", user_id="default")
    assert default.get_all() == []
    assert [m.content for m in again.get_all()] == ["I am Ana"]
    assert [m.content for m in bos.get_all()] == ["I am Bo"]
    assert bos.search("Ana", mode="lexical").hits == []  # (the user's memory only)
    assert Memory.from_defaults(session_id="s", user_id="ana", db=db).user_id == "ana"
    with pytest.raises(UsageError, match="3 users have a session 's': ana, bo, default"):
        Memory.from_defaults(session_id="s", db=db)
    assert Memory.from_defaults(session_id="new", db=db).user_id == "default"


def test_a_put_of_something_not_a_message_says_what_to_pass() -> None:
    from memcli import InputError

    memory = Memory.from_defaults()
    with pytest.raises(InputError, match=r"a Message or a dict, not str.*Message\(\"user\""):
        memory.put("hello")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="missing role"):
        memory.put({"content": "hello"})  # type: ignore[arg-type]
    assert memory.get_all() == []
