import pytest

from mdlite import Block, escape, parse_blocks, render_block, render_inline, to_html
from mdlite.inline import is_safe_url


def test_escape():
    assert escape('<a href="x">&</a>') == "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"


def test_inline_emphasis_and_strong():
    assert render_inline("*a* and **b**") == "<em>a</em> and <strong>b</strong>"
    assert render_inline("**a *b* c**") == "<strong>a <em>b</em> c</strong>"


def test_inline_emphasis_needs_non_space_edges():
    assert render_inline("2 * 3 * 4") == "2 * 3 * 4"
    assert render_inline("* not *") == "* not *"


def test_inline_code_is_literal_and_escaped():
    assert render_inline("use `*x* <y>` here") == "use <code>*x* &lt;y&gt;</code> here"
    assert render_inline("`a` and `b`") == "<code>a</code> and <code>b</code>"


def test_inline_escapes_text():
    assert render_inline("a < b & c") == "a &lt; b &amp; c"


def test_inline_links():
    assert render_inline("[home](https://x.org/a)") == '<a href="https://x.org/a">home</a>'
    assert render_inline("[*em*](/p)") == '<a href="/p"><em>em</em></a>'


def test_unsafe_link_keeps_only_text():
    assert render_inline("[click](javascript:alert)") == "click"


@pytest.mark.parametrize(
    "url, safe",
    [
        ("https://a.b", True),
        ("http://a.b", True),
        ("mailto:me@x.org", True),
        ("/abs", True),
        ("#frag", True),
        ("docs/page.html", True),
        ("javascript:alert(1)", False),
        ("data:text/html", False),
    ],
)
def test_is_safe_url(url, safe):
    assert is_safe_url(url) is safe


def test_headings_levels_and_closing_hashes():
    assert to_html("# One") == "<h1>One</h1>"
    assert to_html("### Three ###") == "<h3>Three</h3>"
    assert to_html("###### Six") == "<h6>Six</h6>"
    assert to_html("####### seven") == "<p>####### seven</p>"
    assert to_html("#tag") == "<p>#tag</p>"


def test_paragraph_lines_join_and_blank_line_splits():
    assert to_html("a\nb\n\nc") == "<p>a b</p>\n<p>c</p>"


def test_unordered_list():
    assert to_html("- one\n* two") == "<ul>\n<li>one</li>\n<li>two</li>\n</ul>"


def test_blank_line_splits_lists():
    assert to_html("- a\n\n- b") == "<ul>\n<li>a</li>\n</ul>\n<ul>\n<li>b</li>\n</ul>"


def test_ordered_list_start_number():
    assert to_html("1. a\n2. b") == "<ol>\n<li>a</li>\n<li>b</li>\n</ol>"
    assert to_html("3. c\n9. d") == '<ol start="3">\n<li>c</li>\n<li>d</li>\n</ol>'


def test_fenced_code_block_is_verbatim():
    text = "```python\nif a < b:\n    *x*\n```\nafter"
    assert to_html(text) == (
        '<pre><code class="language-python">if a &lt; b:\n    *x*</code></pre>\n<p>after</p>'
    )


def test_unclosed_fence_runs_to_end():
    assert to_html("```\ncode\n\nmore") == "<pre><code>code\n\nmore</code></pre>"


def test_quote_and_rule():
    assert to_html("> a\n> *b*\n\n---") == "<blockquote>\n<p>a <em>b</em></p>\n</blockquote>\n<hr>"
    assert to_html("***") == "<hr>"


def test_parse_blocks_structure():
    blocks = parse_blocks("# T\ntext\n- x\n- y\n\n5. z")
    assert blocks == [
        Block("heading", ["T"], level=1),
        Block("paragraph", ["text"]),
        Block("ul", ["x", "y"]),
        Block("ol", ["z"], level=5),
    ]


def test_heading_interrupts_paragraph():
    assert to_html("para\n## Head\nmore") == "<p>para</p>\n<h2>Head</h2>\n<p>more</p>"


def test_empty_document():
    assert to_html("") == ""
    assert parse_blocks("\n  \n") == []


def test_render_block_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown block kind 'table'"):
        render_block(Block("table"))
