"""Speakers a query names: which of its words name a speaker (the whole name, or one of its
words of three letters or more: "Ana" of "Ana Lopez"), and which messages such a speaker said.
The retriever reads the query without those words and ranks their messages first
(`memcli.search.retriever`); the names come from the store (`memcli.store.index`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memcli.store import index as sql

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from memcli.store.base import SQLStore


def spoken_by(store: SQLStore, ids: Sequence[int], words: set[str]) -> list[int]:
    """The messages of `ids` (in that order) whose speaker's name is among `words` (lowercase)."""
    if not words or not ids:
        return []
    names = sql.message_names(store, ids)
    return [item for item in ids if _name_words(names.get(item, ""), words)]


def naming_words(names: Iterable[str], words: set[str]) -> set[str]:
    """The words of `words` (lowercase) that name one of `names` (lowercase), as `spoken_by`
    reads names."""
    out: set[str] = set()
    for name in names:
        out |= _name_words(name, words)
    return out


def _name_words(name: str, words: set[str]) -> set[str]:
    """The words of `words` that name `name` (lowercase): the whole name, or its words of three
    letters or more."""
    if not name:
        return set()
    return ({name} & words) | {w for w in name.split() if len(w) >= 3 and w in words}
