"""The rows of a FAISS index in a search's scope (`search/dense.py`): as a mask over all rows,
or, for a user's or a session's scope, found by code without a pass over every row, so that a
small scope of a big index is searched exactly over its own vectors (`exact`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.store import index as sql

if TYPE_CHECKING:
    from memcli.store.index import Scope


def new_mask(arrays: dict[str, Any], codes: dict[str, dict[str, int]], scope: Scope) -> Any:
    """The rows of `arrays` in scope as booleans (None: all of them)."""
    import numpy as np

    mask = np.ones(len(arrays["message_ids"]), dtype=bool)
    if scope.user_id is not None:
        mask &= arrays["users"] == codes["user"].get(scope.user_id, -1)
    if scope.session_id is not None:
        mask &= arrays["sessions"] == codes["session"].get(scope.session_id, -1)
    if scope.since is not None:
        mask &= arrays["times"] >= sql.unix_ms(scope.since)
    if scope.until is not None:
        mask &= arrays["times"] < sql.unix_ms(scope.until)
    return None if bool(mask.all()) else mask


class Groups:
    """An index's rows by user and by session code (sorted once, on first use)."""

    def __init__(self, arrays: dict[str, Any]) -> None:
        self.arrays = dict(arrays)  # the arrays themselves: a new array is a new index
        self._sorted: dict[str, tuple[Any, Any]] = {}

    def _rows_of(self, kind: str, code: int) -> Any:
        import numpy as np

        if kind not in self._sorted:
            order = np.argsort(self.arrays[kind], kind="stable")
            self._sorted[kind] = (order, self.arrays[kind][order])
        order, codes = self._sorted[kind]
        low, high = np.searchsorted(codes, code, "left"), np.searchsorted(codes, code, "right")
        return order[low:high]  # in row order: the sort is stable

    def rows(self, scope: Scope, codes: dict[str, dict[str, int]], limit: int) -> Any:
        """The rows of a user's or session's scope (in row order) when there are at most
        `limit` of the user's or the session's; None when the scope names neither, or more."""
        import numpy as np

        picks = []
        if scope.user_id is not None:
            picks.append(self._rows_of("users", codes["user"].get(scope.user_id, -1)))
        if scope.session_id is not None:
            picks.append(self._rows_of("sessions", codes["session"].get(scope.session_id, -1)))
        if not picks or min(len(p) for p in picks) > limit:
            return None
        rows = min(picks, key=len)
        for other in picks:
            if other is not rows:
                rows = np.intersect1d(rows, other, assume_unique=True)
        times = self.arrays["times"][rows]
        if scope.since is not None:
            rows = rows[times >= sql.unix_ms(scope.since)]
            times = self.arrays["times"][rows]
        if scope.until is not None:
            rows = rows[times < sql.unix_ms(scope.until)]
        return rows


def exact(
    query: Any, owners: list[int], matrix: Any, active: set[int], n: int
) -> list[tuple[int, float]]:
    """(message id, inner product) of the best `n` messages of the rows `matrix` (each row's
    message in `owners`), each once, best first, none of `active`."""
    import numpy as np

    best: dict[int, float] = {}
    if not owners:
        return []
    scores = matrix @ query
    for at in np.argsort(-scores, kind="stable").tolist():
        if owners[at] not in active:
            best.setdefault(int(owners[at]), float(scores[at]))
            if len(best) == n:
                break
    return list(best.items())
