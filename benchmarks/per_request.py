"""docs/python.md's per-request pattern in an aiohttp service: each request opens the user's
Memory (`async with await Memory.aopen(...)`), puts the user's message, reads what goes to the
model, puts the reply and closes it; 40 users at once, each sending its requests one after
another. Printed for SQLite and PostgreSQL: requests, errors, the process's open file descriptors
(/proc/self/fd) and threads before and after (and the most seen meanwhile), the connections the
server saw at most, and CPU per request (the process's: the aiohttp server and its clients);
then the same app with one Memory per user opened once, for comparison.

Run: .venv/bin/python benchmarks/per_request.py [--users 40] [--requests 15] [--url postgresql://...]

Without --url it starts Debian's PostgreSQL (tests/pg.py) in a temporary directory (its default
max_connections, 100). Nothing here is part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from aiohttp import ClientSession, web  # noqa: E402

from memcli import Memory, Message  # noqa: E402


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def server_connections(url: str | None) -> int:
    if url is None:
        return 0
    import psycopg

    name = url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchone()
    return int(row[0]) if row else 0


class Watch:
    """The most fds, threads and server connections seen while the app serves (every 50 ms)."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.fds = self.threads = self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.fds = max(self.fds, fds())
            self.threads = max(self.threads, threading.active_count() - 1)  # (this one)
            self.connections = max(self.connections, server_connections(self.url))

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def serve(db: str, users: int, requests: int, per_request: bool) -> tuple[int, int]:
    """An aiohttp app on 127.0.0.1 and `users` clients; (requests answered, errors)."""
    held: dict[str, Memory] = {}

    async def turn(memory: Memory, text: str) -> str:
        await memory.aput(Message("user", text))
        context = await memory.aget()
        reply = f"noted: {context[-1].content}"  # (your LLM here)
        await memory.aput(Message("assistant", reply))
        return reply

    async def chat(request: web.Request) -> web.Response:
        user = request.match_info["user"]
        text = await request.text()
        if per_request:
            async with await Memory.aopen(session_id=f"s-{user}", user_id=user, db=db) as memory:
                return web.Response(text=await turn(memory, text))
        if user not in held:
            held[user] = await Memory.aopen(session_id=f"s-{user}", user_id=user, db=db)
        return web.Response(text=await turn(held[user], text))

    app = web.Application()
    app.router.add_post("/chat/{user}", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    answered = errors = 0

    async def client(session: ClientSession, user: int) -> None:
        nonlocal answered, errors
        for n in range(requests):
            async with session.post(
                f"http://127.0.0.1:{port}/chat/u{user}", data=f"message {n} from user {user}"
            ) as response:
                await response.read()
                if response.status == 200:
                    answered += 1
                else:
                    errors += 1

    async with ClientSession() as session:
        await asyncio.gather(*(client(session, u) for u in range(users)))
    for memory in held.values():
        await memory.aclose()
    await runner.cleanup()
    return answered, errors


def run(label: str, db: str, url: str | None, users: int, requests: int, per_request: bool) -> None:
    before_fds, before_threads = fds(), threading.active_count()
    cpu = time.process_time()
    with Watch(url) as watch:
        answered, errors = asyncio.run(serve(db, users, requests, per_request))
    cpu = time.process_time() - cpu
    time.sleep(0.2)  # (threads that were told to stop end)
    total = users * requests
    print(
        f"{label:>9} {'per request' if per_request else 'per user':>11}: {answered}/{total}"
        f" answered, {errors} errors; fds {before_fds} -> {fds()} (max {watch.fds}), threads"
        f" {before_threads} -> {threading.active_count()} (max {watch.threads}),"
        f" server connections max {watch.connections}; {cpu / total * 1000:.2f} ms CPU per request"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--requests", type=int, default=15)
    parser.add_argument("--url", help="an empty PostgreSQL database (default: start a server)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="memcli-per-request-"))
    server = None
    url = args.url
    if url is None:
        import psycopg
        from pg import DebianServer

        server = DebianServer().start()
        url = server.url(f"b_{uuid.uuid4().hex[:8]}")
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{url.rsplit("/", 1)[1].split("?")[0]}"')
    try:
        for label, db, watched in (
            ("SQLite", str(folder / "per_request.db"), None),
            ("Postgres", url, url),
        ):
            run(label, db, watched, 2, 2, per_request=True)  # warm: imports, the schema
            for per_request in (True, False):
                run(label, db, watched, args.users, args.requests, per_request)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
