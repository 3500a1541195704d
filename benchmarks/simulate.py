"""How fast `memcli simulate flush FILE --json` is, against tiktoken alone counting the same texts.

Run: PYTHONPATH=. python benchmarks/simulate.py [MESSAGES ...]     (default: 25000 50000 100000)

The transcript is a chat of real LoCoMo turns (both conversations, words shuffled, so no two
messages are the same), one message a line or one turn a `{"messages": [...]}` line, about 30
tokens a message. Then, at the largest size, a transcript of new words: the same turns with two
words in three replaced by ids never seen before (hashes, user ids, random strings), where
counting word by word gains nothing (`TiktokenTokenizer` then counts texts whole). For each it
prints:
- the floor: tiktoken alone counting every message in this process, with the encoding loaded and
  the texts in memory, `[len(enc.encode_ordinary(t)) for t in texts]`. The exact count can take no
  less: every message goes through tiktoken once. (`encode_ordinary_batch` is printed beside it:
  it runs a thread pool over the texts, and on short texts its per-text overhead makes it slower,
  so it is not the floor.)
- the whole command as a user runs it, a process of its own: Python start-up, imports, loading the
  encoding, reading the JSON Lines, counting, the replay (limit 4000, flush size 400, a put a call)
  and the JSON Lines written to /dev/null;
- the command's time over the floor's (the target: at most 1.5).
Each is the best of several runs, in wall time and in CPU time (user + system: on a busy machine
the CPU time is the steadier figure). Then, for the largest size, where the command's time goes,
stage by stage in this process; and the engine: `Memory.put_messages` of the chat, a call a turn
(no blocks, an in-memory store), with `TiktokenTokenizer` and with tiktoken counting each text
whole (what every count cost before the word cache).
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOCOMO = next(
    p / "shared" / "data" / "locomo"
    for p in Path(__file__).resolve().parents
    if (p / "shared" / "data" / "locomo").is_dir()
)
RUNS = 5


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


def write_transcript(path: Path, messages: int, seed: int = 7, new_words: bool = False) -> None:
    """A user message and one to three replies a turn, each a LoCoMo turn with its words shuffled;
    half the turns one `{"messages": [...]}` line (one put call), the others a message a line.
    With new_words, two words in three are ids never seen before."""
    turns = locomo_turns()
    rng = random.Random(seed)
    with path.open("w") as out:
        written = 0
        while written < messages:
            turn = []
            for role in ["user"] + ["assistant"] * rng.randint(1, 3):
                if written == messages:
                    break
                words = list(rng.choice(turns))
                rng.shuffle(words)
                if new_words:
                    words = [w if rng.random() < 1 / 3 else new_word(rng) for w in words]
                turn.append({"role": role, "content": " ".join(words)})
                written += 1
            if rng.random() < 0.5:
                out.write(json.dumps({"messages": turn}) + "\n")
            else:
                out.writelines(json.dumps(m) + "\n" for m in turn)


def new_word(rng: random.Random) -> str:
    """An id: a hash, a user id, or a random string."""
    kind = rng.random()
    if kind < 0.4:
        return f"{rng.getrandbits(48):012x}"
    if kind < 0.7:
        return f"user_{rng.randrange(10**7)}"
    return "".join(
        rng.choices("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", k=10)
    )


def best(fn, runs: int = RUNS) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The best wall time and the best CPU time of `runs` calls of fn in this process."""
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def command(path: Path, runs: int = RUNS) -> tuple[float, float]:
    """The best wall and CPU time of the whole command."""
    argv = [sys.executable, "-m", "memcli", "simulate", "flush", str(path), "--json"]
    return processes(argv + ["--token-limit", "4000", "--flush-size", "400"], runs)


def processes(argv: list[str], runs: int) -> tuple[float, float]:
    """The best wall and CPU time (user + system) of `runs` processes running argv."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(walls), min(cpus)


def line(label: str, wall: float, cpu: float) -> None:
    print(f"  {label:<44} {wall:6.3f} s wall {cpu:6.3f} s CPU")


def main() -> None:
    from memcli.tokens import load_encoding
    from memcli.transcripts import parse_columns, read_source

    sizes = [int(a) for a in sys.argv[1:]] or [25_000, 50_000, 100_000]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; best of {RUNS}")
    start, start_cpu = time.perf_counter(), time.process_time()
    encoding = load_encoding("cl100k_base")
    encoding.encode_ordinary("warm up")
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    print(f"loading cl100k_base: {wall:.3f} s wall {cpu:.3f} s CPU (the command pays it too)")
    load = (wall, cpu)
    with tempfile.TemporaryDirectory() as folder:
        runs = [(n, False) for n in sizes] + [(max(sizes), True)]
        for n, new_words in runs:
            path = Path(folder) / f"{'ids' if new_words else 'chat'}{n}.jsonl"
            write_transcript(path, n, new_words=new_words)
            texts = parse_columns(*read_source(path)).contents  # as simulate reads it
            tokens = sum(len(t) for t in encoding.encode_ordinary_batch(texts))
            kind = "new words (2 in 3 ids)" if new_words else "chat"
            size = path.stat().st_size / 1e6
            print(f"\n{kind}, {n:,} messages, {tokens:,} tokens, {size:.1f} MB")
            floor = best(lambda t=texts: [len(encoding.encode_ordinary(x)) for x in t])
            line("floor: encode_ordinary, text by text", *floor)
            if not new_words:
                line(
                    "  (encode_ordinary_batch)",
                    *best(lambda t=texts: encoding.encode_ordinary_batch(t)),
                )
            tokenizer = best(lambda t=texts: count_all(_tokenizer(), t))
            line("TiktokenTokenizer().count, text by text", *tokenizer)
            whole = command(path)
            line("memcli simulate flush FILE --json", *whole)
            ratio = f"{whole[0] / floor[0]:6.2f} wall {whole[1] / floor[1]:6.2f} CPU"
            print(f"  {'command / floor (target <= 1.5)':<44} {ratio}")
            with_load = (floor[0] + load[0], floor[1] + load[1])
            ratio = f"{whole[0] / with_load[0]:6.2f} wall {whole[1] / with_load[1]:6.2f} CPU"
            print(f"  {'command / (floor + loading the encoding)':<44} {ratio}")
            if not new_words:
                chat = path
        stages(chat)
        engine(chat, encoding)


def stages(path: Path) -> None:
    """Where the command's time goes, in this process (start-up and imports not included)."""
    from memcli.flush import Budget
    from memcli.simulate import Replay, events_json, run

    print(f"\nstages in this process, {path.name}:")
    replay = Replay.from_source(path, "call", _tokenizer())[0]
    line(
        "read the JSON Lines and count the tokens",
        *best(lambda: Replay.from_source(path, "call", _tokenizer()), 3),
    )
    sim = run(replay, Budget(4000, 0.7, 400))
    line(
        f"replay ({sim.summary.puts:,} puts, {sim.summary.flushes:,} flushes)",
        *best(lambda: run(replay, Budget(4000, 0.7, 400)), 3),
    )
    line("write the JSON Lines (to a string)", *best(lambda: events_json(sim.events, 0), 3))
    n = len(replay.tokens)
    agent = Replay(["user"] + ["assistant"] * (n - 1), replay.tokens, [1] * n)
    label = "replay, one user message then only replies"
    line(label, *best(lambda: run(agent, Budget(4000, 0.7, 400)), 3))
    argv = [sys.executable, "-c", "import memcli.cli.app, memcli.simulate"]
    line("Python start-up and the imports (a process)", *processes(argv, 3))


def count_all(tokenizer, texts: list[str]) -> list[int]:  # type: ignore[no-untyped-def]
    """Each text's tokens, by one tokenizer (its word cache starting empty)."""
    return [tokenizer.count(text) for text in texts]


def engine(path: Path, encoding) -> None:  # type: ignore[no-untyped-def]
    """Memory.put_messages of the transcript, a call a line, with the word cache and without."""
    from memcli import Memory
    from memcli.formats import read

    calls = [record.messages for record in read(path).records]  # as import reads it
    n = sum(len(c) for c in calls)

    class Whole:
        """tiktoken counting each text whole, as every count did before the word cache."""

        def count(self, text: str) -> int:
            return len(encoding.encode(text, allowed_special="all"))

    print(f"\nengine: Memory.put_messages of {path.name}, {len(calls):,} calls, no blocks:")
    for label, make in [("TiktokenTokenizer (word cache)", _tokenizer), ("tiktoken, whole", Whole)]:

        def put(make=make) -> None:  # type: ignore[no-untyped-def]
            memory = Memory.from_defaults(token_limit=4000, token_flush_size=400, tokenizer=make())
            for call in calls:
                memory.put_messages(call)

        wall, cpu = best(put, 2)
        print(f"  {label:<44} {wall:6.3f} s wall {cpu:6.3f} s CPU  {n / wall:9,.0f} messages/s")


def _tokenizer():  # type: ignore[no-untyped-def]
    from memcli.tokens import TiktokenTokenizer

    return TiktokenTokenizer()


if __name__ == "__main__":
    main()
