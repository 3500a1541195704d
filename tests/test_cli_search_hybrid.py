"""`memcli search` over everything stored: --since/--until, --explain, --queries, timestamps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import memcli

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def backend(vdb: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on SQLite (the default file), PostgreSQL (a FAISS file) and pgvector."""
    if vdb.startswith("postgresql://"):
        monkeypatch.setenv("MEMCLI_DB", vdb)
    return vdb


LINES = [
    ("user", "I adopted a puppy called Biscuit", "2023-05-08T13:56:00Z"),
    ("assistant", "What breed is Biscuit?", "2023-05-08T13:57:00Z"),
    ("user", "My sister plays the cello in an orchestra", "2023-06-01T09:00:00Z"),
    ("assistant", "Does she perform often?", "2023-06-01T09:01:00Z"),
    ("user", "We went kayaking on the Douro river", "2023-07-15T18:30:00Z"),
    ("assistant", "That sounds lovely", "2023-07-15T18:31:00Z"),
]


def write(path: Path, session: str = "s1") -> str:
    path.write_text(
        "\n".join(
            json.dumps({"role": r, "content": c, "timestamp": t, "session": session})
            for r, c, t in LINES
        )
        + "\n"
    )
    return str(path)


def test_search_finds_short_term_messages_with_times(tmp_path: Path) -> None:
    assert memcli("import", write(tmp_path / "a.jsonl"), "--no-blocks").code == 0
    run = memcli("search", "what instrument does her sister play", "-k", "2", "--json")
    assert run.code == 0, run.stderr
    hits = run.records()
    assert hits[0]["type"] == "hit" and "cello" in hits[0]["text"]
    assert hits[0]["first_time"] <= "2023-06-01T09:00:00Z" <= hits[0]["last_time"]
    assert hits[0]["session"] == "s1" and hits[0]["message_ids"]
    ids = [i for h in hits for i in h["message_ids"]]
    assert len(ids) == len(set(ids))


def test_since_and_until(tmp_path: Path) -> None:
    assert memcli("import", write(tmp_path / "a.jsonl"), "--no-blocks").code == 0
    run = memcli(
        "search",
        "Biscuit cello kayaking",
        "-k",
        "10",
        "--json",
        "--since",
        "2023-06-01",
        "--until",
        "2023-07-01",
    )
    assert run.code == 0, run.stderr
    texts = " ".join(h["text"] for h in run.records())
    assert "cello" in texts and "Biscuit" not in texts and "kayaking" not in texts
    run = memcli("search", "cello", "--since", "yesterday-ish")
    assert run.code == 2 and "--since" in run.stderr
    run = memcli("search", "cello", "--since", "2024-01-01", "--until", "2023-01-01")
    assert run.code == 2


def test_explain_shows_both_ranks(tmp_path: Path) -> None:
    assert memcli("import", write(tmp_path / "a.jsonl"), "--no-blocks").code == 0
    run = memcli("search", "puppy Biscuit", "-k", "1", "--explain", "--json")
    assert run.code == 0, run.stderr
    (hit,) = run.records()
    assert hit["lexical_rank"] == 1 and hit["lexical_score"] > 0
    assert hit["vector_rank"] is not None and -1 <= hit["vector_score"] <= 1
    assert hit["matched_id"] in hit["message_ids"]


def test_a_time_in_the_query_is_searched_and_explained(tmp_path: Path) -> None:
    assert memcli("import", write(tmp_path / "a.jsonl"), "--no-blocks").code == 0
    # "what did we do" says little; "in July" finds the kayaking (July 2023, the latest July).
    run = memcli("search", "what did we do in July?", "-k", "1", "--explain", "--json")
    assert run.code == 0, run.stderr
    assert "kayaking" in run.records()[0]["text"]
    assert "'in July': also searched from 2023-07-01T00:00:00+00:00 to 2023-08-01" in run.stderr
    plain = memcli("search", "what did we do?", "-k", "1", "--explain", "--json")
    assert plain.code == 0 and "also searched" not in plain.stderr


def test_queries_file_and_stdin(tmp_path: Path) -> None:
    assert memcli("import", write(tmp_path / "a.jsonl"), "--no-blocks").code == 0
    assert (
        memcli("import", write(tmp_path / "b.jsonl", "s2"), "--no-blocks", "--user", "bob").code
        == 0
    )
    queries = '{"query": "cello"}\n\n{"query": "kayaking", "k": 1, "user": "bob"}\n'
    run = memcli("search", "--queries", "-", "--json", input=queries)
    assert run.code == 0, run.stderr
    records = run.records()
    assert {r["query_index"] for r in records} == {0, 2}
    assert [r["session"] for r in records if r["query_index"] == 2] == ["s2"]
    assert all(r["session"] == "s1" for r in records if r["query_index"] == 0)
    run = memcli("search", "--queries", "-", input='{"query": "x"}\n{"k": 2}\n')
    assert run.code == 2 and "<stdin>:2" in run.stderr
    run = memcli("search", "cello", "--queries", "-", input="")
    assert run.code == 2
    # A line's own session or user that does not fit: the error names the file and line.
    path = tmp_path / "q.jsonl"
    path.write_text('{"query": "cello"}\n{"query": "x", "session": "nope"}\n')
    run = memcli("search", "--queries", str(path))
    assert run.code == 1 and f"{path}:2: no session 'nope'" in " ".join(run.stderr.split())
    path.write_text('{"query": "cello", "session": "s2", "user": "ana"}\n')
    run = memcli("search", "--queries", str(path))
    said = " ".join(run.stderr.split())
    assert run.code == 1 and f"{path}:1: no session 's2' of user 'ana'" in said
