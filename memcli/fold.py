"""The one text rule of search: how a word is compared, in message search and in fact search, on
SQLite and on PostgreSQL. `fold` gives a text's compared form: Latin letters lose their accents
(what Unicode's NFD splits off: é, ñ, ń, ü, İ), the Latin letters that do not decompose are
written as the letters people type for them (`LETTERS`: ø→o, æ→ae, ł→l, ß→ss, ...), combining
accents of those letters written apart (e + ◌́) are dropped, and case is lowered. Other scripts
keep their letters (й is not и in Russian), and so do ǽ and ǿ (an accented æ or ø, as FTS5
keeps them). So `tromso` finds "Tromsø" and `Gdańsk` finds "gdansk", either way round.

The rule is one table of characters (`TABLE`), applied by Python to queries and to fact texts,
and written into SQL where a database folds what it indexes: PostgreSQL's `memcli_fold`
(`translate` and `replace`, `pg_function`), SQLite's view under its full-text index (`sqlite_rows`:
FTS5's tokenizer `unicode61 remove_diacritics 2` already takes the accents off, so the view
replaces only the letters it keeps, `SQLITE_LETTERS`; tests/test_fold.py checks that every
entry of the table meets its fold through FTS5's tokenizer).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

#: Latin letters that NFD leaves whole, as people type them without the key for them.
LETTERS: dict[str, str] = {
    "ø": "o", "Ø": "o", "æ": "ae", "Æ": "ae", "œ": "oe", "Œ": "oe", "ł": "l", "Ł": "l",
    "đ": "d", "Đ": "d", "ð": "d", "Ð": "d", "ß": "ss", "ẞ": "ss", "ı": "i", "þ": "th",
    "Þ": "th", "ħ": "h", "Ħ": "h", "ŧ": "t", "Ŧ": "t",
}  # fmt: skip

#: The Latin blocks whose letters lose their accents: Latin-1 Supplement, Latin Extended-A and
#: -B, Latin Extended Additional (Vietnamese).
_LATIN = [(0x00C0, 0x024F), (0x1E00, 0x1EFF)]


def _table() -> dict[int, str]:
    table: dict[int, str] = {}
    marks: set[str] = set()  # the accents Latin letters are made of, dropped where written apart
    for start, end in _LATIN:
        for code in range(start, end + 1):
            char = chr(code)
            if not char.isalpha():
                continue
            parts = unicodedata.normalize("NFD", char)
            marks.update(c for c in parts if unicodedata.combining(c))
            base = "".join(c for c in parts if not unicodedata.combining(c))
            base = base.lower()  # (ǽ, ǿ: an accented æ or ø stays: FTS5 keeps them too)
            if base and base != char.lower() and base.isascii():
                table[code] = base
    table.update({ord(k): v for k, v in LETTERS.items()})
    table.update(dict.fromkeys(map(ord, marks), ""))
    return table


#: Each character that folds, to what it folds to ("" for a combining accent).
TABLE: dict[int, str] = _table()


def fold(text: str) -> str:
    """The compared form of a text: lowercased, then `TABLE` applied ("Tromsø" → "tromso",
    "Straße" → "strasse", "ÆRØ" → "aero"); folding it again changes nothing."""
    return text.lower().translate(TABLE)


#: The letters SQLite's view replaces: those FTS5's tokenizer keeps as they are (its
#: remove_diacritics takes the accents off the others, and drops the accents written apart):
#: LETTERS, and ȧ with a macron.
SQLITE_LETTERS: dict[str, str] = LETTERS | {"Ǡ": "a", "ǡ": "a"}


def sqlite_rows(rows: str, folded: Sequence[str], kept: Sequence[str] = ()) -> str:
    """SQLite SQL of a subquery: the columns `kept` of `rows` (a table, or a subquery in
    parentheses) as they are and the columns `folded` with SQLITE_LETTERS replaced (`replace`
    calls, only in a text that holds one of them: a text of ASCII alone, its bytes as many as
    its characters, is not even looked through)."""
    chars = "".join(SQLITE_LETTERS)
    columns = list(kept)
    for name in folded:
        sql = name
        for letter, to in SQLITE_LETTERS.items():
            sql = f"replace({sql}, '{letter}', '{to}')"
        plain = f"length(CAST({name} AS BLOB)) = length({name}) OR {name} NOT GLOB '*[{chars}]*'"
        columns.append(f"CASE WHEN {plain} THEN {name} ELSE {sql} END AS {name}")
    return f"(SELECT {', '.join(columns)} FROM {rows})"


#: The blocks `pg_function` folds one at a time, each only in a text that holds one of its
#: characters: `translate` compares each character with every one it replaces, so a block's
#: few are compared, not the whole table's.
_PG_BLOCKS = [
    (0x00C0, 0x00FF),
    (0x0100, 0x017F),
    (0x0180, 0x024F),
    (0x0300, 0x036F),
    (0x1E00, 0x1EFF),
]


def pg_function(name: str) -> str:
    """PostgreSQL's CREATE FUNCTION of `name`(text), folding by `TABLE`: a text of ASCII alone
    as it is; else, per block of `_PG_BLOCKS` that it holds, one `translate` for the characters
    that become one letter or none and a `replace` for each that becomes two."""
    steps = []
    for low, high in _PG_BLOCKS:
        block = {k: v for k, v in TABLE.items() if low <= k <= high}
        single = {k: v for k, v in block.items() if len(v) == 1}
        gone = [k for k, v in block.items() if not v]
        sources = "".join(chr(k) for k in single) + "".join(chr(k) for k in gone)
        sql = f"translate(t, '{sources}', '{''.join(single.values())}')"
        for code, to in block.items():
            if len(to) > 1:
                sql = f"replace({sql}, '{chr(code)}', '{to}')"
        steps.append(f"   IF t ~ '[{chr(low)}-{chr(high)}]' THEN t := {sql}; END IF;")
    body = "\n".join(steps)
    return f"""CREATE FUNCTION {name}(p_text TEXT) RETURNS TEXT
   LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE t TEXT := p_text;
BEGIN
   IF octet_length(t) = length(t) THEN RETURN t; END IF;
{body}
   RETURN t;
END $$"""
