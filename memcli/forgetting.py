"""Deleting for good, as `memcli rm` and the MCP server do it: what a deletion will take (to show
before asking), and the deletion itself, the database's files and the retrieval index files
included. The rows go through the store (`Store.delete_session`, `delete_message`,
`forget_user`; what each keeps consistent: `memcli.store.forget`); `purge()` leaves no copy in the
database's files, and the index files, which hold the messages' vectors and session and user
names, are removed (the next search rebuilds them from the database)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.errors import MessageNotFound, UsageError
from memcli.messages import format_time, session_name
from memcli.store.base import require_session
from memcli.words import plural

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from memcli.messages import Message
    from memcli.store.base import Store
    from memcli.store.forget import Forgotten

KINDS = ("session", "message", "user")


@dataclass(frozen=True)
class Deletion:
    """One thing a deletion takes: a session (with `messages` messages), one message of a
    session, or everything of a user (`forgotten`: what of them)."""

    kind: str
    session: str | None = None  # (the store's key: `SessionInfo.id`)
    messages: int = 0
    message: Message | None = None
    forgotten: Forgotten | None = None

    @property
    def session_name(self) -> str | None:
        """The session's name, as its user calls it."""
        return None if self.session is None else session_name(self.session)

    def record(self, *, done: bool = True) -> dict[str, Any]:
        """As a JSON record: `deleted` / `forgotten` once done, `would_delete` / `would_forget`
        for a dry run."""
        if self.forgotten is not None:
            return {**self.forgotten.to_dict(), "type": "forgotten" if done else "would_forget"}
        record: dict[str, Any] = {"type": "deleted" if done else "would_delete"}
        record["session"] = self.session_name
        if self.message is not None:
            m = self.message
            record.update(message=m.id, role=m.role, status=m.status, content=m.content)
            if m.timestamp is not None:
                record["timestamp"] = format_time(m.timestamp)
        else:
            record["messages"] = self.messages
        return record

    def describe(self) -> str:
        """One line for a person: what goes."""
        if self.forgotten is not None:
            f = self.forgotten
            if f.is_empty:  # (a mistyped name, as often as not)
                return f"user {f.user!r}: nothing is stored for this user"
            return (
                f"user {f.user!r}: {plural(len(f.sessions), 'session')}"
                f" ({', '.join(session_name(k) for k in f.sessions)}),"
                f" {plural(f.messages, 'message')}, {plural(f.facts, 'fact')}"
                f" ({plural(f.fact_changes, 'history entry', 'history entries')}),"
                f" {plural(f.summaries, 'summary', 'summaries')}, {plural(f.block_states, 'block state')},"
                f" {plural(f.vectors, 'vector')}"
            )
        if self.message is not None:
            m = self.message
            text = " ".join(m.content.split())
            text = text if len(text) <= 60 else text[:59] + "…"
            return f"message {m.id} of session {self.session_name} ({m.role}, {m.status}): {text}"
        return f"session {self.session_name} ({plural(self.messages, 'message')})"


def plan(
    store: Store,
    sessions: Sequence[str] = (),
    message_ids: Sequence[int] = (),
    user: str | None = None,
) -> list[Deletion]:
    """What deleting these takes, deleting nothing: sessions (by their names, or unique starts
    of them; of `user`, when given), messages of the one session given, or with no session,
    everything of `user`. Raises UsageError for a
    combination that means nothing, SessionNotFound / MessageNotFound for what is not there."""
    if message_ids and len(sessions) != 1:
        raise UsageError(
            "--message needs exactly one SESSION", "Write e.g. `memcli rm demo --message 12`"
        )
    if not sessions:
        if user is None:
            raise UsageError(
                "nothing to delete", "Name sessions (`memcli rm demo`) or a user (--user NAME)"
            )
        return [Deletion("user", forgotten=store.survey_user(user))]
    infos = [require_session(store, s, user, prefix=True) for s in dict.fromkeys(sessions)]
    infos = list({info.id: info for info in infos}.values())
    if not message_ids:
        return [
            Deletion("session", info.id, info.active_messages + info.archived_messages)
            for info in infos
        ]
    session = infos[0].id
    found = {m.id: m for m in store.get_messages(session, ids=list(dict.fromkeys(message_ids)))}
    for message_id in message_ids:
        if message_id not in found:
            raise MessageNotFound(session_name(session), message_id)
    return [Deletion("message", session, 1, message=found[i]) for i in dict.fromkeys(message_ids)]


def delete(
    store: Store, deletions: Sequence[Deletion], index_dir: str | Path | None = None
) -> list[Deletion]:
    """Delete what `plan` listed, for good; return what went (a message another process deleted
    meanwhile is left out). `index_dir`: where a PostgreSQL database's index files are kept."""
    done: list[Deletion] = []
    sessions = [d for d in deletions if d.kind == "session"]
    if sessions:
        store.prepare_delete()
        with store.transaction():
            for d in sessions:
                count = store.delete_session(d.session or "")
                done.append(Deletion("session", d.session, count))
        store.purge()
    for d in deletions:
        if d.kind == "message" and d.message is not None and d.message.id is not None:
            gone = store.delete_message(d.session or "", d.message.id)
            if gone is not None:
                done.append(Deletion("message", d.session, 1, message=gone))
        elif d.kind == "user" and d.forgotten is not None:
            done.append(Deletion("user", forgotten=forget_user(store, d.forgotten.user, index_dir)))
    _remove_index_files(store, index_dir)
    return done


def forget_user(store: Store, user: str, index_dir: str | Path | None = None) -> Forgotten:
    """Delete everything of `user` for good (`Store.forget_user`) and the index files."""
    forgotten = store.forget_user(user)
    _remove_index_files(store, index_dir)
    return forgotten


def finish_deletes(store: Store, index_dir: str | Path | None = None) -> int:
    """Finish the deletes that were stopped between their commit and their cleanup (see
    `memcli.search.dense.finish_deletes`); return how many there were."""
    from memcli.search.dense import finish_deletes

    return finish_deletes(store, index_dir)


def _remove_index_files(store: Store, index_dir: str | Path | None) -> None:
    from memcli.search.dense import finish_deletes

    finish_deletes(store, index_dir, deleted=True)
