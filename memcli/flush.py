"""The flush policy, as pure functions over (role, token count) lists.

This is LlamaIndex `Memory._manage_queue` (llama-index-core 0.14.25) step for step. The engine
(`Memory`) and `memcli simulate flush` both call `plan_flush`, so what the simulation prints is what
the engine does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcli.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

#: The batch reached the flush size (the message that crossed it included).
REASON_FLUSH_SIZE = "flush_size"
#: The queue ran down to one message before the batch reached the flush size.
REASON_QUEUE_END = "queue_end"
#: The largest token limit (and flush size) a budget takes: far beyond any model's context, and
#: within what SQLite stores as an integer.
MAX_TOKEN_LIMIT = 1_000_000_000


@dataclass(frozen=True)
class Budget:
    """The token budget of a session's short-term memory."""

    token_limit: int = 30000
    chat_history_token_ratio: float = 0.7
    token_flush_size: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.token_limit, bool) or not isinstance(self.token_limit, int):
            raise UsageError(
                "token_limit must be a whole number",
                "Pass e.g. 30000 (--token-limit on the command line)",
            )
        if not 0 < self.token_limit <= MAX_TOKEN_LIMIT:
            shown = str(self.token_limit) if self.token_limit < 10**30 else "a far larger number"
            raise UsageError(
                f"token_limit must be positive and at most {MAX_TOKEN_LIMIT:,}, not {shown}",
                "Pass e.g. 30000 (--token-limit on the command line)",
            )
        ratio = self.chat_history_token_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise UsageError(
                f"chat_history_token_ratio must be in (0, 1], not {ratio}",
                "Pass e.g. 0.7 (--ratio on the command line)",
            )
        if self.token_flush_size is None:
            object.__setattr__(self, "token_flush_size", max(1, self.token_limit // 10))
        size = self.token_flush_size
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise UsageError(
                f"token_flush_size must be a positive whole number, not {size}",
                "Pass e.g. 3000 (--flush-size on the command line)",
            )
        if size > self.token_limit:
            raise UsageError(
                f"token_flush_size {size} is larger than token_limit {self.token_limit}",
                "Pass a flush size no larger than the token limit (the default is 10% of it;"
                " --flush-size and --token-limit on the command line)",
            )

    @property
    def flush_size(self) -> int:
        assert self.token_flush_size is not None
        return self.token_flush_size

    @property
    def threshold(self) -> float:
        """Short-term memory flushes while its active tokens are above this."""
        return self.token_limit * self.chat_history_token_ratio


@dataclass(frozen=True)
class BudgetOverride:
    """The budget values asked for (budget flags, the settings for new sessions), each optional:
    None keeps the value of the budget it is applied to."""

    token_limit: int | None = None
    ratio: float | None = None
    flush_size: int | None = None

    @property
    def is_empty(self) -> bool:
        """Nothing is asked for."""
        return self.token_limit is None and self.ratio is None and self.flush_size is None

    def check(self) -> BudgetOverride:
        """These values are each valid, and together when given together (a flush size no larger
        than a token limit given with it): UsageError as `Budget` says it. Checked before a command
        creates anything."""
        Budget(
            self.token_limit if self.token_limit is not None else MAX_TOKEN_LIMIT,
            self.ratio if self.ratio is not None else 0.7,
            self.flush_size if self.flush_size is not None else 1,
        )
        return self

    def over(self, base: BudgetOverride) -> BudgetOverride:
        """The values asked for here, else `base`'s (flags over the settings)."""
        return BudgetOverride(
            self.token_limit if self.token_limit is not None else base.token_limit,
            self.ratio if self.ratio is not None else base.ratio,
            self.flush_size if self.flush_size is not None else base.flush_size,
        )

    def budget(self) -> Budget:
        """A new budget of these values (for those not given, Budget's defaults: 30,000 tokens,
        ratio 0.7, a flush size of 10% of the token limit)."""
        return self.apply(Budget())

    def apply(self, base: Budget) -> Budget:
        """`base` with the values asked for in place of its own; a new token limit without a flush
        size gets the default flush size, 10% of it."""
        flush_size = self.flush_size
        if flush_size is None and self.token_limit in (None, base.token_limit):
            flush_size = base.token_flush_size
        return Budget(
            self.token_limit if self.token_limit is not None else base.token_limit,
            self.ratio if self.ratio is not None else base.chat_history_token_ratio,
            flush_size,
        )


@dataclass(frozen=True)
class Batch:
    """One flush: the `count` oldest active messages leave short-term memory.

    `start` is the batch's first position in the queue the plan was made for; `reason` says why the
    batch stopped where it did (`flush_size` or `queue_end`); `extended` counts the messages added so
    that the queue starts with a user message; `kept_turn` says the newest turn was given back.
    """

    start: int
    count: int
    tokens: int
    reason: str
    extended: int = 0
    kept_turn: bool = False

    @property
    def end(self) -> int:
        """One past the batch's last position."""
        return self.start + self.count

    def describe(self) -> str:
        """Why the batch has its shape, in words."""
        parts = [
            "reached the flush size" if self.reason == REASON_FLUSH_SIZE else "queue down to one"
        ]
        if self.extended:
            parts.append(f"extended by {self.extended} so the queue starts with a user message")
        if self.kept_turn:
            parts.append("newest turn kept")
        return "; ".join(parts)


def plan_flush(
    roles: Sequence[str],
    tokens: Sequence[int],
    threshold: float,
    flush_size: int,
) -> list[Batch]:
    """Which oldest messages leave a queue of messages with these roles and token counts.

    Returns the batches in order; each takes the oldest messages left by the ones before it. An
    empty list means nothing is flushed.
    """
    n = len(roles)
    total = sum(tokens)
    start = 0
    batches: list[Batch] = []
    while total > threshold:
        if n - start <= 1:
            break
        # Take the oldest messages until the batch reaches the flush size, leaving at least one.
        end = start
        batch_tokens = 0
        while batch_tokens < flush_size and n - end > 1:
            batch_tokens += tokens[end]
            end += 1
        reason = REASON_FLUSH_SIZE if batch_tokens >= flush_size else REASON_QUEUE_END
        # Then the queue must start with a user message.
        extended_from = end
        while roles[end] != "user" and n - end > 1:
            end += 1
        extended = end - extended_from
        kept_turn = False
        if n - end == 1 and roles[end] != "user":
            # Only a non-user message would remain: the newest complete turn goes back instead.
            end = n
            last_user = _last_user(roles, start, n)
            if last_user is not None:
                end = last_user
                kept_turn = True
        if end == start:
            break
        moved = sum(tokens[start:end])
        batches.append(Batch(start, end - start, moved, reason, extended, kept_turn))
        total -= moved
        start = end
    return batches


def _last_user(roles: Sequence[str], start: int, stop: int) -> int | None:
    for i in range(stop - 1, start - 1, -1):
        if roles[i] == "user":
            return i
    return None


def truncation_order(priorities: Sequence[int]) -> list[int]:
    """Indexes of the blocks that may be cut, in the order they are cut.

    Priority 0 is never cut; among the others the highest number goes first, as LlamaIndex
    documents it; blocks of equal priority go in declaration order.
    """
    candidates = [i for i, p in enumerate(priorities) if p != 0]
    return sorted(candidates, key=lambda i: -priorities[i])
