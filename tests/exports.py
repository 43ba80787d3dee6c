"""Confluence HTML space exports written by tests (the project's own fixtures, no real data)."""

from __future__ import annotations

from pathlib import Path


def para(topic: str, n: int) -> str:
    return " ".join(
        f"Step {i}: inspect the {topic} and record the reading in the maintenance log."
        for i in range(n)
    )


def write_export(
    root: Path,
    pages: dict[str, tuple[str, str, str]],
    *,
    space: str = "EQT",
    name: str = "Test Space",
    home: str = "100",
) -> Path:
    """``pages``: id -> (title, area, body html). Home page ``home`` holds areas as children.

    The layout of Confluence's "Export space -> HTML": index.html with the space's Key/Name
    table and its "Available Pages" tree, one ``<id>.html`` per page.
    """
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("*.html"):
        old.unlink()
    items = "".join(f'<li><a href="{pid}.html">{t}</a></li>' for pid, (t, _, _) in pages.items())
    (root / "index.html").write_text(
        "<html><body><div id='main-content' class='pageSection'><table>"
        f"<tr><th>Key</th><td>{space}</td></tr><tr><th>Name</th><td>{name}</td></tr>"
        "</table></div><div class='pageSection'><h2>Available Pages:</h2><ul><li>"
        f"<a href='{home}.html'>Home</a><img src='images/icons/contenttypes/home_page_16.png'/>"
        f"<ul>{items}</ul></li></ul></div></body></html>",
        encoding="utf-8",
    )
    for pid, (title, area, body) in pages.items():
        (root / f"{pid}.html").write_text(
            f"<html><head><title>{name} : {title}</title></head><body><div id='page'>"
            "<div id='main-header'><ol id='breadcrumbs'>"
            f"<li><a href='index.html'>{name}</a></li><li><a href='{home}.html'>Home</a></li>"
            f"<li><a href='9{pid}.html'>{area}</a></li></ol>"
            f"<h1 id='title-heading'><span id='title-text'>{name} : {title}</span></h1>"
            "</div><div id='content'><div class='page-metadata'>Created by "
            "<span class='author'>Ann</span>, last modified on Jun 29, 2019</div>"
            f"<div id='main-content' class='wiki-content group'>{body}</div></div></div>"
            "</body></html>",
            encoding="utf-8",
        )
    return root


def base_pages() -> dict[str, tuple[str, str, str]]:
    return {
        "201": (
            "Seal replacement",
            "PUMP",
            f"<h2>Tools</h2><p>{para('seal', 4)}</p>"
            f"<h2>Procedure</h2><p>{para('impeller', 30)}</p>",
        ),
        "202": ("Bearing noise", "PUMP", f"<p>{para('bearing', 3)}</p>"),
        "301": ("Fan belt", "FAN", f"<h3>Tension</h3><p>{para('belt', 25)}</p>"),
        "302": (
            "Fan contacts",
            "FAN",
            "<p>Escalate to the duty engineer on 13812345678 or ops@example.com.</p>",
        ),
        "401": ("Empty page", "COMP", ""),
    }
