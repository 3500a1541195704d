"""Search: hybrid retrieval (BM25 and dense vectors, fused) over every stored message.

The public types: `SearchOptions` (what a search is asked: the `[search]` settings), `Hit` and
`SearchResult` (what it answers), `Retriever` (the search itself), `Embedder` (the protocol of
an embedding model) and `OnnxEmbedder` (the bundled model). The modules:

- `types`: SearchOptions, Hit, SearchResult, the modes;
- `ranking`: the pure parts: a query's terms, reciprocal rank fusion, a long message's excerpt;
- `embedder`: the Embedder protocol and the one text splitter; `onnx`: OnnxEmbedder;
- `lexical`: BM25 through the store's full-text index, its cost bounded;
- `dense`: the FAISS index files over the stored vectors, or pgvector's search;
- `retriever`: Retriever, which embeds what is missing, runs both sides and fuses them;
- `queries`: query files and the searches `memcli search` runs.

It imports only `memcli.store`, `messages`, `tokens` and `errors`: the folders it keeps files in
(the exported model, the FAISS files of a PostgreSQL database) are handed in by its callers.
Heavy packages (numpy, faiss, onnxruntime) load inside the functions that use them; the names
below other than the types load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.search.types import Hit, SearchOptions, SearchResult

if TYPE_CHECKING:
    from memcli.search.embedder import Embedder
    from memcli.search.onnx import OnnxEmbedder
    from memcli.search.retriever import Retriever

__all__ = ["Embedder", "Hit", "OnnxEmbedder", "Retriever", "SearchOptions", "SearchResult"]


def __getattr__(name: str) -> Any:
    if name == "Retriever":
        from memcli.search.retriever import Retriever

        return Retriever
    if name == "OnnxEmbedder":
        from memcli.search.onnx import OnnxEmbedder

        return OnnxEmbedder
    if name == "Embedder":
        from memcli.search.embedder import Embedder

        return Embedder
    raise AttributeError(f"module 'memcli.search' has no attribute {name!r}")
