"""Expert trajectories for SFT: the `oracle` policy run through the real harness.

    python -m data.build_sft --tasks artifacts/data/tasks --out artifacts/data/sft --variants 2

Each kept episode is exactly what a model sees in RL and eval (same system prompt, tool
schemas, tool-result formatting and truncation), exported as a chat row:

    {"messages": [...], "tools": "<JSON list of tool schemas>", "task_id", "family", "tier", "variant"}

assistant messages carry `content` (prose) and `tool_calls` with canonical JSON-string
arguments; the chat template renders them back to the exact raw text the harness parsed
(checked here for every turn). Only solved, submitted episodes are kept. A separate
`bad_examples.json` holds deliberately malformed turns for tests; it never enters the SFT data.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from env.episode import EpisodeConfig, Trajectory, run_episode
from env.metrics import summarize
from env.policies import OraclePolicy
from env.protocol import format_assistant_turn, parse_turn
from env.tasks import TaskError, load_task, load_task_set


class ExportError(ValueError):
    """A trajectory whose turns do not round-trip through the canonical format."""


def sft_messages(traj: Trajectory) -> list[dict]:
    """Harness messages -> chat-template messages (structured tool calls, JSON-string arguments)."""
    schemas = {s["function"]["name"]: s["function"] for s in traj.tools}
    out = []
    for msg in traj.messages:
        if msg["role"] != "assistant":
            out.append({k: msg[k] for k in ("role", "content", "name") if k in msg})
            continue
        parsed = parse_turn(msg["content"], schemas)
        if parsed.malformed_calls:
            raise ExportError(f"{traj.task_id}: malformed call in an expert turn: {parsed.malformed_calls[0].error}")
        if format_assistant_turn(parsed.content, parsed.valid_calls) != msg["content"]:
            raise ExportError(f"{traj.task_id}: assistant turn is not in canonical form: {msg['content'][:80]!r}")
        out.append({"role": "assistant", "content": parsed.content, "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in parsed.valid_calls]})
    return out


def sft_row(traj: Trajectory, meta: dict, variant: int) -> dict:
    return {"messages": sft_messages(traj), "tools": json.dumps(traj.tools, ensure_ascii=False),
            "task_id": traj.task_id, "family": meta.get("family", ""), "tier": meta.get("tier", ""),
            "variant": variant}


def _episode(job: tuple[str, int, EpisodeConfig]) -> tuple[Trajectory, dict, int]:
    task_dir, variant, config = job
    task = load_task(task_dir)
    return run_episode(task, OraclePolicy(seed=variant), config), task.meta, variant


def bad_examples(rng: random.Random) -> list[dict]:
    """Malformed assistant turns, each with the error the parser must report (for tests only)."""
    good = '{"name": "read_file", "arguments": {"path": "README.md"}}'
    cases = [
        ("<tool_call>\n" + good[:-2] + "\n</tool_call>", "invalid JSON"),
        ('<tool_call>\n{"name": "open_file", "arguments": {"path": "a.py"}}\n</tool_call>', "unknown tool"),
        ('<tool_call>\n{"name": "edit_file", "arguments": {"path": "a.py"}}\n</tool_call>', "missing required argument"),
        ('<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py", "lines": 3}}\n</tool_call>',
         "unexpected argument"),
        ("<tool_call>\n" + good, "unclosed <tool_call>"),
        ('<tool_call>\n{"name": "read_file", "arguments": {"path": 7}}\n</tool_call>', "must be of type string"),
        (good + "\n</tool_call>", "stray </tool_call>"),
    ]
    rng.shuffle(cases)
    return [{"text": text, "expected_error": err} for text, err in cases]


def distribution(trajs: list[Trajectory]) -> dict:
    turns = Counter(len(t.turns) for t in trajs)
    return {**summarize(trajs), "turns_histogram": dict(sorted(turns.items())),
            "recovered_edit_errors": sum(any(c["error"] for tn in t.turns for c in tn["calls"]) for t in trajs),
            "linted_before_submit": sum(any(c["name"] == "lint" for tn in t.turns for c in tn["calls"]) for t in trajs)}


def build(tasks_dir: Path, out: Path, variants: int, seed: int, workers: int, limit: int | None,
          tokenizer_path: str | None = None, overwrite: bool = False, val_tasks: int | None = None) -> dict:
    import datasets
    from tqdm import tqdm

    from data.common import environment_info, prepare_output_dir, sha256_file, spread_subset, write_manifest

    t0 = time.perf_counter()
    if out.is_dir() and any(out.iterdir()) and not overwrite:  # fail before the episodes, not after
        raise ValueError(f"output directory {out} exists and is not empty; pass --overwrite to replace it")
    splits = {"train": tasks_dir / "train", "validation": tasks_dir / "val"}
    if not splits["train"].is_dir():  # a plain task set: everything is training data
        splits = {"train": tasks_dir}
    config = EpisodeConfig()
    result, stats = {}, {}
    for split, path in splits.items():
        if not path.is_dir():
            continue
        tasks = load_task_set(path)[:limit] if limit else load_task_set(path)
        if split == "validation" and val_tasks:  # a loss curve needs few; the held-out split may be large
            tasks = spread_subset(tasks, val_tasks)
        jobs = [(str(t.root), seed + v, config) for t in tasks for v in range(variants)]
        rows, kept, dropped = [], [], Counter()
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for traj, meta, variant in tqdm(pool.map(_episode, jobs), total=len(jobs), desc=f"oracle {split}"):
                if not (traj.solved and traj.exit_status == "submitted"):
                    dropped[f"unsolved:{traj.exit_status}"] += 1
                    continue
                try:
                    rows.append(sft_row(traj, meta, variant))
                except ExportError as e:
                    dropped["export_error"] += 1
                    print(f"warning: {e}", file=sys.stderr)
                    continue
                kept.append(traj)
        if not rows:
            raise TaskError(f"no solved oracle episodes in {path}: nothing to train on")
        result[split] = datasets.Dataset.from_list(rows)
        stats[split] = {"tasks": len(tasks), "episodes": len(jobs), "kept": len(rows),
                        "dropped": dict(dropped), "distribution": distribution(kept)}
        if tokenizer_path:
            stats[split]["tokens"] = _token_stats(rows, tokenizer_path)
    dataset = datasets.DatasetDict(result)
    prepare_output_dir(out, overwrite, marker_files=["manifest.json"])
    dataset.save_to_disk(str(out / "dataset"))
    (out / "bad_examples.json").write_text(json.dumps(bad_examples(random.Random(seed)), indent=1))
    manifest = {"builder": "data.build_sft", "tasks": str(tasks_dir), "variants": variants, "seed": seed,
                "val_tasks": val_tasks,
                "splits": stats, "sha256": {split: sha256_file(f) for split in result
                                            for f in sorted((out / "dataset" / split).glob("*.arrow"))[:1]},
                "environment": environment_info("datasets", "transformers"),
                "build_s": round(time.perf_counter() - t0, 1)}
    write_manifest(out / "manifest.json", manifest)
    return manifest


def _token_stats(rows: list[dict], tokenizer_path: str) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    lengths = sorted(len(tok.apply_chat_template(r["messages"], tools=json.loads(r["tools"]), tokenize=True,
                                                 return_dict=False))
                     for r in rows)
    return {"mean": sum(lengths) / len(lengths), "p50": lengths[len(lengths) // 2],
            "p95": lengths[int(len(lengths) * 0.95)], "max": lengths[-1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", required=True, help="task factory output (with train/ and val/) or any task set")
    p.add_argument("--out", required=True)
    p.add_argument("--variants", type=int, default=2, help="oracle episodes per task (different seeds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--limit", type=int, default=None, help="at most N tasks per split")
    p.add_argument("--val-tasks", type=int, default=None,
                   help="at most N validation tasks, evenly spaced over the val split (loss curve only)")
    p.add_argument("--tokenizer", default=None, help="count tokens with this tokenizer's chat template")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier output at --out")
    args = p.parse_args(argv)
    if not Path(args.tasks).is_dir():
        p.error(f"--tasks {args.tasks!r} is not a directory")
    if args.variants < 1 or args.workers < 1:
        p.error("--variants and --workers must be >= 1")
    if args.val_tasks is not None and args.val_tasks < 1:
        p.error(f"--val-tasks must be >= 1 (or left out for the whole val split), got {args.val_tasks}")
    try:
        manifest = build(Path(args.tasks), Path(args.out), args.variants, args.seed, args.workers, args.limit,
                         args.tokenizer, args.overwrite, args.val_tasks)
    except (TaskError, ValueError) as e:
        print(f"build_sft: error: {e}", file=sys.stderr)
        return 2
    for split, s in manifest["splits"].items():
        d = s["distribution"]
        print(f"{split}: kept {s['kept']}/{s['episodes']} episodes | mean turns {d['mean_turns']:.2f} | "
              f"parallel-call rate {d['parallel_call_rate']:.1%} | tool mix {d['tool_mix']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
