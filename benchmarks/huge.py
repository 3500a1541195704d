"""Huge messages: time and peak memory of `memcli import` of one huge message, then of
`memcli search` (hybrid: the first search embeds it; then lexical), each a fresh CLI process as a
user runs it, with the default configuration (the vector block on).

    PYTHONPATH=. python benchmarks/huge.py                       # 10 MB of lorem ipsum
    PYTHONPATH=. python benchmarks/huge.py --mb 50 --single-word # one 50 MB word

The home is a temporary folder; `--models` points its `models` folder at an existing ONNX export
(default: $MEMCLI_HOME/models or ~/.local/share/memcli/models when there is one), so that the
one-time export of the model is not timed. Reported per command: wall seconds, peak RSS (MB),
exit status, and the length of the hit's text.
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

LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt"
    " ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation.\n"
)


def run(command: list[str], env: dict[str, str]) -> dict[str, object]:
    """Run a command; its wall time, peak RSS (its own, from wait4) and output."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return {
            "seconds": round(seconds, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024),
            "exit": process.returncode,
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace")[-500:],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="size of the message")
    parser.add_argument("--single-word", action="store_true", help="one word, no white space")
    parser.add_argument("--models", type=Path, default=None, help="an existing ONNX export")
    args = parser.parse_args()
    size = int(args.mb * 1_000_000)
    text = "a" * size if args.single_word else (LOREM * (size // len(LOREM) + 1))[:size]
    models = args.models
    if models is None:
        for candidate in (
            Path(os.environ.get("MEMCLI_HOME", "/nonexistent")) / "models",
            Path.home() / ".local/share/memcli/models",
        ):
            if candidate.is_dir():
                models = candidate
                break
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder) / "home"
        home.mkdir()
        if models is not None:
            (home / "models").symlink_to(models.resolve(), target_is_directory=True)
        source = Path(folder) / "huge.jsonl"
        source.write_text(json.dumps({"role": "user", "content": text}) + "\n")
        env = {**os.environ, "MEMCLI_HOME": str(home), "NO_COLOR": "1"}
        env.pop("MEMCLI_CONFIG", None)
        cli = [sys.executable, "-m", "memcli"]
        word = "aaaa" if args.single_word else "lorem"
        steps = [
            ("import", [*cli, "import", str(source), "--session", "huge"]),
            ("search hybrid", [*cli, "search", word, "-k", "1", "--json"]),
            ("search lexical", [*cli, "search", word, "-k", "1", "--mode", "lexical", "--json"]),
            ("search vector", [*cli, "search", word, "-k", "1", "--mode", "vector", "--json"]),
        ]
        what = f"one {args.mb:g} MB {'single-word' if args.single_word else 'lorem ipsum'} message"
        print(f"{what}; python {sys.version.split()[0]}; {os.cpu_count()} cores")
        for name, command in steps:
            result = run(command, env)
            hit = ""
            for line in str(result["stdout"]).splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("type") == "hit":
                    hit = f"; hit: {len(record['text'])} characters, {record['tokens']} tokens"
            print(
                f"{name:15} {result['seconds']:7.1f} s  peak RSS {result['peak_rss_mb']:5} MB"
                f"  exit {result['exit']}{hit}",
                flush=True,
            )
            if result["exit"] != 0:
                print(result["stderr"], file=sys.stderr)


if __name__ == "__main__":
    main()
