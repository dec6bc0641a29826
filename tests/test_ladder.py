"""The task ladder: every rung builds, deterministically, with disjoint train/held-out seeds and names;
gold solves and noop fails every built task (env.grading.grade); the oracle solves each rung, grounded."""

import importlib
import pkgutil
import random
import re
import shutil
from collections import defaultdict

import pytest

import data.families
from data.build_tasks import build, parse_args
from data.families import LADDER, ladder, ladder_ask
from data.grounding import trajectory_report
from data.oracle import OraclePolicy
from env.episode import run_episode
from env.grading import grade
from env.patch_apply import apply_patch
from env.tasks import load_task_set

# every rung module of data/families/ (ladder_*.py), found there rather than listed again here
RUNGS = {module.FAMILY: module for module in (importlib.import_module(f"data.families.{m.name}")
                                              for m in pkgutil.iter_modules(data.families.__path__)
                                              if m.name.startswith("ladder_"))}


def _made(module, split: str, index: int, seed: int = 0):
    """One candidate of a rung without validation (what `ladder.generate` makes from that seed)."""
    rng = random.Random(ladder.task_seed(seed, split, module.FAMILY, index))
    names = ladder.Names(rng, split)
    return module.make(rng, names), names


@pytest.fixture(scope="module")
def ladder_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("ladder")
    manifest = build(parse_args(["--out", str(out), "--ladder-only", "--ladder", "1", "--ladder-held-out", "1",
                                 "--seed", "0", "--workers", "2", "--overwrite"]))
    return out, manifest


def test_registry_lists_every_rung_module():
    assert LADDER == {family: module.generate for family, module in RUNGS.items()}


def test_every_rung_builds_in_every_split(ladder_build):
    out, manifest = ladder_build
    tasks = load_task_set(out)
    assert {(t.meta["family"], t.meta["split"]) for t in tasks} == {(f, s) for f in LADDER
                                                                    for s in ("train", "val", "test")}
    assert {t.meta["tier"] for t in tasks} == {"ladder"}
    assert all(manifest["candidates"][f]["accepted"] == 3 for f in LADDER)


def test_gold_solves_and_noop_fails_every_built_task(ladder_build, tmp_path):
    """The build grades every candidate (noop must fail, gold must pass) and keeps only those that do;
    here the held-out test split is graded again, independently of the build."""
    out, manifest = ladder_build
    tasks = load_task_set(out)
    assert sum(manifest["candidates"][f]["accepted"] for f in LADDER) == len(tasks)
    for task in load_task_set(out / "test"):
        assert not grade(task, task.repo_dir, "").solved, f"noop solves {task.id}"
        workspace = tmp_path / task.id
        shutil.copytree(task.repo_dir, workspace)
        if task.gold_patch:
            apply_patch(workspace, task.gold_patch)
        result = grade(task, workspace, task.gold_answer or "")
        assert result.solved, f"gold fails {task.id}: {result.output[-400:]}"


def test_oracle_solves_every_rung_grounded(ladder_build):
    out, _ = ladder_build
    for task in load_task_set(out / "val"):
        policy = OraclePolicy(seed=1)
        traj = run_episode(task, policy)
        assert traj.solved and traj.exit_status == "submitted", (task.id, traj.grade.get("output", "")[-400:])
        report = trajectory_report(traj, policy.marked_turns)
        assert report.grounded_rate == 1.0, (task.id, [(c.name, c.reason) for c in report.ungrounded])
        assert not report.wasted, (task.id, report.wasted)


@pytest.mark.parametrize("family", list(RUNGS))
def test_generation_is_deterministic_per_seed(family):
    module = RUNGS[family]
    for index in range(5):
        (a, _), (b, _) = _made(module, "train", index), _made(module, "train", index)
        assert (a is None) == (b is None)
        if a is not None:
            assert (a.instruction, a.repo, a.hidden, a.gold_patch, a.meta) == \
                   (b.instruction, b.repo, b.hidden, b.gold_patch, b.meta)
    first, _ = next((s, n) for s, n in (_made(module, "train", i) for i in range(5)) if s is not None)
    other, _ = next((s, n) for s, n in (_made(module, "train", i, seed=1) for i in range(5)) if s is not None)
    assert first.repo != other.repo  # another build seed, other tasks


@pytest.mark.parametrize("family", list(RUNGS))
def test_train_and_held_out_share_no_seed_and_no_identifier(family):
    module = RUNGS[family]
    seeds, names = defaultdict(set), defaultdict(set)
    for split in ("train", "val", "test"):
        for index in range(40):
            spec, made = _made(module, split, index)
            seeds[split].add(ladder.task_seed(0, split, family, index))
            if spec is not None:
                text = "\n".join([spec.instruction, *spec.repo, *spec.repo.values()])
                assert all(name in text for name in made.made), "every tracked identifier is used in the task"
                names[split].update(made.made)
    held_out = names["val"] | names["test"]
    assert names["train"] and held_out and not names["train"] & held_out
    assert not seeds["train"] & (seeds["val"] | seeds["test"]) and not seeds["val"] & seeds["test"]


@pytest.mark.parametrize("family", list(RUNGS))
def test_rungs_vary_wording_layout_and_size(family):
    module = RUNGS[family]
    specs = [s for s, _ in (_made(module, "train", i) for i in range(60)) if s is not None]
    assert len(specs) >= 50
    wordings = {re.sub(r"`[^`]*`|\S*[_/.-]\S*|\d+", "", s.instruction)[:25] for s in specs}
    assert len(wordings) >= 3, wordings
    layouts = {"nested" if any(p.count("/") >= 2 for p in s.repo) else
               "package" if any("/" in p and not p.startswith("tests/") for p in s.repo) else "flat" for s in specs}
    assert layouts == {"flat", "package", "nested"}
    assert len({len(s.repo) for s in specs}) >= 3
    if family == "ladder_locate":
        assert min(len([p for p in s.repo if not p.endswith("__init__.py")]) for s in specs) >= 8


def test_generation_is_fast():
    import time

    start = time.perf_counter()
    made = sum(_made(module, "test", i)[0] is not None for module in RUNGS.values() for i in range(100))
    assert made >= 96 * len(RUNGS) and time.perf_counter() - start < 20  # hundreds of tasks in seconds (before validation)


def test_answer_checker_wants_the_exact_answer(tmp_path):
    import subprocess
    import sys

    def passes(checker: str, submission: str) -> bool:
        (tmp_path / "check.py").write_text(checker)
        (tmp_path / ".submission.txt").write_text(submission)
        return subprocess.run([sys.executable, "check.py"], cwd=tmp_path, check=False,
                              capture_output=True).returncode == 0

    word = ladder.answer_checker("kavo-381-zune", ["tela-77-rim"], False, [])
    assert passes(word, "kavo-381-zune") and passes(word, "The code is kavo-381-zune.")
    assert not passes(word, "kavo-381-zun") and not passes(word, "kavo-381-zune or tela-77-rim")
    where = ladder.answer_checker("pkg/a.py:12", [], True, ["pkg/a.py", "pkg/b.py"])
    assert passes(where, "pkg/a.py:12") and passes(where, "It is at ./pkg/a.py:12.")
    assert not passes(where, "pkg/a.py") and not passes(where, "pkg/a.py:13")
    assert not passes(where, "pkg/a.py:12 and pkg/b.py:3")
    path_only = ladder.answer_checker("pkg/a.py", [], False, ["pkg/a.py", "pkg/b.py"])
    assert passes(path_only, "pkg/a.py") and not passes(path_only, "pkg/b.py")


def test_a_ladder_only_build_may_leave_a_split_empty(ladder_build, tmp_path):
    from datasets import load_from_disk

    from data.build_tasks import save_dataset

    out, _ = ladder_build
    save_dataset({"train": [], "val": load_task_set(out / "val"), "test": []}, tmp_path / "dataset")
    dataset = load_from_disk(str(tmp_path / "dataset"))
    assert list(dataset) == ["val"] and len(dataset["val"]) == len(LADDER)


@pytest.mark.slow  # `make test-fast` leaves it out
def test_ask_rung_hides_the_value_and_the_oracle_asks_before_it_edits(tmp_path):
    from env.tasks import load_task

    for index in range(6):
        spec, _ = _made(ladder_ask, "train", index)
        value = re.search(r"\d+", spec.meta["user_answer"]).group(0)
        target = spec.meta["symbol"]
        assert target in spec.instruction and value not in spec.instruction
        # nothing the agent can open shows the new value on the target's line, or a test of it
        assert not any(re.search(rf"{target}\s*==?\s*{value}\b", text) for text in spec.repo.values())
        assert any(f"{target} == {value}" in text for text in spec.hidden.values())
        spec.id = f"ask-{index}"
        task = load_task(spec.write(tmp_path / spec.id))
        policy = OraclePolicy(seed=index)
        traj = run_episode(task, policy)
        assert traj.solved, traj.grade.get("output", "")[-300:]
        names = [[c["name"] for c in turn["calls"]] for turn in traj.turns]
        asked = next(i for i, calls in enumerate(names) if "ask_user" in calls)
        edited = next(i for i, calls in enumerate(names) if "edit_file" in calls)
        assert asked == 0 and edited > asked
        tool_results = [m["content"] for m in traj.messages if m.get("role") == "tool"]
        assert value in tool_results[names[0].index("ask_user")]  # the harness answered with the task's answer
