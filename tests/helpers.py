"""Helpers for CLI tests: run memcli in-process or as a subprocess, parse JSON Lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def records(self) -> list[dict[str, Any]]:
        """Every stdout line parsed as JSON (a test fails if one is not)."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


def memcli(
    *args: str,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> Run:
    """Run `python -m memcli ARGS` in a subprocess, as a shell would."""
    full_env = {**os.environ, **(env or {})}
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(
        [sys.executable, "-m", "memcli", *args],
        input=data,
        capture_output=True,
        env=full_env,
        timeout=timeout,
    )
    return Run(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@pytest.fixture
def no_blocks(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config file without long-term blocks (`blocks = []`) for every command the test runs:
    for CLI tests that do not test the blocks, so that no command loads an embedding model.
    Use it with `pytestmark = pytest.mark.usefixtures("no_blocks")`; `--config` still wins."""
    path = isolated.parent / "no-blocks.toml"
    path.write_text("blocks = []\n")
    monkeypatch.setenv("MEMCLI_CONFIG", str(path))
    return path
