"""The tools on a real workspace: behaviour, errors the agent sees, schemas."""

import re
import time

import pytest

from env.protocol import parse_turn
from env.tools import CodeTools, call_tool, code_tokens, tool_names, tool_schemas, truncate
from env.workspace import make_workspace, remove_workspace

PUBLIC_API = ["read_file", "edit_file", "grep", "search", "run", "lint", "run_tests", "ask_user", "submit"]


@pytest.fixture
def tools(calc_task):
    ws = make_workspace(calc_task.repo_dir)
    yield CodeTools(ws, calc_task)
    remove_workspace(ws)


def test_tool_names_and_schemas_are_the_public_api(tools):
    assert tool_names() == PUBLIC_API
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas(tools)}
    assert list(schemas) == PUBLIC_API
    assert schemas["read_file"]["parameters"]["required"] == ["path"]
    assert schemas["edit_file"]["parameters"]["required"] == ["path", "old_str", "new_str"]
    assert all(s["description"] and "return" not in s for s in schemas.values())
    for s in schemas.values():
        for prop in s["parameters"]["properties"].values():
            assert prop.get("description"), f"{s['name']}: every argument is documented"


def test_read_file_numbers_lines_and_ranges(tools):
    assert call_tool(tools, "read_file", {"path": "calc/ops.py"}).splitlines()[1] == "   2|     return a - b"
    assert call_tool(tools, "read_file", {"path": "calc/ops.py", "start_line": 5, "end_line": 5}) == \
        "   5| def mul(a, b):"
    assert call_tool(tools, "read_file", {"path": "nope.py"}).startswith("Error: ")
    assert "past the end" in call_tool(tools, "read_file", {"path": "calc/ops.py", "start_line": 99})


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "calc/../../x"])
def test_file_tools_refuse_paths_outside(tools, path):
    for name, args in [("read_file", {"path": path}), ("edit_file", {"path": path, "old_str": "", "new_str": "x"}),
                       ("grep", {"pattern": "x", "path": path}), ("lint", {"path": path})]:
        out = call_tool(tools, name, args)
        assert out.startswith("Error: "), (name, out)


def test_edit_file_exact_unique_and_create(tools):
    assert "not found" in call_tool(tools, "edit_file", {"path": "calc/ops.py", "old_str": "a ** b", "new_str": ""})
    assert "occurs 2 times" in call_tool(tools, "edit_file", {"path": "calc/ops.py", "old_str": "(a, b)", "new_str": ""})
    out = call_tool(tools, "edit_file", {"path": "calc/ops.py", "old_str": "a - b", "new_str": "a + b"})
    assert out.startswith("Edited calc/ops.py at line 2")
    assert "a + b" in (tools.workspace / "calc/ops.py").read_text()
    assert "Created" in call_tool(tools, "edit_file", {"path": "calc/new/mod.py", "old_str": "", "new_str": "X = 1\n"})
    assert "already exists" in call_tool(tools, "edit_file", {"path": "calc/ops.py", "old_str": "", "new_str": "x"})


def test_grep_and_search(tools):
    assert call_tool(tools, "grep", {"pattern": r"def add"}) == "calc/ops.py:1:def add(a, b):"
    assert "No matches" in call_tool(tools, "grep", {"pattern": "zzz_nothing"})
    assert call_tool(tools, "grep", {"pattern": "("}).startswith("Error: grep failed")
    out = call_tool(tools, "search", {"query": "multiply mul numbers", "k": 2})
    assert out.splitlines()[0].startswith(("calc/ops.py:", "tests/test_ops.py:"))
    assert "k must be between" in call_tool(tools, "search", {"query": "x", "k": 0})
    assert code_tokens("parseURL snake_case") == ["parseurl", "parse", "url", "snake_case", "snake", "case"]


def test_search_index_follows_edits(tools):
    assert "No results" in call_tool(tools, "search", {"query": "frobnicate"})
    call_tool(tools, "edit_file", {"path": "calc/extra.py", "old_str": "", "new_str": "def frobnicate():\n    pass\n"})
    assert call_tool(tools, "search", {"query": "frobnicate"}).startswith("calc/extra.py:1-2")


def test_run_lint_tests_in_sandbox(tools):
    assert call_tool(tools, "run", {"command": "echo hi; exit 3"}) == "hi\n[exit code 3]"
    assert "timeout_s must be between" in call_tool(tools, "run", {"command": "true", "timeout_s": 0})
    assert "1 failed, 1 passed" in call_tool(tools, "run_tests", {})
    assert "1 passed" in call_tool(tools, "run_tests", {"target": "tests/test_ops.py::test_mul"})
    (tools.workspace / "calc/bad.py").write_text("import os\n")
    assert "F401" in call_tool(tools, "lint", {"path": "calc"})


def test_ask_user_and_submit(tools):
    assert "No further information" in call_tool(tools, "ask_user", {"question": "which file?"})
    tools.task.meta["user_answer"] = "Use calc/ops.py."
    assert call_tool(tools, "ask_user", {"question": "which file?"}) == "Use calc/ops.py."
    assert call_tool(tools, "submit", {"summary": "done"}) == "Submitted." and tools.submission == "done"


def test_output_truncation_says_so(tools):
    tools.max_output_chars = 200
    out = call_tool(tools, "run", {"command": "seq 1 5000"})
    assert len(out) < 300 and "characters truncated" in out and out.rstrip().endswith("[exit code 0]")
    assert truncate("x" * 10, 100) == "x" * 10


def test_schemas_validate_calls(tools):
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas(tools)}
    ok = parse_turn('<tool_call>\n{"name": "run_tests", "arguments": {"target": null}}\n</tool_call>', schemas)
    bad = parse_turn('<tool_call>\n{"name": "search", "arguments": {"query": "x", "k": "5"}}\n</tool_call>', schemas)
    assert not ok.malformed_calls and "must be of type integer" in bad.malformed_calls[0].error


def test_deadline_caps_commands_then_refuses_them(tools):
    assert tools.deadline is None
    tools.deadline = time.monotonic() + 1.0
    start = time.monotonic()
    out = call_tool(tools, "run", {"command": "sleep 20", "timeout_s": 30})
    assert time.monotonic() - start < 5 and "the episode's time budget ran out" in out
    time.sleep(max(0.0, tools.deadline - time.monotonic()) + 0.05)
    for name, args in [("run", {"command": "true"}), ("run_tests", {}), ("lint", {}), ("grep", {"pattern": "add"})]:
        assert call_tool(tools, name, args).startswith("Error: the episode's time budget is spent"), name
    assert call_tool(tools, "read_file", {"path": "calc/ops.py"}).startswith("   1|")  # in-process tools still answer
    assert call_tool(tools, "submit", {"summary": "s"}) == "Submitted."
    tools.deadline = None
    assert call_tool(tools, "run", {"command": "echo ok"}) == "ok\n[exit code 0]"


def test_direct_calls_are_validated_like_parsed_ones(tools):
    assert call_tool(tools, "run", {"command": "true", "timeout_s": True}).startswith(
        "Error: run: argument 'timeout_s' must be of type integer, got bool")
    assert "out of range" in call_tool(tools, "read_file", {"path": "calc/ops.py", "start_line": 10**5000})
    assert "unexpected argument" in call_tool(tools, "read_file", {"path": "calc/ops.py", "mode": "w"})
    assert call_tool(tools, "nope", {}).startswith("Error: unknown tool 'nope'")


def test_run_tests_target_cannot_pass_options(tools):
    (tools.workspace / "-p").write_text("")
    out = call_tool(tools, "run_tests", {"target": "-p"})
    assert "no tests ran" in out or "ERROR" in out  # collected as the file ./-p, not read as pytest's -p option


def test_a_very_deep_tree_does_not_break_listing_or_search(tools):
    levels = [tools.workspace]  # 1,200 levels: Python 3.11's os.walk and rmtree recurse once per level
    for _ in range(1200):
        levels.append(levels[-1] / "d")
        levels[-1].mkdir()
    (levels[-1] / "x.py").write_text("deep_marker = 1\n")
    out = call_tool(tools, "search", {"query": "deep_marker"})
    assert out.startswith("d/d/d/") and "deep_marker" in out
    (levels[-1] / "x.py").unlink()
    for level in reversed(levels[1:]):  # rmtree in the fixture would hit the recursion limit
        level.rmdir()


def test_tool_schemas_are_what_transformers_and_trl_build():
    # The harness builds the schemas itself (env/ does not import transformers); they must stay identical
    # to transformers' get_json_schema, which TRL uses for `tools=`, or prompts would drift from TRL's.
    from transformers.utils import get_json_schema

    from env.tools import CodeTools, function_schema, tool_names

    for name in tool_names(CodeTools):
        expected = get_json_schema(getattr(CodeTools, name))
        expected["function"].pop("return", None)
        expected["function"]["parameters"]["properties"].pop("self", None)
        assert function_schema(getattr(CodeTools, name)) == expected, name


def test_run_tests_on_an_answer_graded_task_says_there_is_nothing_to_run(tmp_path):
    """An answer task's test_command is its hidden checker: running it in the workspace would only fail."""
    from env.tasks import load_task, write_task

    task = load_task(write_task(tmp_path / "t", id="answer-task", instruction="Which file defines `zorb`?",
                                test_command="python check_answer.py", repo={"a.py": "zorb = 1\n"},
                                hidden={"check_answer.py": "raise SystemExit(0)\n"}, gold_answer="a.py"))
    workspace = make_workspace(task.repo_dir)
    try:
        output = CodeTools(workspace, task).run_tests()
    finally:
        remove_workspace(workspace)
    assert "no visible tests" in output and "check_answer" not in output


def test_run_tests_output_is_the_same_text_every_run(tools):
    # the runner's duration is the one part that changes between runs of the same code; it made greedy evals
    # of one checkpoint differ
    outputs = {call_tool(tools, "run_tests", {}) for _ in range(3)}
    assert len(outputs) == 1
    (output,) = outputs
    assert "1 failed, 1 passed" in output and not re.search(r"\d+\.\d+s\b", output), output


def test_durations_are_dropped_from_pytest_and_unittest_summaries_only():
    from env.tools import without_durations

    assert without_durations("==== 2 failed, 1 passed, 3 warnings in 61.23s (0:01:01) ====\n[exit code 1]") == \
        "==== 2 failed, 1 passed, 3 warnings ====\n[exit code 1]"
    assert without_durations("..\n1 passed in 0.01s\n[exit code 0]") == "..\n1 passed\n[exit code 0]"
    assert without_durations("no tests ran in 0.00s") == "no tests ran"
    assert without_durations("-----\nRan 3 tests in 0.004s\n\nOK") == "-----\nRan 3 tests\n\nOK"
    untouched = "E   assert sleep_for(0.5) == 'slept in 0.5s'\nprint('ran in 2s')"
    assert without_durations(untouched) == untouched


# ------------------------------------------------------------------ byte-exact file edits
def edit(tools, path, old, new) -> str:
    return call_tool(tools, "edit_file", {"path": path, "old_str": old, "new_str": new})


def test_edit_file_changes_only_the_replaced_bytes(tools):
    ws = tools.workspace
    crlf = b"line one\r\nold value\r\nline three\r\n"
    (ws / "win.txt").write_bytes(crlf)
    (ws / "win.txt").chmod(0o640)
    # old_str as the model writes it (LF); the file is CRLF: matched, and the replacement is written CRLF
    out = edit(tools, "win.txt", "old value\nline three\n", "new value\nline three\nline four\n")
    assert out.startswith("Edited win.txt at line 2"), out
    assert (ws / "win.txt").read_bytes() == b"line one\r\nnew value\r\nline three\r\nline four\r\n"
    assert (ws / "win.txt").stat().st_mode & 0o777 == 0o640  # mode kept
    # a single-line edit of a CRLF file: every other byte as it was
    edit(tools, "win.txt", "line one", "line 1")
    assert (ws / "win.txt").read_bytes() == b"line 1\r\nnew value\r\nline three\r\nline four\r\n"
    # lone CR, form feed, U+2028 and a BOM in an LF file survive an edit elsewhere
    odd = "\ufeffa = 1\rb = 2\n\x0c\nc = 3\u2028d\nkeep = 0\n".encode()
    (ws / "odd.py").write_bytes(odd)
    assert edit(tools, "odd.py", "keep = 0", "keep = 1").startswith("Edited odd.py at line 4")
    assert (ws / "odd.py").read_bytes() == odd.replace(b"keep = 0", b"keep = 1")
    # a mixed file: the exact text wins, new_str verbatim
    (ws / "mixed.txt").write_bytes(b"a\r\nb\nc\r\n")
    edit(tools, "mixed.txt", "b\n", "B\n")
    assert (ws / "mixed.txt").read_bytes() == b"a\r\nB\nc\r\n"
    # creating: exactly the bytes given
    edit(tools, "new/crlf.txt", "", "x\r\ny\n")
    assert (ws / "new/crlf.txt").read_bytes() == b"x\r\ny\n"


@pytest.mark.parametrize("data, why", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR text \r\n", "binary file"),  # NUL bytes
    (b"caf\xe9 = 1\r\nold = 2\r\n", "not UTF-8 text"),  # Latin-1: no NUL, not UTF-8
])
def test_edit_file_refuses_binary_and_non_utf8_and_leaves_them_unchanged(tools, data, why):
    (tools.workspace / "f.bin").write_bytes(data)
    out = edit(tools, "f.bin", "text" if b"PNG" in data else "old = 2", "changed")
    assert out.startswith("Error: ") and why in out, out
    assert (tools.workspace / "f.bin").read_bytes() == data


def test_read_file_on_binary_and_line_endings(tools):
    ws = tools.workspace
    (ws / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    out = call_tool(tools, "read_file", {"path": "img.png"})
    assert "binary file of 12 bytes" in out and not out.startswith("Error")
    (ws / "win.txt").write_bytes(b"one\r\ntwo\x0cstill two\r\n")
    assert call_tool(tools, "read_file", {"path": "win.txt"}) == "   1| one\n   2| two\x0cstill two"
    (ws / "latin.txt").write_bytes(b"caf\xe9\n")
    assert call_tool(tools, "read_file", {"path": "latin.txt"}) == "   1| caf\ufffd"


def test_edit_file_never_writes_through_a_fifo_or_symlink(tools):
    import os

    ws = tools.workspace
    os.mkfifo(ws / "pipe")
    assert "not a regular file" in edit(tools, "pipe", "x", "y")
    assert "not a regular file" in call_tool(tools, "read_file", {"path": "pipe"})
    (ws / "ln").symlink_to("calc/ops.py")
    assert "already exists" in edit(tools, "ln", "", "x")


def test_a_call_on_a_sandbox_closed_by_a_stopping_run_fails_quietly(tools, caplog):
    """A stopping run closes live sandboxes under in-flight calls: one failed call, not a logged harness bug."""
    tools.sandbox.close()
    with caplog.at_level("ERROR"):
        result = call_tool(tools, "run_tests", {})
    assert result == "Error: run_tests was stopped: the sandbox is closed"
    assert caplog.records == []
