"""Sparse lexical vectors for L3: BM25 term weights, the IDF left to Qdrant.

Dense embeddings of a small model separate relevant from irrelevant chunks only weakly; exact
terms (part numbers, error codes, the words of a procedure title) are what a lexical match is
good at. Each chunk therefore also carries a sparse vector, and the collection's sparse vector
has Qdrant's ``Modifier.IDF``: the engine multiplies each query term by its inverse document
frequency over the collection at query time, so the document side holds only the BM25
term-frequency part::

    w(t, d) = tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avg_len))

(saturating in ``tf``, normalised by the document's length), and a query term weighs 1.
``score(q, d) = sum over shared terms of idf(t) * w(t, d)``, i.e. BM25.

Tokens (no model needed, so the router encodes a query in microseconds and the ids do not
depend on the embedding model):

* Latin and other space-separated scripts: NFKC, lower case, runs of letters/digits; a short
  English stop-word list and single letters (the "s" of "pump's") are dropped and a light
  plural stemmer (``-ies`` -> ``-y``, ``-es`` -> ``-e``, ``-s``) folds plurals;
* Han, kana: each character and each pair of adjacent characters (unigrams + bigrams: Chinese
  has no spaces, and bigrams are the usual word approximation for it).

A term's id is the CRC-32 of its UTF-8 bytes: stable across processes, machines and Python
versions (``hash()`` is salted per process), in the uint32 range Qdrant takes. Collisions of
two terms in 2^32 ids merge their weights; at corpus vocabularies (~10^5-10^6 terms) that
touches a handful of rare terms.

bge-m3 has its own learned sparse head (``sparse_linear.pt`` next to the weights, loaded by
FlagEmbedding, not by sentence-transformers). That head is not on this machine (the model is
not in the local Hugging Face cache, FlagEmbedding is not installed), so every model uses this
encoder; :data:`SPARSE_ENCODER` is the name collections record, so vectors from another sparse
encoder are never mixed into the same collection.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Sequence

from context_core.knowledge.store import SparseVector

__all__ = ["SPARSE_ENCODER", "SparseEncoder", "tokenize"]

#: The name collections record for vectors made by :class:`SparseEncoder` with its defaults.
SPARSE_ENCODER = "bm25-crc32-v1"

K1 = 1.2
B = 0.75
# Typical length of an ingested chunk in this tokenizer's terms (256 model tokens, minus stop
# words); only the ratio len(d) / avg_len matters.
AVG_LEN = 120.0

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKENS = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")

# Function words that carry no topic; kept short on purpose (IDF already damps the rest).
_STOP_WORDS = """a about above after again against all am an and any are as at be because been
    before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers him his how i if in into is it its itself me
    more most my no nor not of off on once only or other our ours out over own same she should
    so some such than that the their theirs them then there these they this those through to
    too under until up very was we were what when where which while who whom why will with
    would you your yours"""
_STOP = frozenset(_STOP_WORDS.split())


def _stem(word: str) -> str:
    """Fold English plurals (a conservative "S-stemmer"); other words pass unchanged."""
    if len(word) <= 3 or not word.isascii() or not word.isalpha():
        return word
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """The terms of ``text`` in order (see the module doc); empty for no content."""
    out: list[str] = []
    for m in _TOKENS.finditer(unicodedata.normalize("NFKC", text).lower()):
        han, word = m.group(1), m.group(2)
        if han:
            out.extend(han)
            out.extend(han[i : i + 2] for i in range(len(han) - 1))
        elif word not in _STOP and (len(word) > 1 or word.isdigit()):
            out.append(_stem(word))
    return out


def _term_id(term: str) -> int:
    return zlib.crc32(term.encode("utf-8"))


@functools.lru_cache(maxsize=4096)  # the router asks the same step queries again and again
def _query_vector(text: str) -> SparseVector:
    ids = sorted({_term_id(t) for t in tokenize(text)})
    return SparseVector(tuple(ids), (1.0,) * len(ids))


class SparseEncoder:
    """Texts -> :class:`SparseVector` of BM25 document weights (or unit query weights)."""

    def __init__(self, *, k1: float = K1, b: float = B, avg_len: float = AVG_LEN) -> None:
        if k1 < 0 or not 0.0 <= b <= 1.0 or avg_len <= 0:
            raise ValueError(f"BM25 needs k1 >= 0, 0 <= b <= 1, avg_len > 0: {k1}, {b}, {avg_len}")
        self.k1, self.b, self.avg_len = k1, b, avg_len
        defaults = (k1, b, avg_len) == (K1, B, AVG_LEN)
        self.name = SPARSE_ENCODER if defaults else f"{SPARSE_ENCODER}:{k1},{b},{avg_len}"

    def __repr__(self) -> str:
        return f"SparseEncoder(name={self.name!r})"

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        return [self._document(t) for t in texts]

    def _document(self, text: str) -> SparseVector:
        terms = tokenize(text)
        if not terms:
            return SparseVector((), ())
        tf: Counter[int] = Counter(_term_id(t) for t in terms)
        norm = self.k1 * (1.0 - self.b + self.b * len(terms) / self.avg_len)
        ids = sorted(tf)
        return SparseVector(
            tuple(ids), tuple(tf[i] * (self.k1 + 1.0) / (tf[i] + norm) for i in ids)
        )

    @staticmethod
    def encode_query(text: str) -> SparseVector:
        """Each distinct query term with weight 1 (Qdrant applies the IDF); cached."""
        return _query_vector(text)

    @staticmethod
    def query_length(text: str) -> int:
        """Terms in the query (stop words dropped; Han unigrams and bigrams both count)."""
        return len(tokenize(text))
