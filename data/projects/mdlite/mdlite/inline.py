"""Span-level markup: code, links, strong and emphasis."""

from __future__ import annotations

import re

CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
STRONG = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
EMPHASIS = re.compile(r"\*(?=\S)(.+?)(?<=\S)\*")
PLACEHOLDER = "\x00{}\x00"
SAFE_SCHEMES = ("http://", "https://", "mailto:", "/", "#")


def escape(text: str) -> str:
    """Escapes the characters that are special in HTML text and attribute values."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def is_safe_url(url: str) -> bool:
    """Only absolute http(s)/mailto URLs, site-absolute paths, fragments and plain relative paths.

    Anything with another scheme (`javascript:`, `data:`) is refused.
    """
    if url.startswith(SAFE_SCHEMES):
        return True
    return ":" not in url.split("/", 1)[0]


def render_inline(text: str) -> str:
    """Renders inline markup in `text` to HTML.

    Code spans are cut out first (their content is literal), then the rest is escaped and
    links, strong and emphasis are applied in that order. A link with an unsafe URL is
    rendered as its text alone.
    """
    code_spans: list[str] = []

    def stash_code(match: re.Match[str]) -> str:
        code_spans.append(f"<code>{escape(match.group(1))}</code>")
        return PLACEHOLDER.format(len(code_spans) - 1)

    text = CODE_SPAN.sub(stash_code, text)
    text = escape(text)

    def link(match: re.Match[str]) -> str:
        label, url = match.group(1), match.group(2)
        if not is_safe_url(url):
            return label
        return f'<a href="{url}">{label}</a>'

    text = LINK.sub(link, text)
    text = STRONG.sub(r"<strong>\1</strong>", text)
    text = EMPHASIS.sub(r"<em>\1</em>", text)
    for index, html in enumerate(code_spans):
        text = text.replace(PLACEHOLDER.format(index), html)
    return text
