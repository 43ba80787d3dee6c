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
  English stop-word list and single letters (the "s" of "pump's") are dropped and ASCII words
  are reduced to their stem by the Snowball English stemmer (Porter 2: "compressible",
  "compressibility" -> "compress"), so a query finds the other forms of its words;
* Han, kana: each character and each pair of adjacent characters (unigrams + bigrams: Chinese
  has no spaces, and bigrams are the usual word approximation for it).

**Versions.** The tokenizer is part of a collection's identity: a query must be cut into terms
the same way as the documents were. ``bm25-crc32-v2`` (the default) stems with Snowball;
``bm25-crc32-v1`` (collections written before it) folds plurals only. A collection records
the name of the encoder that wrote it and :meth:`SparseEncoder.from_name` rebuilds that one, so
an older collection keeps answering with its own tokenizer until it is re-ingested. On
Cranfield the stemmer lifts sparse recall@10 from 0.391 to 0.392 and nDCG@10 from 0.362 to
0.368 (one run, brute force over the same chunks); its gain is in hybrid (0.451 -> 0.457).

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
from collections.abc import Callable, Sequence

import snowballstemmer

from context_core.knowledge.store import SparseVector

__all__ = ["SPARSE_ENCODER", "VERSIONS", "SparseEncoder", "tokenize"]

#: The name collections record for vectors made by :class:`SparseEncoder` with its defaults.
SPARSE_ENCODER = "bm25-crc32-v2"
#: Every tokenizer version :meth:`SparseEncoder.from_name` can rebuild: v1 folds plurals, v2
#: stems with Snowball English.
VERSIONS = ("v1", "v2")
_NAME = re.compile(r"^bm25-crc32-(v[0-9]+)(?::([0-9.eE+-]+),([0-9.eE+-]+),([0-9.eE+-]+))?$")

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


def _plural(word: str) -> str:
    """v1: fold English plurals (a conservative "S-stemmer"); other words pass unchanged."""
    if len(word) <= 3 or not word.isascii() or not word.isalpha():
        return word
    if word.endswith("ies") and not word.endswith(("eies", "aies")):
        return word[:-3] + "y"
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith("s") and not word.endswith(("us", "ss")):
        return word[:-1]
    return word


_SNOWBALL = snowballstemmer.stemmer("english")


@functools.lru_cache(maxsize=1 << 16)  # a corpus has ~10^4-10^5 distinct words
def _snowball(word: str) -> str:
    """v2: the Snowball English stem of an ASCII word; other words pass unchanged."""
    if len(word) <= 3 or not word.isascii() or not word.isalpha():
        return word
    return str(_SNOWBALL.stemWord(word))


_STEMMERS: dict[str, Callable[[str], str]] = {"v1": _plural, "v2": _snowball}


def tokenize(text: str, version: str = "v2") -> list[str]:
    """The terms of ``text`` in order (see the module doc); empty for no content."""
    stem = _STEMMERS[version]
    out: list[str] = []
    for m in _TOKENS.finditer(unicodedata.normalize("NFKC", text).lower()):
        han, word = m.group(1), m.group(2)
        if han:
            out.extend(han)
            out.extend(han[i : i + 2] for i in range(len(han) - 1))
        elif word not in _STOP and (len(word) > 1 or word.isdigit()):
            out.append(stem(word))
    return out


def _term_id(term: str) -> int:
    return zlib.crc32(term.encode("utf-8"))


@functools.lru_cache(maxsize=4096)  # the router asks the same step queries again and again
def _query_vector(text: str, version: str) -> SparseVector:
    ids = sorted({_term_id(t) for t in tokenize(text, version)})
    return SparseVector(tuple(ids), (1.0,) * len(ids))


class SparseEncoder:
    """Texts -> :class:`SparseVector` of BM25 document weights (or unit query weights)."""

    def __init__(
        self, *, k1: float = K1, b: float = B, avg_len: float = AVG_LEN, version: str = "v2"
    ) -> None:
        if k1 < 0 or not 0.0 <= b <= 1.0 or avg_len <= 0:
            raise ValueError(f"BM25 needs k1 >= 0, 0 <= b <= 1, avg_len > 0: {k1}, {b}, {avg_len}")
        if version not in VERSIONS:
            raise ValueError(f"unknown sparse tokenizer version {version!r}; use one of {VERSIONS}")
        self.k1, self.b, self.avg_len, self.version = k1, b, avg_len, version
        base = f"bm25-crc32-{version}"
        defaults = (k1, b, avg_len) == (K1, B, AVG_LEN)
        self.name = base if defaults else f"{base}:{k1},{b},{avg_len}"

    @classmethod
    def from_name(cls, name: str) -> SparseEncoder:
        """The encoder a collection recorded (``bm25-crc32-v1``, ``bm25-crc32-v2:1.2,0.75,120``
        ...): queries against it must be cut into terms the way its documents were."""
        m = _NAME.match(name.strip())
        if m is None or m.group(1) not in VERSIONS:
            raise ValueError(
                f"unknown sparse encoder {name!r}: this version reads bm25-crc32-<version> "
                f"with version one of {VERSIONS}; re-ingest the collection to rewrite it"
            )
        if m.group(2) is None:
            return cls(version=m.group(1))
        k1, b, avg = (float(m.group(i)) for i in (2, 3, 4))
        return cls(k1=k1, b=b, avg_len=avg, version=m.group(1))

    def __repr__(self) -> str:
        return f"SparseEncoder(name={self.name!r})"

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        return [self._document(t) for t in texts]

    def _document(self, text: str) -> SparseVector:
        terms = tokenize(text, self.version)
        if not terms:
            return SparseVector((), ())
        tf: Counter[int] = Counter(_term_id(t) for t in terms)
        norm = self.k1 * (1.0 - self.b + self.b * len(terms) / self.avg_len)
        ids = sorted(tf)
        return SparseVector(
            tuple(ids), tuple(tf[i] * (self.k1 + 1.0) / (tf[i] + norm) for i in ids)
        )

    def encode_query(self, text: str) -> SparseVector:
        """Each distinct query term with weight 1 (Qdrant applies the IDF); cached."""
        return _query_vector(text, self.version)

    @staticmethod
    def query_length(text: str) -> int:
        """Terms in the query (stop words dropped; Han unigrams and bigrams both count; the
        same count in every version)."""
        return len(tokenize(text))
