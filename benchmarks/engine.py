"""Engine figures: start-up, bulk import, put/get cost with a huge archive, and a full window.

Run: .venv/bin/python benchmarks/engine.py [--archived 1000000] [--import-messages 100000]
     .venv/bin/python benchmarks/engine.py --skip startup import archive   (the window figures only)
Prints one line per figure, measuring the `memcli` that Python imports (PYTHONPATH picks a checkout).
Nothing here is part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = (
    "the a memory token budget flush user assistant tell me about your day I went hiking with my "
    "dog yesterday and we saw a lake near the mountains it was cold but sunny"
).split()


def short_messages(n: int, seed: int = 1, words: tuple[int, int] = (3, 12)) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))),
        }
        for i in range(n)
    ]


def run(args: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True, env={**os.environ, **(env or {})})
    return time.perf_counter() - start


def startup(tmp: Path) -> None:
    env = {"MEMCLI_HOME": str(tmp / "home")}
    memcli = [sys.executable, "-m", "memcli"]
    data = tmp / "small.jsonl"
    data.write_text("".join(json.dumps(m) + "\n" for m in short_messages(50)))
    run([*memcli, "import", str(data), "--session", "s"], env)
    for label, args in (
        ("--help", ["--help"]),
        ("inspect", ["inspect", "s"]),
        ("sessions", ["sessions"]),
    ):
        times = [run([*memcli, *args], env) for _ in range(7)]
        print(
            f"startup  memcli {label:<9} median {statistics.median(times) * 1000:6.0f} ms  (goal < 250 ms)"
        )


def bulk_import(tmp: Path, n: int) -> None:
    data = tmp / "bulk.jsonl"
    data.write_text("".join(json.dumps(m) + "\n" for m in short_messages(n)))
    db = tmp / "bulk.db"
    seconds = run(
        [
            sys.executable,
            "-m",
            "memcli",
            "--db",
            str(db),
            "import",
            str(data),
            "--no-blocks",
            "--session",
            "bulk",
            "--token-limit",
            "2000",
        ]
    )
    print(
        f"import   --no-blocks {n:,} short messages: {seconds:.2f} s, {n / seconds:,.0f} messages/s  (goal >= 20,000/s; whole command)"
    )


def huge_archive(tmp: Path, archived: int) -> None:
    from memcli import Memory, Message
    from memcli.flush import Budget
    from memcli.store.sqlite import SQLiteStore
    from memcli.tokens import TiktokenTokenizer

    db = tmp / "huge.db"
    store = SQLiteStore(db)
    tokenizer = TiktokenTokenizer()
    memory = Memory(store, "big", budget=Budget(2000, 0.7, 200), tokenizer=tokenizer)
    messages = [Message(m["role"], m["content"]) for m in short_messages(10_000)]
    start = time.perf_counter()
    while store.get_session("big").archived_messages < archived:  # type: ignore[union-attr]
        with store.transaction():
            for i in range(0, len(messages), 2):
                memory.put_messages(messages[i : i + 2])
    built = time.perf_counter() - start
    info = store.get_session("big")
    assert info is not None
    print(f"archive  built {info.archived_messages:,} archived messages in {built:.1f} s")
    store.close()
    memory = Memory(SQLiteStore(db), "big", tokenizer=tokenizer)
    memory.get()
    puts, gets = [], []
    for i in range(300):
        m = messages[i % len(messages)]
        t0 = time.perf_counter()
        memory.put(m)
        t1 = time.perf_counter()
        memory.get()
        t2 = time.perf_counter()
        puts.append(t1 - t0)
        gets.append(t2 - t1)
    print(
        f"put()    with {info.archived_messages:,} archived: median {statistics.median(puts) * 1000:.2f} ms,"
        f" p95 {sorted(puts)[int(len(puts) * 0.95)] * 1000:.2f} ms  (goal < 5 ms)"
    )
    print(
        f"get()    with {info.archived_messages:,} archived: median {statistics.median(gets) * 1000:.2f} ms,"
        f" p95 {sorted(gets)[int(len(gets) * 0.95)] * 1000:.2f} ms  (goal < 5 ms)"
    )


def percentile(times: list[float], fraction: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def full_window(tmp: Path, calls: int) -> None:
    """`get()` and `put()` on a full default window (30,000 tokens, ratio 0.7), no blocks, on disk."""
    from memcli import Memory, Message
    from memcli.tokens import count_messages

    db = tmp / "window.db"
    memory = Memory.from_defaults(session_id="w", db=db)
    messages = [Message(m["role"], m["content"]) for m in short_messages(20_000, 2, (2, 7))]
    window, tokens = [], 0
    for m, t in zip(messages, count_messages(messages, memory.tokenizer), strict=True):
        if tokens + t > memory.threshold:
            break
        window.append(m)
        tokens += t
    assert not memory.put_messages(window)  # exactly at the threshold: no flush yet
    print(
        f"window   {len(window):,} active messages, {tokens:,} tokens (threshold {memory.threshold:,.0f})"
    )

    def report(label: str, times: list[float], goal: str) -> None:
        print(
            f"{label:<38} median {statistics.median(times) * 1000:7.3f} ms,"
            f" p90 {percentile(times, 0.9) * 1000:7.3f} ms over {len(times):,} calls  {goal}"
        )

    cold = Memory.from_defaults(session_id="w", db=db)
    t0 = time.perf_counter()
    assert len(cold.get()) == len(window)
    print(
        f"{'get()    first call of a new Memory':<38} {(time.perf_counter() - t0) * 1000:7.3f} ms"
    )
    memory.get()
    gets = []
    for _ in range(calls):
        t0 = time.perf_counter()
        memory.get()
        gets.append(time.perf_counter() - t0)
    report("get()    warm, full window, no blocks", gets, "(goal < 1 ms)")
    puts, cycle = [], []
    extra = messages[len(window) :]
    for i in range(calls):
        t0 = time.perf_counter()
        memory.put(extra[i % len(extra)])
        t1 = time.perf_counter()
        memory.get()
        t2 = time.perf_counter()
        puts.append(t1 - t0)
        cycle.append(t2 - t0)
    report("put()    per call, full window", puts, "")
    report("put()+get() a chat turn, full window", cycle, "")
    # Another process writes: the next get() sees it (and pays one reload).
    other = Memory.from_defaults(session_id="w", db=db)
    other.put(Message("user", "from another process"))
    t0 = time.perf_counter()
    assert memory.get()[-1].content == "from another process"
    print(f"{'get()    after another writer':<38} {(time.perf_counter() - t0) * 1000:7.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archived", type=int, default=1_000_000)
    parser.add_argument("--import-messages", type=int, default=100_000)
    parser.add_argument("--window-calls", type=int, default=2000)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["startup", "import", "archive", "window"]
    )
    args = parser.parse_args()
    import memcli

    print(f"memcli   from {Path(memcli.__file__).parent}")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        if "startup" not in args.skip:
            startup(tmp)
        if "import" not in args.skip:
            bulk_import(tmp, args.import_messages)
        if "archive" not in args.skip:
            huge_archive(tmp, args.archived)
        if "window" not in args.skip:
            full_window(tmp, args.window_calls)


if __name__ == "__main__":
    main()
