"""Heading-aware chunking to the embedding model's token budget.

Rules (what the property tests check):

* A chunk never holds text of two sections, and its ``text`` is at most ``max_tokens`` tokens
  counted by the model's own tokenizer (no special tokens), *including* the context line.
* Each chunk's text starts with a context line, "Page title > Heading > Subheading", then a
  newline, then the body. The line costs a few tokens but makes a lone chunk ("Replace the
  bearing when ...") findable by what it is about; the budget accounts for it.
* Bodies are cut at sentence ends (". ", "! ", "? ", "。", "！", "？", "；", and every newline,
  which the readers put between paragraphs, list items and table rows). Only a single sentence
  longer than the budget is cut inside, at a word boundary where there is one (CJK text has
  none, so it is cut between characters) -- never mid-token-window without reason.
* Overlap: a chunk repeats the tail of its predecessor in the same section, at most
  ``overlap`` tokens: whole trailing sentences when they fit, else the last words.
* Exactness: bodies are slices of ``Section.text`` (already whitespace-normalised by the
  readers). With ``(s_i, e_i) = chunk_i.char_span``: ``e_{i-1}`` is where chunk i's new text
  starts, so ``text[0:e_0] + text[e_0:e_1] + ... == Section.text`` exactly, and
  ``text[s_i:e_{i-1}]`` is the overlap. ``chunk.body == text[s_i:e_i].strip()``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

from context_core.ingest.model import Chunk, Page

__all__ = ["HFTokenizer", "TokenCounter", "chunk_page", "sentence_spans", "split_spans"]

CountFn = Callable[[str], int]

# A sentence ends after . ! ? (plus closing quotes/brackets) followed by whitespace, after CJK
# full stops (which need no following space), and at every newline.
_BOUNDARY = re.compile(
    r"[.!?]+[\"'”’)\]]*[ \t]+|[。！？；!?]+[\"'”’」』)\]]*[ \t]*|\n",
)
_SPACE = re.compile(r"\s")


class TokenCounter(Protocol):
    """What the chunker needs from a tokenizer (``embedding.Encoder`` satisfies it)."""

    def count_tokens(self, text: str) -> int: ...


class HFTokenizer:
    """tokenize/decode/count_tokens over a Hugging Face ``tokenizer.json``, no special tokens
    and no truncation (a truncating tokenizer would under-count long texts).

    Lighter than loading the whole model when only counting is needed (tests, dry runs).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._tok.no_truncation()
        self._tok.no_padding()

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> HFTokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")))

    def tokenize(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def count_tokens(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


def _counter(tokenizer: TokenCounter | CountFn) -> CountFn:
    fn = getattr(tokenizer, "count_tokens", None)
    if callable(fn):
        return cast(CountFn, fn)
    if callable(tokenizer):
        return tokenizer
    raise TypeError("tokenizer must have count_tokens(text) -> int or be such a callable")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Contiguous ``(start, end)`` spans covering ``text``; each ends after a sentence end
    (with its trailing spaces) or a newline."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        if m.end() > start:
            spans.append((start, m.end()))
            start = m.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def _hard_split(
    text: str, a: int, b: int, count: CountFn, limit: int
) -> list[tuple[int, int, int]]:
    """Cut one over-long sentence into pieces of at most ``limit`` tokens, preferring to cut
    after whitespace in the second half of a window (word boundary); CJK is cut anywhere."""
    pieces: list[tuple[int, int, int]] = []
    s = a
    while s < b:
        c = count(text[s:b])
        if c <= limit:
            pieces.append((s, b, c))
            break
        lo, hi = s + 1, b - 1  # largest e with count(text[s:e]) <= limit (lo is always kept)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[s:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        e = lo
        ws = max((m.end() for m in _SPACE.finditer(text, s + (e - s) // 2, e)), default=-1)
        if ws > s:
            e = ws
        pieces.append((s, e, count(text[s:e])))
        s = e
    return pieces


def _overlap_start(
    text: str,
    pieces: list[tuple[int, int, int]],
    first: int,
    last: int,
    count: CountFn,
    overlap: int,
) -> int:
    """Where the next chunk starts: the tail of pieces[first..last] of <= ``overlap`` tokens."""
    end = pieces[last][1]
    if overlap <= 0:
        return end
    total, k = 0, last
    while k >= first and total + pieces[k][2] <= overlap:
        total += pieces[k][2]
        k -= 1
    if k < last:  # whole sentences fit; verify exactly, dropping leading ones if needed
        for j in range(k + 1, last + 1):
            if count(text[pieces[j][0] : end]) <= overlap:
                return pieces[j][0]
        return end
    # the last sentence alone is longer than the overlap: take its last words
    a = pieces[last][0]
    lo, hi = a, end  # smallest p with count(text[p:end]) <= overlap
    while lo < hi:
        mid = (lo + hi) // 2
        if count(text[mid:end]) <= overlap:
            hi = mid
        else:
            lo = mid + 1
    p = lo
    m = _SPACE.search(text, p, end)
    if p > a and not text[p - 1].isspace() and m is not None:
        p = m.end()  # start at a word boundary
    return p if p < end and count(text[p:end]) <= overlap else end


def split_spans(
    text: str,
    tokenizer: TokenCounter | CountFn,
    *,
    max_tokens: int,
    overlap: int = 0,
    verify: bool = True,
) -> list[tuple[int, int]]:
    """Character spans of ``text`` for chunks of at most ``max_tokens`` tokens each.

    Consecutive spans overlap by at most ``overlap`` tokens; see the module docstring for the
    exact reconstruction guarantee. Chunk sizes are summed from per-sentence counts; with
    ``verify`` each chunk is re-counted whole (exact for any tokenizer, about 2x the cost).
    ``chunk_page`` passes ``verify=False`` because it counts the final text anyway.
    """
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
    if not 0 <= overlap < max_tokens:
        raise ValueError(f"overlap must be in [0, max_tokens), got {overlap}")
    count = _counter(tokenizer)
    if not text.strip():
        return []
    room = max(1, max_tokens - overlap)
    pieces: list[tuple[int, int, int]] = []
    for a, b in sentence_spans(text):
        c = count(text[a:b])
        if c <= room:
            pieces.append((a, b, c))
        else:
            pieces.extend(_hard_split(text, a, b, count, room))
    # whitespace-only pieces (a lone newline) merge into the previous piece
    merged: list[tuple[int, int, int]] = []
    for p in pieces:
        if merged and not text[p[0] : p[1]].strip():
            a, _, c = merged[-1]
            merged[-1] = (a, p[1], c + p[2])
        else:
            merged.append(p)
    pieces = merged

    spans: list[tuple[int, int]] = []
    i, prev_first = 0, -1
    while i < len(pieces):
        start = pieces[i][0]
        if prev_first >= 0:
            start = _overlap_start(text, pieces, prev_first, i - 1, count, overlap)
        est = count(text[start : pieces[i][0]]) if start < pieces[i][0] else 0
        j = i
        while j < len(pieces) and est + pieces[j][2] <= max_tokens:
            est += pieces[j][2]
            j += 1
        if j == i:  # not even one piece fits after the overlap: drop the overlap
            start, j = pieces[i][0], i + 1
        if verify:
            while j > i + 1 and count(text[start : pieces[j - 1][1]]) > max_tokens:
                j -= 1
            if count(text[start : pieces[j - 1][1]]) > max_tokens:
                start = pieces[i][0]
        spans.append((start, pieces[j - 1][1]))
        prev_first, i = i, j
    if spans and not text[spans[-1][1] :].strip():
        spans[-1] = (spans[-1][0], len(text))
    return spans


def _context_line(title: str, heading_path: tuple[str, ...], count: CountFn, cap: int) -> str:
    """ "Title > H1 > H2", shortened (headings only, last heading, nothing) to fit ``cap``."""
    candidates = [
        " > ".join((title, *heading_path)),
        " > ".join(heading_path),
        heading_path[-1] if heading_path else "",
    ]
    for c in candidates:
        c = c.strip()
        if c and count(c) <= cap:
            return c
    return ""


def chunk_page(
    page: Page,
    tokenizer: TokenCounter | CountFn,
    *,
    max_tokens: int = 256,
    overlap: int = 32,
    context_line: bool = True,
) -> list[Chunk]:
    """Split every section of ``page`` into chunks of at most ``max_tokens`` tokens.

    ``tokenizer`` is anything with ``count_tokens(text) -> int`` (``embedding.Encoder``,
    :class:`HFTokenizer`) or such a function. Note that sentence-transformers adds [CLS]/[SEP]
    around a text, so a model with a 256-token window should be given ``max_tokens=254``
    to embed every token. ``context_line=False`` leaves the heading path to the metadata only.
    """
    count = _counter(tokenizer)
    chunks: list[Chunk] = []
    for section in page.sections:
        prefix = (
            _context_line(page.title, section.heading_path, count, max(1, max_tokens // 4))
            if context_line
            else ""
        )
        head = f"{prefix}\n" if prefix else ""
        budget = max_tokens - (count(prefix) if prefix else 0)
        for _attempt in range(8):
            ov = min(overlap, budget // 2)
            built = []
            spans = split_spans(section.text, count, max_tokens=budget, overlap=ov, verify=False)
            for a, b in spans:
                body = section.text[a:b].strip()
                text = head + body
                built.append((text, count(text), (a, b)))
            excess = max((n for _, n, _ in built), default=0) - max_tokens
            if excess <= 0:
                break
            budget -= excess  # tokenizer not additive at the seam: tighten and redo
        else:  # pragma: no cover - would need a pathological tokenizer
            raise ValueError(f"cannot fit section {section.heading_path} of {page.page_id}")
        for text, n, span in built:
            chunks.append(
                Chunk(
                    page_id=page.page_id,
                    chunk_index=len(chunks),
                    heading_path=section.heading_path,
                    section=page.section,
                    text=text,
                    n_tokens=n,
                    char_span=span,
                    body_start=len(head),
                )
            )
    return chunks
