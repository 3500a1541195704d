"""`memcli setup`: prepare what the first search would otherwise wait for (the embedding model)."""

from __future__ import annotations

import time

import typer

from memcli.cli import common, output


def setup_command(ctx: typer.Context, json_: common.Json = False) -> None:
    """Prepare the embedding model: export the bundled all-MiniLM-L6-v2 to ONNX into
    `$MEMCLI_HOME/models` and, at the default `[search] embedding_precision = "int8"`, quantise a
    copy of it to int8 (about 15 s, once), then load it once (ONNX Runtime saves the graph it
    optimises beside it), so that the first search, import or chat does not wait for it. `./run`
    does it; after `pip install memcli`, run it once. Running it again only checks. No database
    is created.

    Example: pip install memcli && memcli setup
    """
    s = common.settings(ctx)
    embedder = common.embedder(s)
    started = time.perf_counter()
    exported = embedder.prepare()
    embedder.embed(["memcli setup"])  # loads it once: ONNX Runtime saves its optimised graph
    seconds = time.perf_counter() - started
    path = s.home / "models"
    if output.wants_json(json_):
        output.emit_all(
            [
                {
                    "type": "setup",
                    "embedding_model": str(path),
                    "embedding_model_file": str(embedder.path),
                    "precision": embedder.precision,
                    "exported": exported,
                    "seconds": round(seconds, 3),
                }
            ]
        )
    what = f"The embedding model ({embedder.precision}) is ready in {path}"
    if exported:
        output.info(f"{what} ({seconds:.1f} s).")
    else:
        output.info(f"{what} (already exported).")
