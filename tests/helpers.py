"""Helpers for CLI tests: run memcli in-process or as a subprocess, parse JSON Lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any


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
