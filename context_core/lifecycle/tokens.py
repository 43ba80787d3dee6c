"""Counting the tokens of the L1 action trace, for the context_overflow trigger.

The reference design evicts the oldest trace pairs once the L1 trace holds more than 2K
tokens (``CTX_L1_MAX_TRACE_TOKENS``). Tokens are counted the way the platform's model sees
text: with the embedding model's own tokenizer (:meth:`context_core.knowledge.embedding.Encoder.
count_tokens`) when one is given. Without a model loaded (plain library use, tests) a
heuristic stands in:

* a run of ASCII letters costs ``ceil(len / 5)`` tokens (WordPiece keeps common words
  whole and splits rare ones into ~4-5-letter pieces);
* a run of digits costs ``ceil(len / 3)`` (numbers split into short pieces);
* every CJK / kana / hangul character, punctuation mark or other symbol costs 1;
* whitespace is free.

On JSON tool payloads, URLs and mixed English/Chinese text this stays within ~15 % of
all-MiniLM-L6-v2's WordPiece count and errs high (more tokens, so the trigger fires a little
early rather than late); prose costs a few percent more than the model counts.

What a trace item costs: its tool name and its payload (the cleaned JSON, or the pointer
that replaced an offloaded one), plus the result status. The trace changes by one pair per
event and every event counts the whole trace, so :class:`TraceTokenCounter` caches the count per
item text (a bounded LRU): counting a full 10-pair trace costs at most two tokenizer calls
per event.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from context_core.errors import ConfigError

if TYPE_CHECKING:
    from context_core.session.state import SessionState, TraceItem

__all__ = [
    "TraceTokenCounter",
    "count_trace_tokens",
    "heuristic_count_tokens",
    "item_text",
    "pair_tokens",
]

_PIECES = re.compile(
    r"[A-Za-z]+"
    r"|[0-9]+"
    r"|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]"
    r"|[^\sA-Za-z0-9]"
)


def heuristic_count_tokens(text: str) -> int:
    """Approximate WordPiece token count of ``text`` (see the module doc for the rule)."""
    n = 0
    for m in _PIECES.finditer(text):
        piece = m.group(0)
        c = piece[0]
        if c.isascii() and c.isalpha():
            n += math.ceil(len(piece) / 5)
        elif c.isascii() and c.isdigit():
            n += math.ceil(len(piece) / 3)
        else:
            n += 1
    return n


def item_text(item: TraceItem) -> str:
    """The text of one trace item that counts against the budget."""
    status = f" {item.status}" if item.status else ""
    return f"{item.name}{status} {item.payload}"


class TraceTokenCounter:
    """Counts tokens with ``count_tokens`` (the model's tokenizer; None = the heuristic),
    caching the count per distinct text (LRU of ``cache_size`` entries, thread-safe)."""

    def __init__(
        self, count_tokens: Callable[[str], int] | None = None, *, cache_size: int = 4096
    ) -> None:
        if cache_size <= 0:
            raise ConfigError(f"TraceTokenCounter: cache_size must be positive, got {cache_size}")
        self.uses_model = count_tokens is not None
        self._count: Callable[[str], int] = functools.lru_cache(maxsize=cache_size)(
            count_tokens or heuristic_count_tokens
        )

    def __call__(self, text: str) -> int:
        return int(self._count(text))

    @property
    def source(self) -> str:
        """``"tokenizer"`` or ``"heuristic"``: what the counts come from (for effects)."""
        return "tokenizer" if self.uses_model else "heuristic"

    def items(self, items: Iterable[TraceItem]) -> int:
        return sum(self(item_text(i)) for i in items)

    def trace(self, state: SessionState) -> int:
        """Tokens of the whole L1 trace of ``state``."""
        return self.items(state.trace)


def pair_tokens(state: SessionState, counter: TraceTokenCounter) -> list[tuple[str, int]]:
    """``(call_id, tokens)`` per trace pair, oldest first (a pair = its call and result)."""
    order: list[str] = []
    cost: dict[str, int] = {}
    for item in state.trace:
        if item.call_id not in cost:
            cost[item.call_id] = 0
        if item.kind == "tool_call":
            order.append(item.call_id)
        cost[item.call_id] += counter(item_text(item))
    return [(cid, cost[cid]) for cid in order]


def count_trace_tokens(
    state: SessionState, count_tokens: Callable[[str], int] | TraceTokenCounter | None = None
) -> int:
    """Tokens of ``state``'s L1 trace, counted with ``count_tokens`` (a tokenizer's count
    function, a :class:`TraceTokenCounter`, or None for the heuristic)."""
    counter = (
        count_tokens
        if isinstance(count_tokens, TraceTokenCounter)
        else TraceTokenCounter(count_tokens)
    )
    return counter.trace(state)
