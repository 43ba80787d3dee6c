"""The output sanitizer: what an agent replies is cleaned before it is stored or shown.

The gateway (:mod:`context_core.gateway`) keeps secrets and PII out of memory; an agent's
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
* **Markdown links handled**: inline links and images, reference definitions, autolinks and
  bare URLs; an unsafe link becomes its text (an image its alt text), an unsafe definition is
  dropped, an unsafe autolink or bare URL becomes ``(link removed)``; safe ones are kept as
  written;
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

import html
import ipaddress
import logging
import re
import threading
import unicodedata
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Literal

import nh3

from context_core.gateway import REDACTED, Finding, Gateway
from context_core.redaction import redact_text

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
    text = "".join(ch if ch.isprintable() else " " for ch in raw).strip()
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


# --- URLs -------------------------------------------------------------------------------------

_SCHEME_RX = re.compile(r"([a-z][a-z0-9+.\-]*):")
_MD_ESCAPE_RX = re.compile(r"\\([!-/:-@\[-`{-~])")
_INVISIBLE = {"\u00ad", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}
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
    s = "".join(
        ch
        for ch in s
        if not (ch.isspace() or ch in _INVISIBLE or unicodedata.category(ch) in ("Cc", "Cf"))
    )
    return s.replace("\\", "/")


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
    """The allowed start tag ``tok`` as nh3 keeps it ("" when nh3 drops it)."""
    ctx = _TABLE_CONTEXT.get(name, "")
    cleaned = _clean_for(allowed)(ctx + tok)
    for m in _START_RX.finditer(cleaned):
        if m.group(1) == name:
            return m.group(0)
    return ""


_CLEANERS: dict[frozenset[str], Callable[[str], str]] = {_TAGS: _CLEAN_HTML}
_CLEANERS_LOCK = threading.Lock()


def _clean_for(allowed: frozenset[str]) -> Callable[[str], str]:
    with _CLEANERS_LOCK:
        fn = _CLEANERS.get(allowed)
        if fn is None:
            fn = _CLEANERS[allowed] = _cleaner(allowed | frozenset({"table", "tr", "colgroup"}))
        return fn


def _inline_html(seg: str, allowed: frozenset[str], code: bool, findings: _Findings) -> str:
    """HTML inside Markdown: each tag through nh3 (or escaped, in code); autolinks checked;
    a ``<`` that starts no complete tag is escaped."""
    out: list[str] = []
    unclosed: set[str] = set()
    i, n = 0, len(seg)
    while True:
        j = seg.find("<", i)
        if j < 0:
            out.append(seg[i:])
            break
        out.append(seg[i:j])
        m = _TOKEN_RX.match(seg, j, min(n, j + _MAX_TOKEN))
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

_FENCE_RX = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*$", re.M)
_TICKS_RX = re.compile(r"(?<!\\)`+")
_REFDEF_RX = re.compile(
    r"^ {0,3}\[((?:[^\[\]\\\n]|\\.){1,999})\]:[ \t]*\n?[ \t]*(<[^<>\n]*>|\S+)[^\n]*$", re.M
)
_TITLE_RX = re.compile(r"""\s+(?:"[^"]*"|'[^']*'|\([^()]*\))\s*\Z""")
_BARE_RX = re.compile(
    r"(?i)(?<![A-Za-z0-9+.\-])"
    r"(?:(?:https?|ftps?|wss?)://|(?:javascript|vbscript|data|file):(?=[^\s<>\"'`])|www\.)"
    r"[^\s<>\"'`]*"
)


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
    out: list[tuple[bool, str]] = []
    pos = start = 0
    while True:
        m = _TICKS_RX.search(text, pos)
        if m is None:
            break
        run = m.group(0)
        closer = re.compile(rf"(?<!`){run}(?!`)")
        c = closer.search(text, m.end())
        if c is None:
            pos = m.end()
            continue
        out.append((False, text[start : m.start()]))
        out.append((True, text[m.start() : c.end()]))
        pos = start = c.end()
    out.append((False, text[start:]))
    return [p for p in out if p[1]]


def _open_bracket(text: str, close: int) -> int:
    """Index of the ``[`` matching the ``]`` at ``close``, or -1."""
    depth = 0
    lo = max(0, close - _MAX_TOKEN)
    k = close - 1
    while k >= lo:
        ch = text[k]
        escaped = k > 0 and text[k - 1] == "\\"
        if not escaped:
            if ch == "]":
                depth += 1
            elif ch == "[":
                if depth == 0:
                    return k
                depth -= 1
        k -= 1
    return -1


def _close_paren(text: str, start: int) -> int:
    """Index just past the ``)`` closing a link destination that starts at ``start``."""
    depth = 1
    k, hi = start, min(len(text), start + _MAX_TOKEN)
    while k < hi:
        ch = text[k]
        if ch == "\\":
            k += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return k + 1
        k += 1
    return -1


def _destination(inner: str) -> str:
    dest = inner.strip()
    if dest.startswith("<") and ">" in dest:
        return dest[1 : dest.index(">")]
    return _TITLE_RX.sub("", dest)


def _md_links(text: str, findings: _Findings) -> str:
    """Inline links and images: an unsafe one becomes its text (alt text)."""
    pos = 0
    while True:
        k = text.find("](", pos)
        if k < 0:
            return text
        start = _open_bracket(text, k)
        end = _close_paren(text, k + 2) if start >= 0 else -1
        if end < 0:
            pos = k + 2
            continue
        dest = _destination(text[k + 2 : end - 1])
        verdict = check_url(dest)
        if verdict is None:
            pos = k + 2
            continue
        image = start > 0 and text[start - 1] == "!"
        what = "image" if image else "link"
        findings.add(verdict[0], dest, f"markdown {what}: {verdict[1]}", url=True)
        s0 = start - 1 if image else start
        text = text[:s0] + text[start + 1 : k] + text[end:]
        pos = s0


def _md_refdefs(text: str, findings: _Findings) -> str:
    def repl(m: re.Match[str]) -> str:
        dest = m.group(2)
        if dest.startswith("<"):
            dest = dest[1:-1]
        verdict = check_url(dest)
        if verdict is None:
            return m.group(0)
        findings.add(
            verdict[0], dest, f"link definition [{m.group(1)[:20]}]: {verdict[1]}", url=True
        )
        return ""

    return _REFDEF_RX.sub(repl, text)


def _trim_bare(url: str) -> str:
    """Trailing punctuation is the sentence's, and so is a ``)``/``]`` the URL did not open."""
    while url:
        last = url[-1]
        unbalanced = (last == ")" and url.count("(") < url.count(")")) or (
            last == "]" and url.count("[") < url.count("]")
        )
        if not (last in "?!.,:;*_~'\"" or unbalanced):
            break
        url = url[:-1]
    return url


def _bare_urls(text: str, findings: _Findings) -> str:
    """Bare URLs (http, https, ftp, ws, www., and javascript:/vbscript:/data:/file: tokens)."""

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


def _markdown(text: str, allowed: frozenset[str], findings: _Findings) -> str:
    text = _md_refdefs(text, findings)
    text = _md_links(text, findings)
    pieces = [
        _inline_html(piece, allowed, code, findings) if "<" in piece else piece
        for code, piece in _split_code(text)
    ]
    return _bare_urls("".join(pieces), findings)


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
) -> SanitizedOutput:
    """Clean an agent's reply for storing and showing; see the module docstring.

    ``gateway`` cleans secrets/PII and receives the audit record (its ``audit_path``);
    ``where`` labels the audit records (it is DLP-cleaned before it is written).
    """
    if fmt not in ("markdown", "html", "text"):
        raise ValueError(f"fmt must be 'markdown', 'html' or 'text', not {fmt!r}")
    findings = _Findings(gateway.hash_value)
    allowed = _TAGS if fmt != "text" else frozenset()
    current = _dlp(text, gateway, where, findings)
    for _ in range(_MAX_ROUNDS):
        if fmt == "html":
            passed = _html(current, findings)
        else:
            passed = _markdown(current, allowed, findings)
        if passed == current:
            break
        current = _dlp(passed, gateway, where, findings)
    else:  # still changing: hostile nesting; make every remaining tag inert
        current = current.replace("<", "&lt;")
        findings.add("html_tag", "<", "nested constructs: every '<' escaped")
    _audit(gateway, where, findings.items, findings.dropped)
    return SanitizedOutput(current, tuple(findings.items))
