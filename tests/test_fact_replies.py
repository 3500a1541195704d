"""The replies a fact block reads: a corpus of the shapes models answer in, clean and messy
(what 1-8B local models produce, a reply cut by its token bound, JSON from structured output),
each with the facts read from it, or None when it is refused (nothing is stored)."""

from __future__ import annotations

import pytest

from memcli.blocks.fact_replies import parse_fact_reply

EXAMPLE_ECHO = """<facts>
  <fact topics="topic a, topic b" entities="Name">Specific fact 1</fact>
  <fact topics="topic c" replaces="12">A fact that replaces fact 12</fact>
  <retire id="7">Why fact 7 is no longer true</retire>
</facts>"""

#: (id, reply, expected): expected is the facts' texts, or (texts, retired (id, why)), or None.
CORPUS = [
    ("clean", "<facts><fact>A</fact><fact> B  c </fact></facts>", ["A", "B c"]),
    (
        "preamble-comment-escapes",
        "Here you go:\n<facts>\n  <fact>A &amp; B</fact>\n  <!-- more -->\n</facts>",
        ["A & B"],
    ),
    ("fenced-empty", "```xml\n<facts></facts>\n```", []),
    ("self-closing-empty", "<facts/>", []),
    ("fenced-block", "```xml\n<facts>\n<fact>A</fact>\n</facts>\n```", ["A"]),
    (
        "prose-around-block",
        "Sure! From the conversation:\n\n<facts><fact>A</fact></facts>\n\nHope this helps.",
        ["A"],
    ),
    ("bare-one", "<fact>A</fact>", ["A"]),
    (
        "bare-lines-prose-around",
        'Sure! Here are the facts:\n<fact topics="pets">Ana has a dog</fact>\n'
        "<fact>Ana likes tea</fact>\nLet me know if you need more.",
        ["Ana has a dog", "Ana likes tea"],
    ),
    ("bare-numbered", "1. <fact>A</fact>\n2. <fact>B</fact>", ["A", "B"]),
    ("bare-closing-only", "<fact>A</fact>\n</facts>", ["A"]),
    ("dashed-list-in-block", "<facts>\n- <fact>A</fact>\n- <fact>B</fact>\n</facts>", ["A", "B"]),
    (
        "unclosed-cut-in-fact",
        "<facts>\n<fact>Ana has a dog</fact>\n<fact>Ana lives in Por",
        ["Ana has a dog"],
    ),
    ("unclosed-cut-in-end-tag", "<facts><fact>A</fact><fact>B</fa", ["A"]),
    ("unclosed-cut-in-attribute", '<facts><fact>A</fact><fact topics="fo', ["A"]),
    ("unclosed-cut-in-facts-end", "<facts><fact>A</fact></fac", ["A"]),
    ("unclosed-complete", "<facts>\n<fact>A</fact>\n<fact>B</fact>", ["A", "B"]),
    ("unclosed-then-prose", "<facts>\n<fact>A</fact>\nHope this helps!", ["A"]),
    ("bare-cut", "<fact>A</fact>\n<fact>B is", ["A"]),
    ("repeated", "<facts><fact>A</fact></facts>\n<facts><fact>A</fact></facts>", ["A"]),
    (
        "repeated-then-cut",
        "<facts><fact>A</fact><fact>B</fact></facts>\n\n<facts><fact>A</fact><fact>B",
        ["A", "B"],
    ),
    (
        "two-blocks",
        "<facts><fact>A</fact></facts><facts><fact>b</fact><fact>a</fact></facts>",
        ["A", "b"],
    ),
    (
        "thinking-first",
        "<think>The user said a <fact> about tea.</think>\n<facts><fact>A</fact></facts>",
        ["A"],
    ),
    (
        "replace-and-retire",
        '<facts><fact replaces="3">Ana lives in Lisbon</fact><retire id="4">moved</retire></facts>',
        (["Ana lives in Lisbon"], [("4", "moved")]),
    ),
    (
        "json",
        '{"facts": [{"text": "A", "topics": ["food"], "entities": [], "replaces": [],'
        ' "expires": ""}], "retire": [{"id": "7", "reason": "moved"}]}',
        (["A"], [("7", "moved")]),
    ),
    ("json-fenced-plain-texts", '```json\n{"facts": ["A"], "retire": []}\n```', ["A"]),
    ("json-empty", '{"facts": [], "retire": []}', []),
    (
        "json-with-prose-around",
        'Here is the JSON:\n{"facts": [{"text": "A"}], "retire": []}\nDone.',
        ["A"],
    ),
    ("json-fenced-after-prose", 'Sure.\n```json\n{"facts": ["A"]}\n```\nBye', ["A"]),
    # Refused: nothing is stored, the batch stays pending.
    ("empty", "", None),
    ("blank", "   \n ", None),
    ("prose", "I could not find any facts.", None),
    ("prose-mentions-facts", "There are no facts to extract from this conversation.", None),
    ("stray-text-in-block", "<facts><fact>A</fact>stray text</facts>", None),
    ("empty-fact", "<facts><fact>A</fact><fact></fact></facts>", None),
    ("unclosed-fact-in-closed-block", "<facts><fact>A</facts>", None),
    ("nested-fact", "<facts><fact>A <fact>B</fact></fact></facts>", None),
    ("other-tags-in-block", "<facts><item>A</item></facts>", None),
    ("other-tags", "<facts_list><f>A</f></facts_list>", None),
    ("unclosed-then-other-tags", "<facts><fact>A</fact><note>x</note>", None),
    ("retire-without-id", "<facts><retire>no id</retire></facts>", None),
    ("retire-extra-attribute", '<facts><retire id="1" x="2">two</retire></facts>', None),
    ("bare-runs-split-by-prose", "<fact>A</fact>\nAlso:\n<fact>B</fact>", None),
    ("a-bad-block-among-good", "<facts><fact>A</fact></facts><facts>junk</facts>", None),
    ("prompt-example-echoed", EXAMPLE_ECHO, None),
    ("cut-while-thinking", "<think>Let me consider what the user", None),
    ("json-cut", '{"facts": [{"text": "A"}, {"text": "B', None),
    ("json-other-shape", '{"answer": "Ana likes tea"}', None),
    ("json-empty-fact", '{"facts": [{"text": "  "}], "retire": []}', None),
    ("prose-with-braces", "No facts {none} here.", None),
    ("json-retire-without-id", '{"facts": [], "retire": [{"reason": "x"}]}', None),
]


@pytest.mark.parametrize(("reply", "expected"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_reply_corpus(reply: str, expected) -> None:
    parsed = parse_fact_reply(reply)
    if expected is None:
        assert parsed is None
        return
    texts, retired = expected if isinstance(expected, tuple) else (expected, [])
    assert parsed is not None
    assert [f.text for f in parsed.facts] == texts
    assert parsed.retire == retired


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 20 and len({c[0] for c in CORPUS}) == len(CORPUS)


def test_attributes_survive_in_every_shape() -> None:
    """A bare fact, a fact of a cut reply and a JSON fact keep their topics, entities, replaces
    and expiry."""
    tagged = (
        '<fact topics="Pets, home" entities="Rex" replaces="3" expires="2030-01-02">'
        "Ana has Rex</fact>"
    )
    for reply in (tagged, f"<facts>{tagged}<fact>cut", f"```\n{tagged}\n```"):
        (fact,) = parse_fact_reply(reply).facts
        assert (fact.topics, fact.entities, fact.replaces) == (["home", "pets"], ["Rex"], ["3"])
        assert fact.expires_at.date().isoformat() == "2030-01-02"
    reply = (
        '{"facts": [{"text": "Ana has Rex", "topics": ["Pets", "home"], "entities": ["Rex"],'
        ' "replaces": [3], "expires": "2030-01-02"}], "retire": []}'
    )
    (fact,) = parse_fact_reply(reply).facts
    assert (fact.topics, fact.entities, fact.replaces) == (["home", "pets"], ["Rex"], ["3"])
    assert fact.expires_at.date().isoformat() == "2030-01-02"
