"""The full-screen chat's input history (Up/Down): one file per user, so that forgetting a user
(`memcli rm --user`, the agent tools' `forget_user`: MCP) takes their typed lines with the rest.

`$MEMCLI_HOME/chat_histories/<hash of the user name>`, in prompt_toolkit's `FileHistory` format
(each entry a `# time` line, then its lines each after a `+`). Before, one file was shared by
every user of the home (`$MEMCLI_HOME/chat_history`): it is no longer written, and `rm --user`
and forgetting take out of it every entry that is the text of one of the user's messages (an entry never sent,
such as a slash command, cannot be told apart: remove that file by hand).
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from memcli.store.base import Store

#: The file every user shared before the history was per user.
SHARED = "chat_history"


def history_path(home: Path, user: str) -> Path:
    """Where the chat keeps `user`'s input history."""
    digest = hashlib.sha256(user.encode()).hexdigest()[:32]
    return home / "chat_histories" / digest


def forget_user(home: Path, store: Store, user: str) -> None:
    """Before `user` is forgotten: delete their input history, and take the entries that are
    their messages' texts out of the file shared before (read from the store: call it first)."""
    history_path(home, user).unlink(missing_ok=True)
    shared = home / SHARED
    if not shared.is_file():
        return
    with open(shared, encoding="utf-8", errors="surrogateescape", newline="") as file:
        entries = _entries(file.read())  # (as written: a "\r" in a line is no end of line)
    # (typed lines are kept as typed, messages stored stripped: both are compared stripped)
    wanted = {_digest(_text(e).strip()) for e in entries}
    theirs: set[str] = set()
    for info in store.list_sessions(user):
        for m in store.iter_messages(info.id):
            if m.role == "user" and (digest := _digest(m.content.strip())) in wanted:
                theirs.add(digest)
    kept = [e for e in entries if _digest(_text(e).strip()) not in theirs]
    if len(kept) == len(entries):
        return
    tmp = shared.with_name(f"{SHARED}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="") as file:
        file.write("".join(kept))
    os.replace(tmp, shared)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _entries(data: str) -> list[str]:
    """A FileHistory file's entries, each with its lines: its `#` line (and the empty one
    before it), then its `+` lines."""
    entries: list[str] = []
    current: list[str] = []
    has_text = False
    pieces = data.split("\n")  # (FileHistory's lines end with a newline, nothing else)
    for line in [p + "\n" for p in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else []):
        is_text = line.startswith("+")
        if has_text and not is_text:
            entries.append("".join(current))
            current, has_text = [], False
        current.append(line)
        has_text = has_text or is_text
    if current:
        entries.append("".join(current))
    return entries


def _text(entry: str) -> str:
    """An entry's text: its `+` lines without the `+`, as FileHistory reads it."""
    lines = [ln[1:] for ln in entry.split("\n") if ln.startswith("+")]
    return "\n".join(lines)
