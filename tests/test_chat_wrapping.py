"""How the full-screen chat wraps its conversation (issue 44, item 9): a reply's mark (the
Ctrl-C note "⏹ cancelled: partial reply kept") never breaks mid-word at the window's edge, and
`/help` continues a long description under it, not at column 0."""

from __future__ import annotations

import pytest
from prompt_toolkit.formatted_text import fragment_list_to_text

from memcli.chat.commands import help_lines
from memcli.cli.chat.panels import MARKS, Entry, conversation


def rows(entries: list[Entry], width: int) -> list[str]:
    return fragment_list_to_text(conversation(entries, width, {})).split("\n")


@pytest.mark.parametrize("width", range(20, 61))
def test_the_cancel_mark_wraps_at_words_at_every_width(width):
    reply = Entry("assistant", "Once upon a time there was a kingdom by the sea", "cancelled")
    shown = rows([reply], width)
    assert all(len(row) <= width - 1 for row in shown), shown  # the window never wraps it again
    words = MARKS["cancelled"][1].split()
    text = " ".join(" ".join(shown).split())
    assert " ".join(words) in text  # each word of the note whole, in order


@pytest.mark.parametrize("width", [50, 60, 80])
def test_help_continues_each_description_under_it(width):
    shown = rows([Entry("note", "\n".join(help_lines()))], width)
    column = help_lines()[0].index("show")  # where descriptions start
    assert any(not row[:column].strip() and row.strip() for row in shown)  # some wrapped
    for row in shown:
        if row.strip():
            assert not row.startswith(" ") or row.startswith(" " * column), row
    assert all(len(row) <= width - 1 for row in shown)


def test_the_status_line_names_what_the_chat_prepares_as_a_user_knows_it(tmp_path):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli import SQLiteStore
    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp

    chat = Chat(SQLiteStore(tmp_path / "s.db"))
    chat.open("s")
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, tmp_path / "history", pipe, DummyOutput())
        ui.loading = {"litellm", "blocks"}
        assert "loading the memory blocks and the model's client…" in ui.status()
        assert "litellm" not in ui.status()
    chat.close()
