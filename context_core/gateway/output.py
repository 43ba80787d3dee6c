"""The output sanitizer: what an agent replies is cleaned before it is stored or shown.

The gateway (:mod:`context_core.gateway.sanitize`) keeps secrets and PII out of memory; an agent's
*reply* also goes to a person's screen (a chat UI rendering Markdown or HTML) and to tools that
follow its links. :func:`sanitize_output` returns the reply with

* **dangerous links removed**: schemes other than ``http``/``https``/``mailto`` on real links
  (``javascript:``, ``vbscript:``, ``data:``, ``file:`` ... in any case, with tabs, newlines,
  control characters, entities or percent-escapes inside), and links to hosts that are not on
  the public internet: loopback, link-local, private and unique-local ranges, cloud metadata
  addresses and names, ``0.0.0.0``, ``localhost``/``*.localhost``/``*.internal``/``*.local``,
  in every form a browser accepts (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``[::1]``,
  ``[::ffff:127.0.0.1]``, ``http://good.com@127.0.0.1/``, ``http:\\\\127.0.0.1``). URLs are
  parsed with :mod:`urllib.parse`, addresses with :mod:`ipaddress` (after the WHATWG IPv4
  number forms); no DNS lookup is made, so a public name that resolves to a private address
  (``127.0.0.1.nip.io``) is not caught here;
* **HTML reduced to an allow-list** with nh3 (ammonia): ``<script>``, event handlers,
  ``style``, ``<iframe>``, ``<svg>``, ``<math>``, ``<form>``, ``<base>``, ``<meta>`` ... go
  (script-like elements with their content), every kept ``<a>`` gets
  ``rel="noopener noreferrer"``, ``href``/``src``/``cite`` pass the link check above;
* **Markdown links handled as a CommonMark renderer reads them**: every destination after
  ``](`` (inline links and images, whatever the brackets before them: link texts of any
  length, labels over several lines) and after ``]:`` (reference definitions in any
  container: blockquotes, list items, nested ones, the destination on the next line), plus
  autolinks and bare URLs (``http(s)://``, ``www.``, scheme-relative ``//host``). A linear
  scan finds and checks the destinations; where one is unsafe, markdown-it (the CommonMark
  reference parser) parses the text and its tokens say what to rewrite: an unsafe link
  becomes its text (an image its alt text), an unsafe definition goes with its lines, an
  unsafe autolink or bare URL becomes ``(link removed)``. What the tokens do not cover (a
  destination inside code, a text over markdown-it's cost bounds: 1,024 lines or 64 KB)
  loses its destination only (``[x](javascript:y)`` -> ``[x]()``). Safe links are kept as
  written. The work is linear in the text (``benchmarks/output_sanitizer.py``);
  ``budget_ms`` caps the CPU time of one call;
* **secrets and PII removed** by the gateway (its rules, its audit trail: nothing is
  duplicated here).

``fmt`` says how the text will be rendered: ``"markdown"`` (default; inline HTML allowed from
the list), ``"html"`` (the whole text is an HTML fragment, cleaned by nh3 as a document) or
``"text"`` (no HTML survives). In Markdown, HTML inside code (fenced blocks, code spans) is
escaped (``&lt;script>``) rather than removed: renderers disagree about where code ends, and
an escaped tag is inert either way. Links are checked everywhere, code included.

The passes run again until the text no longer changes (removing one construct can join the
pieces of another, ``<<b></b>img ...>``), at most :data:`_MAX_ROUNDS` times, after which every
``<`` is escaped. Each removal is reported (:class:`Removal`): its kind, a short display value
(DLP-cleaned, query strings and user info cut, truncated; never a secret) and a detail. The
removals are audited in the gateway's audit file as one record per call (kind and a hash of the
removed value, never the value), next to the gateway's own record of its DLP findings.
"""

from __future__ import annotations

import bisect
import contextvars
import functools
import html
import ipaddress
import logging
import re
import threading
import time
import unicodedata
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any, Literal

import nh3
from markdown_it import MarkdownIt
from markdown_it.helpers import parseLinkLabel
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token

from context_core.errors import SanitizeBudgetExceededError
from context_core.gateway.redaction import redact_text
from context_core.gateway.sanitize import REDACTED, Finding, Gateway

__all__ = [
    "ALLOWED_SCHEMES",
    "LINK_REMOVED",
    "OutputFormat",
    "Removal",
    "SanitizedOutput",
    "check_url",
    "sanitize_output",
]

log = logging.getLogger(__name__)

OutputFormat = Literal["markdown", "html", "text"]

#: Schemes a kept link may have (links without a scheme, relative ones, are kept too).
ALLOWED_SCHEMES = frozenset({"http", "https", "mailto"})
#: What an unsafe autolink or bare URL is replaced with.
LINK_REMOVED = "(link removed)"

_MAX_ROUNDS = 4
_MAX_TOKEN = 4096  # a tag, comment or link longer than this is not parsed as one (escaped)
_MAX_FINDINGS = 200
_DISPLAY_MAX = 60

# --- the HTML allow-list -----------------------------------------------------------------------

_TAGS = frozenset(
    {
        "a", "abbr", "b", "blockquote", "br", "caption", "cite", "code", "col", "colgroup",
        "dd", "del", "details", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2",
        "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "mark", "ol", "p", "pre",
        "q", "s", "samp", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody",
        "td", "tfoot", "th", "thead", "tr", "u", "ul", "var", "wbr",
    }
)  # fmt: skip
_ATTRIBUTES: dict[str, set[str]] = {
    "*": {"title", "lang", "dir"},
    "a": {"href", "hreflang"},
    "img": {"src", "alt", "width", "height"},
    "blockquote": {"cite"},
    "q": {"cite"},
    "del": {"cite", "datetime"},
    "ins": {"cite", "datetime"},
    "ol": {"start"},
    "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align", "scope"},
    "col": {"span"},
    "colgroup": {"span"},
}
# Elements removed together with their content (their content is script, markup or a
# document of its own, never text meant for the reader).
_DROP_CONTENT = frozenset(
    {
        "script", "style", "iframe", "frame", "frameset", "object", "applet", "template",
        "noscript", "noembed", "noframes", "xmp", "plaintext", "svg", "math", "title",
        "textarea", "select",
    }
)  # fmt: skip
_URL_ATTRS = frozenset(
    {"href", "src", "cite", "action", "formaction", "xlink:href", "poster", "background",
     "data", "srcset", "ping", "srcdoc", "codebase", "longdesc", "lowsrc", "dynsrc"}
)  # fmt: skip
_LINK_REL = "noopener noreferrer"

# A start tag's context, so that html5ever keeps it when it is cleaned on its own.
_TABLE_CONTEXT = {
    "td": "<table><tr>",
    "th": "<table><tr>",
    "tr": "<table>",
    "tbody": "<table>",
    "thead": "<table>",
    "tfoot": "<table>",
    "caption": "<table>",
    "colgroup": "<table>",
    "col": "<table><colgroup>",
}

# --- findings ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Removal:
    """One thing taken out of a reply.

    ``kind``: ``scheme``, ``private_host``, ``bad_url``, ``html_tag``, ``html_attr``,
    ``html_comment``, ``secret`` or ``pii``. ``value``: what was removed, for display: cleaned
    by the gateway's rules, without query string, fragment or user info, truncated (for
    ``secret``/``pii``: ``[REDACTED]``). ``detail``: why, in a few words.
    """

    kind: str
    value: str
    detail: str
    digest: str = field(default="", repr=False, compare=False)  # audit only

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "value": self.value, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class SanitizedOutput:
    """The cleaned text and what was removed from it (in the order found)."""

    text: str
    removed: tuple[Removal, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.removed)


def _display(raw: str, *, url: bool = False) -> str:
    """A removed value as shown to the client: DLP-cleaned, no query/user info, truncated."""
    text = "".join(ch if ch.isprintable() else " " for ch in raw[: 8 * _DISPLAY_MAX]).strip()
    if url:
        text = re.split(r"[?#]", text, maxsplit=1)[0]
        m = re.match(r"(?i)([a-z][a-z0-9+.\-]*:/*)([^/]*@)", text)
        if m:  # user info: may hold a password, always a distraction
            text = m.group(1) + "…@" + text[m.end() :]
    text = redact_text(text)[0]
    if len(text) > _DISPLAY_MAX:
        text = text[: _DISPLAY_MAX - 1] + "…"
    return text


class _Findings:
    def __init__(self, hasher: Callable[[bytes], str]) -> None:
        self.items: list[Removal] = []
        self.dropped = 0
        self.hasher = hasher  # the gateway's audit hash (HMAC-keyed when configured)

    def add(self, kind: str, raw: str, detail: str, *, url: bool = False) -> None:
        if len(self.items) >= _MAX_FINDINGS:
            self.dropped += 1
            return
        digest = self.hasher(raw.encode("utf-8", "surrogatepass"))
        self.items.append(Removal(kind, _display(raw, url=url), detail, digest))


class _Budget:
    """The CPU time (this thread's) one call may take; checked every few hundred steps of
    the passes, the parser's link rules included."""

    def __init__(self, budget_ms: float) -> None:
        self.budget_ms = budget_ms
        self.deadline = time.thread_time() + budget_ms / 1000.0
        self.steps = 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps & 0xFF == 0:
            self.check()

    def check(self) -> None:
        if time.thread_time() > self.deadline:
            raise SanitizeBudgetExceededError(self.budget_ms)


# --- URLs -------------------------------------------------------------------------------------

_SCHEME_RX = re.compile(r"([a-z][a-z0-9+.\-]*):")
_MD_ESCAPE_RX = re.compile(r"\\([!-/:-@\[-`{-~])")
# What _normalize_url removes: whitespace (str.isspace), control and format characters
# (Unicode categories Cc and Cf, soft hyphen and zero-width ones included), as one class
# (Unicode 14; tests/test_output_sanitizer.py checks it against unicodedata).
_STRIPPED = (
    "\u0000-\u0020\u007f-\u00a0\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2"
    "\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ufeff"
    "\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
_STRIPPED_RX = re.compile(f"[{_STRIPPED}]+")
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})
_SPECIAL_SCHEMES = frozenset({"http", "https", "ws", "wss", "ftp"})

_LOCAL_NAMES = frozenset(
    {
        "localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "metadata",
        "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal",
        "kubernetes.default", "kubernetes.default.svc",
    }
)  # fmt: skip
_LOCAL_SUFFIXES = (".localhost", ".internal", ".local", ".home.arpa", ".svc.cluster.local")
_METADATA_IPS = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),
        ipaddress.ip_address("169.254.170.2"),
        ipaddress.ip_address("100.100.100.200"),
        ipaddress.ip_address("192.0.0.192"),
        ipaddress.ip_address("fd00:ec2::254"),
    }
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPv4_PART = {16: re.compile(r"[0-9a-f]*\Z"), 8: re.compile(r"[0-7]*\Z"), 10: re.compile(r"\d+\Z")}


def _normalize_url(raw: str) -> str:
    """The URL as a browser would read it, for checking only: entities and Markdown escapes
    decoded, percent-escapes decoded, NFKC-folded, whitespace/control/invisible characters
    removed, backslashes as slashes."""
    s = html.unescape(raw)
    s = _MD_ESCAPE_RX.sub(r"\1", s)
    s = urllib.parse.unquote(s)
    s = unicodedata.normalize("NFKC", s).translate(_DOTS)
    return _STRIPPED_RX.sub("", s).replace("\\", "/")


def _ipv4_number_form(host: str) -> ipaddress.IPv4Address | None:
    """WHATWG IPv4 parsing: 1-4 parts, each decimal, octal (leading 0) or hex (0x)."""
    parts = host.split(".")
    if parts and parts[-1] == "":
        parts.pop()
    if not 1 <= len(parts) <= 4:
        return None
    nums: list[int] = []
    for part in parts:
        if part.startswith(("0x", "0X")):
            base, digits = 16, part[2:].lower()
        elif len(part) > 1 and part.startswith("0"):
            base, digits = 8, part[1:]
        else:
            base, digits = 10, part
        if not _IPv4_PART[base].match(digits) or (base == 10 and not digits):
            return None
        nums.append(int(digits, base) if digits else 0)
    if any(n > 255 for n in nums[:-1]) or nums[-1] >= 256 ** (5 - len(nums)):
        return None
    value = nums[-1]
    for i, n in enumerate(nums[:-1]):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    n = int(ip)
    if n >> 32 == 0 and n > 1:  # ::a.b.c.d (deprecated "compatible" form); :: and ::1 excluded
        return ipaddress.IPv4Address(n & 0xFFFFFFFF)
    if ip in _NAT64:
        return ipaddress.IPv4Address(n & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def _ip_verdict(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address):
        v4 = _embedded_v4(ip)
        if v4 is not None:
            inner = _ip_verdict(v4)
            if inner is not None:
                return f"{inner} via {ip.compressed}"
    if ip in _METADATA_IPS:
        return f"metadata address {ip.compressed}"
    for test, what in (
        (ip.is_loopback, "loopback"),
        (ip.is_unspecified, "unspecified"),
        (ip.is_link_local, "link-local"),
        (ip.is_private, "private"),
        (ip.is_multicast, "multicast"),
        (not ip.is_global, "not globally routable"),
    ):
        if test:
            return f"{what} address {ip.compressed}"
    return None


def _host_verdict(host: str) -> str | None:
    host = host.strip().rstrip(".").lower()
    if not host:
        return "no host"
    if ":" in host:  # IPv6 (urllib has removed the brackets); drop a zone id
        try:
            return _ip_verdict(ipaddress.IPv6Address(host.split("%", 1)[0]))
        except ValueError:
            return "malformed IPv6 address"
    try:
        ip: ipaddress.IPv4Address | None = ipaddress.IPv4Address(host)
        obfuscated = False
    except ValueError:
        ip, obfuscated = _ipv4_number_form(host), True
    if ip is not None:
        verdict = _ip_verdict(ip)
        if verdict is not None and obfuscated:
            verdict += f" (written {host})"
        return verdict
    if host in _LOCAL_NAMES or host.endswith(_LOCAL_SUFFIXES):
        return f"local name {host}"
    return None


def check_url(raw: str) -> tuple[str, str] | None:
    """See :func:`_check_url`; short URLs' verdicts are cached (repeated links are common)."""
    if len(raw) <= 512:
        return _check_url_cached(raw)
    return _check_url(raw)


def _check_url(raw: str) -> tuple[str, str] | None:
    """``None`` when ``raw`` is a safe link target, else ``(kind, detail)``: kind ``scheme``
    (not http/https/mailto), ``private_host`` (a host off the public internet) or
    ``bad_url`` (one that does not parse)."""
    url = _normalize_url(raw)
    m = _SCHEME_RX.match(url.lower())
    if m is None:
        if not url.startswith("//"):
            return None  # relative: path, query or fragment on the page's own origin
        scheme, rest = "https", url
    else:
        scheme, rest = m.group(1), url[m.end() :]
        if scheme not in ALLOWED_SCHEMES:
            return "scheme", f"{scheme}: links are not allowed"
        if scheme not in _SPECIAL_SCHEMES:
            return None  # mailto: names no host to fetch
    # http:host, http:/host and http:///host all reach "host" in a browser
    rest = "//" + rest.lstrip("/")
    try:
        netloc = urllib.parse.urlsplit(f"{scheme}:{rest}").netloc
    except ValueError:  # brackets in the user info: the host is what follows the last "@"
        netloc = re.split(r"[/?#]", rest[2:], maxsplit=1)[0]
    try:
        parts = urllib.parse.urlsplit(f"{scheme}://{netloc.rpartition('@')[2]}")
        host = parts.hostname
        _ = parts.port  # a port that is not a number is a URL no browser opens
    except ValueError as e:
        return "bad_url", f"unparseable URL ({e})"
    verdict = _host_verdict(host or "")
    if verdict is None:
        return None
    return ("bad_url" if verdict == "no host" else "private_host"), verdict


_check_url_cached = functools.lru_cache(maxsize=4096)(_check_url)

# --- HTML ---------------------------------------------------------------------------------


def _attribute_filter(tag: str, attr: str, value: str) -> str | None:
    if attr in _URL_ATTRS and check_url(value) is not None:
        return None
    return value


def _cleaner(tags: frozenset[str]) -> Callable[[str], str]:
    attributes = {t: a for t, a in _ATTRIBUTES.items() if t == "*" or t in tags}
    cleaner = nh3.Cleaner(
        tags=set(tags),
        clean_content_tags=set(_DROP_CONTENT),
        attributes=attributes,
        attribute_filter=_attribute_filter,
        url_schemes=set(ALLOWED_SCHEMES),
        link_rel=_LINK_REL,
        strip_comments=True,
    )
    return cleaner.clean


_CLEAN_HTML = _cleaner(_TAGS)


class _HtmlReport(HTMLParser):
    """What nh3 will remove from an HTML document, for the report (nh3 does not say)."""

    def __init__(self, findings: _Findings, allowed: frozenset[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.findings, self.allowed = findings, allowed

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        _report_tag(self.findings, tag, attrs, self.allowed)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        _report_tag(self.findings, tag, attrs, self.allowed)

    def handle_comment(self, data: str) -> None:
        self.findings.add("html_comment", "<!-- -->", "comment removed")

    def handle_decl(self, decl: str) -> None:
        self.findings.add("html_tag", f"<!{decl[:20]}>", "declaration removed")

    def handle_pi(self, data: str) -> None:
        self.findings.add("html_tag", "<?…>", "processing instruction removed")

    def unknown_decl(self, data: str) -> None:
        self.findings.add("html_tag", "<![…]>", "declaration removed")


def _report_tag(
    findings: _Findings, tag: str, attrs: list[tuple[str, str | None]], allowed: frozenset[str]
) -> None:
    if tag not in allowed:
        what = "removed with its content" if tag in _DROP_CONTENT else "removed"
        findings.add("html_tag", f"<{tag}>", f"tag <{tag}> {what}")
        return
    ok = _ATTRIBUTES.get(tag, set()) | _ATTRIBUTES["*"]
    for name, value in attrs:
        if name == "rel" and tag == "a":
            continue  # replaced by rel="noopener noreferrer", not removed
        if name not in ok:
            shown = f"{name}={value}" if value is not None else name
            findings.add("html_attr", shown, f"attribute {name} removed from <{tag}>")
        elif name in _URL_ATTRS and value is not None:
            verdict = check_url(value)
            if verdict is not None:
                findings.add(verdict[0], value, f"<{tag} {name}>: {verdict[1]}", url=True)


_ATTR_RX = re.compile(r"""([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+)))?""")
_TOKEN_RX = re.compile(
    r"""
    (?P<comment><!--.*?-->)
  | (?P<cdata><!\[CDATA\[.*?\]\]>)
  | (?P<decl><![A-Za-z][^>]*>)
  | (?P<pi><\?.*?\?>)
  | (?P<end></(?P<endname>[A-Za-z][A-Za-z0-9:\-]*)[^>]*>)
  | (?P<autolink><[A-Za-z][A-Za-z0-9+.\-]{1,31}:[^\s<>]*>)
  | (?P<email><[A-Za-z0-9.!\#$%&'*+/=?^_`{|}~\-]+@[A-Za-z0-9](?:[A-Za-z0-9\-.]*[A-Za-z0-9])?>)
  | (?P<start><(?P<name>[A-Za-z][A-Za-z0-9:\-]*)(?=[\s/>])(?:[^>"']++|"[^"]*+"|'[^']*+')*+>)
    """,
    re.S | re.X,
)
_START_RX = re.compile(r"""<([a-z][a-z0-9:\-]*)(?:[^>"']++|"[^"]*+"|'[^']*+')*+>""")


def _tag_attrs(tok: str) -> list[tuple[str, str | None]]:
    body = re.sub(r"^<[A-Za-z][A-Za-z0-9:\-]*", "", tok)[:-1]
    out: list[tuple[str, str | None]] = []
    for m in _ATTR_RX.finditer(body):
        value = next((g for g in m.groups()[1:] if g is not None), None)
        out.append((m.group(1).lower(), html.unescape(value) if value is not None else None))
    return out


def _clean_start_tag(tok: str, name: str, allowed: frozenset[str]) -> str:
    """The allowed start tag ``tok`` as nh3 keeps it ("" when nh3 drops it); short tags'
    answers cached (replies repeat their tags)."""
    if len(tok) <= 256:
        return _clean_start_tag_cached(tok, name, allowed)
    return _clean_start_tag_once(tok, name, allowed)


def _clean_start_tag_once(tok: str, name: str, allowed: frozenset[str]) -> str:
    ctx = _TABLE_CONTEXT.get(name, "")
    cleaned = _clean_for(allowed)(ctx + tok)
    for m in _START_RX.finditer(cleaned):
        if m.group(1) == name:
            return m.group(0)
    return ""


_clean_start_tag_cached = functools.lru_cache(maxsize=4096)(_clean_start_tag_once)
_CLEANERS: dict[frozenset[str], Callable[[str], str]] = {_TAGS: _CLEAN_HTML}
_CLEANERS_LOCK = threading.Lock()


def _clean_for(allowed: frozenset[str]) -> Callable[[str], str]:
    with _CLEANERS_LOCK:
        fn = _CLEANERS.get(allowed)
        if fn is None:
            fn = _CLEANERS[allowed] = _cleaner(allowed | frozenset({"table", "tr", "colgroup"}))
        return fn


_UNTERMINATED_RX = re.compile(r"<(?=[^\W\d_]|[/!?])")  # what the loop escapes when no tag ends
_CLOSERS = (("<!--", "-->"), ("<![CDATA[", "]]>"), ("<?", "?>"))


def _may_close(seg: str, j: int, limit: int, closers: dict[str, int]) -> bool:
    """False when the construct at ``j`` cannot end within ``limit``: every alternative of
    _TOKEN_RX ends with ">", and a comment, CDATA section or processing instruction with its
    own closer. The next closer after a position is remembered, so that ``"<a href=" * N``
    or ``"<!--" * N`` is not scanned N times up to the window's end."""
    gt = closers.get(">")
    if gt is None or 0 <= gt < j:
        gt = closers[">"] = seg.find(">", j)
    if gt < 0 or gt >= limit:
        return False
    for opener, closer in _CLOSERS:
        if seg.startswith(opener, j):
            start = j + len(opener)
            at = closers.get(closer)
            if at is None or 0 <= at < start:
                at = closers[closer] = seg.find(closer, start)
            return at >= 0 and at + len(closer) <= limit
    return True


def _inline_html(seg: str, allowed: frozenset[str], code: bool, findings: _Findings) -> str:
    """HTML inside Markdown: each tag through nh3 (or escaped, in code); autolinks checked;
    a ``<`` that starts no complete tag is escaped."""
    out: list[str] = []
    unclosed: set[str] = set()
    closers: dict[str, int] = {}
    i, n = 0, len(seg)
    while True:
        j = seg.find("<", i)
        if j < 0:
            out.append(seg[i:])
            break
        out.append(seg[i:j])
        gt = closers.get(">")
        if gt is None or 0 <= gt < j:
            gt = closers[">"] = seg.find(">", j)
        stop = n if gt < 0 else gt - _MAX_TOKEN + 1
        if stop > j + 1:  # no "<" before ``stop`` reaches a ">" within its window: in bulk
            region = seg[j:stop]
            escaped = _UNTERMINATED_RX.findall(region)
            shown = min(len(escaped), max(0, _MAX_FINDINGS - len(findings.items)))
            for _ in range(shown):
                findings.add("html_tag", "<", "unterminated tag escaped")
            findings.dropped += len(escaped) - shown
            out.append(_UNTERMINATED_RX.sub("&lt;", region))
            i = stop
            continue
        limit = min(n, j + _MAX_TOKEN)
        m = _TOKEN_RX.match(seg, j, limit) if _may_close(seg, j, limit, closers) else None
        if m is None:
            nxt = seg[j + 1 : j + 2]
            if nxt and (nxt.isalpha() or nxt in "/!?"):
                out.append("&lt;")  # an unterminated (or too long) tag: inert text
                findings.add("html_tag", seg[j : j + 24], "unterminated tag escaped")
            else:
                out.append("<")
            i = j + 1
            continue
        tok, kind = m.group(0), m.lastgroup
        i = m.end()
        if kind == "autolink":
            verdict = check_url(tok[1:-1])
            if verdict is None:
                out.append(tok)
            else:
                findings.add(verdict[0], tok[1:-1], f"autolink: {verdict[1]}", url=True)
                out.append(LINK_REMOVED)
        elif kind == "email":
            out.append(tok)
        elif kind == "end":
            name = (m.group("endname") or "").lower()
            if name in allowed:
                out.append(f"</{name}>")
            elif code:
                out.append("&lt;" + tok[1:])
        elif kind == "start":
            name = (m.group("name") or "").lower()
            kept = _clean_start_tag(tok, name, allowed) if name in allowed else ""
            if code:
                if kept and kept == tok:
                    out.append(tok)
                else:
                    findings.add("html_tag", f"<{name}>", f"tag <{name}> escaped in code")
                    out.append("&lt;" + tok[1:])
                continue
            if kept != tok:  # kept as written: nothing to report
                _report_tag(findings, name, _tag_attrs(tok), allowed if kept else frozenset())
            out.append(kept)
            if not kept and name in _DROP_CONTENT:
                # its content goes too, up to its end tag; without one only the tag goes (what
                # follows is then ordinary text, and is cleaned as such)
                close = None
                if name not in unclosed:  # searched once in vain: no end tag later either
                    close = re.compile(rf"</{re.escape(name)}[\s/>]", re.I).search(seg, i)
                    if close is None:
                        unclosed.add(name)
                if close is not None:
                    gt = seg.find(">", close.end() - 1)
                    i = gt + 1 if gt >= 0 else n
        else:  # comment, CDATA, declaration, processing instruction
            if code:
                out.append("&lt;" + tok[1:])
            else:
                kind_name = "html_comment" if kind == "comment" else "html_tag"
                findings.add(kind_name, tok[:4] + "…", f"{kind} removed")
    return "".join(out)


# --- Markdown -------------------------------------------------------------------------------
#
# Where a renderer takes a link destination from, in CommonMark: right after "](" (inline
# links and images, whatever the brackets before them), after "]:" (reference definitions,
# in any container, the label over any number of lines), between "<" and ">" (autolinks).
# Two layers find them:
#
# 1. a linear scan (_scan) reads the destination after every "](" and "]:" with CommonMark's
#    rules (markdown-it's parseLinkDestination, as a single pass with a stack for the nested
#    parentheses, so that "](" * N is linear) and checks it: a superset of what any renderer
#    produces, code spans included, and no bracket matching (the quadratic part);
# 2. when the scan finds an unsafe destination, markdown-it (the CommonMark reference
#    implementation in Python, its validateLink accepting everything) parses the text and
#    its tokens say what to rewrite: a link or image becomes its text, a reference definition
#    (from env["references"], duplicates included) goes with its lines, an autolink becomes
#    LINK_REMOVED. Token positions are recorded by wrapping its link, image and autolink rules
#    and mapped from the inline content back to the source lines (container prefixes, tabs).
#
# Whatever the tokens do not cover (a destination in code, a text too big for the token pass,
# a position that does not map) loses its destination: "[x](javascript:y)" -> "[x]()". The
# passes repeat until nothing changes; if markdown-it still reports an unsafe link that could
# not be rewritten, every "[" and "<" is escaped (no link can form).

_FENCE_RX = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*$", re.M)
_TICKS_RX = re.compile(r"`+")
_BARE_RX = re.compile(
    r"(?i)(?<![A-Za-z0-9+.\-])"
    r"(?:(?:https?|ftps?|wss?)://|(?:javascript|vbscript|data|file):(?=[^\s<>\"'`])|www\.)"
    r"[^\s<>\"'`]*"
    r"|(?<![^\s(\[{<\"'=])//(?=[^\s/<>\"'`])[^\s<>\"'`]*"  # scheme-relative (linkify's "//")
)

# A destination worth checking starts like a scheme (letters up to ":" or up to something
# that decodes to a letter or ":": an entity, a percent-escape, a backslash, non-ASCII), a
# slash, a backslash, "&", "%", "<" or non-ASCII. Anything else is a relative URL.
_SUSPECT = r"(?:<|[A-Za-z][A-Za-z0-9+.\-]*(?=[:&%\\]|[^\x00-\x7f])|[/\\&%]|[^\x00-\x7f])"
_SUSPECT_RX = re.compile(_SUSPECT)
_CAND_RX = re.compile(r"\][(:]([ \t]*(?:\n[ \t>]*)?)(?=" + _SUSPECT + ")")
_SIG_RX = re.compile(r"[()\\\x00-\x20\x7f]")
_ANGLE_RX = re.compile(r"<((?:[^<>\n\\]|\\[^\n])*)>?")
# the end of a destination's scheme and authority: "?", "#" (not "&#", an entity), or a
# (back)slash after a character that is not a slash, backslash, ":" or ";" (and a backslash
# that escapes nothing); what follows does not change where a link goes
_AUTH_END_RX = re.compile(r"\?|(?<!&)#|(?<=[^/\\:;])(?:/|\\(?![!-/:-@\[-`{-~]))")
_MAX_PARENS = 32  # CommonMark renderers' limit on nested parentheses in a destination
# markdown-it's cost bounds (it is pure Python: ~5 us a line in the block parser, ~1 us a
# character and ~8 us a "[" in the inline one); beyond them the scan's rewrite applies alone
_MD_MAX_LINES = 1024
_MD_MAX_CHARS = 64 * 1024
_MD_MAX_INLINE_CHARS = 32 * 1024
_MD_MAX_BRACKETS = 2048


@dataclass(slots=True)
class _Dest:
    """An unsafe destination the scan found: ``[start, end)`` in the text (the edit)."""

    start: int
    end: int
    kind: str  # "](" inline, "]:" definition
    verdict: tuple[str, str]
    angle_raw: str | None = None  # the text between "<" and ">" of a <...> one

    def raw(self, src: str) -> str:
        return self.angle_raw if self.angle_raw is not None else src[self.start : self.end]


class _Scan:
    """The linear destination scan: one pass, candidates found by a regex in C, the nested
    parentheses of overlapping destinations (``"](http:x" * N``) on a stack."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.found: list[_Dest] = []

    def run(self) -> list[_Dest]:
        src, pos = self.src, 0
        while True:
            _tick()
            m = _CAND_RX.search(src, pos)
            if m is None:
                return self.found
            start = m.end()
            kind = "](" if src[m.start() + 1] == "(" else "]:"
            if src.startswith("<", start):
                pos = self._angle(start, kind)
            else:
                pos = self._bare(start, m.start(), kind)

    def _angle(self, start: int, kind: str) -> int:
        a = _ANGLE_RX.match(self.src, start)
        assert a is not None  # "<" matches the empty form
        raw = a.group(1)
        lead = _STRIPPED_RX.match(raw)  # a browser strips these before the scheme
        if _SUSPECT_RX.match(raw, lead.end() if lead else 0):
            verdict = check_url(raw)  # <...> ones do not overlap: each is checked whole
            if verdict is not None:
                self.found.append(_Dest(start, a.end(), kind, verdict, raw))
        return max(start + 1, a.end())

    def _bare(self, first: int, at: int, kind: str) -> int:
        """The destination at ``first`` and any nested "](" ones: ``stack`` entries are a
        destination's start (>= 0) or -1 for a "(" inside. Returns where to search on."""
        src, n = self.src, len(self.src)
        self.first = (first, kind)
        search, cand, add = _SIG_RX.search, _CAND_RX.match, self._add
        stack = [first]
        p = q = first
        resume = -1
        steps = 0
        while stack:
            steps += 1
            if not steps & 0x3F:
                _tick()
            m = search(src, p)
            if m is None:
                q = n
                self._end_all(stack, q)
                break
            q = m.start()
            ch = src[q]
            if ch == "(":
                c = cand(src, q - 1) if q and src[q - 1] == "]" else None
                stack.append(-1)
                if c is not None:
                    if c.group(1):  # "](" then spaces: the spaces end the live ones
                        resume = q - 1 if resume < 0 else resume
                    elif src.startswith("<", c.end()):
                        self._angle(c.end(), "](")
                    else:
                        stack.append(c.end())
                while len(stack) > _MAX_PARENS + 1:  # the oldest one is too deep
                    add(stack[0], q)
                    k = 1
                    while k < len(stack) and stack[k] < 0:
                        k += 1
                    del stack[:k]
                p = q = q + 1
                continue
            if ch == ")":
                top = stack.pop()
                if top >= 0:  # level 0: this ")" ends it
                    add(top, q)
                    if stack and stack[-1] < 0:
                        stack.pop()
                while stack and stack[0] < 0:
                    del stack[0]
                p = q = q + 1
                continue
            if ch == "\\":
                if q + 1 < n and src[q + 1] == " ":
                    self._end_all(stack, q)
                    break
                p = q = q + 2
                continue
            self._end_all(stack, q)  # a space or control character
            break
        return resume if resume >= 0 else max(q, at + 2)

    def _end_all(self, stack: list[int], q: int) -> None:
        for s in stack:
            if s >= 0:
                self._add(s, q)
        stack.clear()

    def _add(self, start: int, end: int) -> None:
        if end > start:
            kind = self.first[1] if start == self.first[0] else "]("
            verdict = _check_bare(self.src, start, end)
            if verdict is not None:
                self.found.append(_Dest(start, end, kind, verdict))


def _check_bare(src: str, start: int, end: int) -> tuple[str, str] | None:
    """check_url on a bare destination's scheme and authority only (what decides where the
    link goes): prefixes that end before the next "](" do not overlap, so nested
    destinations are not normalized over and over."""
    stop = src.find("](", start, end)
    lim = end if stop < 0 else stop
    m = _AUTH_END_RX.search(src, start + 1, lim)  # its look-behind stays inside
    if m is None and stop >= 0:
        return "bad_url", "destination runs into another link"
    return check_url(src[start : m.start() if m is not None else lim])


def _scan(src: str) -> list[_Dest]:
    """The unsafe destinations in ``src``, in the order found."""
    return _Scan(src).run()


# --- markdown-it: tokens with source positions ---------------------------------------------

_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("_BUDGET", default=None)


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.tick()


def _span_rule(orig: Callable[[StateInline, bool], bool], first: str, what: str) -> Any:
    """An inline rule that also records where its token starts and ends (``meta["span"]``:
    start, label start, label end, end; in the inline content's coordinates)."""

    def rule(state: StateInline, silent: bool) -> bool:
        src, start = state.src, state.pos
        if src[start] != first:
            return False
        _tick()
        n0 = len(state.tokens)
        ok = orig(state, silent)
        if ok and not silent:
            end = state.pos
            if what == "autolink":
                span = (start, start, end, end)
            else:
                label = start + (2 if what == "image" else 1)
                label_end = parseLinkLabel(state, label - 1, what == "link")
                span = (start, label, label_end, end)
            for tok in state.tokens[n0:]:
                if tok.type in ("link_open", "image"):
                    tok.meta["span"] = span
                    break
        return ok

    return rule


def _build_parser() -> MarkdownIt:
    md = MarkdownIt("commonmark")
    md.validateLink = lambda url: True  # type: ignore[method-assign]  # see every destination
    md.normalizeLink = lambda url: url  # type: ignore[method-assign]  # as written (unescaped)
    md.normalizeLinkText = lambda link: link  # type: ignore[method-assign]
    # the rules that do not decide where a link is or goes
    md.disable(["emphasis", "newline", "entity", "balance_pairs", "fragments_join", "text_join"])
    md.disable("inline")  # the core rule: inline contents are parsed on demand (_md_rewrite)
    for name, first in (("link", "["), ("image", "!"), ("autolink", "<")):
        orig = md.inline.ruler.__rules__[md.inline.ruler.__find__(name)].fn
        md.inline.ruler.at(name, _span_rule(orig, first, name))
    return md


_MD = _build_parser()


def _line_starts(src: str) -> list[int]:
    starts = [0]
    find = src.find
    i = find("\n")
    while i >= 0:
        starts.append(i + 1)
        i = find("\n", i + 1)
    return starts


class _ContentMap:
    """Offsets in an inline token's content -> offsets in the source: each content line is
    (padding +) the end of its source line, the first and last ones stripped."""

    def __init__(self, src: str, starts: list[int], content: str, first_line: int) -> None:
        self.rows: list[tuple[int, int, int] | None] = []  # (content start, source start, pad)
        self.cstarts: list[int] = []
        c = 0
        for k, cline in enumerate(content.split("\n")):
            line = first_line + k
            if line >= len(starts):
                self.rows.append(None)
            else:
                s0 = starts[line]
                s1 = starts[line + 1] - 1 if line + 1 < len(starts) else len(src)
                loc = _locate(cline, src[s0:s1])
                self.rows.append(None if loc is None else (c, s0 + loc[0], loc[1]))
            self.cstarts.append(c)
            c += len(cline) + 1

    def __call__(self, pos: int) -> int | None:
        k = bisect.bisect_right(self.cstarts, pos) - 1
        row = self.rows[k] if k >= 0 else None
        if row is None:
            return None
        c0, s0, pad = row
        return s0 + max(0, pos - c0 - pad)


def _locate(cline: str, sline: str) -> tuple[int, int] | None:
    for pad in dict.fromkeys((0, len(cline) - len(cline.lstrip(" ")))):
        rest = cline[pad:]
        for t in (sline, sline.rstrip()):
            if t.endswith(rest):
                return len(t) - len(rest), pad
    k = sline.find(cline)  # an ATX heading's text (its closing #s cut)
    return (k, 0) if k >= 0 else None


@dataclass(slots=True)
class _Rewrite:
    edits: list[tuple[int, int, str]] = field(default_factory=list)
    unresolved: int = 0


def _md_rewrite(src: str, unsafe: list[_Dest], findings: _Findings) -> _Rewrite:
    """The tokens' rewrite of ``src`` where the scan found unsafe destinations."""
    out = _Rewrite()
    starts = _line_starts(src)
    if len(starts) > _MD_MAX_LINES or len(src) > _MD_MAX_CHARS:
        return out
    env: dict[str, Any] = {}
    tokens = _MD.parse(src, env)
    # reference definitions, in any container, first and duplicate ones alike (a renderer
    # may take either)
    refs = list(env.get("references", {}).items())
    refs += [(r["label"], r) for r in env.get("duplicate_refs", [])]
    for label, ref in refs:
        verdict = check_url(ref["href"])
        if verdict is None:
            continue
        l0, l1 = ref["map"]
        s0 = starts[l0]
        e1 = starts[l1] - 1 if l1 < len(starts) else len(src)
        bracket = src.find("[", s0, e1)
        if bracket < 0:
            out.unresolved += 1
            continue
        findings.add(
            verdict[0], ref["href"], f"link definition [{label[:20]}]: {verdict[1]}", url=True
        )
        out.edits.append((bracket, e1, ""))
    # inline contents holding an unsafe destination
    lines = sorted({bisect.bisect_right(starts, d.start) - 1 for d in unsafe})
    brackets = chars = 0
    for tok in tokens:
        if tok.type != "inline" or tok.map is None:
            continue
        l0, l1 = tok.map
        i = bisect.bisect_left(lines, l0)
        if i >= len(lines) or lines[i] >= l1:
            continue
        brackets += tok.content.count("[")
        chars += len(tok.content)
        if brackets > _MD_MAX_BRACKETS or chars > _MD_MAX_INLINE_CHARS:
            break
        children: list[Token] = []
        _MD.inline.parse(tok.content, _MD, env, children)
        where: _ContentMap | None = None
        for child in children:
            span = child.meta.get("span") if child.meta else None
            if span is None:
                continue
            url = str(child.attrs.get("src" if child.type == "image" else "href", ""))
            verdict = check_url(url)
            if verdict is None:
                continue
            where = where or _ContentMap(src, starts, tok.content, l0)
            edits = _token_edits(src, child, span, where)
            if edits is None:
                out.unresolved += 1
                continue
            what = (
                "autolink"
                if child.markup == "autolink"
                else ("markdown image" if child.type == "image" else "markdown link")
            )
            findings.add(verdict[0], url, f"{what}: {verdict[1]}", url=True)
            out.edits.extend(edits)
    return out


def _token_edits(
    src: str, tok: Token, span: tuple[int, int, int, int], where: _ContentMap
) -> list[tuple[int, int, str]] | None:
    start, label, label_end, end = (where(p) for p in span)
    if start is None or label is None or label_end is None or end is None:
        return None
    if tok.markup == "autolink":
        if src[start] != "<" or src[end - 1] != ">":
            return None
        return [(start, end, LINK_REMOVED)]
    opener = "![" if tok.type == "image" else "["
    if not src.startswith(opener, start) or src[label_end] != "]" or src[end - 1] not in ")]":
        return None
    return [(start, label, ""), (label_end, end, "")]


def _apply(src: str, edits: list[tuple[int, int, str]]) -> str:
    out: list[str] = []
    pos = 0
    for s, e, repl in sorted(edits):
        if s < pos:  # overlaps one applied already (a destination inside a removed link)
            if e > pos:
                pos = e
            continue
        out.append(src[pos:s])
        out.append(repl)
        pos = e
    out.append(src[pos:])
    return "".join(out)


def _md_links(text: str, findings: _Findings) -> tuple[str, bool]:
    """Unsafe Markdown link destinations out of ``text``; True when markdown-it still saw an
    unsafe link that could not be rewritten."""
    src = text
    if "\r" in src or "\0" in src:  # markdown-it's own normalization, so positions agree
        src = src.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")
    unsafe = _scan(src)
    if not unsafe:
        return text, False  # as written (line endings kept)
    text = src
    rewrite = _md_rewrite(text, unsafe, findings)
    covered = sorted((s, e) for s, e, _ in rewrite.edits)
    for d in unsafe:
        i = bisect.bisect_right(covered, (d.start, len(text) + 1)) - 1
        if i >= 0 and covered[i][0] <= d.start < covered[i][1]:
            continue  # inside a link or definition the tokens removed
        if len(findings.items) < _MAX_FINDINGS:
            what = "link definition" if d.kind == "]:" else "link destination"
            findings.add(d.verdict[0], d.raw(text), f"{what}: {d.verdict[1]}", url=True)
        else:
            findings.dropped += 1
        rewrite.edits.append((d.start, d.end, ""))
    return _apply(text, rewrite.edits), rewrite.unresolved > 0


def _neutralize_links(text: str) -> str:
    """The last resort: no "[" and no "<" left that could start a link."""
    return text.replace("[", "\\[").replace("<", "&lt;")


def _split_code(text: str) -> list[tuple[bool, str]]:
    """(is code, piece): fenced code blocks and code spans, CommonMark-like."""
    pieces: list[tuple[bool, str]] = []
    pos = 0
    while True:
        m = _FENCE_RX.search(text, pos)
        if m is None:
            break
        fence = m.group(1)
        closer = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M)
        c = closer.search(text, m.end())
        end = c.end() if c is not None else len(text)
        pieces.extend(_split_spans(text[pos : m.start()]))
        pieces.append((True, text[m.start() : end]))
        pos = end
    pieces.extend(_split_spans(text[pos:]))
    return pieces


def _split_spans(text: str) -> list[tuple[bool, str]]:
    """Code spans: a backtick run up to the next run of the same length (one pass over the
    runs, so that runs of every length do not each rescan the text)."""
    runs = [(m.start(), m.end()) for m in _TICKS_RX.finditer(text)]
    by_len: dict[int, list[int]] = {}
    for i, (s, e) in enumerate(runs):
        by_len.setdefault(e - s, []).append(i)
    out: list[tuple[bool, str]] = []
    start = 0
    i = 0
    while i < len(runs):
        s, e = runs[i]
        if s > 0 and text[s - 1] == "\\":  # an escaped backtick opens nothing
            i += 1
            continue
        same = by_len[e - s]
        k = bisect.bisect_right(same, i)
        if k == len(same):
            i += 1
            continue
        j = same[k]
        out.append((False, text[start:s]))
        out.append((True, text[s : runs[j][1]]))
        start = runs[j][1]
        i = j + 1
    out.append((False, text[start:]))
    return [p for p in out if p[1]]


def _trim_bare(url: str) -> str:
    """Trailing punctuation is the sentence's, and so is a ``)``/``]`` the URL did not open."""
    opened = {")": url.count("("), "]": url.count("[")}
    closed = {")": url.count(")"), "]": url.count("]")}
    end = len(url)
    while end:
        last = url[end - 1]
        unbalanced = last in closed and opened[last] < closed[last]
        if not (last in "?!.,:;*_~'\"" or unbalanced):
            break
        if last in closed:
            closed[last] -= 1
        end -= 1
    return url[:end]


def _bare_urls(text: str, findings: _Findings) -> str:
    """Bare URLs (http, https, ftp, ws, www., scheme-relative //host, and javascript:,
    vbscript:, data:, file: tokens): what GFM and linkify make links of."""

    def repl(m: re.Match[str]) -> str:
        token = m.group(0)
        url = _trim_bare(token)
        if not url:
            return token
        target = "http://" + url if url[:4].lower() == "www." else url
        verdict = check_url(target)
        if verdict is None:
            return token
        findings.add(verdict[0], url, f"bare URL: {verdict[1]}", url=True)
        return LINK_REMOVED + token[len(url) :]

    return _BARE_RX.sub(repl, text)


def _markdown(text: str, allowed: frozenset[str], findings: _Findings) -> tuple[str, bool]:
    text, unresolved = _md_links(text, findings)
    _tick()
    pieces = [
        _inline_html(piece, allowed, code, findings) if "<" in piece else piece
        for code, piece in _split_code(text)
    ]
    _tick()
    return _bare_urls("".join(pieces), findings), unresolved


def _html(text: str, findings: _Findings) -> str:
    report = _HtmlReport(findings, _TAGS)
    try:
        report.feed(text)
        report.close()
    except Exception:  # the report is best effort; the cleaning below is not
        log.debug("output sanitizer: HTML report failed", exc_info=True)
    return _bare_urls(_CLEAN_HTML(text), findings)


# --- DLP and audit --------------------------------------------------------------------------


def _dlp(text: str, gateway: Gateway, where: str, findings: _Findings) -> str:
    """The gateway's cleaning of ``text`` (audited by the gateway); its findings reported."""
    cleaned, found = gateway.clean_text_with_findings(text, where=where)
    for f in found:
        kind = "pii" if f.kind.startswith("pii") else "secret"
        if len(findings.items) < _MAX_FINDINGS:
            findings.items.append(Removal(kind, REDACTED, f.kind, f.value_sha256))
        else:
            findings.dropped += 1
    return cleaned


def _audit(gateway: Gateway, where: str, removals: list[Removal], dropped: int) -> None:
    """One record in the gateway's audit trail: kind and hash of each removal, no values."""
    own = [r for r in removals if r.kind not in ("secret", "pii")]  # the gateway wrote those
    items = [Finding("$.output", r.kind, r.digest) for r in own]
    if items and dropped:
        items.append(Finding("$.output", "more_removed", str(dropped)))
    gateway.audit(where, items)


# --- entry point ------------------------------------------------------------------------------


def sanitize_output(
    text: str,
    *,
    gateway: Gateway,
    fmt: OutputFormat = "markdown",
    where: str = "output",
    budget_ms: float | None = None,
) -> SanitizedOutput:
    """Clean an agent's reply for storing and showing; see the module docstring.

    ``gateway`` cleans secrets/PII and receives the audit record (its ``audit_path``);
    ``where`` labels the audit records (it is DLP-cleaned before it is written).
    ``budget_ms``: the CPU time (of the calling thread) the call may take; over it,
    :class:`~context_core.errors.SanitizeBudgetExceededError` is raised and nothing is
    returned or audited (the service sets it from ``CTX_OUTPUT_SANITIZE_BUDGET_MS``).
    """
    if fmt not in ("markdown", "html", "text"):
        raise ValueError(f"fmt must be 'markdown', 'html' or 'text', not {fmt!r}")
    budget = _Budget(budget_ms) if budget_ms is not None else None
    token = _BUDGET.set(budget)
    try:
        return _sanitize(text, gateway, fmt, where, budget)
    finally:
        _BUDGET.reset(token)


def _sanitize(
    text: str, gateway: Gateway, fmt: OutputFormat, where: str, budget: _Budget | None
) -> SanitizedOutput:
    findings = _Findings(gateway.hash_value)
    allowed = _TAGS if fmt != "text" else frozenset()
    current = _dlp(text, gateway, where, findings)
    unresolved = False
    for _ in range(_MAX_ROUNDS):
        if budget is not None:
            budget.check()
        if fmt == "html":
            passed = _html(current, findings)
        else:
            passed, unresolved = _markdown(current, allowed, findings)
        if passed == current:
            break
        current = _dlp(passed, gateway, where, findings)
    else:  # still changing: hostile nesting; make every remaining tag inert
        current = current.replace("<", "&lt;")
        findings.add("html_tag", "<", "nested constructs: every '<' escaped")
        if fmt != "html":
            unresolved = bool(_scan(current))
    if unresolved:  # markdown-it saw an unsafe link no pass could rewrite
        current = _neutralize_links(current)
        findings.add("bad_url", "[", "unresolved link: every '[' and '<' escaped")
    if budget is not None:
        budget.check()
    _audit(gateway, where, findings.items, findings.dropped)
    return SanitizedOutput(current, tuple(findings.items))
