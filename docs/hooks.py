"""mkdocs hook: on the API pages, a member's entry in the table of contents reads ``Class.member``."""

from __future__ import annotations

from typing import Any


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    """Prefix each class member's table-of-contents title with its class's name (API pages only)."""
    if page.file.src_uri.startswith("api/"):
        for item in page.toc.items:  # the page title; the objects are its children
            for obj in item.children:
                for member in obj.children:
                    member.title = f"{obj.title}.{member.title}"
    return html
