"""The encoder with the real packaged MiniLM model and a real Redis for the query cache."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
import redis

from context_core.config import Settings, get_settings
from context_core.errors import ConfigError, ModelLoadError
from context_core.knowledge.embedding import MODEL_REGISTRY, Encoder, load_encoder


class CountingEncoder(Encoder):
    """A real encoder that counts how often the model itself runs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.model_calls = 0

    def _encode_raw(self, texts: list[str], batch_size: int, show_progress: bool) -> np.ndarray:
        self.model_calls += 1
        return super()._encode_raw(texts, batch_size, show_progress)


def test_minilm_shape_and_normalisation(encoder: Encoder) -> None:
    assert (encoder.name, encoder.dim, encoder.max_tokens) == ("minilm", 384, 256)
    vecs = encoder.encode(["pump bearing temperature", "fan vibration limits", "x"], batch_size=2)
    assert vecs.shape == (3, 384)
    assert vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert encoder.encode([]).shape == (0, 384)


def test_similar_sentences_score_higher(encoder: Encoder) -> None:
    a, b, c = encoder.encode(
        [
            "How do I replace the seal on a centrifugal pump?",
            "Steps to change a centrifugal pump's mechanical seal",
            "The quarterly sales report is due on Friday.",
        ]
    )
    similar, unrelated = float(a @ b), float(a @ c)
    assert similar > 0.6
    assert unrelated < 0.2
    assert similar > unrelated + 0.4


def test_tokenizer_counts_real_tokens(encoder: Encoder) -> None:
    text = "Compressor COMP-0042 tripped on high discharge temperature."
    ids = encoder.tokenize(text)
    expected = encoder.model.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == expected
    assert encoder.count_tokens(text) == len(expected) > 8
    # decode is lossy for WordPiece ("comp-0042" -> "comp - 0042") but stable under re-encoding
    assert encoder.tokenize(encoder.decode(ids)) == ids
    spans = encoder.token_offsets(text)
    assert len(spans) == len(ids)
    assert "".join(text[a:b] for a, b in spans[:4]) == "CompressorCOMP-"  # exact original slices
    assert text[spans[-1][0] :] == "."
    long_text = "vibration " * 1000
    assert encoder.count_tokens(long_text) == 1000  # no truncation, no special tokens


def test_tokenize_uses_a_plain_copy_of_the_rust_backend_with_the_wrappers_ids(
    encoder: Encoder,
) -> None:
    """MiniLM's backend truncates and pads to 128 tokens; the encoder counts with a copy that
    does neither (a third of the wrapper's CPU; the L1 budget counts every event), and the
    model's own backend is left as it was."""
    own = encoder.model.tokenizer.backend_tokenizer
    assert encoder._backend is not None and encoder._backend is not own
    assert encoder._backend.truncation is None and encoder._backend.padding is None
    texts = [
        "Why is the pump vibrating?",
        "RMS 4.2 mm/s at 2026-12-01T10:00:00Z " * 200,  # far over the 128-token window
        "泵的振动 温度 123.45 ok",
        '{"device": "PUMP-0042", "rms_mm_s": 4.2, "status": "running"}',
        "",
    ]
    for text in texts:
        wrapper = list(encoder.model.tokenizer(text, add_special_tokens=False)["input_ids"])
        assert encoder.tokenize(text) == wrapper, text[:40]


def test_token_counts_are_not_cut_by_the_models_window_after_it_embedded_text() -> None:
    """The model's backend is reconfigured by each wrapper call: a plain call leaves it
    without truncation, an embedding sets the 128-token window again. An encoder made on a
    model in the first state (as a second service in one process is, on the cached model)
    used to count with that very backend, so after the next embedding every long tool
    result counted 128 tokens and the L1 budget never overflowed."""
    from sentence_transformers import SentenceTransformer

    spec = MODEL_REGISTRY["minilm"]
    model = SentenceTransformer(str(spec.resolve()), device="cpu")
    model.tokenizer("warm", add_special_tokens=False)  # leaves the backend untruncated
    assert model.tokenizer.backend_tokenizer.truncation is None
    fresh = Encoder(spec, model)
    long_text = " ".join(str(i % 10) for i in range(800))
    assert fresh.count_tokens(long_text) == 800
    fresh.encode_query(long_text)  # the model truncates its own input to its window
    assert fresh.model.tokenizer.backend_tokenizer.truncation is not None
    assert fresh.count_tokens(long_text) == 800


def test_query_cache_in_redis(encoder: Encoder, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)  # bytes in, bytes out
    counting = CountingEncoder(MODEL_REGISTRY["minilm"], encoder.model, redis_client=client)
    text = f"pump seal leak procedure {uuid.uuid4().hex}"
    key = counting.cache_key(text)
    assert key.startswith("embcache:minilm:") and len(key.rsplit(":", 1)[1]) == 64
    try:
        assert client.exists(key) == 0
        first = counting.encode_query(text)
        assert counting.model_calls == 1
        counting.flush_cache_writes()  # written by the writer thread, after the answer
        assert client.exists(key) == 1
        assert 86_000 <= client.ttl(key) <= 86_400
        raw = client.get(key)
        assert isinstance(raw, bytes) and len(raw) == 384 * 4
        assert np.array_equal(np.frombuffer(raw, dtype=np.float32), first)

        second = counting.encode_query(text)
        assert counting.model_calls == 1  # served from this process's recent vectors
        assert np.array_equal(first, second)
        assert np.allclose(first, encoder.encode([text])[0], atol=1e-6)

        # another process (a fresh encoder) has no recent vectors: Redis serves it
        other = CountingEncoder(MODEL_REGISTRY["minilm"], encoder.model, redis_client=client)
        client.set(key, (first * 2).astype(np.float32).tobytes(), ex=60)  # mark Redis's copy
        assert np.array_equal(other.encode_query(text), first * 2)
        assert other.model_calls == 0
        assert np.array_equal(counting.encode_query(text), first)  # the local copy answered
    finally:
        client.delete(key)
        client.close()


def test_cache_client_must_return_bytes(settings: Settings, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigError, match="decode_responses=False"):
            load_encoder(settings, redis_client=client)
    finally:
        client.close()


def test_unknown_model_name_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        load_encoder(get_settings(data_dir=tmp_path, embed_model="no-such-model"))
    msg = str(err.value)
    assert "CTX_EMBED_MODEL='no-such-model'" in msg
    assert "pre-download" in msg and "local sentence-transformers directory" in msg
    assert "bge-m3" in msg and "minilm" in msg


def test_uncached_hub_model_fails_offline(tmp_path: Path) -> None:
    cached = Path.home() / ".cache" / "huggingface" / "hub" / "models--BAAI--bge-m3"
    if cached.exists():
        pytest.skip(f"bge-m3 is in the local HF cache ({cached}); nothing to fail on")
    with pytest.raises(ModelLoadError, match=r"'bge-m3' \(BAAI/bge-m3\) could not be loaded"):
        load_encoder(get_settings(data_dir=tmp_path, embed_model="bge-m3"))


def test_local_directory_model(tmp_path: Path, encoder: Encoder) -> None:
    path = MODEL_REGISTRY["minilm"].resolve()
    enc = load_encoder(get_settings(data_dir=tmp_path, embed_model=path))
    assert enc.name == str(Path(path).resolve())
    assert enc.dim == 384
    assert np.allclose(enc.encode(["same text"]), encoder.encode(["same text"]), atol=1e-6)


def test_cache_writes_are_bounded_and_never_fail_the_caller(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At most MAX_PENDING_CACHE_WRITES writes wait for the writer thread; more are dropped,
    and a write that raises is logged, not raised."""
    import threading

    from context_core.knowledge import embedding

    monkeypatch.setattr(embedding, "MAX_PENDING_CACHE_WRITES", 2)
    writer = embedding._CacheWriter()
    gate, done = threading.Event(), []

    def slow(n: int) -> None:
        gate.wait(10)
        done.append(n)

    def broken() -> None:
        raise ConnectionError("redis went away")

    # one write in the thread's hands, at most two waiting: the next one is refused
    accepted = [writer.submit(slow, n) for n in range(1, 6)]
    taken = accepted.index(False)
    assert 2 <= taken <= 3 and not any(accepted[taken:]), accepted
    gate.set()
    writer.flush(10)
    assert done == list(range(1, taken + 1))
    assert writer.submit(broken)  # room again
    writer.flush(10)
    assert "embedding cache write failed" in caplog.text


def test_a_forked_child_writes_the_cache_with_a_thread_of_its_own(tmp_path: Path) -> None:
    """The writer thread does not survive a fork (Airflow and uvicorn fork workers): the
    child's first write starts its own, so its cache writes are not silently queued forever."""
    import os

    from context_core.knowledge import embedding

    mark = tmp_path / "written"
    embedding._CACHE_WRITES.submit(lambda: None)  # the parent's thread is running
    embedding._CACHE_WRITES.flush(10)
    pid = os.fork()
    if pid == 0:  # the child: write, flush, exit with the outcome
        ok = embedding._CACHE_WRITES.submit(mark.write_text, "child")
        embedding._CACHE_WRITES.flush(10)
        os._exit(0 if ok and mark.exists() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert mark.read_text() == "child"
