"""Fact search: a user's facts ranked by words (BM25) and by meaning (an Embedder), fused as the
message search fuses its sides (`ranking.fuse`); a fact whose entities the query names is
boosted. Used by `memcli facts --query`, the `search_facts` tool, and the fact block (the facts
an extraction is shown, the facts rendered first when they do not all fit).

Facts are few per user next to messages: they are scored in memory, the words of each fact
counted on the spot, their vectors kept in a `FactVectors` cache for the life of the process
(keyed by text: an edited fact is embedded again).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from memcli.fold import fold
from memcli.search.ranking import STOPWORDS, fuse, query_terms

if TYPE_CHECKING:
    from memcli.search.embedder import Embedder
    from memcli.store.facts import Fact


class Ranked(Protocol):
    """What ranking reads of a fact (a `Fact`, or the lighter `FactText`)."""

    @property
    def id(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def entities(self) -> list[str]: ...


R = TypeVar("R", bound=Ranked)

#: BM25's parameters (the usual ones).
K1 = 1.2
B = 0.75
#: How far down each side's list fusion looks.
SIDE_DEPTH = 200
#: The weight of the entity list in the fusion (words and meaning weigh 1 each).
ENTITY_WEIGHT = 2.0


def stem(word: str) -> str:
    """A crude English stem, so that live, lives, lived and living meet: one suffix (-ing, -ed,
    -es, -s) off, then a final e."""
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def _words(text: str) -> list[str]:
    return [stem(w) for w in re.findall(r"\w+", fold(text)) if w not in STOPWORDS and len(w) > 1]


#: A word in more than this share of the facts does not choose which facts are scored (it
#: still scores them): "ana" in every fact of Ana's would make every fact a candidate.
COMMON_SHARE = 0.2
#: The most facts BM25 scores for one query (the newest of those holding a chosen word).
MAX_SCORED = 2_000


def bm25(facts: Sequence[Ranked], query: str) -> list[tuple[int, float]]:
    """(index in `facts`, score) of the facts sharing a word with `query`, best first.

    Words compare folded (`memcli.fold`), as in message search.
    Bounded: each query word's fact count is found by a substring test over the folded texts
    (a pass in C); only the facts holding a word that is not common (see COMMON_SHARE) are cut
    into words and scored, at most MAX_SCORED of them."""
    terms = list(dict.fromkeys(stem(t) for t in query_terms(query)))
    if not terms or not facts:
        return []
    lowered = [fold(f.text) for f in facts]
    frequency = {t: sum(1 for text in lowered if t in text) for t in terms}
    choosing = [t for t in terms if 0 < frequency[t] <= max(COMMON_SHARE * len(facts), 50)]
    choosing = choosing or [t for t in terms if frequency[t]]
    chosen = [i for i, text in enumerate(lowered) if any(t in text for t in choosing)]
    chosen = chosen[-MAX_SCORED:]
    docs = {i: Counter(_words(facts[i].text)) for i in chosen}
    average = sum(sum(d.values()) for d in docs.values()) / max(len(docs), 1) or 1.0
    scores = []
    for i, doc in docs.items():
        length = sum(doc.values())
        score = 0.0
        for term in terms:
            tf = doc.get(term, 0)
            if not tf:
                continue
            df = max(frequency[term], 1)
            idf = math.log(1 + (len(facts) - df + 0.5) / (df + 0.5))
            score += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / average))
        if score > 0:
            scores.append((i, score))
    return sorted(scores, key=lambda pair: (-pair[1], pair[0]))


def named_entities(facts: Sequence[Ranked], query: str) -> list[int]:
    """Indexes of the facts with an entity the query names (as whole words, folded:
    `memcli.fold`)."""
    low = " " + " ".join(re.findall(r"\w+", fold(query))) + " "
    found = []
    for i, fact in enumerate(facts):
        for name in fact.entities:
            words = " ".join(re.findall(r"\w+", fold(name)))
            if words and f" {words} " in low:
                found.append(i)
                break
    return found


class FactVectors:
    """Fact texts' vectors from an Embedder, kept for the life of the object."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._vectors: dict[str, Any] = {}

    def similar(self, facts: Sequence[Ranked], query: str) -> list[tuple[int, float]]:
        """(index in `facts`, cosine similarity to `query`), best first."""
        import numpy as np

        if not facts:
            return []
        missing = list(dict.fromkeys(f.text for f in facts if f.text not in self._vectors))
        if missing:
            for text, row in zip(missing, self.embedder.embed(missing), strict=True):
                self._vectors[text] = row
        matrix = np.stack([self._vectors[f.text] for f in facts])
        scores = matrix @ self.embedder.embed([query])[0]
        order = np.argsort(-scores, kind="stable")
        return [(int(i), float(scores[i])) for i in order]


def rank_facts(
    facts: Sequence[R],
    query: str,
    k: int,
    vectors: FactVectors | None = None,
    mode: str = "hybrid",
) -> list[tuple[R, float]]:
    """The best `k` of `facts` for `query`, best first, with their fused scores: `hybrid` (words
    and meaning; words only without `vectors`), `lexical` or `vector`; facts whose entities the
    query names are boosted in every mode. None share a word or an entity with an empty query."""
    if not query.strip() or k < 1:
        return []
    sides: list[tuple[float, Sequence[int]]] = []
    if mode in ("hybrid", "lexical") or vectors is None:
        sides.append((1.0, [i for i, _ in bm25(facts, query)[:SIDE_DEPTH]]))
    if mode in ("hybrid", "vector") and vectors is not None:
        sides.append((1.0, [i for i, _ in vectors.similar(facts, query)[:SIDE_DEPTH]]))
    sides.append((ENTITY_WEIGHT, named_entities(facts, query)))
    return [(facts[i], score) for i, score in fuse(sides)[:k]]


def search_facts(
    store: Any,
    scope_key: str,
    query: str,
    k: int = 10,
    vectors: FactVectors | None = None,
    mode: str = "hybrid",
    block: str | None = None,
    entity: str | None = None,
) -> list[tuple[Fact, float]]:
    """The best `k` current facts of a scope (of one block, about one entity) for `query`, best
    first with their scores (`rank_facts`)."""
    from memcli.store import facts as fact_store

    if entity is not None:
        facts: Sequence[Ranked] = fact_store.list_facts(store, block, scope_key, entity=entity)
    else:
        facts = fact_store.fact_texts(store, block, scope_key)
    ranked = rank_facts(facts, query, k, vectors, mode)
    whole = {f.id: f for f in fact_store.get_facts(store, [f.id for f, _ in ranked])}
    return [(whole[f.id], score) for f, score in ranked if f.id in whole]
