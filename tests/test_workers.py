"""Several worker processes on one database (SQLite and PostgreSQL): putting into one session and
into their own at once, nothing is lost or duplicated, each session keeps its order, flushes take
whole turns oldest first, and a reader is never blocked by a writer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from fakes import WordTokenizer, importing_fakes

from memcli import Memory, Message
from memcli.flush import Budget
from memcli.store import open_store

WORKER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from memcli import Memory, Message
    from fakes import WordTokenizer
    from memcli.flush import Budget
    from memcli.store import open_store

    db, session, worker, turns, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    memory = Memory(open_store(db), session, budget=Budget(60, 0.7, 10), tokenizer=WordTokenizer())
    while not Path(go).exists():  # all start together
        pass
    for i in range(turns):
        memory.put_messages(
            [
                Message("user", f"{worker} q{i} " + "word " * (i % 5)),
                Message("assistant", f"{worker} a{i} fine"),
            ]
        )
    """
)

SHARED = 4  # workers putting into the session "shared"
OWN = 4  # workers putting into a session of their own
TURNS = 25


def _start_workers(db: str, tmp_path: Path) -> tuple[list[subprocess.Popen[bytes]], Path]:
    script = tmp_path / "worker.py"
    script.write_text(importing_fakes(WORKER))
    go = tmp_path / "go"
    sessions = ["shared"] * SHARED + [f"own{w}" for w in range(OWN)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), db, session, f"w{w}", str(TURNS), str(go)],
            stderr=subprocess.PIPE,
        )
        for w, session in enumerate(sessions)
    ]
    return procs, go


def _check_session(memory: Memory, workers: list[str]) -> None:
    """Every put message there once, each worker's in its order with each reply right after its
    question; ids grow with the order; flushes are whole turns, oldest first, back to back; the
    window is within budget (or a single turn)."""
    everything = memory.get_all()
    contents = [m.content.split()[:2] for m in everything]
    expected = {(w, f"{k}{i}") for w in workers for i in range(TURNS) for k in "qa"}
    assert len(contents) == len(expected) == len({tuple(c) for c in contents})
    assert {tuple(c) for c in contents} == expected
    ids = [m.id for m in everything]
    assert ids == sorted(ids)
    for w in workers:
        mine = [c[1] for c in contents if c[0] == w]
        assert mine == [f"{k}{i}" for i in range(TURNS) for k in "qa"]
    for i, m in enumerate(everything):
        if m.role == "user":
            assert everything[i + 1].content.split()[:2] == [
                m.content.split()[0],
                "a" + m.content.split()[1][1:],
            ]
    archived = [m for m in everything if m.status == "archived"]
    assert everything[: len(archived)] == archived  # the oldest, and only they
    position = {m.id: i for i, m in enumerate(everything)}
    start = 0
    for flush in memory.store.list_flushes(memory.session_id):
        first, last = position[flush.first_message_id], position[flush.last_message_id]
        assert first == start  # back to back, oldest first
        assert [m.flush_id for m in everything[first : last + 1]] == [flush.id] * (last - first + 1)
        assert everything[first].role == "user"  # whole turns
        assert last + 1 == len(everything) or everything[last + 1].role == "user"
        start = last + 1
    assert start == len(archived)
    info = memory.session()
    active = everything[len(archived) :]
    assert info.active_messages == len(active)
    assert info.active_tokens == sum(m.tokens for m in active)
    single_turn = sum(1 for m in active if m.role == "user") <= 1
    assert info.active_tokens <= info.threshold or single_turn


def test_workers_put_into_one_session_and_their_own(db: str, tmp_path: Path) -> None:
    """8 processes: 4 put into one session, 4 each into their own; a reader reads meanwhile."""
    Memory(open_store(db), "shared", budget=Budget(60, 0.7, 10), tokenizer=WordTokenizer())
    procs, go = _start_workers(db, tmp_path)
    reads: list[int] = []
    problems: list[str] = []
    done = threading.Event()

    def reader() -> None:
        store = open_store(db)
        while not done.is_set():
            messages = store.get_messages("shared")
            ids = [m.id for m in messages]
            if ids != sorted(ids) or len(set(ids)) != len(ids):
                problems.append(f"a read saw ids out of order: {ids}")
            reads.append(len(messages))
        store.close()

    thread = threading.Thread(target=reader)
    thread.start()
    go.touch()
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err.decode()
    finally:
        done.set()
        thread.join()
    assert problems == [] and reads
    store = open_store(db)
    _check_session(
        Memory(store, "shared", tokenizer=WordTokenizer()), [f"w{w}" for w in range(SHARED)]
    )
    for w in range(OWN):
        name = f"w{SHARED + w}"
        _check_session(Memory(store, f"own{w}", tokenizer=WordTokenizer()), [name])
    assert store.check() == []


def test_a_reader_is_not_blocked_by_an_open_write_transaction(db: str) -> None:
    """While one connection holds a write transaction on a session (its rows changed, not yet
    committed), another reads the session, and another session is written, without waiting."""
    writer = open_store(db)
    memory = Memory(writer, "s", tokenizer=WordTokenizer())
    memory.put(Message("user", "committed"))
    other = Memory(open_store(db), "t", tokenizer=WordTokenizer())
    seen: list[list[str]] = []
    with writer.transaction():
        memory.put(Message("assistant", "not yet"))
        memory.flush_now()

        def read() -> None:
            seen.append([m.content for m in open_store(db).get_messages("s")])

        thread = threading.Thread(target=read)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the reader waited for the writer"
        if db.startswith("postgresql://"):  # writers of other sessions do not wait either
            other.put(Message("user", "meanwhile"))
    assert seen == [["committed"]]
    assert [m.content for m in open_store(db).get_messages("s")] == ["committed", "not yet"]
