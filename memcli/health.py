"""Unfinished long-term work in a database: what `memcli check` lists besides its integrity, and
`memcli info` counts.

- `pending`: batches a block failed on (the LLM was down or answered badly), per block and user,
  with the last error (kind, HTTP status, message) and when they are retried;
- `unfed`: flushed batches a block was never handed (an import or a chat killed between storing
  its messages and feeding its blocks: a re-run finds the messages stored and feeds nothing;
  `import --no-blocks`); for a block that `catches_up_itself` (the vector block: the next
  search embeds every message without a vector) they are listed as needing nothing;
- `unread`: conversations a fact block started to read for their facts (an import's
  extraction, `memcli facts extract`) and did not finish (the process was killed): finished by
  `memcli facts extract`;
- `condense`: a fact block over its `max_facts` whose condensing failed (retried after the next
  extraction, or by `memcli facts extract --pending`);
- `index`: index files that are damaged (rebuilt by the next search) or stale;
- `delete`: deletes for good stopped between their commit and their cleanup (the database's
  files not purged, the index files not removed: they may still hold what was deleted),
  finished by `memcli check --repair`, the next search, or the next `memcli rm`.

Each item carries the command that fixes it. `stale` index files and batches never handed to a
block that `catches_up_itself` need nothing: the next search brings them up to date
(`Attention.needed` is False).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.store import work
from memcli.words import plural, shell_arg

if TYPE_CHECKING:
    from memcli.blocks.base import MemoryBlock


@dataclass(frozen=True)
class Attention:
    """One piece of unfinished work: its kind (see the module docstring), what it is, and the
    command that finishes it."""

    kind: str
    message: str
    fix: str
    block: str | None = None
    user: str | None = None
    count: int = 0
    status: int | None = None
    error: str | None = None
    needed: bool = True

    def record(self) -> dict[str, Any]:
        return {
            "type": "attention",
            "kind": self.kind,
            "block": self.block,
            "user": self.user,
            "count": self.count,
            "status": self.status,
            "error": self.error,
            "needed": self.needed,
            "message": self.message,
            "fix": self.fix,
        }


BlocksFor = Callable[[str, str], Sequence["MemoryBlock"]]


def unfinished(
    store: Any, blocks_for: BlocksFor | None = None, index_dir: str | Path | None = None
) -> list[Attention]:
    """Every piece of unfinished work in the store. `blocks_for(session, user)` gives the blocks
    a session feeds (as `memcli blocks backfill` builds them); without it, batches never fed
    are not looked for. `index_dir`: where a PostgreSQL database's index files are."""
    found: list[Attention] = []
    known: dict[str, MemoryBlock] = {}
    if blocks_for is not None:
        found += _unfed(store, blocks_for, known)
    found += _unread(store)
    found += _pending(store, known)
    found += _condensations(store)
    found += _deletes(store)
    found += _index(store, index_dir)
    return found


def _deletes(store: Any) -> list[Attention]:
    from memcli.store.forget import unfinished_deletes

    n = len(unfinished_deletes(store))
    if not n:
        return []
    return [
        Attention(
            "delete",
            f"{n} delete(s) for good stopped before their cleanup: the database's files and"
            " the index files may still hold what they deleted",
            "memcli check --repair (finishes them)",
            count=n,
        )
    ]


def _user(user: str) -> str:
    return f" --user {shell_arg(user)}" if user else ""


def _unfed(store: Any, blocks_for: BlocksFor, known: dict[str, MemoryBlock]) -> list[Attention]:
    counts: dict[tuple[str, str], list[int]] = {}
    itself: set[str] = set()
    for session, user in work.flushed_sessions(store):
        for block in blocks_for(session, user):
            known.setdefault(block.name, block)
            if not block.receives_flushes:
                continue
            catches_up = getattr(block, "catches_up_itself", False)
            if catches_up:  # (what a search embedded meanwhile is no work left)
                itself.add(block.name)
            key = block.key_for(session, user)
            n = work.unfed_count(store, block.name, key, session, unembedded=catches_up)
            if n:
                entry = counts.setdefault((block.name, user), [0, 0])
                entry[0] += n
                entry[1] += 1
    out = []
    for (name, user), (n, s) in sorted(counts.items()):
        message = (
            f"block {name!r}: {_batches(n)} of user {user!r} ({_sessions(s)}) never handed"
            " to the block (`import --no-blocks`, or an import or chat stopped before it fed"
            " its blocks)"
        )
        fix = f"memcli blocks backfill{_user(user)}"
        if name in itself:  # searching embeds what has no vector: the backfill only does it now
            message += "; the next search of the user catches up on them"
            fix += " (now, else the next search does it)"
        out.append(
            Attention(
                "unfed", message, fix, block=name, user=user, count=n, needed=name not in itself
            )
        )
    return out


def _unread(store: Any) -> list[Attention]:
    out = []
    for (name, user), n in sorted(work.unread_conversations(store).items()):
        out.append(
            Attention(
                "unread",
                f"block {name!r}: {plural(n, 'conversation')} of user {user!r} not read for"
                " facts (an import's extraction or `facts extract` stopped before it read them"
                " all)",
                f"memcli facts extract{_user(user)}",
                block=name,
                user=user,
                count=n,
            )
        )
    return out


def _pending(store: Any, known: dict[str, MemoryBlock]) -> list[Attention]:
    out = []
    for p in work.pending_batches(store):
        block = known.get(p.block)
        retries = getattr(block, "auto_retries", None)
        if block is not None and retries is None:
            when = "not retried automatically"
        elif retries is not None and p.attempts > retries:
            when = f"no longer retried automatically ({p.attempts} attempts)"
        elif p.due_after_flushes:
            when = f"retried automatically after {p.due_after_flushes} more flush(es)"
        else:
            when = "retried automatically at the next flush"
        status = _status(p.error)
        out.append(
            Attention(
                "pending",
                f"block {p.block!r}: {_batches(p.count)} of user {p.user_id!r} pending"
                f" ({_sessions(p.sessions)}, {p.attempts} attempt(s), last {p.updated_at}):"
                f" {p.error or 'no error recorded'}; {when}",
                f"memcli blocks backfill{_user(p.user_id)}",
                block=p.block,
                user=p.user_id,
                count=p.count,
                status=status,
                error=p.error,
            )
        )
    return out


def _condensations(store: Any) -> list[Attention]:
    out = []
    for block, scope_key, value in work.condense_failures(store):
        user = scope_key.partition(":")[2] if scope_key.startswith("user:") else ""
        error = str(value.get("error"))
        out.append(
            Attention(
                "condense",
                f"block {block!r} ({scope_key}): condensing {value.get('facts')} facts to"
                f" {value.get('max_facts')} failed ({value.get('at')}): {error};"
                " retried after the next extraction",
                f"memcli facts extract --pending{_user(user)}",
                block=block,
                user=user or None,
                count=1,
                status=_status(error),
                error=error,
            )
        )
    return out


def _index(store: Any, index_dir: str | Path | None) -> list[Attention]:
    from memcli.search.dense import index_health

    state = index_health(store, index_dir)
    if state is None:
        return []
    kind, why, path = state
    if kind == "damaged":
        return [
            Attention(
                "index",
                f"index file {path} is damaged: {why}",
                'memcli search "anything" (rebuilds it from the database)',
                count=1,
                error=why,
            )
        ]
    return [
        Attention(
            "index",
            f"index file {path} is stale: {why}",
            "nothing: the next search brings it up to date",
            count=1,
            error=why,
            needed=False,
        )
    ]


def _status(error: str | None) -> int | None:
    """The HTTP status a recorded error names (`server (HTTP 500): ...`), if any."""
    if not error:
        return None
    _, sep, rest = error.partition("(HTTP ")
    if not sep:
        return None
    digits = rest.split(")", 1)[0]
    return int(digits) if digits.isdigit() else None


def _batches(n: int) -> str:
    return plural(n, "batch")


def _sessions(n: int) -> str:
    return plural(n, "session")
