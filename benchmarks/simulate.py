"""How fast `memcli simulate flush` replays a long transcript: 100,000 messages, three put modes.

Run: PYTHONPATH=. python benchmarks/simulate.py [MESSAGES]
Two transcripts of real LoCoMo turns (words shuffled): "chat", one turn per message (about 26
tokens a message), and "long", where a reply joins one to three turns (about 52). For each: the
seconds for reading the transcript, counting tokens (tiktoken cl100k_base, in bulk) and the replay
itself, and the end-to-end CLI time (the whole `memcli simulate flush ... --json` process, output
to /dev/null), best and median of three.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memcli.flush import Budget
from memcli.simulate import Replay, run
from memcli.tokens import TiktokenTokenizer
from memcli.transcripts import call_sizes, read_columns

LOCOMO = next(
    p / "shared" / "data" / "locomo" / "26.json"
    for p in Path(__file__).resolve().parents
    if (p / "shared" / "data" / "locomo").is_dir()
)


def write_transcript(path: Path, messages: int, seed: int = 7, most_turns: int = 3) -> None:
    """Turns of a user message and one to three replies, as JSON Lines (a message or a turn a line).

    Each message is a real LoCoMo turn (conversation 26) with its words shuffled, so lengths and
    vocabulary are those of a real chat but no two messages are the same; a reply joins one to
    three turns, as assistants write longer than users.
    """
    conversation = json.loads(LOCOMO.read_text())
    turns = [
        t["text"].split()
        for key, value in conversation.items()
        if key.startswith("session_") and isinstance(value, list)
        for t in value
    ]
    rng = random.Random(seed)

    def text(pieces: int) -> str:
        words = [w for _ in range(pieces) for w in rng.choice(turns)]
        rng.shuffle(words)
        return " ".join(words)

    with path.open("w") as out:
        written = 0
        while written < messages:
            turn = []
            for role in ["user"] + ["assistant"] * rng.randint(1, 3):
                if written == messages:
                    break
                turn.append(
                    {
                        "role": role,
                        "content": text(1 if role == "user" else rng.randint(1, most_turns)),
                    }
                )
                written += 1
            if rng.random() < 0.5:  # half the turns as one {"messages": [...]} line (one put call)
                out.write(json.dumps({"messages": turn}) + "\n")
            else:
                out.writelines(json.dumps(m) + "\n" for m in turn)


def timed(label: str, fn):  # type: ignore[no-untyped-def]
    """Run fn; print its wall time and this process's CPU time (threads included)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{label:<46} {wall:7.3f} s wall {cpu:7.3f} s CPU")
    return result


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as folder:
        for name, most_turns in (("chat", 1), ("long", 3)):
            path = Path(folder) / f"{name}.jsonl"
            write_transcript(path, n, most_turns=most_turns)
            print(f"\n{name}: {n:,} messages ({path.stat().st_size / 1e6:.1f} MB)")
            library(path, n)
            command(path)


def library(path: Path, n: int) -> None:
    tokenizer = TiktokenTokenizer()
    tokenizer.count("warm up")  # loading the encoding is not the simulation
    wall, cpu = time.perf_counter(), time.process_time()
    columns = timed("read the transcript", lambda: read_columns(path))
    replay = timed(
        "count tokens (tiktoken cl100k_base)",
        lambda: Replay.from_columns(columns, "message", tokenizer),
    )
    print(f"    {sum(replay.tokens):,} tokens, {sum(replay.tokens) / n:.1f} a message")
    budget = Budget(4000, 0.7, 400)
    for put in ("message", "call", "batch"):
        mode = Replay(replay.roles, replay.tokens, call_sizes(columns.sizes, put))
        sim = timed(f"replay --put {put} (limit 4000, flush 400)", lambda m=mode: run(m, budget))
        print(f"    {sim.summary.puts:,} puts, {sim.summary.flushes:,} flushes")
    agent = Replay(["user"] + ["tool"] * (n - 1), replay.tokens, [1] * n)
    sim = timed("replay, one user message then only tool output", lambda: run(agent, budget))
    print(f"    {sim.summary.flushes:,} flushes, {sim.summary.over_threshold_puts:,} puts over")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{'library total (read, count, 4 replays)':<46} {wall:7.3f} s wall {cpu:7.3f} s CPU")


def command(path: Path) -> None:
    """The whole CLI process, as a user runs it: start-up, read, count, replay, write JSON Lines."""
    argv = [sys.executable, "-m", "memcli", "simulate", "flush", str(path), "--put", "message"]
    argv += ["--token-limit", "4000", "--flush-size", "400", "--json"]
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    print(
        f"{'CLI end to end, --json to /dev/null':<46} {min(times):7.3f} s best,"
        f" {statistics.median(times):.3f} s median of 3"
    )


if __name__ == "__main__":
    main()
