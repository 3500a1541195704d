"""The CLI on a PostgreSQL database: named by --db, MEMCLI_DB or `db` in the config file; what
only a SQLite file has (backups) says what to use instead; a password is never shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("no_blocks")


def _chat(tmp_path: Path) -> str:
    path = tmp_path / "t.jsonl"
    lines = []
    for i in range(10):
        lines += [
            {"role": "user", "content": f"question {i} about cats", "session": "demo"},
            {"role": "assistant", "content": f"answer {i} about dogs", "session": "demo"},
        ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_db_flag_takes_a_url(pg_url: str, tmp_path: Path) -> None:
    run = memcli("--db", pg_url, "import", _chat(tmp_path), "--token-limit", "40")
    assert run.code == 0, run.stderr
    sessions = memcli("--db", pg_url, "sessions", "--json").records()
    assert [(s["session"], s["active_messages"] + s["archived_messages"]) for s in sessions] == [
        ("demo", 20)
    ]
    assert memcli("sessions", "--json").records() == []  # the home's SQLite file: nothing there
    run = memcli("--db", pg_url, "check")
    assert run.code == 0 and "no problems found" in run.stderr


def test_config_file_db_takes_a_url(pg_url: str, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'db = "{pg_url}"\nblocks = []\n')
    assert memcli("--config", str(config), "import", _chat(tmp_path)).code == 0
    records = memcli("--config", str(config), "inspect", "demo", "--json").records()
    assert records[-1]["active_messages"] == 20


def test_backup_on_postgresql_writes_a_sqlite_file(pg_url: str, tmp_path: Path) -> None:
    assert memcli("--db", pg_url, "import", _chat(tmp_path), "--no-blocks").code == 0
    run = memcli("--db", pg_url, "backup", str(tmp_path / "b.db"))
    assert run.code == 0, run.stderr
    assert memcli("--db", str(tmp_path / "b.db"), "check").code == 0
    sessions = memcli("--db", str(tmp_path / "b.db"), "sessions", "--json").records()
    assert [r["session"] for r in sessions] == ["demo"]


def test_passwords_are_not_shown(tmp_path: Path) -> None:
    url = f"postgresql://ana:s3cret@/memcli?host={tmp_path}"
    run = memcli("--db", url, "sessions")
    assert run.code == 1 and "cannot connect" in run.stderr
    assert "s3cret" not in run.stderr and "ana:***@" in run.stderr
    info = memcli("--db", url, "info", "--json").records()
    assert info[0]["db"] == f"postgresql://ana:***@/memcli?host={tmp_path}"
    assert "s3cret" not in json.dumps(info)


def test_a_malformed_url_is_a_usage_error() -> None:
    run = memcli("--db", "postgresql://ana@host:port/memcli", "sessions")
    assert run.code == 2 and "malformed" in run.stderr
