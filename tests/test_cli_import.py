"""`memcli import`: formats, sessions, budgets, and bad input that stores nothing."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

# No test here needs the default vector block: no command loads an embedding model.
pytestmark = pytest.mark.usefixtures("no_blocks")


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def turns(n: int, session: str | None = None) -> list[dict]:
    out = []
    for i in range(n):
        out.append({"role": "user", "content": f"message {i} from the user about cats"})
        out.append({"role": "assistant", "content": f"reply {i} from the assistant about dogs"})
    if session:
        for r in out:
            r["session"] = session
    return out


def test_import_new_session_printed_on_stderr(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", turns(3))
    run = memcli("import", str(path))
    assert run.code == 0, run.stderr
    assert "New session:" in run.stderr and "Imported 6 messages" in run.stderr
    (summary,) = run.records()  # stdout is a pipe: the summary as JSON Lines, without --json
    assert summary["type"] == "summary" and summary["new"] == 6 and summary["already_stored"] == 0
    sessions = memcli("sessions", "--json").records()
    assert len(sessions) == 1 and sessions[0]["active_messages"] == 6


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_import_json_summary_and_flushes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", turns(20))
    run = memcli(
        "import",
        str(path),
        "--session",
        "demo",
        "--token-limit",
        "60",
        "--flush-size",
        "10",
        "--json",
    )
    assert run.code == 0, run.stderr
    (summary,) = run.records()
    assert summary["type"] == "summary" and summary["sessions"] == {"demo": 40}
    assert summary["flushes"] > 0 and summary["archived_messages"] > 0
    inspect = memcli("inspect", "demo", "--json").records()
    total = inspect[-1]
    assert total["active_messages"] + total["archived_messages"] == 40
    assert total["token_limit"] == 60 and total["flushes"] == summary["flushes"]


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_sessions_from_records_and_stdin(tmp_path: Path) -> None:
    data = "".join(json.dumps(r) + "\n" for r in turns(2, "alpha") + turns(1, "beta"))
    run = memcli("import", "-", "--user", "ana", input=data)
    assert run.code == 0, run.stderr
    sessions = {s["session"]: s for s in memcli("sessions", "--json").records()}
    assert set(sessions) == {"alpha", "beta"}
    assert sessions["alpha"]["active_messages"] == 4 and sessions["alpha"]["user"] == "ana"


def test_conversation_lines_and_array(tmp_path: Path) -> None:
    convo = tmp_path / "c.jsonl"
    convo.write_text(
        json.dumps({"messages": turns(2)}) + "\n" + json.dumps({"messages": turns(1)}) + "\n"
    )
    assert memcli("import", str(convo), "--session", "c").code == 0
    array = tmp_path / "a.json"
    array.write_text(json.dumps(turns(2)))
    assert memcli("import", str(array), "--session", "a").code == 0
    counts = {s["session"]: s["active_messages"] for s in memcli("sessions", "--json").records()}
    assert counts == {"c": 6, "a": 4}


def test_session_remembers_its_budget(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", turns(1))
    more = write_jsonl(tmp_path / "more.jsonl", turns(2))
    assert memcli("import", str(path), "--session", "b", "--token-limit", "500").code == 0
    assert memcli("import", str(more), "--session", "b").code == 0
    summary = memcli("inspect", "b", "--json").records()[-1]
    assert summary["token_limit"] == 500 and summary["flush_size"] == 50
    assert memcli("import", str(more), "--session", "b", "--token-limit", "500").code == 0


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_a_budget_option_that_differs_is_an_error_unless_rebudget(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", turns(30))
    run = memcli("import", str(path), "--session", "demo", "--token-limit", "4000")
    assert run.code == 0, run.stderr
    before = memcli("export", "demo", "--all").stdout
    more = write_jsonl(tmp_path / "more.jsonl", turns(31)[-2:])
    run = memcli("import", str(more), "--session", "demo", "--token-limit", "100")
    assert run.code == 2
    assert "has the budget 4,000 × 0.7 (flush 400)" in run.stderr and "--rebudget" in run.stderr
    assert memcli("export", "demo", "--all").stdout == before  # nothing stored, nothing flushed
    run = memcli("import", str(more), "--session", "demo", "--token-limit", "100", "--rebudget")
    assert run.code == 0, run.stderr
    assert "budget 100 × 0.7 (flush 10) stored (was 4,000 × 0.7 (flush 400))" in run.stderr
    (summary,) = run.records()
    change = summary["rebudgets"]["demo"]
    assert change["to"] == {"token_limit": 100, "ratio": 0.7, "flush_size": 10}
    assert change["archived_messages"] > 50 and summary["new"] == 2
    assert memcli("inspect", "demo", "--json").records()[-1]["token_limit"] == 100


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_importing_again_stores_nothing_new(tmp_path: Path) -> None:
    records = turns(3, "s")
    records[3]["content"] = records[1]["content"] = "ok"  # "ok" twice: not a duplicate
    path = write_jsonl(tmp_path / "t.jsonl", records)
    assert memcli("import", str(path)).records()[0]["new"] == 6
    run = memcli("import", str(path))
    assert run.code == 0, run.stderr
    assert "0 new, 6 already stored" in run.stderr
    assert run.records()[0]["new"] == 0 and run.records()[0]["already_stored"] == 6
    exported = memcli("export", "s", "--all").stdout
    run = memcli("import", "-", "--session", "s", input=exported)  # its own export
    assert run.code == 0 and run.records()[0]["already_stored"] == 6
    grown = write_jsonl(tmp_path / "grown.jsonl", records + turns(4, "s")[-2:])
    assert memcli("import", str(grown)).records()[0]["new"] == 2
    assert memcli("import", str(path), "--again").records()[0]["new"] == 6
    stored = memcli("inspect", "s", "--all", "--json").records()
    assert len([r for r in stored if r["type"] == "message"]) == 14


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_export_keeps_the_budget(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", turns(10))
    assert (
        memcli("import", str(path), "--session", "a", "--token-limit", "300", "--user", "ana").code
        == 0
    )
    exported = memcli("export", "a", "--all")
    first = exported.records()[0]
    # where the import found it: a hash of its first messages (no title, no keys)
    assert first.pop("source_id").startswith("sha256:")
    assert first == {
        "type": "session",
        "id": "a",
        "user": "ana",
        "token_limit": 300,
        "chat_history_token_ratio": 0.7,
        "token_flush_size": 30,
    }
    run = memcli("import", "-", "--session", "b", input=exported.stdout)
    assert run.code == 0, run.stderr
    a, b = (memcli("inspect", s, "--all", "--json").records()[-1] for s in ("a", "b"))
    for key in ("token_limit", "flush_size", "ratio", "user", "active_messages", "flushes"):
        assert a[key] == b[key], key
    run = memcli("import", "-", "--session", "c", "--token-limit", "200", input=exported.stdout)
    assert memcli("inspect", "c", "--json").records()[-1]["token_limit"] == 200  # flags win
    bare = [r for r in exported.records() if r.get("type") != "session"]
    run = memcli("import", "-", "--session", "d", input="".join(json.dumps(r) + "\n" for r in bare))
    assert run.code == 0 and memcli("inspect", "d", "--json").records()[-1]["token_limit"] == 30000


def test_an_empty_file_says_nothing_to_import(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    run = memcli("import", str(empty))
    assert run.code == 0 and "Nothing to import" in run.stderr
    assert run.records()[0]["new"] == 0
    run = memcli("import", "-", input="")
    assert run.code == 0 and "Nothing to import" in run.stderr
    assert not list(tmp_path.glob("**/*.db"))  # no database was made


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (
            b'{"role": "user", "content": "ok"}\n{"role": "user", "content": "ok"}\n{bad json\n',
            "t.jsonl:3",
        ),
        (b'{"role": "user", "content": "ok"}\n{"content": "no role"}\n', "t.jsonl:2: missing role"),
        (b'{"role": "wizard", "content": "x"}\n', "t.jsonl:1: unknown role"),
        (b'{"role": "user", "content": ["a"]}\n', "t.jsonl:1: content must be text"),
        (
            b'{"role": "user", "content": "ok"}\n{"role": "user", "content": "\xfe\xff"}\n',
            "t.jsonl:2: invalid UTF-8",
        ),
    ],
)
def test_malformed_input_stores_nothing(tmp_path: Path, content: bytes, where: str) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", turns(2))
    assert memcli("import", str(good), "--session", "keep").code == 0
    before = memcli("export", "keep", "--all").stdout
    bad = tmp_path / "t.jsonl"
    bad.write_bytes(content)
    run = memcli("import", str(bad), "--session", "keep")
    assert run.code == 2
    assert where in run.stderr and run.stderr.startswith("Error:")
    assert memcli("export", "keep", "--all").stdout == before
    assert [s["session"] for s in memcli("sessions", "--json").records()] == ["keep"]


def test_usage_errors(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", turns(1))
    run = memcli("import", str(path), "--token-limit", "100", "--flush-size", "500")
    assert run.code == 2 and "larger than token_limit" in run.stderr
    run = memcli("import", str(path), "--put", "sometimes")
    assert run.code == 2 and "--put" in run.stderr
    run = memcli("import", str(tmp_path / "missing.jsonl"))
    assert run.code == 2 and "no such file" in run.stderr
    run = memcli("import", str(path), "--token-limit", "many")
    assert run.code == 2


def test_no_blocks_flag(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", turns(10))
    run = memcli("import", str(path), "--no-blocks", "--token-limit", "50", "--json")
    assert run.code == 0, run.stderr
    summary = run.records()[0]
    assert summary["blocks_fed"] is False and summary["flushes"] > 0


@pytest.mark.usefixtures("cli_db")  # on SQLite and on PostgreSQL
def test_openai_format_round_trips_through_export(tmp_path: Path) -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    records = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": calls, "x-trace": {"n": 1}},
        {"role": "tool", "tool_call_id": "call_1", "content": "42", "metadata": {"k": "v"}},
        {"role": "assistant", "content": "It is 42.", "refusal": None},
    ]
    path = write_jsonl(tmp_path / "openai.jsonl", [{"messages": records}])
    run = memcli("import", str(path), "--session", "a")
    assert run.code == 0, run.stderr
    exported = memcli("export", "a")
    assert exported.code == 0, exported.stderr
    messages = [r for r in exported.records() if r.get("type") != "session"]
    assert all(m.pop("session") == "a" for m in messages)
    assert messages == [{"role": "user", "content": "a\nb"}, *records[1:]]
    run = memcli("import", "-", "--session", "b", input=exported.stdout)
    assert run.code == 0, run.stderr
    again = [r for r in memcli("export", "b").records() if r.get("type") != "session"]
    assert [{**m, "session": "a"} for m in again] == exported.records()[1:]


def test_a_part_that_is_not_text_is_left_out_and_counted(tmp_path: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    records = [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]},
    ]
    path = write_jsonl(tmp_path / "img.jsonl", records)
    run = memcli("import", str(path), "--session", "a")
    assert run.code == 0, run.stderr
    assert "Left out 1 non-text part" in run.stderr
    (summary,) = run.records()
    assert summary["skipped_parts"] == 1 and summary["new"] == 2
    exported = memcli("export", "a").records()
    assert [r["content"] for r in exported if "role" in r] == ["hi", "what is this?"]


EXPORTS = Path(__file__).parent / "data" / "exports"


def test_stdin_twice_stores_nothing_twice(tmp_path: Path) -> None:
    """docs/cli.md's `cat chat.jsonl | memcli import - --user alice`, run twice: one copy."""
    data = "".join(json.dumps(r) + "\n" for r in turns(4))
    first = memcli("import", "-", "--user", "alice", input=data)
    assert first.code == 0, first.stderr
    again = memcli("import", "-", "--user", "alice", input=data)
    assert again.code == 0, again.stderr
    assert "0 new, 8 already stored" in again.stderr
    from_file = memcli(
        "import", str(write_jsonl(tmp_path / "t.jsonl", turns(4))), "--user", "alice"
    )
    assert "0 new, 8 already stored" in from_file.stderr
    assert len(memcli("sessions", "--json").records()) == 1


def test_export_again_from_file_stdin_and_zip_is_0_new(tmp_path: Path) -> None:
    export = EXPORTS / "chatgpt-conversations.json"
    first = memcli("import", str(export), "--user", "alice")
    assert first.code == 0, first.stderr
    assert (
        "New session: sourdough-in-bern-" in first.stderr and "(Sourdough in Bern)" in first.stderr
    )
    assert "Left out 1 non-text part" in first.stderr
    (summary,) = first.records()
    assert summary["new"] == 9 and summary["skipped_parts"] == 1
    assert sorted(summary["titles"].values()) == ["Sourdough in Bern", "Zurich museum day"]
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(export, "conversations.json")
        z.writestr("chat.html", "<html></html>")
    for args, data in (
        ((str(export),), None),
        (("-",), export.read_bytes()),
        ((str(archive),), None),
        (("-",), archive.read_bytes()),
    ):
        run = memcli("import", *args, "--user", "alice", input=data)
        assert run.code == 0, run.stderr
        assert "0 new, 9 already stored" in run.stderr, (args, run.stderr)
    listed = memcli("sessions", "--json").records()
    assert sorted(r["title"] for r in listed) == ["Sourdough in Bern", "Zurich museum day"]
    # another user imports the same export into sessions of their own
    bob = memcli("import", str(archive), "--user", "bob")
    assert bob.code == 0 and bob.records()[0]["new"] == 9
    assert len(memcli("sessions", "--json").records()) == 4


def test_dry_run_prints_what_would_be_stored_and_writes_nothing(isolated: Path) -> None:
    run = memcli("import", str(EXPORTS / "finetune.jsonl"), "--dry-run")
    assert run.code == 0, run.stderr
    (summary,) = run.records()
    assert summary["dry_run"] and summary["new"] == 10 and len(summary["new_sessions"]) == 3
    assert summary["skipped_parts"] == 1
    assert "Dry run: would store 10 messages in 3 sessions (3 new)" in run.stderr
    assert "nothing was written" in run.stderr
    assert not list(isolated.rglob("*.db"))  # no database made
    memcli("import", str(EXPORTS / "finetune.jsonl"))
    dry = memcli("import", str(EXPORTS / "finetune.jsonl"), "--dry-run").records()[0]
    assert dry["new"] == 0 and dry["already_stored"] == 10 and dry["new_sessions"] == []


def test_format_option_and_unknown_shapes(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps([{"id": 1, "question": "q", "answer": "a"}]))
    run = memcli("import", str(path))
    assert run.code == 2
    assert f"{path}: a JSON array of objects with keys id, question, answer" in run.stderr
    wrong = memcli("import", str(EXPORTS / "claude-conversations.json"), "--format", "chatgpt")
    assert wrong.code == 2 and "conversation 0 ('Bakery price list'): no mapping" in wrong.stderr
    assert memcli("import", str(path), "--format", "yaml").code == 2


def test_a_bad_conversation_exits_2_naming_it_and_stores_nothing(tmp_path: Path) -> None:
    items = json.loads((EXPORTS / "chatgpt-conversations.json").read_text())
    items[1]["current_node"] = "gone"
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(items))
    run = memcli("import", str(path), "--user", "alice")
    assert run.code == 2
    assert f"{path}: conversation 1 ('Zurich museum day'): node 'gone'" in run.stderr
    assert memcli("sessions", "--json").records() == []


def test_llm_logs_db_imported_by_path_and_from_stdin(tmp_path: Path) -> None:
    db = tmp_path / "logs.db"
    db.write_bytes((EXPORTS / "llm-0.27-logs.db").read_bytes())
    run = memcli("import", str(db))
    assert run.code == 0, run.stderr
    assert run.records()[0]["new"] == 9
    again = memcli("import", "-", input=db.read_bytes())
    assert "0 new, 9 already stored" in again.stderr
    json_again = memcli("import", str(EXPORTS / "llm-0.27-logs.json"))
    assert "0 new, 9 already stored" in json_again.stderr



# Each real-shaped export: the sessions' titles, each session's roles in order, a canary word
# in it that search must find, and the non-text parts left out.
STACKS = {
    "sharegpt.json": (
        [None, None],
        [
            ["user", "assistant", "user", "assistant"],
            ["system", "user", "assistant", "tool", "assistant"],
        ],
        "Pangolin-4412",
        0,
    ),
    "sharegpt.jsonl": (
        [None, None],
        [["system", "user", "assistant"], ["user", "assistant"]],
        "Okapi-9902",
        0,
    ),
    "openwebui-chats.json": (
        ["Hiking near Interlaken", "Fondue for four"],
        [["user", "assistant", "user", "assistant"], ["user", "assistant"]],
        "Axolotl-5150",
        1,
    ),
    "openwebui-chat.json": (
        ["Train to Zermatt"],
        [["system", "user", "assistant", "user"]],
        "Narwhal-3377",
        0,
    ),
    "sillytavern.jsonl": (
        ["Seraphina - 2024-06-01@12h00m00s"],
        [["assistant", "user", "assistant"]],
        "Marmot-6021",
        0,
    ),
    "lmstudio.conversation.json": (
        ["Sourdough hydration"],
        [["system", "user", "assistant", "user", "assistant"]],
        "Wombat-8080",
        1,
    ),
    "anthropic-messages.json": (
        [None],
        [["system", "user", "assistant", "tool", "assistant", "user"]],
        "Ibex-2468",  # in the system prompt
        1,
    ),
    "llm-0.36-fragments.db": (
        ["My sourdough starter is named Q…", "My sourdough starter is named Q…"],
        [["user", "assistant", "user", "assistant"], ["system", "user", "assistant"]],
        "Quokka-7731",  # only in the fragment
        0,
    ),
}


@pytest.mark.parametrize("name", list(STACKS))
def test_each_stack_export_imports_right_and_once(name: str) -> None:
    titles, roles, canary, dropped = STACKS[name]
    path = str(EXPORTS / name)
    run = memcli("import", path, "--user", "ana")
    assert run.code == 0, run.stderr
    (summary,) = run.records()
    assert summary["new"] == sum(map(len, roles))
    assert summary.get("dropped_parts", 0) == dropped or f"{dropped} non-text" in run.stderr
    sessions = memcli("sessions", "--json").records()
    assert sorted(s["title"] or "" for s in sessions) == sorted(t or "" for t in titles)
    found = []
    for s in sessions:
        (_, *messages) = memcli("export", s["session"]).records()
        found.append([m["role"] for m in messages])
        assert all(m["content"] or m.get("tool_calls") for m in messages)  # nothing empty
    assert sorted(found) == sorted(roles)
    hits = memcli("search", canary, "--mode", "lexical", "--user", "ana", "--json").records()
    assert hits and canary in hits[0]["text"]
    again = memcli("import", path, "--user", "ana")
    assert again.code == 0 and again.records()[0]["new"] == 0
    assert len(memcli("sessions", "--json").records()) == len(titles)


def test_llm_json_after_its_db_with_fragments_stores_nothing_twice(tmp_path: Path) -> None:
    first = memcli("import", str(EXPORTS / "llm-0.36-fragments.db"))
    assert first.code == 0 and first.records()[0]["new"] == 7
    again = memcli("import", str(EXPORTS / "llm-0.36-fragments.json"))
    assert again.code == 0, again.stderr
    assert again.records()[0]["new"] == 0


def test_an_unknown_shape_names_the_formats_memcli_reads(tmp_path: Path) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps([{"question": "q", "answer": "a"}]))
    run = memcli("import", str(path))
    assert run.code == 2
    for word in ("ShareGPT", "Open WebUI", "SillyTavern", "LM Studio", "Anthropic"):
        assert word in run.stderr


def test_a_chatgpt_conversation_without_current_node_is_read_as_chatgpt(tmp_path: Path) -> None:
    (conversation, _) = json.loads((EXPORTS / "chatgpt-conversations.json").read_text())
    del conversation["current_node"]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(conversation))
    run = memcli("import", str(path))
    assert run.code == 0, run.stderr
    (session,) = memcli("sessions", "--json").records()
    assert session["title"] == "Sourdough in Bern"


def test_sessions_json_shows_the_kept_record_keys_as_metadata() -> None:
    run = memcli("import", str(EXPORTS / "finetune.jsonl"))
    assert run.code == 0, run.stderr
    sessions = memcli("sessions", "--json").records()
    assert any("tools" in (s["metadata"] or {}) for s in sessions)


def test_importing_an_export_with_session_keeps_its_title_and_source_id() -> None:
    assert memcli("import", str(EXPORTS / "openwebui-chat.json")).code == 0
    (first,) = memcli("sessions", "--json").records()
    exported = memcli("export", first["session"])
    run = memcli("import", "-", "--session", "copy", input=exported.stdout)
    assert run.code == 0, run.stderr
    copy = next(s for s in memcli("sessions", "--json").records() if s["session"] == "copy")
    assert copy["title"] == "Train to Zermatt" and copy["source_id"] == first["source_id"]


def test_an_imported_session_is_not_updated_before_it_was_created() -> None:
    assert memcli("import", str(EXPORTS / "sillytavern.jsonl")).code == 0
    (session,) = memcli("sessions", "--json").records()
    assert session["updated_at"] >= session["created_at"]


def grown_chatgpt(path: Path, replies: int) -> Path:
    """The ChatGPT export, its first conversation grown by `replies` user/assistant nodes."""
    data = json.loads((EXPORTS / "chatgpt-conversations.json").read_text())
    first = data[0]
    for i in range(replies):
        for role, node in (("user", f"gu{i}"), ("assistant", f"ga{i}")):
            parent = first["current_node"]
            first["mapping"][parent]["children"] = [node]
            first["mapping"][node] = {
                "id": node,
                "parent": parent,
                "children": [],
                "message": {
                    "id": node,
                    "author": {"role": role},
                    "create_time": 1717330000.0 + i,
                    "content": {"content_type": "text", "parts": [f"{role} says {i}"]},
                },
            }
            first["current_node"] = node
    path.write_text(json.dumps(data))
    return path


def messages_of(session: str) -> list[dict]:
    records = memcli("inspect", session, "--all", "--json").records()
    return [r for r in records if r["type"] == "message"]


@pytest.mark.parametrize("session", [None, "s"])
def test_a_deleted_message_stays_deleted_when_the_export_is_imported_again(
    session: str | None,
) -> None:
    export = EXPORTS / "chatgpt-conversations.json"
    target = ["--session", session] if session else []
    first = memcli("import", str(export), *target)
    assert first.code == 0, first.stderr
    name = session or next(s for s in first.records()[0]["sessions"] if s.startswith("sourdough"))
    stored = messages_of(name)
    gone = stored[2]
    run = memcli("rm", name, "--message", str(gone["id"]), "--yes")
    assert run.code == 0, run.stderr
    for _ in range(3):  # (was 6 -> 11 -> 16 -> 21 messages)
        run = memcli("import", str(export), *target)
        assert run.code == 0, run.stderr
        assert run.records()[0]["new"] == 0, run.stderr
    after = messages_of(name)
    assert len(after) == len(stored) - 1
    assert gone["content"] not in [m["content"] for m in after]


@pytest.mark.parametrize("session", [None, "s"])
def test_a_grown_export_stores_only_its_new_messages(tmp_path: Path, session: str | None) -> None:
    target = ["--session", session] if session else []
    run = memcli("import", str(EXPORTS / "chatgpt-conversations.json"), *target)
    assert run.code == 0 and run.records()[0]["new"] == 9, run.stderr
    run = memcli("import", str(grown_chatgpt(tmp_path / "grown.json", 2)), *target)
    assert run.code == 0, run.stderr
    assert (run.records()[0]["new"], run.records()[0]["already_stored"]) == (4, 9)
    sessions = memcli("sessions", "--json").records()
    assert sum(s["active_messages"] + s["archived_messages"] for s in sessions) == 13


@pytest.mark.parametrize("again", [[], ["--again"]])
def test_a_deleted_message_stays_deleted_in_the_users_other_sessions(again: list[str]) -> None:
    """Deleted from the session an export went into, a message does not come back when the
    export is imported into another session of the same user (a new one, or one holding other
    messages); another user's import, and `--again`, are not held back by it."""
    export = EXPORTS / "chatgpt-conversations.json"
    first = memcli("import", str(export), "--session", "a", "--user", "ana")
    assert first.code == 0, first.stderr
    stored = messages_of("a")
    gone = stored[2]
    run = memcli("rm", "a", "--message", str(gone["id"]), "--yes")
    assert run.code == 0, run.stderr
    memcli("import", "-", "--session", "c", "--user", "ana", input='{"role":"user","content":"hi"}\n')
    for target in ("b", "c"):
        run = memcli("import", str(export), "--session", target, "--user", "ana", *again)
        assert run.code == 0, run.stderr
        contents = [m["content"] for m in messages_of(target)]
        assert (gone["content"] in contents) == bool(again), contents
        assert len([c for c in contents if c != "hi"]) == len(stored) - (0 if again else 1)
    run = memcli("import", str(export), "--session", "d", "--user", "bo")
    assert run.code == 0, run.stderr
    assert gone["content"] in [m["content"] for m in messages_of("d")]


_PEAK = """import resource, subprocess, sys
run = subprocess.run([sys.executable, "-m", "memcli", *sys.argv[1:]], capture_output=True)
sys.stderr.write(run.stderr.decode())
print(run.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


@pytest.mark.parametrize(("name", "table"), [("llm-0.27", "responses"), ("llm-0.36", "parts")])
def test_a_logs_db_with_a_generated_column_is_refused_before_it_is_read(
    tmp_path: Path, name: str, table: str
) -> None:
    """A generated column makes its values as they are read: 100 MB each from a small file
    (gigabytes for a few rows). The database is refused naming the table and the column,
    before any row is read, in bounded memory (the import's peak RSS measured)."""
    import sqlite3
    import subprocess
    import sys

    db = tmp_path / "logs.db"
    db.write_bytes((EXPORTS / f"{name}-logs.db").read_bytes())
    conn = sqlite3.connect(db)
    conn.execute(
        f"ALTER TABLE {table} ADD COLUMN big TEXT"
        " GENERATED ALWAYS AS (printf('%.*c', 100000000, 'x')) VIRTUAL"
    )
    conn.commit()
    conn.close()
    assert db.stat().st_size < 400_000
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, "import", str(db), "--user", "alice"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    code, peak_kib = proc.stdout.split()
    assert code == "2", proc.stderr
    assert f"{db}: table {table} has a generated column 'big'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert int(peak_kib) < 600 * 1024  # a guard: 27 MB measured (2 GB before the fix)
    assert memcli("sessions", "--json").records() == []

