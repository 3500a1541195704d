"""Embedding throughput of the bundled MiniLM at fp32 and at int8 (`[search] embedding_precision`).

Texts per CPU second (the process's user + system time, every ONNX Runtime thread counted), at
batch 1 (a query, a chat turn) and batch 32 (an import, a backfill), on the turns of the LoCoMo
development conversations; the two precisions run in alternating rounds so that both see the same
load, and the median round is reported. Also: the cosine of each text's int8 vector to its fp32
vector (mean and minimum), of its int8 vector embedded alone to the one embedded in a batch of 32
(dynamic quantisation scales a run's activations together), and the size of each model file. Recall is measured with
benchmarks/locomo.py --precision fp32 / int8.

    PYTHONPATH=. python benchmarks/embedding_precision.py
    PYTHONPATH=. python benchmarks/embedding_precision.py --texts 256 --rounds 3   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo"
if not DEFAULT_DATA.is_dir():
    DEFAULT_DATA = Path("/work/shared/data/locomo")
BATCHES = (1, 32)


def turns(data: Path, limit: int) -> list[str]:
    """The text of the conversations' turns, in order, up to `limit`."""
    out: list[str] = []
    for path in sorted(data.glob("*.json")):
        conv = json.loads(path.read_text())
        conv = conv.get("conversation", conv)
        n = 1
        while f"session_{n}_date_time" in conv:
            for turn in conv.get(f"session_{n}") or []:
                out.append(f"{turn['speaker']}: {turn['text']}")
            n += 1
    return out[:limit]


def rate(embedder: Any, texts: list[str], batch: int) -> float:
    """Texts per CPU second embedding `texts` `batch` at a time (the model loaded already)."""
    embedder.batch_size = batch
    started = time.process_time()
    for at in range(0, len(texts), batch):
        embedder.embed(texts[at : at + batch])
    return len(texts) / (time.process_time() - started)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from memcli.config import default_home
    from memcli.search.onnx import PRECISIONS, OnnxEmbedder

    cache = Path(args.model_cache or default_home(os.environ) / "models")
    texts = turns(Path(args.data), args.texts)
    embedders = {p: OnnxEmbedder(cache, precision=p, threads=args.threads) for p in PRECISIONS}
    for embedder in embedders.values():
        embedder.embed(["warm up"])  # exported (once) and loaded before any clock runs
    rates: dict[str, dict[int, list[float]]] = {p: {b: [] for b in BATCHES} for p in PRECISIONS}
    for _ in range(args.rounds):
        for batch in BATCHES:
            for precision, embedder in embedders.items():
                rates[precision][batch].append(rate(embedder, texts, batch))
    embedders["fp32"].batch_size = embedders["int8"].batch_size = 32
    fp32 = embedders["fp32"].embed(texts)
    int8 = embedders["int8"].embed(texts)
    cosines = (fp32 * int8).sum(axis=1)
    # At int8 the activations' scale is the run's: a text alone and in a batch of 32 differ.
    alone = np.vstack([embedders["int8"].embed([t]) for t in texts])
    batched = (alone * int8).sum(axis=1)
    return {
        "texts": len(texts),
        "rounds": args.rounds,
        "threads": args.threads,
        "rate": {p: {b: statistics.median(r) for b, r in by.items()} for p, by in rates.items()},
        "cosine_mean": float(np.mean(cosines)),
        "cosine_min": float(np.min(cosines)),
        "int8_alone_mean": float(np.mean(batched)),
        "int8_alone_min": float(np.min(batched)),
        "bytes": {p: e.path.stat().st_size for p, e in embedders.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="folder of LoCoMo *.json")
    parser.add_argument("--texts", type=int, default=512, help="texts embedded per measure")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (median)")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads")
    parser.add_argument(
        "--model-cache",
        default=os.environ.get("MEMCLI_MODEL_CACHE"),
        help="folder of the exported models (default: $MEMCLI_HOME/models, as the CLI)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['texts']} LoCoMo turns, median of {report['rounds']} alternating rounds")
    print(f"{'batch':>6} {'fp32 texts/CPU s':>18} {'int8 texts/CPU s':>18} {'int8/fp32':>10}")
    for batch in BATCHES:
        a, b = report["rate"]["fp32"][batch], report["rate"]["int8"][batch]
        print(f"{batch:>6} {a:>18.1f} {b:>18.1f} {b / a:>9.2f}x")
    print(f"cosine int8 to fp32: mean {report['cosine_mean']:.4f}, min {report['cosine_min']:.4f}")
    print(
        f"int8, alone to in a batch of 32: mean {report['int8_alone_mean']:.4f},"
        f" min {report['int8_alone_min']:.4f}"
    )
    sizes = ", ".join(f"{p} {n / 1e6:.1f} MB" for p, n in report["bytes"].items())
    print(f"model files: {sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
