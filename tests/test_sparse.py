"""The sparse lexical encoder: tokens (Latin and Han), stable term ids, BM25 weights."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from context_core.knowledge.sparse import K1, SPARSE_ENCODER, SparseEncoder, tokenize


def test_latin_words_lower_cased_without_stop_words_and_stemmed() -> None:
    assert tokenize("The Pump's BEARING is worn, and PUMP-0042 vibrates.") == [
        "pump",
        "bear",
        "worn",
        "pump",
        "0042",
        "vibrat",
    ]


def test_snowball_folds_the_forms_of_a_word() -> None:
    forms = ["compressible", "compressibility", "compressed", "compression", "compressing"]
    assert {t for f in forms for t in tokenize(f)} == {"compress"}
    assert tokenize("pumps") == tokenize("pump") == tokenize("pumping")
    # non-ASCII words and numbers pass unstemmed; short words too
    assert tokenize("Größen 1200 gas") == ["größen", "1200", "gas"]


def test_v1_folds_plurals_only() -> None:
    assert tokenize("The Pump's BEARING is worn, and PUMP-0042 vibrates.", "v1") == [
        "pump",
        "bearing",
        "worn",
        "pump",
        "0042",
        "vibrate",
    ]
    assert tokenize("pumps bearings batteries classes status gas", "v1") == [
        "pump",
        "bearing",
        "battery",
        "classe",  # "-es" keeps its "e": a conservative stemmer, consistently applied
        "status",
        "gas",
    ]


def test_encoder_rebuilt_from_a_recorded_name() -> None:
    assert SparseEncoder().name == SPARSE_ENCODER == "bm25-crc32-v2"
    old = SparseEncoder.from_name("bm25-crc32-v1")
    assert old.name == "bm25-crc32-v1" and old.version == "v1"
    # queries are cut the way the recorded version cut its documents
    assert old.encode_query("bearings") == old.encode_query("bearing")
    assert SparseEncoder().encode_query("bearing") != old.encode_query("bearing")
    tuned = SparseEncoder.from_name("bm25-crc32-v2:0.9,0.5,100.0")
    assert (tuned.k1, tuned.b, tuned.avg_len, tuned.version) == (0.9, 0.5, 100.0, "v2")
    assert tuned.name == "bm25-crc32-v2:0.9,0.5,100.0"
    for bad in ("bm25-crc32-v9", "splade-v3", "bm25-crc32-v1:1,2"):
        with pytest.raises(ValueError, match="re-ingest"):
            SparseEncoder.from_name(bad)
    with pytest.raises(ValueError, match="version"):
        SparseEncoder(version="v7")


def test_han_text_gives_unigrams_and_bigrams() -> None:
    assert tokenize("泵振动") == ["泵", "振", "动", "泵振", "振动"]
    # mixed text: each script by its own rule; full-width forms are normalised (NFKC)
    assert tokenize("ＰＵＭＰ泵的振动 check") == [
        "pump",
        "泵",
        "的",
        "振",
        "动",
        "泵的",
        "的振",
        "振动",
        "check",
    ]


def test_japanese_kana_is_cut_like_han() -> None:
    assert tokenize("ポンプ") == ["ポ", "ン", "プ", "ポン", "ンプ"]


def test_nothing_to_index() -> None:
    enc = SparseEncoder()
    assert tokenize("") == [] and tokenize("the of and ...") == []
    (doc,) = enc.encode_documents(["   "])
    assert len(doc) == 0
    assert len(enc.encode_query("the and")) == 0


def test_vectors_are_sorted_unique_uint32() -> None:
    enc = SparseEncoder()
    (doc,) = enc.encode_documents(["pump pump bearing 泵的振动 pump seal seal"])
    assert list(doc.indices) == sorted(set(doc.indices))
    assert all(0 <= i < 2**32 for i in doc.indices)
    assert all(v > 0 for v in doc.values)
    q = enc.encode_query("pump bearing pump")
    assert len(q) == 2 and q.values == (1.0, 1.0)
    assert set(q.indices) <= set(doc.indices)


def test_term_ids_are_stable_across_processes() -> None:
    """Python's hash() is salted per process; the ids must not be."""
    code = (
        "from context_core.knowledge.sparse import SparseEncoder;"
        "print(list(SparseEncoder().encode_query('pump bearing 泵振动').indices))"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
        ).stdout.strip()
        for seed in (1, 2)
    }
    assert runs == {str(list(SparseEncoder().encode_query("pump bearing 泵振动").indices))}


def test_bm25_term_frequency_saturates() -> None:
    enc = SparseEncoder(avg_len=10.0)
    weights = []
    for tf in (1, 2, 3, 4, 60):
        # same document length each time: only the term frequency changes
        text = " ".join(["pump"] * tf + ["filler"] * (64 - tf))
        (doc,) = enc.encode_documents([text])
        pump = enc.encode_query("pump").indices[0]
        weights.append(dict(zip(doc.indices, doc.values, strict=True))[pump])
    assert weights == sorted(weights)  # more occurrences weigh more ...
    assert weights[-1] < K1 + 1  # ... but never more than k1 + 1
    gains = [b - a for a, b in itertools.pairwise(weights)]
    assert gains[0] > gains[1]  # with diminishing returns


def test_bm25_longer_documents_weigh_each_term_less() -> None:
    enc = SparseEncoder()
    pump = enc.encode_query("pump").indices[0]
    short, long = enc.encode_documents(["pump seal", "pump " + " ".join(["seal"] * 300)])
    w_short = dict(zip(short.indices, short.values, strict=True))[pump]
    w_long = dict(zip(long.indices, long.values, strict=True))[pump]
    assert w_short > w_long
    # exact BM25 document weight at len == avg_len, tf == 1: (k1 + 1) / (1 + k1) == 1
    enc2 = SparseEncoder(avg_len=2.0)
    (doc,) = enc2.encode_documents(["pump seal"])
    assert dict(zip(doc.indices, doc.values, strict=True))[pump] == pytest.approx(1.0)


def test_deterministic_and_named() -> None:
    a, b = SparseEncoder(), SparseEncoder()
    text = "Replace the pump seal; 更换泵的密封件"
    assert a.encode_documents([text]) == b.encode_documents([text])
    assert a.name == SPARSE_ENCODER
    assert SparseEncoder(k1=1.5).name != SPARSE_ENCODER  # other weights, other record
    with pytest.raises(ValueError, match="BM25"):
        SparseEncoder(b=2.0)


def test_query_length_counts_terms() -> None:
    assert SparseEncoder.query_length("What is the pump vibration limit?") == 3
    assert SparseEncoder.query_length("泵振动") == 5
