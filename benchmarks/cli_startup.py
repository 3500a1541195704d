"""How long `memcli --help` and `memcli import --help` take, a process each, and what the format
table (`memcli.formats`, imported by the import command's help) costs of it.

Run: python benchmarks/cli_startup.py [CHECKOUT ...]    (default: this checkout)

For each checkout (put first on PYTHONPATH, its modules compiled once into a temporary cache),
each command is run RUNS times; printed: the best
and the median wall time, and the CPU time (user + system) of the best run, the steadier figure on
a busy machine. Then `python -X importtime` of `memcli --help`: the cumulative import time of
`memcli.formats` (the best of RUNS; 0: not imported), and whether `importlib.metadata` (what reading entry points,
the plugins', needs) was imported.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 15
COMMANDS = (["--help"], ["import", "--help"])


def timed(args: list[str], env: dict[str, str], root: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run of `python ARGS` in `root` (`-m` imports from there)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, cwd=root, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def formats_import_ms(env: dict[str, str], root: Path) -> tuple[float, bool]:
    """The cumulative import time of memcli.formats in `memcli --help` (ms; the best of RUNS;
    0: not imported), and whether importlib.metadata was imported."""
    metadata = False
    found: list[float] = []
    for _ in range(RUNS):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "memcli", "--help"],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:"):
                continue
            _, _, cumulative, name = (part.strip() for part in line.replace(":", "|", 1).split("|"))
            if name == "memcli.formats":
                found.append(int(cumulative) / 1000)
            metadata = metadata or name == "importlib.metadata"
    return min(found, default=0.0), metadata


def main(checkouts: list[str]) -> None:
    cache = tempfile.mkdtemp(prefix="memcli-pycache-")
    for checkout in checkouts:
        root = Path(checkout).resolve()
        # Compiled once, into a cache of this run's own (PYTHONDONTWRITEBYTECODE would have
        # every run compile what has no .pyc yet: a checkout's new modules).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env |= {"PYTHONPATH": str(root), "PYTHONPYCACHEPREFIX": cache}
        timed(["-m", "memcli", "import", "--help"], env, root)
        print(f"{root}:")
        for command in COMMANDS:
            runs = [timed(["-m", "memcli", *command], env, root) for _ in range(RUNS)]
            walls = [w for w, _ in runs]
            best = min(runs)
            print(
                f"  memcli {' '.join(command):<14} best {best[0] * 1000:6.1f} ms"
                f" (cpu {best[1] * 1000:6.1f} ms), median {statistics.median(walls) * 1000:6.1f} ms"
            )
        ms, metadata = formats_import_ms(env, root)
        print(
            f"  memcli.formats imported by --help: {ms:.1f} ms (0: not imported);"
            f" importlib.metadata imported: {metadata}"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or [str(Path(__file__).resolve().parents[1])])
