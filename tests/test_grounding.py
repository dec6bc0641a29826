"""data/grounding.py: the checker of the oracle's fairness. It accepts a fix whose every call is grounded in
what the context showed before it, and catches the old oracle's habits (names from the gold patch, line ranges
nobody cited, claims of passing tests), and counts wasted calls. The oracle against it: tests/test_oracle.py."""

import pytest

from data.grounding import grounding_report


def _turns(*calls_and_results):
    """Messages and turn records for a scripted trajectory: ((name, arguments), result) per turn."""
    messages = [{"role": "system", "content": "sys"},
                {"role": "user", "content": "The test `tests/test_a.py::test_add` fails.\n\nFiles:\npkg/a.py\n"
                                            "pkg/b.py\ntests/test_a.py\n"}]
    turns = []
    for (name, arguments), result in calls_and_results:
        messages.append({"role": "assistant", "content": "..."})
        messages.append({"role": "tool", "name": name, "content": result})
        turns.append({"calls": [{"name": name, "arguments": arguments, "malformed": False}]})
    return messages, turns


FAILING = ("tests/test_a.py:4: in test_add\n    assert add(2, 3) == 5\npkg/a.py:7: in add\nE  assert -1 == 5\n"
           "[exit code 1]")
READ = "   6| def add(a, b):\n   7|     return a - b\n   8| "


def test_checker_accepts_a_grounded_fix():
    report = grounding_report(*_turns(
        (("run_tests", {}), FAILING),
        (("grep", {"pattern": r"def add\b"}), "pkg/a.py:6:def add(a, b):"),
        (("read_file", {"path": "pkg/a.py", "start_line": 3, "end_line": 12}), READ),
        (("edit_file", {"path": "pkg/a.py", "old_str": "    return a - b\n", "new_str": "    return a + b\n"}),
         "Edited pkg/a.py at line 7: replaced 1 line(s) with 1."),
        (("run_tests", {}), "1 passed\n[exit code 0]"),
        (("submit", {"summary": "Fixed add in pkg/a.py; the tests pass."}), "Submitted."),
    ))
    assert report.grounded_rate == 1.0, [(c.name, c.reason) for c in report.ungrounded]


@pytest.mark.parametrize("bad_call, why", [
    (("grep", {"pattern": r"(def|class) subtract\b"}), "not in the context"),  # a name only the patch knows
    (("read_file", {"path": "pkg/b.py", "start_line": 40, "end_line": 60}), "no line number"),
    (("read_file", {"path": "pkg/c.py"}), "not in the context"),
    (("edit_file", {"path": "pkg/a.py", "old_str": "    return a - b\n", "new_str": "x"}), "read_file"),
    (("submit", {"summary": "Fixed add in pkg/a.py; the tests pass."}), "tests pass"),
    (("submit", {"summary": "pkg/b.py"}), "not in the context"),  # the file list proves no answer
    (("search", {"query": "subtract numbers"}), "not in the context"),
])
def test_checker_flags_what_the_context_does_not_support(bad_call, why):
    report = grounding_report(*_turns((("run_tests", {}), FAILING), (bad_call, "whatever")))
    assert [c.grounded for c in report.calls] == [True, False] and why in report.calls[1].reason
    marked = grounding_report(*_turns((("run_tests", {}), FAILING), (bad_call, "whatever")), marked_turns={1})
    assert marked.grounded_rate == 1.0 and marked.summary()["marked"] == 1


def test_checker_counts_wasted_calls():
    report = grounding_report(*_turns((("grep", {"pattern": "test_add"}), "No matches for 'test_add' in ."),
                                      (("run_tests", {}), "no tests ran in 0.01s\n[exit code 5]")))
    assert dict(report.wasted) == {"grep without matches": 1, "test run that ran no tests": 1}
