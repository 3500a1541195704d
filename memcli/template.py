"""The `<memory>` template's elements, and `neutralise`: text from users, models and tools is
data wherever it is rendered into them.

The template (`context.render_memory`) is `<memory>`, one element per block named after it, and
inside the blocks the elements around the texts they insert: `<fact>` (facts), `<message>`
(retrieved messages, and a batch shown to an LLM inside `<conversation>`), `<summary>` (the
element a summary is answered in). Every text put into them goes through `neutralise`, so that
it cannot open or close any of them; a text without such a tag is rendered byte for byte, as the
reference renders it.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

#: The template's elements whatever the blocks are named: `<memory>` around everything, and the
#: elements blocks put around the texts they insert (`<fact>`, `<message>`) or an LLM answers a
#: summary in (`<summary>`). The blocks' own elements (`<extracted_info>`, ...) are named by
#: the blocks in use: `context.assemble` adds them.
TEMPLATE_TAGS = ("memory", "fact", "message", "summary")


#: Characters a reader (a model) does not see: zero-width spaces and joiners, the soft hyphen,
#: bidirectional marks and isolates, the word joiner and invisible operators, the byte-order
#: mark. Inside a tag they hide it from a plain match but not from the model.
_INVISIBLE = "[\\s\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0]*"


@lru_cache(maxsize=64)
def _tag_pattern(tags: tuple[str, ...]) -> re.Pattern[str]:
    def spelled(tag: str) -> str:  # (each letter, invisible characters allowed between them)
        return _INVISIBLE.join(re.escape(c) for c in tag)

    names = "|".join(spelled(t) for t in sorted(set(tags), key=len, reverse=True))
    return re.compile(rf"<(?={_INVISIBLE}/?{_INVISIBLE}(?:{names})(?![\w.:-]))", re.I)


def neutralise(text: str, tags: Iterable[str] = TEMPLATE_TAGS) -> str:
    """`text` made unable to open or close an element named in `tags`: the `<` of each opening
    or closing tag of one (any case, with white space after `<` or `/`: `</memory>`,
    `<FACT id=1>`, `< /message >`) becomes `&lt;`. Nothing else changes: a text without such a
    tag is returned as it is (`<b>`, `a < b`, `<memory_notes>` included). Characters a model
    does not see (a zero-width space, a soft hyphen, a bidirectional mark) count as white space
    around and inside a tag's name: `<\u200b/memory>` and `</mem\u00adory>` are tags too."""
    names = tuple(tags)
    if "<" not in text or not names:
        return text
    return _tag_pattern(names).sub("&lt;", text)
