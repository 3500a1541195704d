"""Fact search (`memcli.search.facts`): words with a crude stemmer, entities boosted, vectors
fused, the words side bounded."""

from __future__ import annotations

from memcli.search.facts import FactVectors, bm25, rank_facts, stem
from memcli.store.facts import FactText


def facts(*texts: str, entities: dict[int, list[str]] | None = None) -> list[FactText]:
    return [FactText(i + 1, t, (entities or {}).get(i, [])) for i, t in enumerate(texts)]


def test_stem_joins_the_forms_of_a_word() -> None:
    assert {stem(w) for w in ("live", "lives", "lived", "living")} == {"liv"}
    assert stem("class") == "class" and stem("bus") == "bus"


def test_words_rank_and_entities_boost() -> None:
    found = facts(
        "Ana lives in Zurich",
        "Ana reads books",
        "Ana's sister works at a bank",
        entities={2: ["Eva"]},
    )
    ranked = rank_facts(found, "where does Ana live?", 3)
    assert ranked[0][0].text == "Ana lives in Zurich"
    # No shared word but the entity: Eva's fact comes first.
    assert rank_facts(found, "tell me about Eva", 3)[0][0].text == "Ana's sister works at a bank"
    assert rank_facts(found, "   ", 3) == []


def test_a_common_word_does_not_make_every_fact_a_candidate() -> None:
    many = facts(*[f"Ana collects stamp number {i}" for i in range(500)], "Ana moved to Zurich")
    scored = bm25(many, "Ana moved")
    # "ana" is in every fact: only the facts holding "moved" (uncommon) are scored.
    assert [many[i].text for i, _ in scored] == ["Ana moved to Zurich"]


def test_vectors_find_a_fact_without_shared_words(minilm) -> None:
    found = facts("Ana resides in Zurich", "Ana owns a red bicycle", "Ana plays the violin")
    vectors = FactVectors(minilm)
    assert rank_facts(found, "which city is her home", 1, vectors)[0][0].text == (
        "Ana resides in Zurich"
    )
    assert rank_facts(found, "which city is her home", 3, vectors, mode="lexical") == []
