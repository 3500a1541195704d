"""How fast `memcli simulate flush` replays a long transcript: 100,000 messages, three put modes.

Run: PYTHONPATH=. python benchmarks/simulate.py [MESSAGES]
Prints the seconds for reading the transcript, counting tokens (tiktoken cl100k_base, in bulk) and
the replay itself, and the end-to-end CLI time with `--json` to /dev/null.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memcli.flush import Budget
from memcli.simulate import Replay, run
from memcli.tokens import TiktokenTokenizer
from memcli.transcripts import plan_calls, read_transcript

LOCOMO = next(
    p / "shared" / "data" / "locomo" / "26.json"
    for p in Path(__file__).resolve().parents
    if (p / "shared" / "data" / "locomo").is_dir()
)


def write_transcript(path: Path, messages: int, seed: int = 7) -> None:
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
                    {"role": role, "content": text(1 if role == "user" else rng.randint(1, 3))}
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
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "long.jsonl"
        write_transcript(path, n)
        print(f"{n:,} messages ({path.stat().st_size / 1e6:.1f} MB)")
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        tokenizer = TiktokenTokenizer()
        tokenizer.count("warm up")  # loading the encoding is not the simulation
        wall, cpu = time.perf_counter(), time.process_time()
        records = timed("read the transcript", lambda: read_transcript(path))
        calls = plan_calls(records, "message")
        replay = timed(
            "count tokens (tiktoken cl100k_base)", lambda: Replay.from_calls(calls, tokenizer)
        )
        print(f"    {sum(replay.tokens):,} tokens")
        budget = Budget(4000, 0.7, 400)
        for put in ("message", "call", "batch"):
            sizes = [len(c) for c in plan_calls(records, put)]
            mode = Replay(replay.roles, replay.tokens, sizes)
            sim = timed(
                f"replay --put {put} (limit 4000, flush 400)", lambda m=mode: run(m, budget)
            )
            print(f"    {sim.summary.puts:,} puts, {sim.summary.flushes:,} flushes")
        agent = Replay(["user"] + ["tool"] * (n - 1), replay.tokens, [1] * n)
        sim = timed("replay, one user message then only tool output", lambda: run(agent, budget))
        print(f"    {sim.summary.flushes:,} flushes, {sim.summary.over_threshold_puts:,} puts over")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{'library total (read, count, 4 replays)':<46} {wall:7.3f} s wall {cpu:7.3f} s CPU")
        command = [sys.executable, "-m", "memcli", "simulate", "flush", str(path), "--put"]
        command += ["message", "--token-limit", "4000", "--flush-size", "400", "--json"]
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        print(
            f"{'CLI end to end, --json to /dev/null':<46} {time.perf_counter() - start:7.3f} s wall"
        )


if __name__ == "__main__":
    main()
