"""A small transcript for CLI tests of long-term memory."""

from __future__ import annotations

import json
from pathlib import Path

FACTS = [
    "My dog is called Rex and he chases tennis balls.",
    "I moved to Porto last year, near the Douro river.",
    "I work night shifts as a nurse.",
    "I have been learning the cello for three years.",
]


def write_chat(path: Path, session: str = "s1", small_talk: int = 4) -> str:
    lines = []
    for fact in FACTS:
        lines += [{"role": "user", "content": fact}, {"role": "assistant", "content": "Noted."}]
    for i in range(small_talk):
        lines += [
            {"role": "user", "content": f"small talk {i}"},
            {"role": "assistant", "content": "ok"},
        ]
    path.write_text("\n".join(json.dumps({**line, "session": session}) for line in lines) + "\n")
    return str(path)


BUDGET = ("--token-limit", "400", "--ratio", "0.1", "--flush-size", "20")
