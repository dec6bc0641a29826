"""mdlite: convert a subset of Markdown to HTML."""

from mdlite.blocks import Block, parse_blocks, render_block, to_html
from mdlite.inline import escape, render_inline

__all__ = ["Block", "escape", "parse_blocks", "render_block", "render_inline", "to_html"]
