"""env/results.py: results files read back what was appended, a killed write's partial last line is ignored
(and repaired), a bad line before the end is an error naming it, and run facts refuse other settings."""

import json

import pytest

from env import results

RECORDS = [{"task_set": "s", "id": f"t{i}", "sample": i % 2, "text": "é"} for i in range(3)]


def test_appended_records_read_back_and_rewrite_replaces_the_file(tmp_path):
    path = tmp_path / "episodes.jsonl"
    assert results.read_results(path) == []  # no file yet: nothing played
    with open(path, "a", encoding="utf-8") as f:
        for record in RECORDS:
            results.append_record(f, record)
    assert results.read_results(path) == RECORDS
    results.rewrite_results(path, RECORDS[::-1])
    assert results.read_results(path) == RECORDS[::-1]
    assert [p.name for p in tmp_path.iterdir()] == ["episodes.jsonl"]
    assert results.record_key(RECORDS[1]) == ("s", "t1", 1)
    assert results.record_key({"id": "x"}) == (None, "x", None)


def test_a_partial_last_line_is_ignored_and_repaired(tmp_path):
    path = tmp_path / "episodes.jsonl"
    lines = [json.dumps(r) + "\n" for r in RECORDS]
    path.write_text(lines[0] + lines[1] + lines[2][:10])  # killed while writing a line
    assert results.read_results(path) == RECORDS[:2] and path.read_text().endswith(lines[2][:10])
    assert results.read_results(path, repair=True) == RECORDS[:2] and path.read_text() == lines[0] + lines[1]
    path.write_text(lines[0] + lines[1].rstrip("\n"))  # killed just before the newline
    assert results.read_results(path, repair=True) == RECORDS[:2] and path.read_text() == lines[0] + lines[1]


@pytest.mark.parametrize("bad", ["{not json\n", "[1, 2]\n", '{"no": "id"}\n'])
def test_a_bad_line_before_the_end_names_the_file_and_line(tmp_path, bad):
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + bad + json.dumps(RECORDS[1]) + "\n")
    with pytest.raises(results.ResultsFileError, match=r"episodes.jsonl', line 2"):
        results.read_results(path)


def test_run_facts_refuse_other_settings(tmp_path):
    path = tmp_path / "episodes.jsonl"
    facts = {"episode": {"max_turns": 20}, "seed": 0}
    results.check_run_facts(path, facts)  # nothing recorded: nothing to refuse
    results.write_run_facts(path, facts)
    assert results.run_facts_path(path).name == "episodes.jsonl.run.json"
    results.check_run_facts(path, json.loads(json.dumps(facts)))
    with pytest.raises(results.ResultsFileError,
                       match="played with episode.max_turns=20, this run has episode.max_turns=3"):
        results.check_run_facts(path, {"episode": {"max_turns": 3}, "seed": 0})
    with pytest.raises(results.ResultsFileError, match="played with policy=None, this run has policy='gold'"):
        results.check_run_facts(path, {**facts, "policy": "gold"})
    results.run_facts_path(path).write_text("{oops")
    with pytest.raises(results.ResultsFileError, match=r"episodes.jsonl.run.json"):
        results.check_run_facts(path, facts)
