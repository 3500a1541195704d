"""What the async API adds to a call: put, get, and a put then a get (an agent's turn), sync
against async, with no blocks, on an in-memory and an on-disk database.

Run: .venv/bin/python benchmarks/async_api.py [--calls 1000] [--repeats 9] [--window 1000]
Each figure is the median over `repeats` rounds (sync and async rounds alternate, on two sessions
of one store with the same messages) of the per-call time of `calls` calls, after `window`
messages were put first. Nothing here is part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from memcli import Memory, Message, SQLiteStore

WORDS = (
    "the a memory token budget flush user assistant tell me about your day I went hiking with my "
    "dog yesterday and we saw a lake near the mountains it was cold but sunny"
).split()


def messages(n: int, seed: int) -> list[Message]:
    rng = random.Random(seed)
    return [
        Message(
            "user" if i % 2 == 0 else "assistant",
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))),
        )
        for i in range(n)
    ]


def sync_puts(memory: Memory, batch: list[Message]) -> float:
    start = time.perf_counter()
    for m in batch:
        memory.put(m)
    return time.perf_counter() - start


def async_puts(memory: Memory, batch: list[Message]) -> float:
    async def run() -> float:
        start = time.perf_counter()
        for m in batch:
            await memory.aput(m)
        return time.perf_counter() - start

    return asyncio.run(run())


def sync_gets(memory: Memory, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        memory.get()
    return time.perf_counter() - start


def async_gets(memory: Memory, n: int) -> float:
    async def run() -> float:
        start = time.perf_counter()
        for _ in range(n):
            await memory.aget()
        return time.perf_counter() - start

    return asyncio.run(run())


def sync_turns(memory: Memory, batch: list[Message]) -> float:
    start = time.perf_counter()
    for m in batch:
        memory.put(m)
        memory.get()
    return time.perf_counter() - start


def async_turns(memory: Memory, batch: list[Message]) -> float:
    async def run() -> float:
        start = time.perf_counter()
        for m in batch:
            await memory.aput(m)
            await memory.aget()
        return time.perf_counter() - start

    return asyncio.run(run())


def compare(
    name: str, repeats: int, calls: int, sync: Callable[[int], float], asyn: Callable[[int], float]
) -> None:
    times: dict[str, list[float]] = {"sync": [], "async": []}
    for r in range(repeats):  # alternating which goes first, against drift on a busy machine
        if r % 2:
            times["async"].append(asyn(r) / calls)
            times["sync"].append(sync(r) / calls)
        else:
            times["sync"].append(sync(r) / calls)
            times["async"].append(asyn(r) / calls)
    s, a = statistics.median(times["sync"]), statistics.median(times["async"])
    print(f"{name:<20} sync {s * 1e6:8.1f} µs/call   async {a * 1e6:8.1f} µs/call   {a / s:6.3f}x")


def bench(db: str | Path | None, label: str, calls: int, repeats: int, window: int) -> None:
    store = SQLiteStore(db)
    memories = {kind: Memory.from_defaults(session_id=kind, db=store) for kind in ("s", "a")}
    # Both sessions get the same messages in the same order: the same windows and flushes.
    rounds = [messages(calls, seed) for seed in range(repeats)]
    for memory in memories.values():
        memory.put_messages(messages(window, 99))
    compare(
        f"put ({label})",
        repeats,
        calls,
        lambda r: sync_puts(memories["s"], rounds[r]),
        lambda r: async_puts(memories["a"], rounds[r]),
    )
    compare(
        f"get ({label})",
        repeats,
        calls,
        lambda r: sync_gets(memories["s"], calls),
        lambda r: async_gets(memories["a"], calls),
    )
    compare(
        f"put+get ({label})",
        repeats,
        calls,
        lambda r: sync_turns(memories["s"], rounds[r]),
        lambda r: async_turns(memories["a"], rounds[r]),
    )
    print(f"{'':<20} window: {len(memories['a'].get())} messages")
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--window", type=int, default=1000)
    args = parser.parse_args()
    bench(None, "memory", args.calls, args.repeats, args.window)
    with tempfile.TemporaryDirectory() as tmp:
        bench(Path(tmp) / "m.db", "disk", args.calls, args.repeats, args.window)


if __name__ == "__main__":
    main()
