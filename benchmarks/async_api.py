"""The async API under concurrency: how late a 10 ms ticker on the event loop runs while 20 tasks
each put 200 messages (one `aput` each) into their own sessions, and how much faster the 20 tasks
finish at once than one after another; on SQLite (one file, one store shared by the tasks) and
on PostgreSQL (each task's Memory opened from the URL, so its own connection, as
`Memory.from_defaults(db=url)` does).

Run: .venv/bin/python benchmarks/async_api.py [--tasks 20] [--puts 200] [--url postgresql://...]

Without --url it starts Debian's PostgreSQL (tests/pg.py) with fsync on, in a temporary
directory. The lag of a tick is how much later than 10 ms after the previous one it ran; max and
p99 are over the ticks of the concurrent run. Nothing here is part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes import WordTokenizer  # noqa: E402

from memcli import Memory, Message  # noqa: E402
from memcli.flush import Budget  # noqa: E402
from memcli.store import Store, open_store  # noqa: E402

TICK_S = 0.010
BUDGET = Budget(2000, 0.7, 200)
WORDS = "tell me about your day I went hiking with my dog and we saw a lake".split()


def text(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 12))


async def task(memory: Memory, puts: int) -> None:
    for i in range(puts):
        await memory.aput(Message("user" if i % 2 == 0 else "assistant", text(i)))


async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        lags.append(max(0.0, now - last - TICK_S))
        last = now


async def run(memories: list[Memory], puts: int, concurrent: bool) -> tuple[float, list[float]]:
    """Seconds the tasks took, and the ticker's lags meanwhile."""
    stop = asyncio.Event()
    lags: list[float] = []
    ticking = asyncio.create_task(ticker(stop, lags))
    start = time.perf_counter()
    if concurrent:
        await asyncio.gather(*(task(m, puts) for m in memories))
    else:
        for m in memories:
            await task(m, puts)
    elapsed = time.perf_counter() - start
    stop.set()
    await ticking
    return elapsed, lags


def bench(name: str, open_memory: Callable[[str], Memory], tasks: int, puts: int) -> None:
    results = {}
    for concurrent in (False, True):
        tag = uuid.uuid4().hex[:6]
        memories = [open_memory(f"{tag}-{i}") for i in range(tasks)]
        results[concurrent] = asyncio.run(run(memories, puts, concurrent))
        for memory in memories:
            assert len(memory.get_all()) == puts
    serial, _ = results[False]
    together, lags = results[True]
    ms = 1000
    p99 = statistics.quantiles(lags, n=100)[98] if len(lags) >= 2 else max(lags, default=0.0)
    print(
        f"{name:<11} serial {serial:6.2f} s  concurrent {together:6.2f} s"
        f" ({together / serial:4.2f}x)  loop lag max {max(lags, default=0) * ms:6.1f} ms"
        f"  p99 {p99 * ms:6.1f} ms  ({tasks * puts / together:,.0f} puts/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--puts", type=int, default=200)
    parser.add_argument("--url", help="an existing PostgreSQL database (default: start a server)")
    args = parser.parse_args()
    print(f"{args.tasks} tasks x {args.puts} aput calls, each task its own session:")
    with tempfile.TemporaryDirectory() as tmp:
        store: Store = open_store(Path(tmp) / "m.db")
        bench(
            "SQLite",
            lambda s: Memory(store, s, budget=BUDGET, tokenizer=WordTokenizer()),
            args.tasks,
            args.puts,
        )
    server = None
    url = args.url
    if url is None:
        from pg import DebianServer, new_database

        server = DebianServer(durable=True).start()
        url = new_database(server)
    try:
        bench(
            "PostgreSQL",
            lambda s: Memory(open_store(url), s, budget=BUDGET, tokenizer=WordTokenizer()),
            args.tasks,
            args.puts,
        )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
