"""Delta recall: a bundle as what changed since a bundle the client already holds.

An agent re-sends its context to its LLM at every step; most fragments are the ones it got
the step before. ``router.route(..., delta=True, since_bundle=<id>)`` (``"delta": true,
"since_bundle": ...`` on ``POST /v1/context``) returns the same bundle as a delta: new or
changed fragments in full, unchanged ones by reference (id + hash, no content), and the ids
that left. A new or changed fragment carries its ``hash`` and ``pos``; a reference is
``{id, hash, layer, freshness_hours, pos}``.

**Fragment id and hash.** A fragment's id is its ``source`` (``L1:session.<field>``,
``L2:<key>``, ``L3:<collection>:<point id>``, ``NS:<key>``): stable across routes, and
already what the output cites. A second fragment with the same source in one bundle (none
of the built-in intents makes one) gets ``#2``, ``#3`` ... (:func:`fragment_ids`). Its hash
(:func:`fragment_hash`) is 64 bits of BLAKE2b over the canonical JSON (sorted keys, compact)
of every wire field but ``freshness_hours``: the age of a value moves with the clock on
every route, so it is not a change of content; a reference carries the current age instead.

**Which base: the client says (``since_bundle``).** The server keeps, per session, the
manifests (``[id, hash]`` per fragment, never content) of the session's last
:data:`DEFAULT_KEEP` bundles routed with ``delta``, whatever their intent, in one Redis Hash
``wm:{<sid>}:bundles:recent`` (the session's hash tag, so one Cluster slot; listed in the
session's key index, so closing or timing out the session deletes it; it lives
``CTX_WM_CONTRACT_TTL_S`` from the session's last delta route, as the contract lives from the
last activity). A delta is computed against the bundle the client names, not "the last one
the server sent": two concurrent steps of one session, a lost response or responses applied
out of order then still give exact bundles, since each delta names its base and the client
applies it to that base. Per session rather than per intent: the client picks its base, so
it can diff against the previous step whatever its intent (the L1 fields and the task
contract are shared by most intents), or against the last bundle of the same intent.

One route with delta adds one script call (:data:`BUNDLE_LOG_LUA`: read the base's manifest,
append the new one, drop the one :data:`DEFAULT_KEEP` back, re-expire, list the key) and a
hash per fragment. Bundle ids are ``<seq>.<nonce>``: the log's counter and 32 random bits,
so after the log expired (and its counter restarted) an old id does not match a new entry.
No base asked for, an unknown, evicted or expired base: the answer is the full bundle
(``full: true``, every fragment in ``fragments``) with a ``bundle_id`` to continue from.

**Applying a delta** (client side, :func:`apply_delta`, or :class:`BundleMirror` for a client
that keeps its last few bundles): sort ``fragments`` and ``unchanged`` by ``pos``; replace
each reference by the base's fragment of that id (checked against the reference's hash;
:class:`DeltaMismatchError` when the client holds another version: ask again without
``since_bundle``) with the reference's ``freshness_hours``. The result equals, field for
field and in order, the bundle the same route returns without delta.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from context_core.errors import BackendUnavailableError
from context_core.redis.connection import REDIS_ERRORS
from context_core.redis.ops import call
from context_core.routing.bundle_delta import BundleDelta, delta_wire
from context_core.working_memory.index import INDEX_ADD_LUA
from context_core.working_memory.keys import bundle_log_key, index_key, session_prefix

if TYPE_CHECKING:
    from context_core.routing.bundle import Fragment

__all__ = [
    "BUNDLE_LOG_LUA",
    "DEFAULT_KEEP",
    "DELTA_ONLY",
    "BundleDelta",
    "BundleLog",
    "BundleMirror",
    "DeltaMismatchError",
    "apply_delta",
    "delta_wire",
    "fragment_hash",
    "fragment_ids",
    "log_key",
]

#: Manifests kept per session: how far back (in delta routes) a client's base may be.
DEFAULT_KEEP = 8
#: Wire fields of a delta fragment (or reference) that are not fragment fields.
DELTA_ONLY = ("id", "hash", "pos")
_BUNDLE_ID = re.compile(r"^([0-9]{1,12})\.([0-9a-f]{8})$")


class DeltaMismatchError(ValueError):
    """The client does not hold the delta's base (or holds another version of a fragment
    it references): route again without ``since_bundle`` for a full bundle."""


def _hook(obj: Any) -> Any:
    tolist = getattr(obj, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return tolist()
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=str)
    isoformat = getattr(obj, "isoformat", None)  # dates, as the service's fallback writes them
    return isoformat() if callable(isoformat) else str(obj)


_CANON = msgspec.json.Encoder(enc_hook=_hook, order="sorted")


def fragment_hash(fragment: Mapping[str, Any]) -> str:
    """16 hex digits of BLAKE2b over the canonical JSON of a wire fragment's fields, all but
    ``freshness_hours`` (and the delta-only ``id``/``hash``/``pos``)."""
    body = {k: v for k, v in fragment.items() if k != "freshness_hours" and k not in DELTA_ONLY}
    return hashlib.blake2b(_CANON.encode(body), digest_size=8).hexdigest()


def fragment_ids(sources: Sequence[str]) -> list[str]:
    """The fragment ids of a bundle, from its fragments' sources in order."""
    seen: dict[str, int] = {}
    out: list[str] = []
    for s in sources:
        n = seen.get(s, 0) + 1
        seen[s] = n
        out.append(s if n == 1 else f"{s}#{n}")
    return out


def log_key(session_id: str) -> str:
    """``wm:{<sid>}:bundles:recent``: the session's bundle log (a Hash)."""
    return bundle_log_key(session_id)


# KEYS: 1 the log Hash, 2 the session's key index.  ARGV: 1 base seq ('' = none), 2 the new
# manifest (JSON), 3 manifests kept, 4 ttl seconds.  Returns {new seq, base manifest or ''}.
BUNDLE_LOG_LUA = (
    INDEX_ADD_LUA
    + """
local base = ''
if ARGV[1] ~= '' then base = redis.call('HGET', KEYS[1], 'm:' .. ARGV[1]) or '' end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'm:' .. seq, ARGV[2])
local old = seq - tonumber(ARGV[3])
if old > 0 then redis.call('HDEL', KEYS[1], 'm:' .. old) end
redis.call('EXPIRE', KEYS[1], ARGV[4])
index_add(KEYS[2], tonumber(ARGV[4]), KEYS[1])
return {seq, base}
"""
)

_MANIFEST = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()


class BundleLog:
    """The server's side: each session's recent bundle manifests in Redis (see the module
    doc). Thread-safe (stateless beyond the registered script)."""

    def __init__(
        self,
        client: Any,
        *,
        ttl_s: int,
        keep: int = DEFAULT_KEEP,
        min_replicas: int = 0,
        wait_ms: int = 100,
    ) -> None:
        if keep < 1 or ttl_s < 1:
            raise ValueError(f"BundleLog: keep and ttl_s must be positive, got {keep}, {ttl_s}")
        self._client = client
        self._script = client.register_script(BUNDLE_LOG_LUA)
        self.ttl_s = int(ttl_s)
        self.keep = int(keep)
        self._min_replicas = min_replicas
        self._wait_ms = wait_ms

    def record(
        self,
        session_id: str,
        intent: str,
        fragments: Sequence[Fragment],
        since_bundle: str | None,
    ) -> BundleDelta:
        """Log this bundle's manifest and diff it against ``since_bundle``'s (one script
        call). An unknown, malformed, evicted or expired base gives a full delta."""
        wires = [f.to_dict() for f in fragments]
        ids = fragment_ids([f.source for f in fragments])
        hashes = [fragment_hash(w) for w in wires]
        nonce = secrets.token_hex(4)
        manifest = _MANIFEST.encode(
            {"n": nonce, "i": intent, "f": list(zip(ids, hashes, strict=True))}
        )
        m = _BUNDLE_ID.fullmatch(since_bundle or "")
        key = log_key(session_id)
        try:
            seq, raw = call(
                self._client,
                self._script,
                [key, index_key(session_prefix(session_id))],
                [m.group(1) if m else "", manifest, self.keep, self.ttl_s],
                durable=True,
                min_replicas=self._min_replicas,
                wait_ms=self._wait_ms,
            )
        except REDIS_ERRORS as e:
            raise BackendUnavailableError(f"Redis failed while logging bundle {key}: {e}") from e
        bundle_id = f"{int(seq)}.{nonce}"
        base: dict[str, str] | None = None
        if m is not None and raw:
            doc = _DECODE.decode(raw)
            if doc.get("n") == m.group(2):
                base = {str(i): str(h) for i, h in doc.get("f", [])}
        if base is None:
            return BundleDelta(bundle_id, None, tuple(ids), tuple(hashes), (False,) * len(ids), ())
        kept = set(ids)
        return BundleDelta(
            bundle_id,
            since_bundle,
            tuple(ids),
            tuple(hashes),
            tuple(base.get(i) == h for i, h in zip(ids, hashes, strict=True)),
            tuple(i for i in base if i not in kept),
        )


# --- the client's side ------------------------------------------------------------------------


def apply_delta(
    base: Sequence[Mapping[str, Any]] | None, delta: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The full bundle's fragments (wire dicts, in order) from the base bundle's fragments
    (``None`` for a ``full`` delta; a full delta's ``fragments`` will do) and a delta wire
    answer.

    Raises :class:`DeltaMismatchError` when a referenced fragment is not in ``base`` or has
    another hash there (the client holds another bundle than the delta's base)."""
    held: dict[str, Mapping[str, Any]] = {}
    if not delta["full"]:
        if base is None:
            raise DeltaMismatchError(f"delta against {delta['base_bundle_id']}: no base held")
        held = dict(zip(fragment_ids([f["source"] for f in base]), base, strict=True))
    n = len(delta["fragments"]) + len(delta["unchanged"])
    out: list[dict[str, Any] | None] = [None] * n
    for f in delta["fragments"]:
        out[f["pos"]] = {k: v for k, v in f.items() if k not in DELTA_ONLY}
    for ref in delta["unchanged"]:
        frag = held.get(ref["id"])
        if frag is None or fragment_hash(frag) != ref["hash"]:
            raise DeltaMismatchError(
                f"fragment {ref['id']!r} of base {delta['base_bundle_id']} is not held "
                "(or differs): route again without since_bundle"
            )
        out[ref["pos"]] = {
            **{k: v for k, v in frag.items() if k not in DELTA_ONLY},
            "freshness_hours": ref["freshness_hours"],
        }
    if any(f is None for f in out):
        raise DeltaMismatchError("delta positions are not 0..n-1")
    return [f for f in out if f is not None]


class BundleMirror:
    """A client's last ``keep`` bundles (fragments by bundle id), to apply deltas to in any
    order. :attr:`last_id` is what to send as ``since_bundle`` next."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        self.keep = keep
        self._held: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.last_id: str | None = None

    def apply(self, delta: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The full fragments of a delta answer, remembered under its ``bundle_id``."""
        base = None if delta["full"] else self._held.get(str(delta["base_bundle_id"]))
        frags = apply_delta(base, delta)
        bid = str(delta["bundle_id"])
        self._held[bid] = frags
        self._held.move_to_end(bid)
        while len(self._held) > self.keep:
            self._held.popitem(last=False)
        self.last_id = bid
        return frags

    def forget(self) -> None:
        """Drop every held bundle (the next route should go without ``since_bundle``)."""
        self._held.clear()
        self.last_id = None
