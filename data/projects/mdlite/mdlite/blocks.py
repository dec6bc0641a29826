"""Block-level structure: grouping lines into blocks and rendering them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mdlite.inline import escape, render_inline

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
BULLET = re.compile(r"^[-*]\s+(.*)$")
ORDERED = re.compile(r"^(\d+)\.\s+(.*)$")
FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
RULE = re.compile(r"^(?:-{3,}|\*{3,})\s*$")


@dataclass
class Block:
    """One block: `kind` is heading, paragraph, ul, ol, code, quote or rule.

    `lines` holds the raw content lines (list items for ul/ol); `level` is the heading
    level, or the first number of an ordered list; `language` is a code block's language.
    """

    kind: str
    lines: list[str] = field(default_factory=list)
    level: int = 0
    language: str = ""


def parse_blocks(text: str) -> list[Block]:
    """Groups the lines of `text` into blocks.

    Blank lines end paragraphs, lists and quotes. A fenced code block runs to its closing
    fence (or to the end of the text) and keeps its lines verbatim.
    """
    blocks: list[Block] = []
    lines = text.splitlines()
    # Whether the previous line may be continued by this one (no blank line in between).
    continues = False
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        index += 1
        if not stripped:
            continues = False
            continue
        if fence := FENCE.match(stripped):
            code = Block("code", language=fence.group(1))
            while index < len(lines) and not lines[index].strip().startswith("```"):
                code.lines.append(lines[index])
                index += 1
            index += 1  # skip the closing fence
            blocks.append(code)
        elif heading := HEADING.match(stripped):
            blocks.append(Block("heading", [heading.group(2)], level=len(heading.group(1))))
        elif RULE.match(stripped):
            blocks.append(Block("rule"))
        elif stripped.startswith(">"):
            _append_line(blocks, "quote", stripped[1:].strip(), continues)
        elif bullet := BULLET.match(stripped):
            _append_line(blocks, "ul", bullet.group(1), continues)
        elif ordered := ORDERED.match(stripped):
            block = _append_line(blocks, "ol", ordered.group(2), continues)
            if len(block.lines) == 1:
                block.level = int(ordered.group(1))
        else:
            _append_line(blocks, "paragraph", stripped, continues)
        continues = True
    return blocks


def _append_line(blocks: list[Block], kind: str, line: str, continues: bool) -> Block:
    """Adds `line` to the last block if it continues one of the same kind, else starts a block."""
    if continues and blocks and blocks[-1].kind == kind:
        blocks[-1].lines.append(line)
    else:
        blocks.append(Block(kind, [line]))
    return blocks[-1]


def render_block(block: Block) -> str:
    """The HTML for one block."""
    if block.kind == "heading":
        return f"<h{block.level}>{render_inline(block.lines[0])}</h{block.level}>"
    if block.kind == "paragraph":
        return f"<p>{render_inline(' '.join(block.lines))}</p>"
    if block.kind in ("ul", "ol"):
        items = "\n".join(f"<li>{render_inline(item)}</li>" for item in block.lines)
        start = f' start="{block.level}"' if block.kind == "ol" and block.level != 1 else ""
        return f"<{block.kind}{start}>\n{items}\n</{block.kind}>"
    if block.kind == "code":
        language = f' class="language-{block.language}"' if block.language else ""
        return f"<pre><code{language}>{escape(chr(10).join(block.lines))}</code></pre>"
    if block.kind == "quote":
        return f"<blockquote>\n<p>{render_inline(' '.join(block.lines))}</p>\n</blockquote>"
    if block.kind == "rule":
        return "<hr>"
    raise ValueError(f"unknown block kind {block.kind!r}")


def to_html(text: str) -> str:
    """Converts Markdown `text` to HTML, one block per line group, joined by newlines."""
    return "\n".join(render_block(block) for block in parse_blocks(text))
