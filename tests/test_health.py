"""The embedding claim after a killed holder, and a vector batch done only when it is stored."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from fakes import HashEmbedder

from memcli import Memory, Message, VectorBlock
from memcli.search import retriever as retriever_module
from memcli.store import longterm
from memcli.store import vectors as vsql


def memory(tmp_path: Path) -> tuple[Memory, VectorBlock]:
    block = VectorBlock(embedder=HashEmbedder())
    m = Memory.from_defaults(
        session_id="s",
        token_limit=40,
        token_flush_size=10,
        db=tmp_path / "m.db",
        memory_blocks=[block],
    )
    return m, block


def hold(store, model: str, pid: int) -> None:
    """A claim as a process `pid` of this host would leave it, live for two minutes."""
    value = f"feed/{pid}@{socket.gethostname()} {time.time() + 120:.3f}"
    with store.transaction():
        store.execute(
            "INSERT INTO retrieval_state (key, value) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (f"embedding:{model}", value),
        )


def dead_pid() -> int:
    pid = 999_999
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
        pid -= 1


def statuses(m: Memory, block: VectorBlock) -> list[str]:
    rows = m.store.execute("SELECT status FROM block_flushes WHERE block = ?", (block.name,))
    return [r[0] for r in rows]


def test_a_dead_holders_claim_is_taken_over_at_once(tmp_path: Path) -> None:
    m, block = memory(tmp_path)
    model = block.retriever(m.store).model
    hold(m.store, model, dead_pid())
    started = time.monotonic()
    for i in range(8):
        m.put_messages([Message("user", f"message {i} about tea"), Message("assistant", "ok")])
    assert time.monotonic() - started < 60  # (were the claim waited for, 2 minutes)
    assert statuses(m, block) and set(statuses(m, block)) == {"done"}
    assert vsql.pending_count(m.store, model) <= 4  # only short-term memory may wait
    assert vsql.claim_holder(m.store, model) is None  # released


def test_a_live_holder_leaves_the_batches_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retriever_module, "CLAIM_WAIT", 0.3)
    m, block = memory(tmp_path)
    model = block.retriever(m.store).model
    hold(m.store, model, os.getpid())  # alive: this process, another token
    for i in range(8):
        m.put_messages([Message("user", f"message {i} about tea"), Message("assistant", "ok")])
    found = statuses(m, block)
    assert found and set(found) == {"pending"}
    errors = [
        r[0]
        for r in m.store.execute("SELECT error FROM block_flushes WHERE block = ?", (block.name,))
    ]
    assert all(f"process {os.getpid()}@" in e and "embedding claim" in e for e in errors), errors
    from memcli import unfinished

    items = unfinished(m.store, lambda session, user: [block])
    assert [(a.kind, a.block, a.count) for a in items] == [("pending", block.name, len(found))]
    assert "not retried automatically" in items[0].message
    assert items[0].fix == "memcli blocks backfill --user default"
    # The holder goes away: the next feed embeds, and the retry marks them done.
    with m.store.transaction():
        m.store.execute("DELETE FROM retrieval_state WHERE key LIKE 'embedding:%'")
    from memcli.blocks.feed import backfill

    result = backfill(m.store, [block], m.store.list_sessions("default"), m.tokenizer)
    assert result.pending == {block.name: 0} and result.done[block.name] == len(found)
    assert longterm.pending_flushes(m.store, block.name, "user:default") == []
    assert unfinished(m.store, lambda session, user: [block]) == []


def test_a_vector_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    import sqlite3

    from memcli.errors import StoreDamaged

    m, block = memory(tmp_path)
    for i in range(8):
        m.put_messages([Message("user", f"message {i} about tea"), Message("assistant", "ok")])
    m.store.close()
    conn = sqlite3.connect(tmp_path / "m.db")
    with conn:
        conn.execute("UPDATE retrieval_vectors SET vector = 'garbage' WHERE id = 2")
    conn.close()
    for suffix in ("faiss", "npz", "json"):
        Path(f"{tmp_path / 'm.db'}.retrieval.{suffix}").unlink(missing_ok=True)
    m2, block2 = memory(tmp_path)
    with pytest.raises(StoreDamaged, match="not a vector"):
        block2.retriever(m2.store).search("tea", k=2)


def test_search_and_dump_on_damaged_pages_end_with_an_error(tmp_path: Path) -> None:
    import json
    import sqlite3

    from helpers import memcli

    db = tmp_path / "m.db"
    lines = "".join(
        json.dumps({"role": "user", "content": f"message {i} about tea and Porto " * 8}) + "\n"
        for i in range(300)
    )
    run = memcli(
        "--db", str(db), "import", "-", "--session", "s", "--token-limit", "2000", input=lines
    )
    assert run.code == 0, run.stderr
    assert memcli("--db", str(db), "search", "tea").code == 0  # every message embedded
    conn = sqlite3.connect(db)
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = [
        r[0]
        for r in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'retrieval_vectors' AND pagetype = 'leaf'"
        )
    ]
    conn.close()
    assert pages
    with open(db, "r+b") as file:
        for page in pages[:3]:
            file.seek((page - 1) * size + 8)
            file.write(b"\xa5" * (size - 200))
    for suffix in ("faiss", "npz", "json"):
        Path(f"{db}.retrieval.{suffix}").unlink(missing_ok=True)
    for command in (["search", "tea"], ["dump", "context", "s"]):
        run = memcli("--db", str(db), *command)
        assert run.code == 1, run.stderr
        assert "Traceback" not in run.stderr and "is damaged" in run.stderr, run.stderr
