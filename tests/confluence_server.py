"""A Confluence-compatible REST server for the sync tests: real HTTP on a loopback port.

Speaks the shapes of Atlassian's REST documentation that the sync reads:

* Cloud (``cloud=True``, context path ``/wiki``): v2 ``/api/v2/spaces?keys=``,
  ``/api/v2/spaces/{id}/pages`` (cursor pagination in ``_links.next``, ``status`` filter,
  ``version.number`` / ``version.createdAt``) and ``/api/v2/pages/{id}/attachments``
  (``downloadLink``, ``mediaType``, ``fileSize``), plus the v1 endpoints below;
* Data Center (``cloud=False``, no context path): v1 only; ``/api/v2/...`` is a 404.
* v1: ``/rest/api/space/{key}?expand=homepage``, ``/rest/api/content/search`` (a small CQL
  subset: ``space = "K"``, ``type = page``, ``lastmodified >= "yyyy-MM-dd HH:mm"``; ``start``
  / ``limit`` pagination with ``_links.next`` relative to the context path; ``expand`` of
  ``body.storage``, ``version``, ``ancestors``), ``/rest/api/content/{id}``,
  ``/rest/api/content/{id}/child/attachment`` and ``/download/attachments/{page}/{file}``.

The test drives it: edit :attr:`pages` / :attr:`attachments`, queue faults
(:attr:`throttle` answers 429 with ``Retry-After``, :attr:`errors` answers 5xx), require
credentials (:attr:`auth`); :attr:`log` records every request (path, status, whether a page
body or an attachment's bytes were served). Page bodies are written for these tests.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit


@dataclass
class FakePage:
    id: str
    title: str
    space: str
    body: str
    version: int = 1
    when: str = "2026-11-30T10:00:00.000Z"
    parent: str | None = None
    status: str = "current"


@dataclass
class FakeAttachment:
    id: str
    title: str
    media_type: str
    data: bytes
    version: int = 1
    when: str = "2026-11-30T10:00:00.000Z"


@dataclass
class Served:
    path: str
    status: int
    body: bool = False  # a page's storage body was in the answer
    download: bool = False


@dataclass
class ConfluenceState:
    cloud: bool
    spaces: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {id, homepageId}
    pages: dict[str, FakePage] = field(default_factory=dict)
    attachments: dict[str, list[FakeAttachment]] = field(default_factory=dict)
    auth: str | None = None  # the exact Authorization header required (None: anonymous ok)
    forbidden: bool = False  # every request answers 403
    throttle: int = 0  # answer the next N requests with 429 + Retry-After
    retry_after: str = "0"
    errors: int = 0  # answer the next N requests with 503 (no Retry-After) / 500
    # True: /rest/api/content/{id} answers 404 (v2 has the page); "all": v1 search too
    v1_content_missing: bool | str = False
    hang_s: float = 0.0  # sleep this long before answering (a hung server)
    foreign_next: str | None = None  # v2 listings: this absolute URL as `_links.next`
    link_header: bool = False  # v2 listings: next page only in a `Link` header, not the body
    log: list[Served] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_space(self, key: str, space_id: str, home: FakePage) -> None:
        self.spaces[key] = {"id": space_id, "homepageId": home.id}
        self.pages[home.id] = home

    def add(self, page: FakePage) -> FakePage:
        self.pages[page.id] = page
        return page

    def edit(self, pid: str, body: str, when: str = "2026-12-01T09:30:00.000Z") -> None:
        p = self.pages[pid]
        p.body, p.version, p.when = body, p.version + 1, when

    def bodies_served(self) -> int:
        return sum(1 for s in self.log if s.body)

    def downloads(self) -> int:
        return sum(1 for s in self.log if s.download)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        st = self.server.state
        parts = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        path = parts.path
        self.extra: dict[str, str] = {}
        if st.hang_s:
            time.sleep(st.hang_s)
        with st.lock:
            status, payload, ctype, body_served, download = self._route(st, path, q)
            st.log.append(Served(path, status, body_served, download))
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", st.retry_after)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        for name, value in self.extra.items():
            self.send_header(name, value)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # -- routing ----------------------------------------------------------------------------

    def _route(
        self, st: ConfluenceState, path: str, q: dict[str, str]
    ) -> tuple[int, Any, str, bool, bool]:
        j = "application/json"
        if st.auth is not None and self.headers.get("Authorization") != st.auth:
            return 401, {"statusCode": 401, "message": "Unauthorized"}, j, False, False
        if st.forbidden:
            return 403, {"statusCode": 403, "message": "Forbidden"}, j, False, False
        if st.throttle:
            st.throttle -= 1
            return 429, {"statusCode": 429, "message": "Rate limited"}, j, False, False
        if st.errors:
            st.errors -= 1
            return 503 if st.errors % 2 else 500, {"message": "storm"}, j, False, False
        ctx = "/wiki" if st.cloud else ""
        if not path.startswith(ctx + "/"):
            return 404, {"message": "not found"}, j, False, False
        rel = path[len(ctx) :]
        m = re.fullmatch(r"/api/v2/spaces", rel)
        if m and st.cloud:
            keys = q.get("keys", "").split(",")
            res = [
                {"id": s["id"], "key": k, "homepageId": s["homepageId"]}
                for k, s in st.spaces.items()
                if k in keys
            ]
            return 200, {"results": res, "_links": {}}, j, False, False
        m = re.fullmatch(r"/api/v2/spaces/([^/]+)/pages", rel)
        if m and st.cloud:
            key = next((k for k, s in st.spaces.items() if s["id"] == m.group(1)), None)
            pages = [p for p in self._ordered(st) if p.space == key]
            status = q.get("status", "current,archived").split(",")
            pages = [p for p in pages if p.status in status]
            start = int(q.get("cursor") or 0)
            limit = int(q.get("limit", 25))
            chunk = pages[start : start + limit]
            links: dict[str, str] = {"base": self._base(ctx)}
            if start + limit < len(pages):
                nq = urlencode(
                    {"status": q.get("status", ""), "limit": limit, "cursor": start + limit}
                )
                links["next"] = f"{ctx}/api/v2/spaces/{m.group(1)}/pages?{nq}"
                if st.link_header:
                    self.extra["Link"] = f'<{links.pop("next")}>; rel="next"'
            if st.foreign_next:
                links["next"] = st.foreign_next
            res = [self._v2_page(p, st) for p in chunk]
            return 200, {"results": res, "_links": links}, j, False, False
        m = re.fullmatch(r"/api/v2/pages/([^/]+)", rel)
        if m and st.cloud:
            p = st.pages.get(m.group(1))
            if p is None or p.status != "current":
                return 404, {"errors": [{"status": 404, "title": "Not Found"}]}, j, False, False
            out = self._v2_page(p, st)
            with_body = q.get("body-format") == "storage"
            if with_body:
                out["body"] = {"storage": {"value": p.body, "representation": "storage"}}
            return 200, out, j, with_body, False
        m = re.fullmatch(r"/api/v2/pages/([^/]+)/attachments", rel)
        if m and st.cloud:
            res = [self._v2_att(m.group(1), a, ctx) for a in st.attachments.get(m.group(1), [])]
            return 200, {"results": res, "_links": {}}, j, False, False
        m = re.fullmatch(r"/rest/api/space/([^/]+)", rel)
        if m:
            s = st.spaces.get(m.group(1))
            if s is None:
                return 404, {"statusCode": 404, "message": "No space"}, j, False, False
            home = st.pages[s["homepageId"]]
            return (
                200,
                {
                    "id": s["id"],
                    "key": m.group(1),
                    "homepage": {"id": home.id, "title": home.title},
                },
                j,
                False,
                False,
            )
        if rel.startswith("/rest/api/content") and st.v1_content_missing == "all":
            return 404, {"statusCode": 404, "message": "no v1 here"}, j, False, False
        if rel == "/rest/api/content/search":
            return self._search(st, q, ctx)
        m = re.fullmatch(r"/rest/api/content/([^/]+)", rel)
        if m and st.v1_content_missing and rel != "/rest/api/content/search":
            return 404, {"statusCode": 404, "message": "gone from v1"}, j, False, False
        if m:
            p = st.pages.get(m.group(1))
            if p is None or p.status != "current":
                return 404, {"statusCode": 404, "message": "No content"}, j, False, False
            expand = q.get("expand", "")
            return 200, self._v1_content(p, st, expand), j, "body.storage" in expand, False
        m = re.fullmatch(r"/rest/api/content/([^/]+)/child/attachment", rel)
        if m:
            res = [self._v1_att(m.group(1), a) for a in st.attachments.get(m.group(1), [])]
            return (
                200,
                {
                    "results": res,
                    "start": 0,
                    "limit": 200,
                    "size": len(res),
                    "_links": {"base": self._base(ctx), "context": ctx},
                },
                j,
                False,
                False,
            )
        m = re.fullmatch(r"/download/attachments/([^/]+)/([^/]+)", rel)
        if m:
            for a in st.attachments.get(m.group(1), []):
                if quote(a.title) == m.group(2) or a.title == m.group(2):
                    return 200, a.data, a.media_type, False, True
        return 404, {"statusCode": 404, "message": "not found"}, j, False, False

    def _search(
        self, st: ConfluenceState, q: dict[str, str], ctx: str
    ) -> tuple[int, Any, str, bool, bool]:
        cql = q.get("cql", "")
        if re.search(r"type\s*=\s*attachment", cql):
            return self._attachment_search(st, q, cql)
        sm = re.search(r'space\s*=\s*"?([A-Za-z0-9~_-]+)"?', cql)
        lm = re.search(r'lastmodified\s*>=?\s*"([^"]+)"', cql)
        pages = [p for p in self._ordered(st) if p.status == "current"]
        if sm:
            pages = [p for p in pages if p.space == sm.group(1)]
        if lm:
            since = datetime.strptime(lm.group(1), "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
            pages = [p for p in pages if _when(p.when) >= since]
        start, limit = int(q.get("start", 0)), int(q.get("limit", 25))
        chunk = pages[start : start + limit]
        expand = q.get("expand", "")
        links: dict[str, str] = {"base": self._base(ctx), "context": ctx}
        if start + limit < len(pages):
            nq = urlencode({"cql": cql, "expand": expand, "limit": limit, "start": start + limit})
            links["next"] = f"/rest/api/content/search?{nq}"
        res = [self._v1_content(p, st, expand) for p in chunk]
        body = "body.storage" in expand and bool(res)
        return (
            200,
            {"results": res, "start": start, "limit": limit, "size": len(res), "_links": links},
            "application/json",
            body,
            False,
        )

    def _attachment_search(
        self, st: ConfluenceState, q: dict[str, str], cql: str
    ) -> tuple[int, Any, str, bool, bool]:
        sm = re.search(r'space\s*=\s*"?([A-Za-z0-9~_-]+)"?', cql)
        lm = re.search(r'lastmodified\s*>=?\s*"([^"]+)"', cql)
        since = datetime.strptime(lm.group(1), "%Y-%m-%d %H:%M").replace(tzinfo=UTC) if lm else None
        res = []
        for pid, atts in st.attachments.items():
            page = st.pages.get(pid)
            if page is None or (sm and page.space != sm.group(1)):
                continue
            for a in atts:
                if since is None or _when(a.when) >= since:
                    res.append({**self._v1_att(pid, a), "container": {"id": pid, "type": "page"}})
        return (
            200,
            {"results": res, "start": 0, "limit": len(res), "size": len(res), "_links": {}},
            "application/json",
            False,
            False,
        )

    # -- shapes -----------------------------------------------------------------------------

    def _ordered(self, st: ConfluenceState) -> list[FakePage]:
        return sorted(st.pages.values(), key=lambda p: (_when(p.when), p.id))

    def _base(self, ctx: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{ctx}"

    def _ancestors(self, p: FakePage, st: ConfluenceState) -> list[dict[str, Any]]:
        chain: list[FakePage] = []
        cur = st.pages.get(p.parent) if p.parent else None
        while cur is not None:
            chain.insert(0, cur)
            cur = st.pages.get(cur.parent) if cur.parent else None
        return [{"id": a.id, "type": "page", "status": "current", "title": a.title} for a in chain]

    def _v2_page(self, p: FakePage, st: ConfluenceState) -> dict[str, Any]:
        return {
            "id": p.id,
            "status": p.status,
            "title": p.title,
            "spaceId": st.spaces[p.space]["id"],
            "parentId": p.parent,
            "parentType": "page",
            "authorId": "5b10ac8d82e05b22cc7d4ef5",
            "createdAt": "2026-01-05T08:00:00.000Z",
            "version": {
                "number": p.version,
                "createdAt": p.when,
                "message": "",
                "minorEdit": False,
                "authorId": "5b10ac8d82e05b22cc7d4ef5",
            },
            "_links": {"webui": f"/spaces/{p.space}/pages/{p.id}"},
        }

    def _v1_content(self, p: FakePage, st: ConfluenceState, expand: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": p.id,
            "type": "page",
            "status": p.status,
            "title": p.title,
            "_links": {
                "webui": f"/spaces/{p.space}/pages/{p.id}",
                "self": f"/rest/api/content/{p.id}",
            },
        }
        if "version" in expand:
            out["version"] = {
                "number": p.version,
                "when": p.when,
                "by": {"type": "known", "displayName": "Mei Lin"},
            }
        if "ancestors" in expand:
            out["ancestors"] = self._ancestors(p, st)
        if "space" in expand:
            out["space"] = {"key": p.space, "id": st.spaces[p.space]["id"]}
        if "body.storage" in expand:
            out["body"] = {"storage": {"value": p.body, "representation": "storage"}}
        return out

    def _v2_att(self, pid: str, a: FakeAttachment, ctx: str) -> dict[str, Any]:
        return {
            "id": a.id,
            "status": "current",
            "title": a.title,
            "mediaType": a.media_type,
            "fileSize": len(a.data),
            "pageId": pid,
            "version": {"number": a.version, "createdAt": a.when},
            "downloadLink": f"/download/attachments/{pid}/{quote(a.title)}?version={a.version}",
            "webuiLink": f"/pages/viewpageattachments.action?pageId={pid}",
        }

    def _v1_att(self, pid: str, a: FakeAttachment) -> dict[str, Any]:
        return {
            "id": a.id,
            "type": "attachment",
            "status": "current",
            "title": a.title,
            "metadata": {"mediaType": a.media_type},
            "extensions": {"mediaType": a.media_type, "fileSize": len(a.data)},
            "version": {"number": a.version, "when": a.when},
            "_links": {
                "download": f"/download/attachments/{pid}/{quote(a.title)}?version={a.version}"
            },
        }


def _when(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: ConfluenceState

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out and hung up (the hung-server test) is not an error."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serve(state: ConfluenceState) -> Iterator[str]:
    """Serve ``state`` on a free loopback port; yields the base URL (``.../wiki`` for Cloud)."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = state
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    try:
        yield f"http://{host}:{port}" + ("/wiki" if state.cloud else "")
    finally:
        server.shutdown()
        server.server_close()


def basic(user: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()
