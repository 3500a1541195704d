"""How fast `memcli simulate flush` replays a long transcript: 100,000 messages, three put modes.

Run: PYTHONPATH=. python benchmarks/simulate.py [MESSAGES]
Three transcripts of real LoCoMo turns (both conversations, words shuffled, so no two messages are
the same): "chat", one turn a message (about 30 tokens); "long", where a reply is one to three
turns as paragraphs (about 50); and "varied", "long" with one word in eight replaced by something
rarely seen twice (a number, an id, a made-up word, a path, a date), so the vocabulary runs into
the hundreds of thousands. For each: reading the JSON Lines, loading tiktoken, counting the tokens
(word by word, and tiktoken alone for comparison), reading and counting in two processes as the
command does, the replays, and the whole `memcli simulate flush ... --json` process (output to
/dev/null) with a put a call (the default) and a put a message, best and median of five.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memcli.counting import read_counted
from memcli.flush import Budget
from memcli.simulate import Replay, run
from memcli.tokens import TiktokenTokenizer
from memcli.transcripts import call_sizes, read_columns

LOCOMO = next(
    p / "shared" / "data" / "locomo"
    for p in Path(__file__).resolve().parents
    if (p / "shared" / "data" / "locomo").is_dir()
)


def locomo_turns() -> list[list[str]]:
    """The words of every turn of the LoCoMo conversations here."""
    turns = []
    for path in sorted(LOCOMO.glob("*.json")):
        conversation = json.loads(path.read_text())
        turns += [
            t["text"].split()
            for key, value in conversation.items()
            if key.startswith("session_") and isinstance(value, list)
            for t in value
        ]
    return turns


def rare_word(rng: random.Random) -> str:
    """A word a transcript rarely holds twice: a number, an id, a made-up word, a path, a date."""
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randrange(10**7))
    if kind == 1:
        return f"{rng.getrandbits(32):08x}"
    if kind == 2:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 10)))
    if kind == 3:
        return f"/home/{rng.choice(string.ascii_lowercase)}{rng.randrange(999)}/notes.md"
    return f"2023-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def write_transcript(
    path: Path, messages: int, seed: int = 7, most_turns: int = 3, rare: float = 0.0
) -> None:
    """Turns of a user message and one to three replies, as JSON Lines (a message or a turn a line).

    Each message is a real LoCoMo turn with its words shuffled, so lengths and vocabulary are those
    of a real chat but no two messages are the same; a reply joins one to `most_turns` turns as
    paragraphs, as assistants write longer than users; `rare` of the words are `rare_word`s.
    """
    turns = locomo_turns()
    rng = random.Random(seed)

    def text(pieces: int) -> str:
        paragraphs = []
        for _ in range(pieces):
            words = list(rng.choice(turns))
            rng.shuffle(words)
            if rare:
                words = [rare_word(rng) if rng.random() < rare else w for w in words]
            paragraphs.append(" ".join(words))
        return "\n\n".join(paragraphs)

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
        for name, most_turns, rare in (("chat", 1, 0.0), ("long", 3, 0.0), ("varied", 3, 0.125)):
            path = Path(folder) / f"{name}.jsonl"
            write_transcript(path, n, most_turns=most_turns, rare=rare)
            print(f"\n{name}: {n:,} messages ({path.stat().st_size / 1e6:.1f} MB)")
            library(path, n)
            command(path)


def library(path: Path, n: int) -> None:
    tokenizer = TiktokenTokenizer()
    columns = timed("read the transcript (one process)", lambda: read_columns(path))
    timed("load tiktoken cl100k_base", lambda: tokenizer.count("warm up"))
    distinct = list(dict.fromkeys(columns.contents))
    words = sum(len(t.split()) for t in distinct)
    counts = timed(
        "count tokens word by word (one process)", lambda: tokenizer.count_many(distinct)
    )
    print(f"    {sum(counts):,} tokens, {sum(counts) / n:.1f} a message, {words:,} words")
    joined = timed("    the same with tiktoken alone", lambda: tokenizer.count_joined(distinct))
    assert joined == counts
    data = path.read_bytes()
    for parallel in (False, True):
        label = "read and count, " + ("two processes" if parallel else "one process")
        counted = timed(
            label, lambda p=parallel: read_counted(data, path.name, tokenizer, parallel=p)
        )
    replay = Replay(counted.roles, counted.tokens, call_sizes(counted.sizes, "message"))
    budget = Budget(4000, 0.7, 400)
    for put in ("message", "call", "batch"):
        mode = Replay(replay.roles, replay.tokens, call_sizes(columns.sizes, put))
        sim = timed(f"replay --put {put} (limit 4000, flush 400)", lambda m=mode: run(m, budget))
        print(f"    {sim.summary.puts:,} puts, {sim.summary.flushes:,} flushes")
    agent = Replay(["user"] + ["tool"] * (n - 1), replay.tokens, [1] * n)
    sim = timed("replay, one user message then only tool output", lambda: run(agent, budget))
    print(f"    {sim.summary.flushes:,} flushes, {sim.summary.over_threshold_puts:,} puts over")


def command(path: Path, runs: int = 5) -> None:
    """The whole CLI process, as a user runs it: start-up, read, count, replay, write JSON Lines;
    with the default put mode (a call per line) and with a put per message (the most puts)."""
    for put in ("call", "message"):
        argv = [sys.executable, "-m", "memcli", "simulate", "flush", str(path), "--put", put]
        argv += ["--token-limit", "4000", "--flush-size", "400", "--json"]
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
        print(
            f"{f'CLI end to end, --put {put} --json >/dev/null':<46} {min(times):7.3f} s best,"
            f" {statistics.median(times):.3f} s median of {runs}"
        )


if __name__ == "__main__":
    main()
