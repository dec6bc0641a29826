"""Task factory: split leakage, a small validated build, the task dir <-> dataset round trip."""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data.build_tasks import (
    DATASET_COLUMNS,
    assign_splits,
    build,
    check_split_leakage,
    parse_args,
    row_from_task,
    task_from_row,
    unit_size,
)
from data.families import FAMILIES
from data.families.base import MICRO_MAX_CHARS, SourceProject, load_projects, parse_failure
from data.families.fix_lint import INJECTORS, SIDE_EFFECT_CODES, ruff_diagnostics
from data.families.locate import checker_source
from env.grading import grade
from env.patch_apply import apply_patch
from env.tasks import Task, load_task, load_task_set

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = ROOT / "data" / "projects"
SMALL_BUILD = ["iniconf", "micro_roman", "micro_clamp"]


def _project(name: str, kind: str = "curated") -> SourceProject:
    return SourceProject(name, "", "MIT", "true", {"m.py": "", "tests/test_m.py": ""}, kind)


def test_splits_are_disjoint_complete_nonempty_and_deterministic():
    projects = [_project(f"p{i}") for i in range(8)] + [_project(f"micro_{i}") for i in range(12)]
    splits = assign_splits(projects, seed=0)
    names = [n for split in splits.values() for n in split]
    assert sorted(names) == sorted(p.name for p in projects)  # each project exactly once
    assert all(splits[s] for s in ("train", "val", "test"))
    assert assign_splits(list(reversed(projects)), seed=0) == splits
    assert assign_splits(projects, seed=1) != splits
    for split in ("val", "test"):  # stratified: held-out splits see both tiers
        assert any(n.startswith("micro_") for n in splits[split]) and any(n.startswith("p") for n in splits[split])


def test_too_few_projects_for_three_splits_is_an_error():
    with pytest.raises(ValueError, match="at least 3 source projects"):
        assign_splits([_project("a"), _project("b")], seed=0)


def test_unit_sizes_per_family_and_held_out():
    args = parse_args(["--per-project", "2", "--per-family", "locate=8, fix_bug=3", "--held-out-per-project", "12"])
    assert args.per_family == {"locate": 8, "fix_bug": 3}
    assert unit_size(args, "train", "locate") == 8
    assert unit_size(args, "train", "fix_bug") == 3
    assert unit_size(args, "train", "fix_lint") == 2
    assert unit_size(args, "val", "locate") == unit_size(args, "test", "fix_lint") == 12
    plain = parse_args(["--per-project", "2"])
    assert [unit_size(plain, s, "locate") for s in ("train", "val", "test")] == [2, 2, 2]


@pytest.mark.parametrize("bad", ["locate", "locate=0", "nosuch=3", "locate=x"])
def test_bad_per_family_entries_are_named(bad, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--per-family", bad])
    assert repr(bad) in capsys.readouterr().err


def test_split_leakage_is_detected(tmp_path):
    def task(id_, project):
        return Task(id_, "x", "true", tmp_path, meta={"project": project})

    check_split_leakage({"train": [task("a", "p1")], "val": [task("b", "p2")], "test": []})
    with pytest.raises(ValueError, match="split leakage: project 'p1'"):
        check_split_leakage({"train": [task("a", "p1")], "val": [task("b", "p1")], "test": []})


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("tasks")
    args = parse_args(["--out", str(out), "--projects", str(PROJECTS), "--only", ",".join(SMALL_BUILD),
                       "--per-project", "1", "--seed", "0", "--workers", "2", "--overwrite"])
    return out, build(args)


def test_small_build_layout_manifest_and_no_leakage(small_build):
    out, manifest = small_build
    tasks = load_task_set(out)
    assert len(tasks) == manifest["counts"]["total"] >= 7  # 3 projects x 3 families + locate on iniconf
    assert {t.meta["family"] for t in tasks} == set(FAMILIES)
    assert {t.meta["tier"] for t in tasks} == {"micro", "repo"}
    by_split = {s: [t for t in tasks if t.meta["split"] == s] for s in ("train", "val", "test")}
    check_split_leakage(by_split)
    assert json.loads((out / "splits.json").read_text()) == manifest["splits"]
    for t in tasks:
        assert t.root.parent.name == t.meta["split"]
        assert t.meta["project"] in manifest["splits"][t.meta["split"]]
        assert len(manifest["tasks"][t.id]["sha256"]) == 64
        if t.meta["tier"] == "micro":  # fits the tiny model's context, and ships the tests run_tests runs
            assert sum(len(p.read_text()) for p in t.repo_dir.rglob("*") if p.is_file()) < MICRO_MAX_CHARS
            assert any(p.name.startswith("test_") for p in t.repo_dir.rglob("*.py"))
    assert manifest["candidates"]["fix_bug"]["accepted"] == len([t for t in tasks if t.meta["family"] == "fix_bug"])


def test_small_build_gold_solves_all_and_noop_none(small_build, tmp_path):
    out, _ = small_build
    for task in load_task_set(out):
        assert not grade(task, task.repo_dir, "").solved, f"noop solves {task.id}"
        workspace = tmp_path / task.id
        shutil.copytree(task.repo_dir, workspace)
        if task.gold_patch:
            apply_patch(workspace, task.gold_patch)
        else:
            assert task.meta["family"] == "locate" and task.gold_answer
        result = grade(task, workspace, task.gold_answer or "")
        assert result.solved, f"gold fails {task.id}: {result.output[-500:]}"


def test_fix_lint_is_not_solved_by_noqa_comments(small_build, tmp_path):
    out, _ = small_build
    lint_tasks = [t for t in load_task_set(out) if t.meta["family"] == "fix_lint"]
    assert lint_tasks
    for task in lint_tasks:
        files = {p.relative_to(task.repo_dir).as_posix(): p.read_text()
                 for p in task.repo_dir.rglob("*.py")} | {"ruff.toml": (task.hidden_dir / "ruff.toml").read_text()}
        flagged = ruff_diagnostics(files)
        assert flagged
        workspace = tmp_path / task.id
        shutil.copytree(task.repo_dir, workspace)
        for path in {d["filename"] for d in flagged}:
            lines = (workspace / path).read_text().splitlines()
            for row in {d["location"]["row"] for d in flagged if d["filename"] == path}:
                lines[row - 1] += "  # noqa"
            files[path] = "\n".join(lines) + "\n"
            (workspace / path).write_text(files[path])
        assert not ruff_diagnostics(files), "the noqa attack silences plain ruff (else this test proves nothing)"
        assert not grade(task, workspace, "").solved, f"noqa comments solve {task.id}"


def test_fix_bug_instruction_reads_like_a_report_not_a_mutation(small_build):
    out, _ = small_build
    for task in load_task_set(out):
        if task.meta["family"] == "fix_bug":
            assert task.meta["mutation"] not in task.instruction
            assert "test" in task.instruction.lower()


def test_round_trip_task_dir_dataset_row(small_build, tmp_path):
    from datasets import load_from_disk

    out, _ = small_build
    dataset = load_from_disk(str(out / "dataset"))
    assert sum(len(dataset[s]) for s in dataset) == len(load_task_set(out))
    for split in dataset:
        assert set(dataset[split].column_names) == set(DATASET_COLUMNS)
        for row in dataset[split]:
            original = load_task(row["task_dir"])
            assert row == row_from_task(original)
            rebuilt = load_task(task_from_row(row, tmp_path / row["id"]))
            assert {**row_from_task(rebuilt), "task_dir": ""} == {**row, "task_dir": ""}
            files = sorted(p.relative_to(original.root) for p in original.root.rglob("*") if p.is_file())
            assert files == sorted(p.relative_to(rebuilt.root) for p in rebuilt.root.rglob("*") if p.is_file())
            for rel in files:
                assert (original.root / rel).read_bytes() == (rebuilt.root / rel).read_bytes()


def test_task_from_row_rejects_incomplete_rows(tmp_path):
    with pytest.raises(ValueError, match="lacks columns"):
        task_from_row({"id": "x"}, tmp_path / "x")


@pytest.mark.parametrize("kind", sorted(INJECTORS))
def test_each_lint_injection_is_flagged_by_ruff(kind):
    code, inject = INJECTORS[kind]
    source = (PROJECTS / "iniconf" / "iniconf" / "config.py").read_text()
    project = load_projects(PROJECTS, ["iniconf"])[0]
    options = inject(source, random.Random(0))
    assert options, f"{kind} found no site in iniconf/config.py"
    _, injected = options[0]
    codes = [d["code"] for d in ruff_diagnostics({**project.files, "iniconf/config.py": injected})]
    assert [c for c in codes if c not in SIDE_EFFECT_CODES] == [code]


def test_locate_checker_accepts_only_the_right_path(tmp_path):
    (tmp_path / "check.py").write_text(checker_source("pkg/b.py", ["pkg/a.py", "pkg/b.py"]))

    def passes(submission: str) -> bool:
        (tmp_path / ".submission.txt").write_text(submission)
        proc = subprocess.run([sys.executable, "check.py"], cwd=tmp_path, capture_output=True, check=False)
        return proc.returncode == 0

    assert passes("It is defined in pkg/b.py.")
    assert passes("./pkg/b.py")
    assert not passes("")
    assert not passes("pkg/a.py")
    assert not passes("b.py")
    assert not passes("pkg/a.py or pkg/b.py")  # naming every module does not pay


def test_parse_failure_pytest_and_unittest():
    pytest_out = (">       assert to_roman(4) == 'IV'\nE       AssertionError: assert 'IIII' == 'IV'\n"
                  "FAILED tests/test_roman.py::test_round_trip[4-IV] - AssertionError: assert 'IIII' == 'IV'\n"
                  "1 failed in 0.1s\n")
    report = parse_failure(pytest_out)
    assert report.test == "tests/test_roman.py::test_round_trip[4-IV]"
    assert report.message == "AssertionError: assert 'IIII' == 'IV'"
    assert report.source_line == "assert to_roman(4) == 'IV'"
    unittest_out = ("F.\n=====\nFAIL: test_quote (test_shlex.ShlexTest.test_quote)\n-----\nTraceback:\n"
                    "  File \"x\", line 1\nAssertionError: 'a' != 'b'\n-----\nRan 2 tests\n\nFAILED (failures=1)\n")
    report = parse_failure(unittest_out)
    assert report.test == "test_shlex.ShlexTest.test_quote"
    assert report.message == "AssertionError: 'a' != 'b'"
    assert parse_failure("all good\n") is None


class _CycleWithFinalizer:
    """Garbage the collector finalizes in Python code: the thread switch that races CPython 3.11's AST state."""

    def __del__(self):
        sum(range(50))


@pytest.mark.slow  # `make test-fast` leaves it out
def test_parsing_from_the_builders_threads_never_trips_the_ast_state_race():
    # build_tasks runs families on threads while other threads make subprocess/tempfile garbage; on
    # CPython 3.11 a bare ast.parse here fails within a second (SystemError: AST constructor recursion
    # depth mismatch), as it once did in CI
    import threading

    from data import pyast

    source = (ROOT / "data" / "mutations.py").read_text()
    errors: list[BaseException] = []

    def parse_with_garbage():
        for _ in range(100):
            for _ in range(50):
                a, b = _CycleWithFinalizer(), _CycleWithFinalizer()
                a.other, b.other = b, a
            try:
                pyast.parse(source)
            except BaseException as error:  # noqa: BLE001 - the test reports whatever escaped
                errors.append(error)
                return

    threads = [threading.Thread(target=parse_with_garbage) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_data_parses_python_only_through_the_locked_parser():
    import ast

    bare = []
    for path in sorted((ROOT / "data").rglob("*.py")):
        if path.name == "pyast.py" or "projects" in path.relative_to(ROOT / "data").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parse"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ast"):
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bare == [], "use data.pyast.parse: the task builder parses on threads"
