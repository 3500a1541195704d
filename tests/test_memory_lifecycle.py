"""A Memory's life cycle (close, aclose, with, async with, collected unclosed) and the store, pool
and threads the Memories of one database share in a process (memcli.store.pool), on SQLite and
PostgreSQL; and the per-request pattern of docs/python.md under 40 concurrent users."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path

import pytest

from memcli import Memory, Message, SQLiteStore
from memcli.errors import MemcliError, UsageError
from memcli.store import pool

PATIENCE_S = 120.0  # a guard only: CI can be ten times slower than a laptop


def opened_here(db: str) -> list[str]:
    """The shared stores and pools this process holds of `db` (another test of the worker may
    have left a Memory of its own database to the garbage collector)."""
    return [d for d in pool.open_databases() if db.split("@")[-1] in d]


def store_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("memcli-store")]


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def file_fds(path: Path) -> int:
    """How many of this process's file descriptors are open on the database (or its WAL)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path.resolve())):
            found += 1
    return found


def server_connections(url: str) -> int:
    """Connections the server has to the database of `url` (this query's own left out)."""
    import psycopg

    name = url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def held(db: str) -> int:
    """What this process holds on the database: fds on a SQLite file, server connections."""
    if db.startswith("postgresql"):
        return server_connections(db)
    return file_fds(Path(db))


def wait_for(check: object, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_close_frees_the_connection_and_twice_is_harmless(db: str) -> None:
    memory = Memory.from_defaults(session_id="s", user_id="ana", db=db)
    memory.put(Message("user", "hello"))
    assert held(db) >= 1 and pool.open_databases()
    memory.close()
    wait_for(lambda: held(db) == 0, "the connection stayed open after close()")
    assert opened_here(db) == [] and memory.closed
    memory.close()  # twice: nothing happens
    with Memory.from_defaults(session_id="s", db=db) as again:  # what was stored stays
        assert [m.content for m in again.get_all()] == ["hello"]
    wait_for(lambda: held(db) == 0, "the connection stayed open after the with block")


def test_a_closed_memory_says_so(db: str) -> None:
    memory = Memory.from_defaults(session_id="s", db=db)
    memory.close()
    for use in (
        lambda: memory.put(Message("user", "x")),
        memory.get,
        memory.get_all,
        memory.active_tokens,
        lambda: memory.search("x", mode="lexical"),
        lambda: memory.store,
        memory.reset,
        memory.flush_now,
    ):
        with pytest.raises(UsageError, match="the Memory of session 's' is closed"):
            use()
    with pytest.raises(MemcliError, match="is closed"):
        asyncio.run(memory.aput(Message("user", "x")))


def test_async_with_await_aopen_closes_it_and_its_threads(db: str) -> None:
    before = len(store_threads())

    async def main() -> list[str]:
        async with await Memory.aopen(session_id="s", db=db) as memory:
            await memory.aput(Message("user", "hi"))
            assert len(store_threads()) > before  # the database's worker threads run
            texts = [m.content for m in await memory.aget()]
        assert memory.closed
        await memory.aclose()  # twice
        return texts

    assert asyncio.run(main()) == ["hi"]
    wait_for(lambda: len(store_threads()) == before, "the worker threads outlived the Memory")
    wait_for(lambda: held(db) == 0, "the connection stayed open after async with")


def test_a_memory_collected_unclosed_warns_and_frees_its_store(db: str) -> None:
    memory = Memory.from_defaults(session_id="s", db=db)
    memory.put(Message("user", "hello"))
    asyncio.run(memory.aget())  # its worker threads made
    deadline = time.monotonic() + PATIENCE_S
    while sys.getrefcount(memory) > 2:  # (the worker thread lets go of the call it ran)
        assert time.monotonic() < deadline, "something else holds the Memory"
        time.sleep(0.01)
    ref = weakref.ref(memory)
    gc.disable()  # collected by reference counting alone: no cycle keeps it alive
    try:
        with pytest.warns(ResourceWarning, match="unclosed memcli.Memory"):
            del memory
        assert ref() is None
    finally:
        gc.enable()
    wait_for(lambda: held(db) == 0, "a Memory collected unclosed kept its connection")
    wait_for(lambda: not store_threads(), "a Memory collected unclosed kept its threads")
    assert opened_here(db) == []


def test_a_closed_memory_collected_says_nothing(tmp_path: Path) -> None:
    memory = Memory.from_defaults(session_id="s", db=str(tmp_path / "m.db"))
    memory.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del memory
        gc.collect()


def test_a_store_passed_in_stays_open(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "m.db")
    with Memory(store, session_id="s") as memory:
        memory.put(Message("user", "hi"))
    assert not store.closed and store.session_version("s") >= 0
    with Memory.from_defaults(session_id="s", db=store) as memory:
        pass
    assert not store.closed
    store.close()


def test_memories_of_one_file_share_one_store(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    first = Memory.from_defaults(session_id="a", db=str(path))
    second = Memory.from_defaults(session_id="b", db=path)
    assert first.store is second.store
    first.close()
    second.put(Message("user", "still open"))  # the other's close leaves it open
    assert file_fds(path) >= 1
    second.close()
    assert file_fds(path) == 0
    with Memory.from_defaults(session_id="b", db=path) as third:
        assert [m.content for m in third.get_all()] == ["still open"]


def test_an_in_memory_database_is_the_memorys_own(tmp_path: Path) -> None:
    first, second = Memory.from_defaults(session_id="a"), Memory.from_defaults(session_id="a")
    assert first.store is not second.store
    store = first.store
    first.close()
    assert store.closed  # type: ignore[attr-defined]
    second.close()


def test_a_failed_open_gives_the_store_back(db: str) -> None:
    Memory.from_defaults(session_id="s", token_limit=1000, db=db).close()
    with pytest.raises(MemcliError, match="session 's' has the budget"):
        Memory.from_defaults(session_id="s", token_limit=2000, db=db)  # not its budget
    assert opened_here(db) == []
    wait_for(lambda: held(db) == 0, "a failed open kept its connection")


def test_the_postgresql_pool_is_bounded(pg_url: str) -> None:
    """More Memories open than the pool has connections: they share the connections (none
    waits), and each works on its own session."""
    memories = [Memory.from_defaults(session_id=f"s{i}", db=pg_url, pool_size=2) for i in range(5)]
    assert server_connections(pg_url) == 2
    assert len({id(m.store) for m in memories}) == 2

    async def each_puts(memory: Memory, i: int) -> None:
        for n in range(5):
            await memory.aput(Message("user", f"{i}-{n}"))

    async def main() -> None:
        await asyncio.gather(*(each_puts(m, i) for i, m in enumerate(memories)))

    asyncio.run(main())
    for i, memory in enumerate(memories):
        assert [m.content for m in memory.get_all()] == [f"{i}-{n}" for n in range(5)]
    assert server_connections(pg_url) == 2
    memories.pop().close()  # the others go on
    memories[0].put(Message("user", "more"))
    for memory in memories:
        memory.close()
    wait_for(lambda: server_connections(pg_url) == 0, "the pool outlived its last Memory")
    with pytest.raises(UsageError, match="pool_size must be a whole number"):
        Memory.from_defaults(session_id="s", db=pg_url, pool_size=0)


def test_a_postgresql_url_that_does_not_connect_says_why(pg_url: str) -> None:
    bad = pg_url.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(MemcliError, match="no_such_database"):
        Memory.from_defaults(session_id="s", db=bad)
    assert opened_here(bad) == []


USERS, REQUESTS = 40, 3


async def _per_request_app(db: str) -> list[BaseException]:
    """docs/python.md's per-request pattern: each request opens the user's Memory, puts, reads
    what goes to the model, puts the reply and closes it; 40 users at once."""
    errors: list[BaseException] = []

    async def request(user: int, n: int) -> None:
        async with await Memory.aopen(session_id=f"user-{user}", user_id=f"u{user}", db=db) as m:
            await m.aput(Message("user", f"question {n} of user {user}"))
            context = await m.aget()
            await m.aput(Message("assistant", f"answer to {context[-1].content}"))

    async def user(i: int) -> None:
        for n in range(REQUESTS):
            try:
                await request(i, n)
            except Exception as exc:  # counted: the test expects none
                errors.append(exc)

    await asyncio.gather(*(user(i) for i in range(USERS)))
    return errors


def test_per_request_memories_serve_40_users_with_flat_fds_and_threads(db: str) -> None:
    asyncio.run(_per_request_app(db))  # warm: asyncio's own threads, the model of imports
    wait_for(lambda: not store_threads() and held(db) == 0, "warm-up left threads or files")
    fds_before, threads_before = fds(), threading.active_count()
    peak: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # the connections the process holds while it serves
        while not stop.wait(0.05):
            peak.append(held(db))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        errors = asyncio.run(_per_request_app(db))
    finally:
        stop.set()
        watcher.join()
    assert errors == []
    if db.startswith("postgresql"):
        assert max(peak, default=0) <= pool.POOL_SIZE  # never a connection per request
    else:
        assert max(peak, default=0) <= 3  # the file, its WAL and its shared memory: once
    wait_for(lambda: fds() <= fds_before, f"fds grew: {fds_before} -> {fds()}")
    wait_for(
        lambda: threading.active_count() <= threads_before,
        f"threads grew: {threads_before} -> {threading.active_count()}",
    )
    with Memory.from_defaults(session_id="user-7", db=db) as memory:
        assert len(memory.get_all()) == 2 * REQUESTS * 2  # both runs' requests, nothing lost


def test_a_vector_block_shared_by_per_request_memories_keeps_no_dead_index(tmp_path: Path) -> None:
    """A VectorBlock made once and given to a Memory per request: its index over the database's
    store goes when the last Memory on it closes, so the block holds none of closed stores."""
    from fakes import HashEmbedder

    from memcli import VectorBlock

    block = VectorBlock(embedder=HashEmbedder(), index_dir=tmp_path / "indexes")
    for n in range(3):
        with Memory.from_defaults(
            session_id="s", db=tmp_path / "m.db", memory_blocks=[block], token_limit=40
        ) as memory:
            for i in range(6):
                memory.put(Message("user" if i % 2 == 0 else "assistant", f"turn {n} {i} " * 5))
            memory.get("what did we say?")
            assert block._retrievers  # (its index over this store, while open)
            store = memory.store
        assert store.closed  # type: ignore[attr-defined]
        assert not block._retrievers
