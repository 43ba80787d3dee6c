"""A polite HTTP client for the Confluence REST API (Cloud and Data Center / Server).

Why not ``atlassian-python-api`` here: the sync needs control over every request (a per-run
budget, ``Retry-After`` on 429/503, bounded backoff with jitter, a stream that stops at a size
limit, no credentials in any message), and ``requests`` gives that in a few lines.

The base URL decides the flavour: a URL whose path ends in ``/wiki`` is Confluence Cloud
(``https://<site>.atlassian.net/wiki``), listed through the v2 pages API; anything else is
Data Center / Server (``https://host[/context]``), listed through v1 CQL search. A ``/wiki``
site without the v2 API (a Data Center with that context path) falls back to v1.

Credentials: ``user`` + ``token`` are HTTP Basic (Cloud: e-mail + API token); ``token`` alone
is a Bearer personal access token (Data Center). They live only in the session's auth object;
errors and logs name the settings (``CTX_CONFLUENCE_USER``, ``CTX_CONFLUENCE_TOKEN``), never
their values.
"""

from __future__ import annotations

import email.utils
import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from requests.auth import AuthBase, HTTPBasicAuth

from context_core.errors import ConfluenceAuthError, ConfluenceFetchError

__all__ = ["BearerAuth", "ConfluenceClient", "RequestStats", "site_slug"]

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_THROTTLE_STATUS = frozenset({429, 503})


class BearerAuth(AuthBase):
    """``Authorization: Bearer <token>`` (a Data Center personal access token)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["Authorization"] = f"Bearer {self._token}"
        return r

    def __repr__(self) -> str:  # never the token
        return "BearerAuth(***)"


def site_slug(base_url: str) -> str:
    """A file-system-safe name of a site: host and context path (``acme.atlassian.net_wiki``)."""
    parts = urlsplit(base_url)
    raw = f"{parts.netloc}{parts.path.rstrip('/')}"
    return re.sub(r"[^A-Za-z0-9.-]+", "_", raw).strip("_") or "confluence"


@dataclass(slots=True)
class RequestStats:
    """What one run cost the site: HTTP requests sent (retries included), retries, waits."""

    requests: int = 0
    retries: int = 0
    throttled: int = 0  # 429/503 answers
    waited_s: float = 0.0
    page_bodies: int = 0  # page bodies fetched (storage format)
    attachment_downloads: int = 0
    by_status: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "throttled": self.throttled,
            "waited_s": round(self.waited_s, 3),
            "page_bodies": self.page_bodies,
            "attachment_downloads": self.attachment_downloads,
            "by_status": dict(sorted(self.by_status.items())),
        }


class ConfluenceClient:
    """GETs against one Confluence site with retries, a budget and clear failures."""

    def __init__(
        self,
        base_url: str,
        *,
        user: str | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        max_requests: int = 5000,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_wait_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfluenceFetchError(
                f"--confluence-url {base_url!r} is not an http(s) URL; pass the site's base "
                "URL, e.g. https://acme.atlassian.net/wiki (Cloud) or https://wiki.example.com "
                "(Data Center)"
            )
        if parts.username or parts.password:
            raise ConfluenceFetchError(
                "--confluence-url holds credentials; remove them from the URL and set "
                "CTX_CONFLUENCE_USER / CTX_CONFLUENCE_TOKEN in the environment instead"
            )
        self.base_url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.context = parts.path.rstrip("/")
        self.cloud = self.context.endswith("/wiki")
        self.site = site_slug(self.base_url)
        self._has_token = bool(token)
        self._user = user
        self.timeout_s = timeout_s
        self.max_requests = max_requests
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_wait_s = max_wait_s
        self._sleep = sleep
        self.stats = RequestStats()
        self.session = requests.Session()
        self.session.headers["Accept"] = "application/json"
        self.session.headers["User-Agent"] = "context-platform-sync"
        if token and user:
            self.session.auth = HTTPBasicAuth(user, token)
        elif token:
            self.session.auth = BearerAuth(token)

    def close(self) -> None:
        self.session.close()

    # -- URLs -----------------------------------------------------------------------------

    def url(self, path_or_link: str) -> str:
        """An absolute URL on this site for an API path or a ``_links.next``/download link.

        v1 links are relative to the context path (``/rest/api/...``), v2 links hold it
        (``/wiki/api/v2/...``). An absolute link to another host is refused: credentials
        never leave the site.
        """
        if path_or_link.startswith(("http://", "https://")):
            if urlsplit(path_or_link).netloc != urlsplit(self.origin).netloc:
                raise ConfluenceFetchError(
                    f"Confluence at {self.base_url} answered with a link to another host "
                    f"({urlsplit(path_or_link).netloc}); refusing to follow it with the "
                    "site's credentials"
                )
            return path_or_link
        if self.context and path_or_link.startswith(self.context + "/"):
            return urljoin(self.origin, path_or_link)
        return self.base_url + ("" if path_or_link.startswith("/") else "/") + path_or_link

    # -- requests -------------------------------------------------------------------------

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """GET ``path`` (see :meth:`url`) and decode its JSON object."""
        return self._get_json(path, params)[0]

    def _get_json(
        self, path: str, params: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], str | None]:
        """The JSON object and the ``Link: <...>; rel="next"`` header's target, if any."""
        resp = self._get(self.url(path), params=params)
        try:
            data = resp.json()
        except ValueError as e:
            raise ConfluenceFetchError(
                f"Confluence at {self.base_url} answered {_path(resp.url)} with something that "
                "is not JSON; check that --confluence-url is the site's base URL"
            ) from e
        if not isinstance(data, dict):
            raise ConfluenceFetchError(
                f"Confluence at {self.base_url} answered {_path(resp.url)} with JSON that is "
                "not an object"
            )
        return data, (resp.links.get("next") or {}).get("url")

    def paginate(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every ``results`` item of a listing, following ``_links.next`` (v1 and v2 alike; the
        v2 API also sends the next page's URL in a ``Link`` header, used when the body has
        none)."""
        data, link = self._get_json(path, params)
        while True:
            results = data.get("results")
            if not isinstance(results, list):
                raise ConfluenceFetchError(
                    f"Confluence at {self.base_url} answered {path} without a 'results' list"
                )
            yield from (r for r in results if isinstance(r, dict))
            nxt = (data.get("_links") or {}).get("next") or link
            if not nxt:
                return
            data, link = self._get_json(str(nxt))

    def download(self, link: str, *, limit: int) -> bytes | None:
        """The bytes behind a download link, streamed; None once they pass ``limit``."""
        resp = self._get(self.url(link), stream=True)
        self.stats.attachment_downloads += 1
        try:
            size = resp.headers.get("Content-Length")
            if size and size.isdigit() and int(size) > limit:
                return None
            out = bytearray()
            for piece in resp.iter_content(64 * 1024):
                out += piece
                if len(out) > limit:
                    return None
            return bytes(out)
        except requests.RequestException as e:
            raise ConfluenceFetchError(
                f"download of {_path(resp.url)} from {self.base_url} broke off "
                f"({type(e).__name__}); re-run the sync"
            ) from e
        finally:
            resp.close()

    def _get(
        self, url: str, *, params: dict[str, Any] | None = None, stream: bool = False
    ) -> requests.Response:
        attempt = 0
        while True:
            if self.stats.requests >= self.max_requests:
                raise ConfluenceFetchError(
                    f"the sync of {self.base_url} used its budget of {self.max_requests} "
                    "requests (CTX_CONFLUENCE_MAX_REQUESTS) before it finished; nothing was "
                    "written. Raise the budget for a large space, or re-run later if the site "
                    "was throttling"
                )
            self.stats.requests += 1
            try:
                resp = self.session.get(url, params=params, timeout=self.timeout_s, stream=stream)
            except requests.RequestException as e:
                if attempt >= self.max_retries:
                    raise ConfluenceFetchError(
                        f"cannot reach Confluence at {self.base_url} ({type(e).__name__}) after "
                        f"{attempt + 1} attempts (CTX_CONFLUENCE_MAX_RETRIES); nothing was "
                        "written. Check the URL and the network"
                    ) from e
                self._wait(attempt, None, why=type(e).__name__)
                attempt += 1
                continue
            code = resp.status_code
            self.stats.by_status[str(code)] = self.stats.by_status.get(str(code), 0) + 1
            if code < 400:
                return resp
            resp.close()
            if code in (401, 403):
                raise self._auth_error(code, resp.url)
            if code in _RETRY_STATUS and attempt < self.max_retries:
                if code in _THROTTLE_STATUS:
                    self.stats.throttled += 1
                self._wait(attempt, resp.headers.get("Retry-After"), why=f"HTTP {code}")
                attempt += 1
                continue
            if code in _RETRY_STATUS:
                raise ConfluenceFetchError(
                    f"Confluence at {self.base_url} kept answering HTTP {code} for "
                    f"{_path(resp.url)} ({attempt + 1} attempts, CTX_CONFLUENCE_MAX_RETRIES); "
                    "nothing was written or deleted. Re-run later",
                    status=code,
                )
            raise ConfluenceFetchError(
                f"Confluence at {self.base_url} answered HTTP {code} for {_path(resp.url)}; "
                "nothing was written or deleted. Check --confluence-url and the space key",
                status=code,
            )

    def _wait(self, attempt: int, retry_after: str | None, *, why: str) -> None:
        """Sleep before retry ``attempt + 1``: Retry-After when given, else full jitter."""
        self.stats.retries += 1
        delay = _retry_after_s(retry_after)
        if delay is None:
            delay = random.uniform(0, self.backoff_s * (2**attempt))
        delay = min(max(delay, 0.0), self.max_wait_s)
        log.info("confluence: %s, retry %d in %.2fs", why, attempt + 1, delay)
        self.stats.waited_s += delay
        self._sleep(delay)

    def _auth_error(self, code: int, url: str) -> ConfluenceAuthError:
        if code == 401:
            if not self._has_token:
                how = "no credentials are set: set CTX_CONFLUENCE_TOKEN (and CTX_CONFLUENCE_USER "
                how += "for Cloud)"
            elif self._user:
                how = (
                    "check CTX_CONFLUENCE_USER (the account's e-mail) and CTX_CONFLUENCE_TOKEN "
                    "(an API token of that account, not its password)"
                )
            else:
                how = (
                    "check CTX_CONFLUENCE_TOKEN (a Data Center personal access token; for Cloud "
                    "also set CTX_CONFLUENCE_USER to the account's e-mail)"
                )
            return ConfluenceAuthError(
                f"Confluence at {self.base_url} rejected the credentials (HTTP 401); {how}. "
                "Nothing was written or deleted."
            )
        return ConfluenceAuthError(
            f"Confluence at {self.base_url} refused {_path(url)} (HTTP 403): the account of "
            "CTX_CONFLUENCE_USER / CTX_CONFLUENCE_TOKEN lacks permission. Give it 'View' on the "
            "space (and on its attachments) in the space permissions. Nothing was written or "
            "deleted."
        )


def _path(url: str) -> str:
    """The path of a URL without its query (queries may hold CQL, never credentials)."""
    return urlsplit(url).path


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds()
