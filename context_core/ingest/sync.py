"""Refresh L3 straight from a Confluence site: incremental, exact, and polite.

:func:`sync_confluence` runs per space:

1. **list** the space's current pages with their versions, no bodies (Cloud: v2
   ``/api/v2/spaces?keys=`` then ``/api/v2/spaces/{id}/pages?status=current``; Data Center:
   v1 ``/rest/api/content/search`` with CQL, ``expand=version``), following ``_links.next``;
2. **fetch** the bodies of the pages whose version differs from the cursor's (or that the
   collection lacks): one v1 CQL search of the pages modified since the cursor (all pages on a
   first run), then one ``/rest/api/content/{id}`` per page it did not return;
3. **attachments** of the fetched pages (v2 ``/pages/{id}/attachments`` or v1
   ``/child/attachment``): an attachment whose version the cursor holds is not fetched again;
   a new one is streamed within ``CTX_UPLOAD_MAX_BYTES`` and goes through the upload checks
   (:func:`~context_core.ingest.upload.check_file`: type, ClamAV, extraction, blocked
   keywords, redaction). Skipped ones are counted by reason;
4. **plan** with :func:`~context_core.ingest.refresh_plan.plan_pages`: the same quarantine,
   chunk validation and mass-delete guard as an export. Pages of the scope that the listing no
   longer has (deleted, trashed, archived, moved, unreadable) are deleted;
5. only when every space's fetch and plan succeeded: **apply** the plans, then write each
   cursor (``<data_dir>/confluence/<site>/<space>.json``, atomically).

Any fetch failure raises :class:`~context_core.errors.ConfluenceFetchError` before step 5:
nothing is written or deleted. Point ids and scopes carry the site (its base URL), so two sites
with the same space key or page ids never collide.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from context_core.config import Settings
from context_core.errors import (
    ConfluenceFetchError,
    IngestError,
    PayloadTooLargeError,
    ScannerUnavailableError,
    UnsupportedUploadTypeError,
    UploadBlockedError,
    UploadInfectedError,
    UploadRefusedError,
)
from context_core.fsutil import atomic_write_text
from context_core.ingest.confluence_client import ConfluenceClient
from context_core.ingest.model import Page, Quarantined, compute_content_hash
from context_core.ingest.refresh_plan import RefreshPlan, new_run_id, plan_pages, source_scope
from context_core.ingest.rest import read_content

if TYPE_CHECKING:
    from context_core.gateway.sanitize import Gateway
    from context_core.ingest.clamd import Scanner
    from context_core.ingest.pipeline import RefreshSummary
    from context_core.knowledge.embedding import Encoder
    from context_core.knowledge.store import VectorStore

__all__ = [
    "SKIP_REASONS",
    "SYNC_REPORT",
    "SpaceCursor",
    "SyncResult",
    "client_from_settings",
    "sync_confluence",
]

log = logging.getLogger(__name__)

SKIP_REASONS = (
    "too_large",
    "type_not_allowed",
    "infected",
    "blocked_keyword",
    "extract_failed",
    "scanner_unavailable",
    "not_found",
)
_CURSOR_SCHEMA = 1
_EXPAND = "body.storage,version,ancestors,space"
_SEARCH_LIMIT = 50
_LIST_LIMIT = 250
# CQL compares dates in the syncing user's time zone at minute precision: look back a day so
# no change is missed; pages returned whose version the cursor already holds are ignored.
_CQL_LOOKBACK = timedelta(days=1)


@dataclass(slots=True)
class SpaceCursor:
    """What the last successful sync of one space stored: ``pages`` maps page id -> version,
    ``attachments`` maps ``<page id>/attachments/<id>`` -> ``{"version", "status"}``
    (``status`` "ingested" or a skip reason), ``last_when`` the newest ``version.when``."""

    site: str
    space: str
    last_when: str | None = None
    pages: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    attachments: dict[str, dict[str, Any]] = field(default_factory=dict)

    @staticmethod
    def path(settings: Settings, site: str, space: str) -> Path:
        return settings.data_dir / "confluence" / site / f"{space}.json"

    @classmethod
    def load(cls, settings: Settings, site: str, space: str) -> SpaceCursor:
        path = cls.path(settings, site, space)
        if not path.is_file():
            return cls(site, space)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.pop("schema", None) != _CURSOR_SCHEMA:
                raise ValueError("another schema")
            return cls(**data)
        except (OSError, ValueError, TypeError) as e:
            raise IngestError(
                f"sync cursor {path} is unreadable ({e}); delete it and the next sync "
                "re-reads the space (unchanged pages are not re-embedded)"
            ) from e

    def save(self, settings: Settings) -> Path:
        data = {"schema": _CURSOR_SCHEMA, **dataclasses.asdict(self)}
        path = self.path(settings, self.site, self.space)
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


@dataclass(slots=True)
class SyncResult:
    """One space's sync: the refresh summary plus what it cost the site."""

    space: str
    site: str
    summary: RefreshSummary
    pages_listed: int
    bodies_fetched: int
    attachments_ingested: int
    attachments_unchanged: int
    attachments_skipped: dict[str, int]
    requests: dict[str, Any]
    cursor_file: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "space": self.space,
            "site": self.site,
            "pages_listed": self.pages_listed,
            "bodies_fetched": self.bodies_fetched,
            "attachments_ingested": self.attachments_ingested,
            "attachments_unchanged": self.attachments_unchanged,
            "attachments_skipped": dict(self.attachments_skipped),
            "requests": self.requests,
            "cursor_file": self.cursor_file,
            "seconds": round(self.seconds, 3),
            "refresh": self.summary.to_dict(),
        }


def client_from_settings(settings: Settings, base_url: str) -> ConfluenceClient:
    """A client for ``base_url`` with the ``CTX_CONFLUENCE_*`` credentials and limits."""
    token = settings.confluence_token.get_secret_value() if settings.confluence_token else None
    return ConfluenceClient(
        base_url,
        user=settings.confluence_user or None,
        token=token or None,
        timeout_s=settings.confluence_timeout_s,
        max_requests=settings.confluence_max_requests,
        max_retries=settings.confluence_max_retries,
        backoff_s=settings.confluence_backoff_s,
        max_wait_s=settings.confluence_max_wait_s,
    )


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def sync_confluence(
    settings: Settings,
    base_url: str,
    spaces: Sequence[str],
    *,
    allow_deletes: bool = False,
    store: VectorStore | None = None,
    encoder: Encoder | None = None,
    gateway: Gateway | None = None,
    scanner: Scanner | None = None,
    client: ConfluenceClient | None = None,
    collection: str | None = None,
    run_id: str | None = None,
) -> list[SyncResult]:
    """Sync ``spaces`` of the site at ``base_url`` into L3 (see the module docstring).

    Every space is listed, fetched and planned before the first write: a fetch failure, a
    failed check or a mass-delete refusal in any space leaves the collection and every cursor
    as they were. ``scanner`` defaults to clamd at ``CTX_CLAMD_URL`` (no scanner: attachments
    are skipped as ``scanner_unavailable``, pages still sync).
    """
    from context_core.gateway.sanitize import Gateway as _Gateway
    from context_core.ingest.pipeline import apply_refresh
    from context_core.ingest.refresh_plan import load_encoder_lazily
    from context_core.knowledge import open_store

    keys = _space_keys(spaces)
    own_client = client is None
    client = client or client_from_settings(settings, base_url)
    gateway = gateway or _Gateway.from_settings(settings)
    if scanner is None and settings.clamd_url and settings.confluence_attachments:
        from context_core.ingest.clamd import ClamdScanner

        scanner = ClamdScanner(settings.clamd_url, timeout_s=settings.clamd_timeout_s)
    own_store = store is None
    store = store if store is not None else open_store(settings)
    run_id = run_id or new_run_id()
    holder: list[Encoder] = [encoder] if encoder is not None else []

    def factory() -> Encoder:
        if not holder:
            holder.append(load_encoder_lazily(settings, store, collection))
        return holder[0]

    try:
        staged: list[tuple[_SpaceRun, RefreshPlan]] = []
        for key in keys:
            t0 = time.perf_counter()
            run = _SpaceRun(settings, client, key, gateway, scanner)
            items, kept = run.read(store, collection or settings.collection_main)
            plan = plan_pages(
                items,
                space=key,
                source_id=client.base_url,
                kept=kept,
                settings=settings,
                store=store,
                source=f"{client.base_url} space {key}",
                encoder=holder[0] if holder else None,
                gateway=gateway,
                collection=collection,
                encoder_factory=factory,
                allow_deletes=allow_deletes,
                run_id=f"{run_id}-{key}" if len(keys) > 1 else run_id,
                cites=run.cites,
                seconds={"parse": time.perf_counter() - t0},
            )
            staged.append((run, plan))
        results: list[SyncResult] = []
        for run, plan in staged:
            t1 = time.perf_counter()
            summary = apply_refresh(
                plan,
                settings=settings,
                store=store,
                encoder=holder[0] if holder else None,
            )
            path = run.cursor_after(plan).save(settings)
            results.append(run.result(summary, path, time.perf_counter() - t1))
            done = results[-1]
            log.info(
                "confluence sync %s: %d pages listed, %d bodies fetched, %d chunks written, "
                "%d deleted, %d requests so far",
                run.space,
                done.pages_listed,
                done.bodies_fetched,
                summary.chunks_written,
                summary.chunks_deleted,
                done.requests["requests"],
            )
        _write_report(settings, run_id, results)
        return results
    finally:
        if own_store:
            store.close()
        if own_client:
            client.close()


SYNC_REPORT = "confluence_sync.json"  # under reports_dir: the last run, every space


def _write_report(settings: Settings, run_id: str, results: list[SyncResult]) -> Path:
    """``<reports_dir>/confluence_sync.json``: the run's result per space (``ingest_summary.json``
    holds only the last space's refresh summary)."""
    settings.reports_dir.mkdir(parents=True, exist_ok=True)
    data = {"run_id": run_id, "spaces": [r.to_dict() for r in results]}
    return atomic_write_text(
        settings.reports_dir / SYNC_REPORT, json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    )


def _space_keys(spaces: Sequence[str]) -> list[str]:
    keys: list[str] = []
    for raw in spaces:
        key = raw.strip()
        if not key or not key.replace("~", "").replace("_", "").replace("-", "").isalnum():
            raise IngestError(
                f"--space {raw!r} is not a Confluence space key (letters and digits, e.g. DOC)"
            )
        if key not in keys:
            keys.append(key)
    if not keys:
        raise IngestError("no --space given; name at least one space key, e.g. --space DOC")
    return keys


@dataclass(slots=True)
class _Listed:
    version: int
    when: str
    title: str


class _SpaceRun:
    """The read half of one space's sync: listing, bodies, attachments; no writes."""

    def __init__(
        self,
        settings: Settings,
        client: ConfluenceClient,
        space: str,
        gateway: Gateway,
        scanner: Scanner | None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.space = space
        self.gateway = gateway
        self.scanner = scanner
        self.cursor = SpaceCursor.load(settings, client.site, space)
        self.home_id: str | None = None
        self.space_id: str | None = None
        self.v2 = client.cloud
        self.v1 = True  # False once a Cloud site answered 404 for v1 content search
        self.listed: dict[str, _Listed] = {}
        self.fetched: dict[str, Page] = {}
        self.quarantined_ids: dict[str, int] = {}
        self.attachments: dict[str, dict[str, Any]] = {}
        self.cites: dict[str, dict[str, str]] = {}
        self.skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)
        self.att_ingested = 0
        self.att_unchanged = 0
        self.bodies = 0

    # -- reading ----------------------------------------------------------------------------

    def read(
        self, store: VectorStore, collection: str
    ) -> tuple[list[Page | Quarantined], set[str]]:
        """The pages (and attachment pages) to plan and the ids kept unchanged."""
        self._list()
        stored = _stored_sources(store, collection, source_scope(self.space, self.client.base_url))
        need = [
            pid
            for pid, it in self.listed.items()
            if (
                self.cursor.pages.get(pid) != it.version
                and self.cursor.quarantined.get(pid) != it.version
            )
            or (pid in self.cursor.pages and pid not in stored)
        ]
        if self.settings.confluence_attachments and self.cursor.last_when:
            # an attachment added or replaced without a page edit: re-read that page
            need += sorted(self._pages_with_new_attachments() - set(need))
        items: list[Page | Quarantined] = []
        items += self._fetch(set(need))
        kept: set[str] = set()
        for pid in self.listed:
            if pid in self.fetched:
                continue
            if pid not in self.quarantined_ids:  # a quarantined page keeps its chunks anyway
                kept.add(pid)
            for key, rec in self.cursor.attachments.items():
                if key.startswith(f"{pid}/attachments/"):
                    self.attachments[key] = rec
                    if rec.get("status") == "ingested":
                        kept.add(key)
        if self.settings.confluence_attachments:
            for pid, page in self.fetched.items():
                items += self._attachments(pid, page, stored, kept)
        return items, kept

    def _pages_with_new_attachments(self) -> set[str]:
        """Listed pages having an attachment whose version the cursor does not hold, from one
        CQL search of the space's attachments modified since the cursor. Best effort: a site
        that refuses the query (400/404) only delays those attachments to the page's next
        edit."""
        since = _parse_when(self.cursor.last_when)
        if since is None:
            return set()
        cql = (
            f'space = "{self.space}" and type = attachment and lastmodified >= '
            f'"{(since - _CQL_LOOKBACK):%Y-%m-%d %H:%M}"'
        )
        out: set[str] = set()
        try:
            for r in self.client.paginate(
                "/rest/api/content/search",
                {"cql": cql, "expand": "version,container", "limit": _LIST_LIMIT},
            ):
                att = r.get("content", r)
                pid = str((att.get("container") or {}).get("id") or "")
                if att.get("type") != "attachment" or pid not in self.listed:
                    continue
                prev = self.cursor.attachments.get(f"{pid}/attachments/{att.get('id')}") or {}
                if prev.get("version") != _att_version(att):
                    out.add(pid)
        except ConfluenceFetchError as e:
            if e.status not in (400, 404):
                raise
            log.warning("confluence: attachment search refused (HTTP %s); skipped", e.status)
        return out

    def _list(self) -> None:
        if self.v2:
            try:
                space = self._v2_space()
            except _NoV2:
                self.v2 = False
            else:
                self.space_id = str(space.get("id"))
                self.home_id = str(space.get("homepageId") or "") or None
                for r in self.client.paginate(
                    f"/api/v2/spaces/{self.space_id}/pages",
                    {"status": "current", "limit": _LIST_LIMIT},
                ):
                    self._add_listed(r)
                return
        found = self._v1_home()
        for r in self.client.paginate(
            "/rest/api/content/search",
            {
                "cql": f'space = "{self.space}" and type = page',
                "expand": "version",
                "limit": _LIST_LIMIT,
            },
        ):
            self._add_listed(r.get("content", r))
        if not found and not self.listed:
            raise ConfluenceFetchError(_no_space(self.client.base_url, self.space), status=404)

    def _v2_space(self) -> dict[str, Any]:
        try:
            data = self.client.get_json("/api/v2/spaces", {"keys": self.space})
        except ConfluenceFetchError as e:
            if e.status == 404:
                raise _NoV2 from e
            raise
        results = data.get("results") or []
        if not results:
            raise ConfluenceFetchError(_no_space(self.client.base_url, self.space))
        return dict(results[0])

    def _v1_home(self) -> bool:
        """Find the space's home page; False when the space lookup is a 404 (the listing then
        decides: no page either means no such space)."""
        try:
            space = self.client.get_json(f"/rest/api/space/{self.space}", {"expand": "homepage"})
        except ConfluenceFetchError as e:
            if e.status == 404:
                return False
            raise
        self.home_id = str((space.get("homepage") or {}).get("id") or "") or None
        return True

    def _add_listed(self, r: dict[str, Any]) -> None:
        if r.get("type", "page") != "page" or r.get("status", "current") != "current":
            return
        pid = str(r.get("id") or "")
        version = r.get("version") or {}
        number = version.get("number")
        if not pid or not isinstance(number, int):
            raise ConfluenceFetchError(
                f"Confluence at {self.client.base_url} listed a page of space {self.space} "
                "without an id or version number; nothing was written"
            )
        when = str(version.get("when") or version.get("createdAt") or "")
        self.listed[pid] = _Listed(number, when, str(r.get("title") or ""))

    def _fetch(self, need: set[str]) -> list[Page | Quarantined]:
        """Bodies of the ``need`` pages: one CQL search, then a GET per page it missed."""
        out: list[Page | Quarantined] = []
        if not need:
            return out
        cql = f'space = "{self.space}" and type = page'
        since = _parse_when(self.cursor.last_when)
        if since is not None and len(need) < len(self.listed):
            cql += f' and lastmodified >= "{(since - _CQL_LOOKBACK):%Y-%m-%d %H:%M}"'
        got: set[str] = set()
        try:
            for r in self.client.paginate(
                "/rest/api/content/search",
                {
                    "cql": cql + " order by lastmodified asc",
                    "expand": _EXPAND,
                    "limit": _SEARCH_LIMIT,
                },
            ):
                content = r.get("content", r)
                pid = str(content.get("id") or "")
                if pid in need and pid not in got:
                    got.add(pid)
                    out += self._read(content)
        except ConfluenceFetchError as e:
            if e.status != 404 or not self.v2 or got:
                raise
            # a Cloud site without v1 content search: every page by id through v2
            log.warning("confluence: v1 content search not found (404); reading pages by id")
            self.v1 = False
        for pid in sorted(need - got):
            content = self._one_page(pid)
            if content is None:  # deleted since the listing: it is gone
                del self.listed[pid]
                continue
            out += self._read(content)
        return out

    def _one_page(self, pid: str) -> dict[str, Any] | None:
        """One page's body: v1 ``/rest/api/content/{id}``; on Cloud, where v1 answers 404,
        v2 ``/api/v2/pages/{id}?body-format=storage`` (no ancestors: the page's area is then
        its own title). None when neither has it."""
        if self.v1:
            try:
                return self.client.get_json(f"/rest/api/content/{pid}", {"expand": _EXPAND})
            except ConfluenceFetchError as e:
                if e.status != 404 or not self.v2:
                    if e.status == 404:
                        return None
                    raise
        try:
            page = self.client.get_json(f"/api/v2/pages/{pid}", {"body-format": "storage"})
        except ConfluenceFetchError as e:
            if e.status == 404:
                return None
            raise
        page.setdefault("type", "page")
        return page

    def _read(self, content: dict[str, Any]) -> list[Page | Quarantined]:
        self.bodies += 1
        self.client.stats.page_bodies += 1
        page = read_content(
            content,
            base_url=self.client.base_url,
            space=self.space,
            home_id=self.home_id,
            max_page_bytes=self.settings.max_page_bytes,
            max_markup_depth=self.settings.max_markup_depth,
        )
        pid = str(content.get("id") or "")
        version = (content.get("version") or {}).get("number")
        if isinstance(page, Page):
            self.fetched[pid] = page
            if pid in self.listed and isinstance(version, int):
                self.listed[pid].version = version
            self.cites[pid] = {"url": _web_url(self.client, content, pid)}
            return [page]
        if isinstance(page, Quarantined) and pid in self.listed:
            self.quarantined_ids[pid] = self.listed[pid].version
        return [page] if page is not None else []

    # -- attachments -----------------------------------------------------------------------

    def _attachments(
        self, pid: str, page: Page, stored: set[str], kept: set[str]
    ) -> list[Page | Quarantined]:
        out: list[Page | Quarantined] = []
        for att in self._list_attachments(pid):
            aid = str(att.get("id") or "")
            title = str(att.get("title") or "")
            version = _att_version(att)
            if not aid or not title:
                continue
            key = f"{pid}/attachments/{aid}"
            prev = self.cursor.attachments.get(key) or {}
            status = prev.get("status")
            if prev.get("version") == version and (
                (status == "ingested" and key in stored)
                or (status in SKIP_REASONS and status != "scanner_unavailable")
            ):
                self.attachments[key] = prev
                if status == "ingested":
                    kept.add(key)
                    self.att_unchanged += 1
                else:
                    self.skipped[str(status)] += 1
                continue
            result = self._attachment(pid, page, att, key, title, version)
            if isinstance(result, str):
                self.skipped[result] += 1
                if result == "scanner_unavailable":
                    if status == "ingested" and key in stored:
                        kept.add(key)  # keep the last scanned version; retried next run
                        self.attachments[key] = prev
                else:
                    self.attachments[key] = {"version": version, "status": result}
                continue
            self.att_ingested += 1
            self.attachments[key] = {"version": version, "status": "ingested"}
            out.append(result)
        return out

    def _list_attachments(self, pid: str) -> list[dict[str, Any]]:
        """The page's attachments; none when the page vanished since it was read (404)."""
        try:
            if self.v2:
                return list(
                    self.client.paginate(f"/api/v2/pages/{pid}/attachments", {"limit": 250})
                )
            return list(
                self.client.paginate(
                    f"/rest/api/content/{pid}/child/attachment",
                    {"expand": "version", "limit": 200},
                )
            )
        except ConfluenceFetchError as e:
            if e.status != 404:
                raise
            log.warning("confluence: attachments of page %s not found (404); none synced", pid)
            return []

    def _attachment(
        self, pid: str, page: Page, att: dict[str, Any], key: str, title: str, version: int | None
    ) -> Page | str:
        """The attachment as a page of its own, or the reason it was skipped."""
        from context_core.ingest.upload import check_file, resolve_type

        media = str(att.get("mediaType") or (att.get("metadata") or {}).get("mediaType") or "")
        limit = self.settings.upload_max_bytes
        try:
            resolve_type(title, media or None)
        except UnsupportedUploadTypeError:
            return "type_not_allowed"
        size = att.get("fileSize") or (att.get("extensions") or {}).get("fileSize")
        if isinstance(size, int) and size > limit:
            return "too_large"
        link = str(att.get("downloadLink") or (att.get("_links") or {}).get("download") or "")
        if not link:
            return "extract_failed"
        if self.scanner is None:  # fail closed, as uploads do: nothing unscanned gets in
            return "scanner_unavailable"
        try:
            data = self.client.download(link, limit=limit)
        except ConfluenceFetchError as e:
            if e.status != 404:
                raise
            return "not_found"  # removed since it was listed
        if data is None:
            return "too_large"
        try:
            checked = check_file(
                data,
                title,
                media or None,
                scanner=self.scanner,
                gateway=self.gateway,
                settings=self.settings,
                source=f"{self.client.base_url}/pages/{key}",
                blocked_keywords=_keywords(self.settings),
            )
        except ScannerUnavailableError:
            return "scanner_unavailable"
        except UploadInfectedError:
            return "infected"
        except UploadBlockedError:
            return "blocked_keyword"
        except UnsupportedUploadTypeError:
            return "type_not_allowed"
        except PayloadTooLargeError:
            return "too_large"
        except UploadRefusedError:
            return "extract_failed"
        when = _parse_when(_att_when(att)) or page.updated_at
        url = self.client.url(link)
        self.cites[key] = {"url": url, "page": pid, "attachment": title}
        return Page(
            page_id=key,
            title=f"{page.title} / {checked.title}",
            space=self.space,
            ancestors=(*page.ancestors, page.title),
            author=page.author,
            updated_at=when,
            sections=tuple(checked.sections),
            attachments=(),
            source_path=url,
            content_hash=compute_content_hash(checked.title, checked.sections),
            date_source="api",
        )

    # -- after the writes ------------------------------------------------------------------

    def cursor_after(self, plan: RefreshPlan) -> SpaceCursor:
        """The cursor to persist once ``plan`` is applied."""
        # a page the plan quarantined (no text left to chunk) is not fetched again until it
        # changes, like one the reader quarantined
        dropped = {q["source_path"] for q in plan.quarantined}
        pages: dict[str, int] = {}
        quarantined = dict(self.quarantined_ids)
        for pid, it in self.listed.items():
            if pid in self.fetched:
                if self.fetched[pid].source_path in dropped:
                    quarantined[pid] = it.version
                else:
                    pages[pid] = it.version
            elif pid in self.cursor.pages:
                pages[pid] = self.cursor.pages[pid]
            elif pid in self.cursor.quarantined and pid not in quarantined:
                quarantined[pid] = self.cursor.quarantined[pid]
        whens = [w for w in (it.when for it in self.listed.values()) if w]
        last = max(whens, key=lambda w: _parse_when(w) or datetime.min.replace(tzinfo=UTC))
        return SpaceCursor(
            site=self.client.site,
            space=self.space,
            last_when=last if whens else self.cursor.last_when,
            pages=pages,
            quarantined=quarantined,
            attachments=dict(self.attachments),
        )

    def result(self, summary: RefreshSummary, cursor: Path, apply_s: float) -> SyncResult:
        return SyncResult(
            space=self.space,
            site=self.client.base_url,
            summary=summary,
            pages_listed=len(self.listed),
            bodies_fetched=self.bodies,
            attachments_ingested=self.att_ingested,
            attachments_unchanged=self.att_unchanged,
            attachments_skipped={k: v for k, v in self.skipped.items() if v},
            requests=self.client.stats.to_dict(),
            cursor_file=str(cursor),
            seconds=summary.total_seconds,
        )


class _NoV2(Exception):
    """The site has no v2 API (a Data Center with a /wiki context path)."""


def _no_space(base_url: str, space: str) -> str:
    return (
        f"Confluence at {base_url} has no space {space!r} readable by the syncing account; "
        "check the space key (--space) and that the account of CTX_CONFLUENCE_USER / "
        "CTX_CONFLUENCE_TOKEN has 'View' permission on it. Nothing was written or deleted."
    )


def _stored_sources(store: VectorStore, collection: str, scope: str) -> set[str]:
    if store.info(collection) is None:
        return set()
    return {
        str(rec.payload.get("source", ""))
        for rec in store.scroll(collection, filter={"scope": scope}, with_vectors=False)
    }


def _keywords(settings: Settings) -> list[str]:
    from context_core.ingest.upload import parse_keywords

    return list(parse_keywords(settings.blocked_keywords))


def _att_version(att: dict[str, Any]) -> int | None:
    number = (att.get("version") or {}).get("number")
    return number if isinstance(number, int) else None


def _att_when(att: dict[str, Any]) -> str | None:
    v = att.get("version") or {}
    return v.get("when") or v.get("createdAt") or att.get("createdAt")


def _parse_when(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _web_url(client: ConfluenceClient, content: dict[str, Any], pid: str) -> str:
    webui = (content.get("_links") or {}).get("webui")
    if isinstance(webui, str) and webui.startswith("/"):
        return client.base_url + webui
    return f"{client.base_url}/pages/viewpage.action?pageId={pid}"
