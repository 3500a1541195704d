"""Hybrid retrieval: fusion, the FTS query, scopes and time filters, hits, the FAISS file."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memcli.errors import UsageError
from memcli.messages import Message
from memcli.search import speakers
from memcli.search.ranking import fuse, query_terms
from memcli.search.retriever import Retriever
from memcli.search.types import SearchOptions
from memcli.store import Store, open_store, sqlite_index
from memcli.store import index as sql
from memcli.store import vectors as vsql
from memcli.store.base import NewMessage
from memcli.store.sqlite import SQLiteStore

T0 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


class WordsEmbedder:
    """Bag of words hashed into 64 buckets: texts sharing words are close. Tests only."""

    name = "words"
    dim = 64
    max_tokens = 32

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(len(texts))
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                rows[i, int.from_bytes(digest, "little") % self.dim] += 1.0
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return rows / np.maximum(norms, 1e-12)

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        out = []
        for text in texts:
            words = text.split(" ")
            out.append(
                [" ".join(words[i : i + self.max_tokens]) for i in range(0, len(words), 32)]
                or [text]
            )
        return out


def add(
    store: SQLiteStore,
    session: str,
    user: str,
    texts: Sequence[str],
    start: datetime = T0,
    step: timedelta = timedelta(days=1),
) -> list[int]:
    if store.get_session(session) is None:
        store.create_session(session, user, 30000, 0.7, 3000)
    new = [
        NewMessage(
            Message(
                role="user" if i % 2 == 0 else "assistant",
                content=text,
                name="Ana" if i % 2 == 0 else "Ben",
                timestamp=start + step * i,
            ),
            len(text.split()),
        )
        for i, text in enumerate(texts)
    ]
    return store.append_messages(session, new)


@pytest.fixture
def store(vdb: str) -> Iterator[Store]:
    """A new store of each backend: SQLite, PostgreSQL (a FAISS file), PostgreSQL with pgvector."""
    opened = open_store(vdb)
    yield opened
    opened.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> SQLiteStore:
    """For what only SQLite has: the index file beside the database, the FTS5 table."""
    return SQLiteStore(tmp_path / "memcli.db")


# -- fusion and the query ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranked", "k", "expected"),
    [
        ([(1.0, [1, 2, 3]), (1.0, [2, 3, 1])], 60, [2, 1, 3]),
        ([(1.0, [1, 2, 3]), (1.0, [3, 2, 1])], 60, [1, 3, 2]),  # first and last beat two seconds
        ([(1.0, [1, 2]), (1.0, [])], 60, [1, 2]),
        ([(1.0, [1, 2]), (3.0, [2, 1])], 60, [2, 1]),  # the heavier list wins
        ([(0.0, [1, 2]), (1.0, [2, 1])], 60, [2, 1]),  # weight 0: left out
        ([(1.0, [1, 5]), (1.0, [5, 9])], 0, [5, 1, 9]),  # 1/2 + 1/1 > 1/1 > 1/2
    ],
)
def test_fuse_orders_by_weighted_reciprocal_rank(
    ranked: list[tuple[float, list[int]]], k: int, expected: list[int]
) -> None:
    assert [item for item, _ in fuse(ranked, k)] == expected


def test_fuse_scores_are_the_rrf_sums() -> None:
    fused = dict(fuse([(1.0, [7, 8]), (0.5, [8])], rrf_k=10))
    assert fused[7] == pytest.approx(1 / 11)
    assert fused[8] == pytest.approx(1 / 12 + 0.5 / 11)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("When did Caroline go to the LGBTQ support group?", '"caroline" OR "go" OR "lgbtq"'),
        ("what is it?", '"what" OR "is" OR "it"'),  # only stopwords: keep them all
        ("   ?!  ", None),
        ('say "hi" AND NOT x*', '"say" OR "hi"'),  # FTS syntax in a query is just words
    ],
)
def test_fts_query(text: str, expected: str | None) -> None:
    query = sqlite_index.fts_match(query_terms(text))
    if expected is None:
        assert query is None
    else:
        assert query is not None and query.startswith(expected)


def test_options_are_checked() -> None:
    with pytest.raises(UsageError):
        SearchOptions(lexical_weight=0, vector_weight=0)
    with pytest.raises(UsageError):
        SearchOptions(vector_weight=-1)
    with pytest.raises(UsageError):
        SearchOptions(context_tokens=-5)


# -- search -----------------------------------------------------------------------------------

CHAT = [
    "I adopted a puppy named Biscuit last week",
    "That is wonderful, what breed is Biscuit?",
    "A golden retriever, he loves the beach",
    "My sister plays the cello in an orchestra",
    "Does she perform often?",
    "Every month at the city hall",
]


def test_hybrid_search_finds_and_explains(store: SQLiteStore) -> None:
    ids = add(store, "s1", "u1", CHAT)
    retriever = Retriever(store, WordsEmbedder(), SearchOptions(context_before=0, context_after=0))
    result = retriever.search("what breed is the puppy Biscuit", k=3, user_id="u1")
    assert result.hits and result.hits[0].message_ids[0] in ids[:3]
    top = result.hits[0]
    # The question asked before ("what breed is Biscuit?") does not outrank what answers it.
    assert ids[1] not in [h.message_ids[0] for h in result.hits]
    assert top.lexical_rank is not None or top.vector_rank is not None
    record = top.to_dict(explain=True)
    assert {"lexical_rank", "lexical_score", "vector_rank", "vector_score"} <= set(record)
    assert record["first_time"].startswith("2023-05-")
    assert result.embedded == len(CHAT)  # what was missing was embedded before the query


@pytest.mark.parametrize("mode", ["hybrid", "lexical", "vector"])
def test_hits_never_repeat_a_message(store: SQLiteStore, mode: str) -> None:
    add(store, "s1", "u1", CHAT * 3)
    retriever = Retriever(store, WordsEmbedder(), SearchOptions(context_tokens=40))
    hits = retriever.search("Biscuit cello puppy orchestra beach", k=20, mode=mode).hits
    seen = [i for h in hits for i in h.message_ids]
    assert seen and len(seen) == len(set(seen))


def test_neighbours_join_a_hit_within_the_token_allowance(store: SQLiteStore) -> None:
    ids = add(store, "s1", "u1", ["ok", "the cello concert was on Sunday", "yes", "x " * 50])
    options = SearchOptions(context_before=1, context_after=1, context_tokens=10)
    hit = Retriever(store, WordsEmbedder(), options).search("cello concert", k=1).hits[0]
    assert hit.anchor_id == ids[1]
    assert hit.message_ids == ids[:3]  # the short turns around it, not the 50-word one
    assert hit.tokens == 1 + 6 + 1
    off = Retriever(store, WordsEmbedder(), SearchOptions(context_before=0, context_after=0))
    assert off.search("cello concert", k=1).hits[0].message_ids == [ids[1]]


def test_lexical_finds_messages_not_embedded_yet(store: SQLiteStore) -> None:
    add(store, "s1", "u1", CHAT)
    embedder = WordsEmbedder()
    retriever = Retriever(store, embedder, SearchOptions(embed_limit=0))
    result = retriever.search("cello orchestra", k=2)
    assert result.pending == len(CHAT) and result.embedded == 0
    assert "cello" in result.hits[0].text
    assert retriever.index() == len(CHAT)
    assert retriever.pending() == 0
    assert retriever.index() == 0  # nothing left to do


def test_scope_by_user_and_session(store: SQLiteStore) -> None:
    add(store, "a1", "ana", ["the cello is mine"])
    add(store, "a2", "ana", ["my cello broke"])
    add(store, "b1", "bob", ["bob plays cello too"])
    retriever = Retriever(store, WordsEmbedder())
    for mode in ("hybrid", "lexical", "vector"):
        hits = retriever.search("cello", k=10, user_id="ana", mode=mode).hits
        assert {h.session_id for h in hits} == {"a1", "a2"}
        hits = retriever.search("cello", k=10, session_id="a2", mode=mode).hits
        assert {h.session_id for h in hits} == {"a2"}
        assert retriever.search("cello", k=10, user_id="nobody", mode=mode).hits == []


@pytest.mark.parametrize("mode", ["hybrid", "lexical", "vector"])
def test_since_and_until_filter_by_message_time(store: SQLiteStore, mode: str) -> None:
    texts = [f"cello lesson number {i}" for i in range(6)]
    ids = add(store, "s1", "u1", texts, start=T0, step=timedelta(days=1))
    retriever = Retriever(store, WordsEmbedder(), SearchOptions(context_before=0, context_after=0))
    since, until = T0 + timedelta(days=2), T0 + timedelta(days=4)
    hits = retriever.search("cello lesson", k=10, since=since, until=until, mode=mode).hits
    assert sorted(i for h in hits for i in h.message_ids) == ids[2:4]  # until is exclusive
    hits = retriever.search("cello lesson", k=10, since=since, mode=mode).hits
    assert sorted(i for h in hits for i in h.message_ids) == ids[2:]
    with pytest.raises(UsageError):
        retriever.search("cello", since=until, until=since)


def test_a_dated_question_finds_that_months_message_over_a_better_worded_one(
    store: SQLiteStore,
) -> None:
    options = SearchOptions(context_before=0, context_after=0)
    [june] = add(
        store,
        "s1",
        "u1",
        ["we hiked up the mountain today"],
        start=datetime(2023, 6, 10, tzinfo=UTC),
    )
    september, _ = add(
        store,
        "s2",
        "u1",
        ["remember where we went hiking? we went hiking up the mountain", "nice"],
        start=datetime(2023, 9, 2, tzinfo=UTC),
    )
    query = "Where did we go hiking in June?"  # June: of 2023, the latest message's year
    for mode in ("hybrid", "lexical", "vector"):
        result = Retriever(store, WordsEmbedder(), options).search(
            query, k=2, user_id="u1", mode=mode
        )
        assert result.window is not None and result.window.text == "in June"
        assert result.window.since == datetime(2023, 6, 1, tzinfo=UTC)
        assert result.hits[0].anchor_id == june, mode
    plain = Retriever(store, WordsEmbedder(), dataclasses.replace(options, window_weight=0))
    result = plain.search(query, k=2, user_id="u1")
    assert result.window is None and result.hits[0].anchor_id == september
    # The window lies within the search's own time range, and none is left when they miss.
    late = Retriever(store, WordsEmbedder(), options).search(
        query, k=2, user_id="u1", since=datetime(2023, 8, 1, tzinfo=UTC)
    )
    assert late.window is None and late.hits[0].anchor_id == september


def test_messages_of_a_speaker_the_query_names_come_first(store: SQLiteStore) -> None:
    options = SearchOptions(context_before=0, context_after=0)
    ana, ben = add(
        store, "s1", "u1", ["Ben's cello! the cello Ben played, cello", "I sold my cello"]
    )
    query = "What did Ben do with the cello?"
    plain = Retriever(store, WordsEmbedder(), dataclasses.replace(options, speaker_weight=0))
    assert plain.search(query, k=2).hits[0].anchor_id == ana  # more of the query's words
    for mode in ("hybrid", "lexical", "vector"):
        hits = Retriever(store, WordsEmbedder(), options).search(query, k=2, mode=mode).hits
        assert [h.anchor_id for h in hits] == [ben, ana], mode
    # Part of a longer name counts; a name the query does not hold changes nothing.
    assert speakers.spoken_by(store, [ana, ben], {"ben", "cello"}) == [ben]
    assert speakers.spoken_by(store, [ana, ben], {"cello"}) == []


def test_a_speakers_name_in_the_query_ranks_their_messages_not_the_words(store: Store) -> None:
    """The name says whose messages to prefer; BM25 and the vector search read the query's other
    words (a name is indexed with every message of its speaker, so it would match them all)."""
    options = SearchOptions(context_before=0, context_after=0)
    ana_tea, ben_tea, ana_office, _ = add(
        store, "s1", "u1", ["I love tea", "tea is fine", "long day at the office", "ok"]
    )
    query = "What does Ana think about tea?"
    retriever = Retriever(store, WordsEmbedder(), options)
    assert retriever.search(query, k=5, user_id="u1").hits[0].anchor_id == ana_tea
    hits = retriever.search(query, k=5, user_id="u1", mode="lexical").hits
    assert [h.anchor_id for h in hits] == [ana_tea, ben_tea]  # Ana's office day: no other word
    named = Retriever(store, WordsEmbedder(), dataclasses.replace(options, speaker_weight=0))
    found = [h.anchor_id for h in named.search(query, k=5, user_id="u1", mode="lexical").hits]
    assert ana_office in found  # without reading speakers, the name is a word like any other
    only_name = retriever.search("Ana?", k=5, user_id="u1", mode="lexical")
    assert {h.anchor_id for h in only_name.hits} == {ana_tea, ana_office}  # nothing else to read
    # A speaker who comes later is known to the next search.
    store.append_messages("s1", [NewMessage(Message("user", "a rainy afternoon", name="Cleo"), 3)])
    found = [
        h.anchor_id for h in retriever.search("Cleo tea", k=5, user_id="u1", mode="lexical").hits
    ]
    assert set(found) == {ana_tea, ben_tea}  # not Cleo's afternoon, which has no tea


def test_the_vector_search_starts_before_bm25_names_the_speakers(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dense search does not wait for BM25's speakers: it starts on the query without the
    names this scope's hits showed before, and again on the right text only when BM25 names
    others. The hits are always those of a retriever that waited."""
    options = SearchOptions(context_before=0, context_after=0)
    add(store, "s1", "u1", ["I love tea", "tea is fine", "long day at the office", "ok"])
    cleo = T0 + timedelta(days=30)
    store.append_messages(
        "s1", [NewMessage(Message("user", "tea by the sea", name="Cleo", timestamp=cleo), 4)]
    )
    retriever = Retriever(store, WordsEmbedder(), options)
    texts: list[str] = []
    dense = retriever._dense

    def recorded(text: str, *args: Any) -> Any:
        texts.append(text)
        return dense(text, *args)

    monkeypatch.setattr(retriever, "_dense", recorded)

    def search(query: str, **scope: Any) -> list[int]:
        fresh = Retriever(store, WordsEmbedder(), options).search(query, k=5, **scope).hits
        hits = [h.anchor_id for h in retriever.search(query, k=5, **scope).hits]
        assert hits == [h.anchor_id for h in fresh], query
        return hits

    search("What does Ana think about tea?", user_id="u1")
    # Nothing known yet: the query as it is, then without the name BM25 found.
    assert texts == ["What does Ana think about tea?", "What does think about tea"]
    texts.clear()
    search("Does Ana like the office?", user_id="u1")
    assert texts == ["Does like the office"]  # Ana is known: one search
    texts.clear()
    search("Cleo and tea", user_id="u1")
    assert texts == ["and tea"]  # Cleo's tea was among the first search's hits
    texts.clear()
    # Before Cleo spoke, BM25 finds no message of hers: "Cleo" is a word again.
    search("Cleo and tea", user_id="u1", until=cleo)
    assert texts == ["and tea", "Cleo and tea"]
    texts.clear()
    search("Ana and tea", user_id="u2")  # another user's scope knows nobody yet
    assert texts == ["Ana and tea"]


def test_the_latest_time_of_a_user_or_session_comes_from_the_time_index(
    store: SQLiteStore,
) -> None:
    """The latest message's time of a user, a session or the store (its timestamp, else when it
    was stored), on SQLite read from the index of the messages' times per session: the same as
    reading every message, whatever the order the times came in."""
    add(store, "s1", "u1", ["a", "b"], start=datetime(2023, 5, 1, tzinfo=UTC))
    add(store, "s2", "u1", ["c"], start=datetime(2021, 1, 1, tzinfo=UTC))  # older, stored later
    add(store, "s3", "u2", ["d", "e", "f"], start=datetime(2022, 3, 1, tzinfo=UTC))
    store.append_messages("s3", [NewMessage(Message("user", "no time of its own"), 4)])
    stored = store.execute("SELECT MAX(created_at) FROM messages WHERE session_id = 's3'")
    now = datetime.fromisoformat(stored.fetchone()[0].replace("Z", "+00:00"))

    def close(found: datetime | None, want: datetime) -> bool:
        return found is not None and abs((found - want).total_seconds()) < 0.001

    assert sql.latest_time(store, sql.Scope(user_id="u1")) == datetime(2023, 5, 2, tzinfo=UTC)
    assert sql.latest_time(store, sql.Scope(session_id="s2")) == datetime(2021, 1, 1, tzinfo=UTC)
    assert close(sql.latest_time(store, sql.Scope(user_id="u2")), now)
    assert close(sql.latest_time(store, sql.Scope()), now)
    assert sql.latest_time(store, sql.Scope(user_id="u1", session_id="s3")) is None
    assert sql.latest_time(store, sql.Scope(user_id="nobody")) is None
    if store.dialect != "sqlite":
        return  # (PostgreSQL: through the vectors' times with pgvector, else the messages')
    plan = " ".join(
        str(r)
        for r in store.execute(
            "EXPLAIN QUERY PLAN SELECT MAX(" + sql.message_time_ms(store) + ") FROM messages m"
            " WHERE m.session_id = ?",
            ("s1",),
        )
    )
    assert "messages_time" in plan


def test_relative_times_count_back_from_the_latest_message_in_scope(store: SQLiteStore) -> None:
    options = SearchOptions(context_before=0, context_after=0)
    add(store, "s1", "u1", ["a swim in the lake"], start=datetime(2021, 3, 4, tzinfo=UTC))
    add(store, "s2", "u1", ["we swam in the lake"], start=datetime(2021, 3, 10, tzinfo=UTC))
    add(store, "s3", "u1", ["ok"], start=datetime(2021, 3, 12, tzinfo=UTC))
    result = Retriever(store, WordsEmbedder(), options).search(
        "did we swim in the lake yesterday?", k=2, user_id="u1"
    )
    assert result.window is not None
    assert result.window.since <= datetime(2021, 3, 11, tzinfo=UTC) < result.window.until
    assert "we swam" in result.hits[0].text
    # The present is the latest message of the user, whatever the time range searched.
    result = Retriever(store, WordsEmbedder(), options).search(
        "did we swim in the lake yesterday?",
        k=2,
        user_id="u1",
        until=datetime(2021, 3, 11, tzinfo=UTC),
    )
    assert result.window is not None and result.window.until == datetime(2021, 3, 11, tzinfo=UTC)
    assert result.window.since == datetime(2021, 3, 10, tzinfo=UTC)


def test_deleted_session_leaves_the_index(store: SQLiteStore) -> None:
    add(store, "s1", "u1", ["the cello is red"])
    add(store, "s2", "u1", ["the cello is blue"])
    retriever = Retriever(store, WordsEmbedder())
    assert len(retriever.search("cello", k=5).hits) == 2
    store.delete_session("s1")
    for mode in ("lexical", "vector"):
        hits = retriever.search("cello", k=5, mode=mode).hits
        assert [h.session_id for h in hits] == ["s2"]
    assert retriever.vectors.rebuilt or sql.has_pgvector(store)  # (pgvector: no index file)


def test_long_message_is_embedded_whole_in_pieces(store: SQLiteStore) -> None:
    long = " ".join(f"w{i}" for i in range(100)) + " zebra"
    add(store, "s1", "u1", ["short one", long])
    embedder = WordsEmbedder()
    retriever = Retriever(store, embedder, SearchOptions(vector_context=0))
    retriever.index()
    rows = store.execute("SELECT message_id, piece FROM retrieval_vectors ORDER BY id").fetchall()
    assert len(rows) == 1 + 4  # 101 words at 32 per piece
    hits = retriever.search("zebra", k=1, mode="vector").hits
    assert "zebra" in hits[0].text  # the last piece is searched too


# -- the FAISS file ---------------------------------------------------------------------------


def index_files(store: Store, index_dir: Path | None = None) -> list[Path]:
    """The files of a store's flat FAISS index (its rows and description: its vectors are the
    database's): beside a SQLite file, under `index_dir` for PostgreSQL."""
    from memcli.search.dense import MessageVectors

    vectors = MessageVectors(store, "words/sum+1", index_dir)
    files = [vectors.file(s) for s in ("npz", "json")]
    assert all(f is not None for f in files)
    return [f for f in files if f is not None]


def test_postgresql_index_files_are_under_the_index_folder_given(
    pg_server: Any, pg_url: str, tmp_path: Path
) -> None:
    from pg import drop_database, new_database

    from memcli.search.dense import MessageVectors

    folder = tmp_path / "indexes"
    store = open_store(pg_url)
    add(store, "s1", "u1", CHAT)
    Retriever(store, WordsEmbedder()).search("puppy", k=1)
    assert MessageVectors(store, "words/sum+1").file("faiss") is None  # none given: in memory
    assert not folder.exists()
    Retriever(store, WordsEmbedder(), index_dir=folder).search("puppy", k=1)
    files = index_files(store, folder)
    assert all(f.is_file() and f.parent.parent == folder for f in files)
    assert index_files(open_store(pg_url), folder) == files  # another process finds them
    other_url = new_database(pg_server)
    try:
        other = open_store(other_url)
        assert index_files(other, folder)[0].parent != files[0].parent  # another database: its own
        other.close()
    finally:
        drop_database(pg_server, other_url)


def test_index_file_is_written_reused_and_extended(db: str, tmp_path: Path) -> None:
    store = open_store(db)
    add(store, "s1", "u1", CHAT)
    Retriever(store, WordsEmbedder(), index_dir=tmp_path / "indexes").search("puppy", k=1)
    assert all(p.is_file() for p in index_files(store, tmp_path / "indexes"))
    fresh = Retriever(open_store(db), WordsEmbedder(), index_dir=tmp_path / "indexes")
    fresh.search("puppy", k=1)
    assert not fresh.vectors.rebuilt  # loaded from the file
    add(store, "s1", "u1", ["a brand new message about kites"])
    hits = fresh.search("kites", k=1, mode="vector").hits
    assert not fresh.vectors.rebuilt and "kites" in hits[0].text  # extended, not rebuilt


@pytest.mark.parametrize("damage", ["delete", "corrupt", "truncate_arrays"])
def test_index_file_rebuilt_when_missing_or_unreadable(
    db: str, damage: str, tmp_path: Path
) -> None:
    store = open_store(db)
    add(store, "s1", "u1", CHAT)
    Retriever(store, WordsEmbedder(), index_dir=tmp_path / "indexes").search("puppy", k=1)
    arrays, meta = index_files(store, tmp_path / "indexes")
    if damage == "delete":
        arrays.unlink()
    elif damage == "corrupt":
        meta.write_bytes(b"not a description at all")
    else:
        arrays.write_bytes(arrays.read_bytes()[:20])
    fresh = Retriever(open_store(db), WordsEmbedder(), index_dir=tmp_path / "indexes")
    hits = fresh.search("golden retriever beach", k=1, mode="vector").hits
    assert fresh.vectors.rebuilt
    assert "retriever" in hits[0].text
    assert arrays.stat().st_size > 100 and meta.stat().st_size > 100  # written again


def test_big_index_is_ivf_of_8bit_vectors_memory_mapped_and_extended(
    db: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import faiss

    from memcli.search import dense

    monkeypatch.setattr(dense, "IVF_FROM", 100)
    store = open_store(db)
    texts = [f"note {i} about topic{i % 37} and thing{i % 11}" for i in range(400)]
    ids = add(store, "s1", "u1", texts)
    add(store, "s2", "u2", ["note about topic5 and thing5 for someone else"])
    options = SearchOptions(context_before=0, context_after=0, vector_context=0)
    first = Retriever(store, WordsEmbedder(), options, tmp_path / "indexes")
    hits = first.search("note 5 topic5 thing5", k=3, mode="vector", user_id="u1").hits
    assert isinstance(first.vectors.index, faiss.IndexIVFScalarQuantizer)
    assert hits[0].anchor_id == ids[5]  # the only one with both words, and u1's
    fresh = Retriever(open_store(db), WordsEmbedder(), options, tmp_path / "indexes")
    again = fresh.search("note 5 topic5 thing5", k=3, mode="vector", user_id="u1").hits
    assert not fresh.vectors.rebuilt and fresh.vectors._mapped  # read from its file, mapped
    assert [h.anchor_id for h in again] == [h.anchor_id for h in hits]
    new = add(store, "s1", "u1", ["kites, kites and kites"])
    kites = fresh.search("kites", k=1, mode="vector", user_id="u1").hits
    assert not fresh.vectors.rebuilt and kites[0].anchor_id == new[0]  # extended in memory
    assert max(ids) < new[0]


def test_in_memory_store_keeps_its_index_in_memory() -> None:
    store = SQLiteStore(None)
    add(store, "s1", "u1", CHAT)
    hits = Retriever(store, WordsEmbedder()).search("cello", k=1).hits
    assert "cello" in hits[0].text


def test_full_text_index_catches_up_and_stays_consistent(sqlite_store: SQLiteStore) -> None:
    store = sqlite_store

    add(store, "s1", "u1", ["the cello is red", "kites fly high"])
    add(store, "s2", "u1", ["the cello is blue"])
    assert sql.catch_up(store) == 3
    assert sql.catch_up(store) == 0  # nothing new: nothing to do
    store.delete_session("s1")  # indexed: leaves the index
    add(store, "s3", "u1", ["a cello of glass"])
    store.delete_session("s3")  # never indexed: nothing to take out
    add(store, "s4", "u1", ["cello again"])
    retriever = Retriever(store, WordsEmbedder())
    hits = retriever.search("cello", k=10, mode="lexical").hits
    assert sorted(h.session_id for h in hits) == ["s2", "s4"]
    store.execute("INSERT INTO retrieval_fts (retrieval_fts) VALUES ('integrity-check')")


def test_bm25_ranks_within_its_budget_rarest_words_first(store: SQLiteStore) -> None:
    ids = add(store, "s1", "u1", ["cello one", "cello two", "cello three", "kite and cello"])
    options = SearchOptions(lexical_budget=2, context_before=0, context_after=0)
    retriever = Retriever(store, WordsEmbedder(), options)
    sql.catch_up(store)  # what a search does first
    assert retriever.lexical.terms("cello kite") == (["kite"], False)  # 4 + 1 > 2: kite only
    hits = retriever.search("cello kite", k=10, mode="lexical").hits
    assert [h.anchor_id for h in hits] == [ids[3]]  # only "kite" was asked
    assert retriever.lexical.terms("cello") == (["cello"], True)  # even the rarest is over
    hits = retriever.search("cello", k=10, mode="lexical").hits
    assert sorted(h.anchor_id for h in hits) == ids[2:]  # its 2 most recent matches are ranked
    wide = Retriever(store, WordsEmbedder(), SearchOptions(context_before=0, context_after=0))
    assert wide.lexical.terms("cello kite") == (["cello", "kite"], False)
    assert len(wide.search("cello", k=10, mode="lexical").hits) == 4


def test_bm25_budget_keeps_the_scope(store: SQLiteStore) -> None:
    mine = add(store, "s1", "u1", ["cello one", "cello two"])
    add(store, "s2", "u2", ["cello three", "cello four"])
    options = SearchOptions(lexical_budget=3, context_before=0, context_after=0)
    retriever = Retriever(store, WordsEmbedder(), options)
    hits = retriever.search("cello", k=10, mode="lexical", user_id="u1").hits
    # Scope first: u1's 2 matches are within the budget (u2's newer ones do not count).
    assert sorted(h.anchor_id for h in hits) == mine
    narrow = Retriever(store, WordsEmbedder(), dataclasses.replace(options, lexical_budget=1))
    hits = narrow.search("cello", k=10, mode="lexical", user_id="u1").hits
    assert [h.anchor_id for h in hits] == [mine[1]]  # u1's most recent match, not none
    with pytest.raises(UsageError):
        SearchOptions(lexical_budget=0)


def test_vectors_of_the_older_runtimes_are_embedded_again(
    store: SQLiteStore, tmp_path: Path
) -> None:
    """Before issue 11, `import` stored MiniLM vectors made by sentence-transformers and `search`
    by ONNX Runtime, with two splitters, under one key: they are not searched, but made again."""
    from memcli import OnnxEmbedder

    class Older(WordsEmbedder):
        name = "all-MiniLM-L6-v2"

    add(store, "s1", "u1", CHAT)
    assert Retriever(store, Older()).index() == len(CHAT)
    current = Retriever(store, OnnxEmbedder(tmp_path))  # the model loads only when it embeds
    assert current.model == "all-MiniLM-L6-v2:onnx-int8/sum+1"  # (int8, the default)
    assert current.pending() == len(CHAT)
    fp32 = Retriever(store, OnnxEmbedder(tmp_path, precision="fp32"))
    assert fp32.model == "all-MiniLM-L6-v2:onnx/sum+1" and fp32.pending() == len(CHAT)


@pytest.mark.parametrize("mode", ["lexical", "vector"])
def test_archived_only_leaves_short_term_messages_out(store: SQLiteStore, mode: str) -> None:
    ids = add(store, "s1", "u1", ["cello one", "cello two", "cello three"])
    retriever = Retriever(store, WordsEmbedder(), SearchOptions(context_before=0, context_after=0))
    assert len(retriever.search("cello", k=5, mode=mode).hits) == 3
    store.archive("s1", ids[:2], 4, "size")
    hits = retriever.search("cello", k=5, mode=mode, archived_only=True).hits
    assert sorted(h.anchor_id for h in hits) == ids[:2]


def test_vector_block_retrieves_archived_messages_with_their_times(vdb: str) -> None:
    from memcli import Memory, VectorBlock

    options = SearchOptions(context_before=0, context_after=0)
    block = VectorBlock(embedder=WordsEmbedder(), similarity_top_k=2, search_options=options)
    memory = Memory.from_defaults(
        session_id="s",
        token_limit=200,
        chat_history_token_ratio=0.1,
        token_flush_size=10,
        db=vdb,
        memory_blocks=[block],
    )
    memory.put_messages(
        [
            Message("user", "my cello is red", timestamp=T0),
            Message("assistant", "a red cello, nice", timestamp=T0 + timedelta(minutes=1)),
        ]
    )
    for i in range(4):
        memory.put_messages([Message("user", f"small talk {i}"), Message("assistant", "ok")])
    active = {m.id for m in memory.get_all(status="active")}
    text = memory.context("what colour is my cello").memory_text
    assert "<message role='user' time='2023-05-08T13:56'>my cello is red</message>" in text
    assert block.last_hits and not active & {i for h in block.last_hits for i in h.message_ids}


def test_unit_vector_is_the_word_weighted_sum_of_the_message_and_the_one_before(
    store: SQLiteStore,
) -> None:
    ids = add(store, "s1", "u1", ["the cello is red", "yes", "the cello is red"])
    embedder = WordsEmbedder()
    retriever = Retriever(store, embedder)
    assert retriever.model == "words/sum+1"
    assert Retriever(store, embedder, SearchOptions(vector_context=0)).model == "words/named+0"
    assert retriever.index() == 3
    assert embedder.calls == [2]  # "Ana: the cello is red" and "Ben: yes", each once
    rows = store.execute(
        "SELECT message_id, dim, vector FROM retrieval_vectors ORDER BY message_id"
    ).fetchall()
    got = {m: vsql.to_matrix([v], d)[0] for m, d, v in rows}  # (stored at float16)
    cello, yes = WordsEmbedder().embed(["Ana: the cello is red", "Ben: yes"])

    def unit(*parts: np.ndarray) -> np.ndarray:
        total = np.sum(parts, axis=0)
        return total / np.linalg.norm(total)

    assert np.allclose(got[ids[0]], cello, atol=1e-3)  # the first: nothing before it
    assert np.allclose(got[ids[1]], unit(2 * yes, 5 * cello), atol=1e-3)
    assert np.allclose(got[ids[2]], unit(5 * cello, 2 * yes), atol=1e-3)


def test_a_query_in_parts_embeds_each_part_once(store: SQLiteStore) -> None:
    add(store, "s1", "u1", CHAT)
    embedder = WordsEmbedder()
    retriever = Retriever(store, embedder, SearchOptions(context_before=0, context_after=0))
    retriever.index()
    # One part: the same vector as the query embedded whole.
    one = "what breed is the puppy Biscuit"
    assert np.allclose(retriever._parts_vector([one]), retriever._query_vector(one), atol=1e-6)
    # A window sliding by a turn: only its new messages reach the model.
    window = ["I adopted a puppy", "What is its name?", "Biscuit, a beagle", "what breed is it"]
    embedder.calls.clear()
    first = retriever.search(" ".join(window), k=2, user_id="u1", mode="vector", parts=window)
    assert embedder.calls == [4] and first.hits
    slid = [*window[2:], "She loves the park", "where does Biscuit play"]
    retriever.search(" ".join(slid), k=2, user_id="u1", mode="vector", parts=slid)
    assert embedder.calls == [4, 2]
    # The sum weighs each part by its words, as a stored message with the one before it.
    a, b = "puppy", "the beagle called Biscuit"
    va, vb = embedder.embed([a])[0], embedder.embed([b])[0]
    expected = va * 1 + vb * 4
    expected /= np.linalg.norm(expected)
    assert np.allclose(retriever._parts_vector([a, b]), expected, atol=1e-6)


def test_word_counts_are_kept_until_the_index_grows(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memcli.search import lexical

    add(store, "s1", "u1", CHAT)
    counted: list[list[str]] = []
    real = sql.term_counts

    def spy(store_: object, terms: Sequence[str], cap: int, scope: object) -> dict[str, int]:
        counted.append(list(terms))
        return real(store_, terms, cap, scope)

    monkeypatch.setattr(sql, "term_counts", spy)
    retriever = Retriever(store, WordsEmbedder())
    retriever.search("puppy biscuit", k=2, user_id="u1", mode="lexical")
    retriever.search("biscuit beagle", k=2, user_id="u1", mode="lexical")
    assert counted == [["puppy", "biscuit"], ["beagle"]]  # biscuit: counted once
    monkeypatch.setattr(lexical, "TERM_COUNTS_SLACK", 1)
    add(store, "s2", "u1", ["more about the puppy", "and Biscuit again"])
    hits = retriever.search("puppy biscuit", k=5, user_id="u1", mode="lexical").hits
    assert counted[-1] == ["puppy", "biscuit"]  # the index grew: counted again
    assert any("Biscuit again" in h.text for h in hits)


def test_a_huge_message_is_stored_and_found_by_its_words(store: Store) -> None:
    """PostgreSQL's tsvector holds at most 1 MB: a message of several MB is still stored, and
    found by the words of its beginning (SQLite's FTS5 has no such bound)."""
    huge = "zebra crossing " + " ".join(f"word{i}" for i in range(600_000))  # about 6 MB
    ids = add(store, "s1", "u1", [huge, "a short one about kites"])
    retriever = Retriever(store, WordsEmbedder(), SearchOptions(context_before=0, context_after=0))
    hits = retriever.search("zebra", k=2, mode="lexical").hits
    assert [h.anchor_id for h in hits] == [ids[0]]
    assert retriever.search("kites", k=1, mode="lexical").hits[0].anchor_id == ids[1]


def test_term_counts_are_capped_alike_with_postgresqls_statistics(pg_url: str) -> None:
    """After ANALYZE, PostgreSQL's estimate stands in for counting a very common word: the
    counts keep their meaning (up to cap + 1)."""
    store = open_store(pg_url)
    add(store, "s1", "u1", [f"cello lesson {i}" for i in range(40)] + ["kite and cello"])
    exact = sql.term_counts(store, ["cello", "kite", "zebra"], 2)
    store.execute("ANALYZE messages")
    assert store.execute("SELECT COUNT(*) FROM pg_stats WHERE attname = 'search'").fetchone()[0]
    assert (
        sql.term_counts(store, ["cello", "kite", "zebra"], 2)
        == exact
        == {
            "cello": 3,
            "kite": 1,
            "zebra": 0,
        }
    )


def test_a_search_says_first_when_it_adds_stored_vectors_to_pgvectors_index(
    pgvector_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vectors stored but not yet in pgvector's column (all of them after `memcli copy`): the
    next search that reads the column (the store's; a small user's compares its own vectors
    from their bytes) adds them first, and says so when that takes a second or more; `memcli
    copy` says it too. Once added, nothing is said."""
    from memcli.cli.copy import _pgvector_fill
    from memcli.search.types import Building
    from memcli.store import pg_index

    monkeypatch.setattr(pg_index, "FILL_RATE", 2.0)  # two vectors a second
    store = open_store(pgvector_url)
    add(store, "s1", "u1", ["the cello is red", "kites fly high", "tea at noon", "ok"])
    said: list[Building] = []
    retriever = Retriever(store, WordsEmbedder(), on_build=said.append)
    assert retriever.index() == 4 and pg_index.unfilled(store) == 4
    message = _pgvector_fill(pgvector_url, "postgresql://db")
    assert message is not None and "4 copied vectors to pgvector's index (about 2 s)" in message
    assert retriever.search("cello", k=2, user_id="u1").hits
    assert said == [] and pg_index.unfilled(store) == 4
    assert retriever.search("cello", k=2).hits
    assert said == [Building("pgvector", 4, 4, 2.0)]
    assert said[0].describe() == "Adding 4 stored vectors to pgvector's index (about 2 s)..."
    assert pg_index.unfilled(store) == 0
    said.clear()
    assert retriever.search("kites", k=2, user_id="u1").hits and said == []
    assert _pgvector_fill(pgvector_url, "postgresql://db") is None
    store.close()


def test_pgvector_search_of_a_user_finds_the_exact_top_10(
    pgvector_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgvector filters after its HNSW scan: a user searched through the index gets the best of
    the scan's rows that are theirs (0.8 goes on scanning until it has enough of them). With a
    narrow scan (so that all three ways show at this size): a user of 60 messages is searched
    exactly; a user of half the store, through the index with iterative scans (an HNSW graph is
    built with random levels, so its answers vary a little from one build to the next), and the
    whole store through the index, each keep at least 0.9 of the exact top 10."""
    from memcli.search.dense import PgVectors
    from memcli.store import pg_index
    from memcli.store.index import Scope

    monkeypatch.setattr(pg_index, "EF_MAX", 40)
    monkeypatch.setattr(pg_index, "IN_SCOPE", 30)
    monkeypatch.setattr(pg_index, "EXACT_MAX", 100)
    store = open_store(pgvector_url)
    sizes = {"ana": 1500, "ben": 1500, "cy": 60}
    owner: dict[int, str] = {}
    for user, size in sizes.items():
        for s in range(0, size, 500):
            ids = add(store, f"{user}{s}", user, [f"m{i}" for i in range(min(500, size - s))])
            owner.update(dict.fromkeys(ids, user))
    rng = np.random.default_rng(4)
    ids = sorted(owner)
    matrix = rng.normal(size=(len(ids), 384)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    rows = [(i, 0, 384, v.tobytes()) for i, v in zip(ids, matrix, strict=True)]
    vsql.add_vectors(store, "m", rows, ids[-1])
    vectors = PgVectors(store, "m")
    users = np.array([owner[i] for i in ids])
    overlap: dict[str, list[float]] = {"ana": [], "store": []}
    for query in rng.normal(size=(8, 384)).astype(np.float32):
        query /= np.linalg.norm(query)
        for user in ("ana", "cy"):  # half the rows (19 of 40 expected in scope), and 60 rows
            scores = np.where(users == user, matrix @ query, -9.0)
            exact = [ids[i] for i in np.argsort(-scores)[:10]]
            found = [i for i, _ in vectors.search(query, Scope(user_id=user), 10)]
            assert len(found) == 10 and {owner[i] for i in found} == {user}
            if user == "cy":
                assert found == exact  # compared one by one
            else:
                overlap["ana"].append(len(set(exact) & set(found)) / 10)
        exact = [ids[i] for i in np.argsort(-(matrix @ query))[:10]]
        found = [i for i, _ in vectors.search(query, Scope(), 10)]
        overlap["store"].append(len(set(exact) & set(found)) / 10)
    # The index: ana's at EF_MAX with iterative scans, the whole store's at EF_WHOLE.
    assert all(sum(o) / len(o) >= 0.9 for o in overlap.values()), overlap
    store.close()


def test_one_users_hits_do_not_change_when_another_user_imports(store: Store) -> None:
    """Scope first: term choice, the budget and BM25's statistics are the user's own, so that
    another user's import (the same words, many times over) changes neither hits nor scores."""
    add(store, "a1", "alice", CHAT)
    add(store, "a2", "alice", ["The cello lesson moved to Friday", "Biscuit hates the beach"])
    options = SearchOptions(lexical_budget=4, context_before=0, context_after=0)
    queries = ["cello orchestra", "Biscuit beach", "what breed is the puppy", "city hall month"]

    def hits(mode: str) -> list[list[tuple[int, float, int | None, float | None]]]:
        retriever = Retriever(store, WordsEmbedder(), options)
        out = []
        for query in queries:
            found = retriever.search(query, k=5, user_id="alice", mode=mode).hits
            out.append([(h.anchor_id, h.score, h.lexical_rank, h.lexical_score) for h in found])
        return out

    before = {mode: hits(mode) for mode in ("lexical", "hybrid")}
    assert all(before["lexical"])
    for n in range(6):
        add(store, f"b{n}", "bob", [f"{t} cello Biscuit beach breed puppy hall" for t in CHAT])
    after = {mode: hits(mode) for mode in ("lexical", "hybrid")}
    assert after == before


def test_a_pasted_page_as_the_query_embeds_a_bounded_number_of_pieces(tmp_path: Path) -> None:
    """A query of many pieces (a 25 KB paste) is embedded as QUERY_PIECES of them, spread over
    it from the first to the last: its vector costs the same whatever its length."""
    from fakes import HashEmbedder

    from memcli.search.retriever import QUERY_PIECES

    store = SQLiteStore(tmp_path / "m.db")
    store.create_session("s", "ana", 100_000, 0.7, 10)
    store.append_messages("s", [NewMessage(Message("user", "the cello concert"), 4)])
    embedder = HashEmbedder(max_tokens=16)
    retriever = Retriever(store, embedder)
    retriever.search("warm up", k=1)  # (the stored message embedded first)
    embedder.calls.clear()
    page = " ".join(f"word{i}" for i in range(16 * 40))  # 40 pieces of 16 words
    assert retriever.search(page, k=1, mode="vector") is not None
    assert embedder.calls == [QUERY_PIECES], embedder.calls
    embedder.calls.clear()
    retriever.search("the cello", k=1, mode="vector")
    assert embedder.calls == [1]
    store.close()


def test_a_delete_left_unfinished_is_finished_on_the_searchs_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next search finishes a delete's cleanup (VACUUM) on its own thread, before the dense
    search starts on another: run there, the VACUUM failed ('SQL statements in progress') while
    BM25's statements ran here on the same connection."""
    import threading

    store = SQLiteStore(tmp_path / "m.db")
    add(store, "s1", "u1", ["the cello is red"])
    add(store, "s2", "u1", ["the cello is blue"])
    retriever = Retriever(store, WordsEmbedder())
    assert len(retriever.search("cello", k=5).hits) == 2
    store.delete_session("s1")  # (its cleanup is left to the next search)
    threads: list[str] = []
    purge = store.purge
    monkeypatch.setattr(
        store, "purge", lambda: (threads.append(threading.current_thread().name), purge())[1]
    )
    hits = retriever.search("cello", k=5).hits
    assert [h.session_id for h in hits] == ["s2"]
    assert threads == [threading.current_thread().name]
    store.close()
