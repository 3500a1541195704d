"""The first search on a fresh home after `memcli setup` (the goal: under 2 s).

In a new temporary MEMCLI_HOME: `memcli setup` (exports the embedding model), `memcli import`
of a small conversation (`--no-blocks`: nothing embedded yet), then the first `memcli search`
in a new process (interpreter start, imports, loading the model, embedding the stored messages
and the query, building the index file) and a second one. Without setup, the first search would
export the model itself (about 15 s on a laptop).

    PYTHONPATH=. python benchmarks/first_search.py [--messages 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(env: dict[str, str], *args: str, stdin: str | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "memcli", *args],
        input=stdin,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        (Path(home) / "none.toml").write_text("")  # the defaults, whatever the user's config
        env = {
            **os.environ,
            "MEMCLI_HOME": home,
            "MEMCLI_CONFIG": str(Path(home) / "none.toml"),
            "PYTHONPATH": str(ROOT),
            "HF_HUB_OFFLINE": "1",
        }
        topics = ["tea", "the cello", "Porto", "night shifts", "a dog named Rex", "hiking"]
        lines = "".join(
            json.dumps(
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"Message {i}: we talked about {topics[i % len(topics)]} today.",
                }
            )
            + "\n"
            for i in range(args.messages)
        )
        setup = run(env, "setup")
        imported = run(env, "import", "-", "--session", "s", "--no-blocks", stdin=lines)
        first = run(env, "search", "what is the dog called")
        second = run(env, "search", "where does she work nights")
    print(f"setup (export the model)       {setup:6.2f} s")
    print(f"import {args.messages} messages           {imported:6.2f} s")
    print(f"first search after setup       {first:6.2f} s   (goal < 2 s)")
    print(f"second search                  {second:6.2f} s")


if __name__ == "__main__":
    main()
