"""LoCoMo evidence recall of memcli search: hybrid, and dense-only and BM25-only as baselines.

Each conversation goes through the real import path (memcli.formats.read, then
memcli.importing.from_source and import_conversations, as `memcli import` does): speaker_a as
`user`, speaker_b as `assistant`, the speaker's name in `name`, each turn's session date as its
`timestamp`, an image's caption after the text as `[image: CAPTION]`. The LoCoMo dia_id of each message is kept in a side mapping (message id ->
dia_id), not in the message, so it changes neither token counts nor retrieval. Every question of
categories 1-4 is then asked of `Retriever.search` with the conversation's user as scope.

Figures, overall and per category: evidence recall@k (k = 2, 5, 10: the share of a question's
evidence turns found among the first k hits' messages, averaged over questions), recall within a
budget of retrieved text (500 and 1,000 tokens: hits taken in order while their text, as a hit
shows it with the speakers' names, fits, counted with tiktoken's cl100k_base), tokens of the first
10 hits (the same count, averaged over questions), build time, query latency.

`--options` takes a JSON object of SearchOptions fields, or a list of them to compare in one run
(e.g. `'[{"window_weight": 0}, {}]'`: before and after reading times in questions).

    PYTHONPATH=. python benchmarks/locomo.py                  # both development conversations
    PYTHONPATH=. python benchmarks/locomo.py --questions 10   # a quick slice
    PYTHONPATH=. python benchmarks/locomo.py --brief --precision fp32  # the model at fp32
    PYTHONPATH=. python benchmarks/locomo.py --db postgresql://...  # in an empty PostgreSQL database
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo"
if not DEFAULT_DATA.is_dir():
    DEFAULT_DATA = Path("/work/shared/data/locomo")
KS = (2, 5, 10)
BUDGETS = (500, 1000)
VARIANTS = ("hybrid", "vector", "lexical")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def parse_date(text: str) -> datetime:
    """LoCoMo's "1:56 pm on 8 May, 2023"."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")


def transcript(conv: dict[str, Any], session: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The conversation as transcript records, and each record's dia_id, in order."""
    records: list[dict[str, Any]] = []
    dia_ids: list[str] = []
    n = 1
    while f"session_{n}_date_time" in conv:
        turns = conv.get(f"session_{n}")
        if isinstance(turns, list):
            when = parse_date(conv[f"session_{n}_date_time"])
            for turn in turns:
                text = turn["text"]
                if turn.get("blip_caption"):
                    text = f"{text} [image: {turn['blip_caption']}]"
                role = "user" if turn["speaker"] == conv["speaker_a"] else "assistant"
                records.append(
                    {
                        "session": session,
                        "role": role,
                        "name": turn["speaker"],
                        "content": text,
                        "timestamp": when.isoformat() + "Z",
                    }
                )
                dia_ids.append(turn["dia_id"])
        n += 1
    return records, dia_ids


@dataclass
class Tally:
    """Sums over questions for one variant (and one category)."""

    questions: int = 0
    recall: dict[int, float] = field(default_factory=lambda: dict.fromkeys(KS, 0.0))
    budget: dict[int, float] = field(default_factory=lambda: dict.fromkeys(BUDGETS, 0.0))
    tokens10: int = 0

    def add(
        self, hits: list[Any], evidence: set[str], dia: dict[int, str], tokens: list[int]
    ) -> None:
        """`tokens`: each hit's text in cl100k tokens."""
        self.questions += 1
        for k in KS:
            found = {dia.get(i) for h in hits[:k] for i in h.message_ids}
            self.recall[k] += len(evidence & found) / len(evidence)
        for budget in BUDGETS:
            used, found = 0, set()
            for h, count in zip(hits, tokens, strict=True):
                if used + count > budget:
                    break
                used += count
                found |= {dia.get(i) for i in h.message_ids}
            self.budget[budget] += len(evidence & found) / len(evidence)
        self.tokens10 += sum(tokens[:10])

    def row(self) -> dict[str, Any]:
        q = max(self.questions, 1)
        return {
            "questions": self.questions,
            **{f"recall@{k}": round(self.recall[k] / q, 3) for k in KS},
            **{f"recall@{b}tok": round(self.budget[b] / q, 3) for b in BUDGETS},
            "tokens@10": round(self.tokens10 / q, 1),
        }


def evidence_of(qa: dict[str, Any]) -> set[str]:
    out = set()
    for item in qa.get("evidence", []):
        for part in str(item).replace(",", ";").split(";"):
            if part.strip():
                out.add(part.strip())
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from memcli.formats import read
    from memcli.importing import Opening, from_source, import_conversations
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever
    from memcli.search.types import SearchOptions
    from memcli.store import open_store
    from memcli.tokens import TiktokenTokenizer

    files = sorted(Path(args.data).glob("*.json"))
    if args.conversations:
        files = [f for f in files if f.stem in args.conversations.split(",")]
    overrides = json.loads(args.options) if args.options else [{}]
    overrides = overrides if isinstance(overrides, list) else [overrides]
    option_sets = [SearchOptions(**o) for o in overrides]
    options = option_sets[0]
    store = open_store(args.db or Path(tempfile.mkdtemp(prefix="memcli-locomo-")) / "locomo.db")
    from memcli.config import default_home

    embedder = OnnxEmbedder(
        args.model_cache or default_home(os.environ) / "models", precision=args.precision
    )
    tokenizer = TiktokenTokenizer()
    retrievers = [Retriever(store, embedder, o) for o in option_sets]
    keys = [(i, v) for i in range(len(option_sets)) for v in VARIANTS]
    tallies = {key: {c: Tally() for c in (0, *CATEGORIES)} for key in keys}
    latency: dict[Any, list[float]] = {key: [] for key in keys}
    build = {"import_s": 0.0, "index_s": 0.0, "messages": 0}
    unknown = 0
    for path in files:
        conv_all = json.loads(path.read_text())
        conv = conv_all.get("conversation", conv_all)
        qas = conv_all.get("qa", conv.get("qa", []))
        user = f"locomo-{path.stem}"
        records, dia_ids = transcript(conv, user)
        if args.turns:
            records, dia_ids = records[: args.turns], dia_ids[: args.turns]
        data = "\n".join(json.dumps(r) for r in records).encode()
        started = time.perf_counter()
        source = read("-", io.BytesIO(data))
        opening = Opening(tokenizer, default_user=user)
        import_conversations(store, from_source(source), opening)
        build["import_s"] += time.perf_counter() - started
        ids = [m.id for m in store.iter_messages(user)]
        dia = dict(zip(ids, dia_ids, strict=True))
        build["messages"] += len(ids)
        started = time.perf_counter()
        for retriever in retrievers:
            retriever.index()
        build["index_s"] += time.perf_counter() - started
        asked = [q for q in qas if q.get("category") in CATEGORIES]
        if args.turns:  # a slice: only the questions it can answer
            asked = [q for q in asked if evidence_of(q) <= set(dia_ids)]
        if args.questions:
            asked = asked[: args.questions]
        for qa in asked:
            evidence = evidence_of(qa)
            unknown += len(evidence - set(dia.values()))
            if not evidence:
                continue
            for i, variant in keys:
                started = time.perf_counter()
                result = retrievers[i].search(
                    qa["question"], k=args.depth, user_id=user, mode=variant
                )
                latency[i, variant].append(time.perf_counter() - started)
                counts = [tokenizer.count(h.text) for h in result.hits]  # cl100k_base
                for category in (0, qa["category"]):
                    tallies[i, variant][category].add(result.hits, evidence, dia, counts)
    store.close()
    report: dict[str, Any] = {
        "conversations": [f.stem for f in files],
        "options": options.__dict__,
        "build": {k: round(v, 2) if isinstance(v, float) else v for k, v in build.items()},
        "unknown_evidence_ids": unknown,
        "variants": {},
    }
    for i, variant in keys:
        times = sorted(latency[i, variant])
        name = variant if len(option_sets) == 1 else f"{variant}#{i}"
        if (
            i
            and variant != "hybrid"
            and any(tallies[j, variant][0].row() == tallies[i, variant][0].row() for j in range(i))
        ):
            continue  # the same baseline again
        report["variants"][name] = {
            "options": overrides[i],
            "overall": tallies[i, variant][0].row(),
            "categories": {CATEGORIES[c]: tallies[i, variant][c].row() for c in CATEGORIES},
            "latency_ms": {
                "mean": round(statistics.fmean(times) * 1000, 1) if times else None,
                "p95": round(times[int(len(times) * 0.95)] * 1000, 1) if times else None,
            },
        }
    return report


def print_report(report: dict[str, Any], args_brief: bool = False) -> None:
    b = report["build"]
    print(
        f"conversations {','.join(report['conversations'])}: {b['messages']} messages;"
        f" import {b['import_s']} s, embedding {b['index_s']} s"
    )
    print(f"options {report['options']}")
    head = ["variant", "category", "q", "R@2", "R@5", "R@10", "R@500t", "R@1000t", "tok@10"]
    print("  ".join(f"{h:>11}" for h in head))
    for variant, data in report["variants"].items():
        if data["options"]:
            print(f"{variant}: {data['options']}")
        rows = [("all", data["overall"]), *data["categories"].items()]
        if args_brief:
            rows = rows[:1]
        for name, row in rows:
            cells = [
                variant,
                name,
                row["questions"],
                *[row[f"recall@{k}"] for k in KS],
                *[row[f"recall@{b}tok"] for b in BUDGETS],
                row["tokens@10"],
            ]
            print("  ".join(f"{c!s:>11}" for c in cells))
        print(
            f"{variant:>11}  latency mean {data['latency_ms']['mean']} ms, p95 {data['latency_ms']['p95']} ms"
        )
    if report["unknown_evidence_ids"]:
        print(f"evidence ids not in the conversation: {report['unknown_evidence_ids']}")


def main(argv: list[str] | None = None) -> int:
    from memcli.search.onnx import PRECISIONS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="folder of LoCoMo *.json")
    parser.add_argument("--conversations", help="comma-separated file stems (default: all)")
    parser.add_argument("--questions", type=int, default=0, help="first N questions per file")
    parser.add_argument(
        "--turns", type=int, default=0, help="only the first N turns (and their questions)"
    )
    parser.add_argument(
        "--db",
        help="an empty database to import into (a path or a postgresql:// URL; default: a"
        " new SQLite file in a temporary folder)",
    )
    parser.add_argument("--depth", type=int, default=60, help="hits asked per query")
    parser.add_argument("--options", help="SearchOptions overrides as JSON")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--brief", action="store_true", help="overall rows only")
    parser.add_argument(
        "--model-cache",
        default=os.environ.get("MEMCLI_MODEL_CACHE"),
        help="folder for the exported ONNX model (default: $MEMCLI_HOME/models, as the CLI)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=PRECISIONS[0],
        help="the embedding model's precision (as [search] embedding_precision)",
    )
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report, args.brief)
    return 0


if __name__ == "__main__":
    sys.exit(main())
