"""How fast `memcli simulate flush` replays a long transcript: 100,000 messages, three put modes.

Run: PYTHONPATH=. python benchmarks/simulate.py [MESSAGES]
Prints the seconds for reading the transcript, counting tokens (tiktoken cl100k_base, in bulk) and
the replay itself, and the end-to-end CLI time with `--json` to /dev/null.
"""

from __future__ import annotations

import json
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
    """Turns of a user message and one to three replies, as JSON Lines.

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
            for role in ["user"] + ["assistant"] * rng.randint(1, 3):
                if written == messages:
                    break
                content = text(1 if role == "user" else rng.randint(1, 3))
                out.write(json.dumps({"role": role, "content": content}) + "\n")
                written += 1


def timed(label: str, fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    print(f"{label:<44} {time.perf_counter() - start:7.3f} s")
    return result


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "long.jsonl"
        write_transcript(path, n)
        print(f"{n:,} messages ({path.stat().st_size / 1e6:.1f} MB)")
        tokenizer = TiktokenTokenizer()
        tokenizer.count("warm up")  # loading the encoding is not the simulation
        total_start = time.perf_counter()
        records = timed("read the transcript", lambda: read_transcript(path))
        calls = plan_calls(records, "message")
        replay = timed("count tokens", lambda: Replay.from_calls(calls, tokenizer))
        budget = Budget(4000, 0.7, 400)
        for put in ("message", "call", "batch"):
            mode = (
                replay
                if put == "message"
                else Replay(replay.roles, replay.tokens, [len(c) for c in plan_calls(records, put)])
            )
            sim = timed(
                f"replay, --put {put} (limit 4000, flush 400)", lambda m=mode: run(m, budget)
            )
            print(
                f"    {sim.summary.flushes:,} flushes, {sim.summary.archived_messages:,} archived"
            )
        print(
            f"{'library total (read + count + 3 replays)':<44} {time.perf_counter() - total_start:7.3f} s"
        )
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "memcli",
                "simulate",
                "flush",
                str(path),
                "--put",
                "message",
                "--token-limit",
                "4000",
                "--flush-size",
                "400",
                "--json",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        print(f"{'CLI end to end: simulate flush --json':<44} {time.perf_counter() - start:7.3f} s")


if __name__ == "__main__":
    main()
