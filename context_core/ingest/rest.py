"""Live source: pages of one space from the Confluence REST API, incrementally.

Uses ``atlassian-python-api`` (``Confluence(url, username, password=token)``) and CQL search
with ``body.storage``, ``version`` and ``ancestors`` expanded, so a nightly sync only pulls
what changed since the last run (``lastmodified > "<cursor>"``). Bodies go through the same
storage-format reader as everything else; bad pages are quarantined, never raised: only a
failure to *fetch* (transport, HTTP, authentication) stops a sync. A page whose body is too
deep, declares entities or otherwise breaks the reader becomes one ``Quarantined`` record and
the sync goes on with the next result.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from context_core.errors import BackendUnavailableError, IngestError
from context_core.ingest.model import Page, Quarantined
from context_core.ingest.storage import parse_storage_page

__all__ = ["ConfluenceRestSource", "read_content"]

log = logging.getLogger(__name__)

_EXPAND = ",".join(
    f"content.{e}" for e in ("body.storage", "version", "ancestors", "space", "history")
)


class ConfluenceRestSource:
    """Yields :class:`Page` / :class:`Quarantined` for the pages of ``space``.

    ``last_modified`` holds the newest ``version.when`` seen by the latest :meth:`pages` run:
    persist it and pass it back as ``since`` next time.
    """

    def __init__(
        self,
        url: str,
        *,
        space: str,
        username: str | None = None,
        token: str | None = None,
        page_size: int = 50,
        max_page_bytes: int = 5 * 1024 * 1024,
        max_markup_depth: int = 200,
        timeout_s: float = 30.0,
        client: Any | None = None,
    ) -> None:
        if client is None:
            from atlassian import Confluence

            client = Confluence(  # type: ignore[no-untyped-call]  # untyped library
                url=url,
                username=username,
                password=token,
                cloud=url.rstrip("/").endswith(".atlassian.net/wiki") or None,
                timeout=timeout_s,
            )
        self._client = client
        self.url = url.rstrip("/")
        self.space = space
        self.page_size = page_size
        self.max_page_bytes = max_page_bytes
        self.max_markup_depth = max_markup_depth
        self.last_modified: datetime | None = None
        self._home_id: str | None = None

    def cql(self, since: datetime | None) -> str:
        q = f'space = "{self.space}" and type = page'
        if since is not None:
            # CQL compares minutes in the site's zone; UTC is what version.when reports
            q += f' and lastmodified > "{since.astimezone(UTC):%Y-%m-%d %H:%M}"'
        return q + " order by lastmodified asc"

    def _home(self) -> str | None:
        if self._home_id is None:
            try:
                space = self._client.get_space(self.space, expand="homepage")
            except Exception as e:  # requests/atlassian errors: name the resource
                raise BackendUnavailableError(
                    f"Confluence at {self.url}: cannot read space {self.space!r} ({e}); check "
                    "the URL, the space key and the account's permission"
                ) from e
            self._home_id = str((space or {}).get("homepage", {}).get("id") or "") or None
        return self._home_id

    def pages(self, since: datetime | None = None) -> Iterator[Page | Quarantined]:
        """Every page modified after ``since`` (all pages when None), oldest change first.

        Raises :class:`BackendUnavailableError` when Confluence cannot be *fetched* from; one
        unusable page never raises (it is yielded as a ``Quarantined``), so the try around the
        fetch covers only the iterator, never the parsing of what it returned.
        """
        home = self._home()
        try:
            results = iter(
                self._client.iter_cql(
                    self.cql(since), limit=self.page_size, expand=_EXPAND, excerpt="none"
                )
            )
        except Exception as e:
            raise self._fetch_error(e) from e
        while True:
            try:
                item = next(results)
            except StopIteration:
                return
            except (IngestError, BackendUnavailableError):
                raise
            except Exception as e:
                raise self._fetch_error(e) from e
            result = self._safe_page(item, home)
            if result is not None:
                yield result

    def _fetch_error(self, e: Exception) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"Confluence search at {self.url} failed ({type(e).__name__}: {e}); check the "
            "URL, credentials and network"
        )

    def _safe_page(self, item: Any, home: str | None) -> Page | Quarantined | None:
        """The result for one search hit (None: not a page); never raises for its content."""
        page = read_content(
            item,
            base_url=self.url,
            space=self.space,
            home_id=home,
            max_page_bytes=self.max_page_bytes,
            max_markup_depth=self.max_markup_depth,
        )
        if isinstance(page, Page) and (
            self.last_modified is None or page.updated_at > self.last_modified
        ):
            self.last_modified = page.updated_at
        return page


def read_content(
    item: dict[str, Any],
    *,
    base_url: str,
    space: str,
    home_id: str | None,
    max_page_bytes: int,
    max_markup_depth: int,
) -> Page | Quarantined | None:
    """One v1 content result (``body.storage``, ``version``, ``ancestors`` expanded; a search
    hit's ``content`` wrapper is unwrapped) as a :class:`Page`, a :class:`Quarantined` with
    the reason, or None when it is not a page. Never raises for the result's content.
    """
    where = f"{base_url}/pages/?"
    try:
        content = item.get("content", item)
        if content.get("type", "page") != "page":
            return None
        where = f"{base_url}/pages/{content.get('id') or '?'}"
        result = _page(content, home_id, base_url, space, max_page_bytes, max_markup_depth)
    except RecursionError:
        result = Quarantined(
            where,
            "markup nested too deep to read (recursion limit hit under "
            f"max_markup_depth={max_markup_depth}; lower CTX_MAX_MARKUP_DEPTH)",
        )
    except Exception as e:  # a malformed result is this page's problem, not the sync's
        log.warning("quarantining %s: %s: %s", where, type(e).__name__, e)
        result = Quarantined(where, f"unreadable API result ({type(e).__name__}: {e})")
    return result


def _page(
    c: dict[str, Any],
    home: str | None,
    url: str,
    space: str,
    max_page_bytes: int,
    max_markup_depth: int,
) -> Page | Quarantined:
    pid = str(c.get("id", ""))
    where = f"{url}/pages/{pid or '?'}"
    body = (((c.get("body") or {}).get("storage") or {}).get("value")) or ""
    title = " ".join(str(c.get("title") or "").split())
    if not pid or not title:
        return Quarantined(where, "malformed API result: no page id or title")
    size = len(body.encode("utf-8"))
    if size > max_page_bytes:
        return Quarantined(
            where,
            f"page is {size} bytes, over max_page_bytes={max_page_bytes} "
            "(raise CTX_MAX_PAGE_BYTES to ingest it)",
        )
    version = c.get("version") or {}
    when = (
        version.get("when")
        or version.get("createdAt")
        or (c.get("history") or {}).get("lastUpdated", {}).get("when")
    )
    try:
        updated = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
        date_source = "api"
    except (TypeError, ValueError):
        log.warning("page %s has no parseable version.when (%r); using now", where, when)
        updated, date_source = datetime.now(UTC), "mtime"
    if updated.tzinfo is None:
        updated = updated.replace(tzinfo=UTC)
    ancestors = [a for a in c.get("ancestors") or [] if a.get("title")]
    if ancestors and str(ancestors[0].get("id")) == home:
        ancestors = ancestors[1:]
    author = ((version.get("by") or {}).get("displayName")) or None
    try:
        page = parse_storage_page(
            body,
            page_id=pid,
            title=title,
            space=space,
            ancestors=[" ".join(str(a["title"]).split()) for a in ancestors],
            ancestor_ids=[str(a.get("id", "")) for a in ancestors],
            author=author,
            updated_at=updated,
            source_path=where,
            date_source=date_source,  # type: ignore[arg-type]
            max_markup_depth=max_markup_depth,
        )
    except IngestError as e:
        return Quarantined(where, str(e))
    if not page.sections:
        return Quarantined(where, "empty body: storage body has no text")
    return page
