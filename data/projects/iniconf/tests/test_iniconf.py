import pytest

from iniconf import ConfigError, InterpolationError, ParseError, parse, parse_lines
from iniconf.parser import _split_pair, _strip_inline_comment

SAMPLE = """
# global settings
name = demo
debug = yes

[server]
host = example.org
port: 8080
url = http://${host}:${port}/${name}
timeout = 2.5

[paths]
roots = /srv, /opt ; inline comment
    /home
"""


def test_sections_in_order_without_default():
    assert parse(SAMPLE).sections() == ["server", "paths"]


def test_get_own_and_inherited_values():
    config = parse(SAMPLE)
    assert config.get("server", "host") == "example.org"
    assert config.get("paths", "name") == "demo"


def test_colon_separator():
    assert parse(SAMPLE).get("server", "port") == "8080"


def test_keys_are_case_insensitive():
    config = parse("[a]\nKey = 1\n")
    assert config.get("a", "KEY") == "1"
    assert config.keys("a") == ["key"]


def test_keys_lists_own_before_inherited():
    config = parse(SAMPLE)
    assert config.keys("server") == ["host", "port", "url", "timeout", "name", "debug"]


def test_section_overrides_default():
    config = parse("name = base\n[s]\nname = own\n")
    assert config.get("s", "name") == "own"


def test_interpolation_same_section_and_default():
    assert parse(SAMPLE).get("server", "url") == "http://example.org:8080/demo"


def test_interpolation_cross_section():
    config = parse("[a]\nx = 1\n[b]\ny = ${a:x}2\n")
    assert config.get("b", "y") == "12"


def test_interpolation_missing_reference():
    config = parse("[a]\nx = ${nope}\n")
    with pytest.raises(InterpolationError, match="nope"):
        config.get("a", "x")


def test_interpolation_cycle_is_detected():
    config = parse("[a]\nx = ${y}\ny = ${x}\n")
    with pytest.raises(InterpolationError, match="deeper"):
        config.get("a", "x")


def test_interpolation_chain_up_to_the_depth_limit():
    chain = "".join(f"k{i} = ${{k{i + 1}}}\n" for i in range(10)) + "k10 = end\n"
    assert parse("[a]\n" + chain).get("a", "k0") == "end"


def test_raw_is_not_interpolated():
    assert parse(SAMPLE).raw("server", "url") == "http://${host}:${port}/${name}"


def test_get_int_float_bool():
    config = parse(SAMPLE)
    assert config.get_int("server", "port") == 8080
    assert config.get_float("server", "timeout") == 2.5
    assert config.get_bool("server", "debug") is True


@pytest.mark.parametrize("word, expected", [("On", True), ("1", True), ("off", False), ("NO", False)])
def test_get_bool_words(word, expected):
    assert parse(f"[a]\nflag = {word}\n").get_bool("a", "flag") is expected


def test_typed_getter_errors_name_the_key():
    config = parse("[a]\nx = abc\n")
    with pytest.raises(ConfigError, match="a.x: expected an integer"):
        config.get_int("a", "x")
    with pytest.raises(ConfigError, match="expected a number"):
        config.get_float("a", "x")
    with pytest.raises(ConfigError, match="expected a boolean"):
        config.get_bool("a", "x")


def test_defaults_apply_only_when_missing():
    config = parse("[a]\nn = 3\n")
    assert config.get("a", "missing", default="d") == "d"
    assert config.get_int("a", "missing", default=7) == 7
    assert config.get_int("a", "n", default=7) == 3
    assert config.get_float("a", "missing", default=0.5) == 0.5
    assert config.get_bool("a", "missing", default=False) is False


def test_missing_key_and_section_raise():
    config = parse("[a]\nx = 1\n")
    with pytest.raises(ConfigError, match="no key 'y'"):
        config.get("a", "y")
    with pytest.raises(ConfigError, match="no section 'b'"):
        config.get("b", "x")


def test_continuation_lines_and_get_list():
    config = parse(SAMPLE)
    assert config.raw("paths", "roots") == "/srv, /opt\n/home"
    assert config.get_list("paths", "roots") == ["/srv", "/opt", "/home"]


def test_get_list_custom_separator_drops_empty_items():
    assert parse("[a]\nx = a;b;;c\n").get_list("a", "x", separator=";") == ["a", "b", "c"]


def test_strip_inline_comment_needs_preceding_space():
    assert _strip_inline_comment("a # b") == "a"
    assert _strip_inline_comment("a#b") == "a#b"
    assert _strip_inline_comment("#x") == "#x"


def test_split_pair_uses_first_separator():
    assert _split_pair("url = http://x") == ("url", "http://x")
    assert _split_pair("a: b = c") == ("a", "b = c")
    assert _split_pair("novalue") is None


def test_reopened_section_keeps_keys():
    config = parse("[a]\nx = 1\n[b]\n[a]\ny = 2\n")
    assert config.keys("a") == ["x", "y"]
    assert config.sections() == ["a", "b"]


def test_to_dict():
    config = parse("g = 1\n[a]\nx = ${g}0\n")
    assert config.to_dict() == {"a": {"x": "10", "g": "1"}}


def test_parse_lines_accepts_newlines_and_crlf():
    config = parse_lines(["[a]\r\n", "x = 1\r\n"])
    assert config.get("a", "x") == "1"


@pytest.mark.parametrize(
    "text, message, line_number",
    [
        ("[a\n", "malformed section header", 1),
        ("[]\n", "malformed section header", 1),
        ("[ ]\n", "empty section name", 1),
        ("[a]\njunk\n", "expected 'key = value'", 2),
        ("[a]\n= 1\n", "expected 'key = value'", 2),
        ("  indented\n", "continuation line without a key", 1),
        ("[a]\nx = 1\n\nX = 2\n", "duplicate key 'x'", 4),
    ],
)
def test_parse_errors(text, message, line_number):
    with pytest.raises(ParseError, match=message) as info:
        parse(text)
    assert info.value.line_number == line_number


def test_continuation_after_header_is_an_error():
    with pytest.raises(ParseError, match="continuation"):
        parse("[a]\nx = 1\n[b]\n  more\n")
