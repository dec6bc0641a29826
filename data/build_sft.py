"""Expert trajectories for SFT: the `oracle` policy run through the real harness.

    python -m data.build_sft --tasks artifacts/data/tasks --out artifacts/data/sft --variants 2

Episodes are played by env.runner.run_tasks (--concurrency at once, tools in threads). Each kept episode
is exactly what a model sees in RL and eval (same system prompt, tool schemas, tool-result formatting and
truncation), exported from its record (`Trajectory.to_record`) as a chat row:

    {"messages": [...], "tools": "<JSON list of tool schemas>", "task_id", "family", "tier", "variant"}

assistant messages carry only `content`: the exact text of the turn in the harness's tool-call syntax
(env/protocol.py), checked to be the canonical text of the calls the loop parsed (its turn records). No
structured `tool_calls`: every chat template renders an assistant's plain content verbatim, while each
template serializes `tool_calls` its own way (Qwen2.5's renders `arguments | tojson`, which double-encodes
the JSON-string arguments a `datasets` row must hold, and dict arguments get `null` keys when `datasets`
unifies the structs across tools), so the text trained on would no longer parse in the harness.
Before anything is written, every row is rendered with the project's chat template and with each
`--verify-template` tokenizer (for a Hub model: its template and the training template TRL swaps in for
assistant-only loss), and every assistant turn of the rendering must be the harness text and parse with no
malformed call (`check_rows_render`); the build refuses otherwise. Episodes are played under `--budget`
(a preset's budget.yaml: the tool-result truncation RL and eval use). Only solved, submitted episodes whose every
unmarked call is grounded in its context (data/grounding.py) are kept. A separate
`bad_examples.json` holds deliberately malformed turns for tests; it never enters the SFT data.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from data.grounding import trajectory_report
from data.oracle import OraclePolicy
from env.budget import Budget, BudgetError, load_budget_file
from env.episode import EpisodeConfig
from env.metrics import summarize
from env.protocol import format_assistant_turn
from env.runner import run_tasks
from env.tasks import Task, TaskError, load_task_set


class ExportError(ValueError):
    """A trajectory whose turns do not round-trip through the canonical format."""


def sft_messages(record: dict) -> list[dict]:
    """Harness messages -> chat-template messages (assistant turns as their harness text, module docstring).

    `record` is the episode record (`Trajectory.to_record`): its turn records hold the calls the loop parsed
    from each assistant message, so nothing is parsed again. A turn is exported only if its message is the
    canonical text of those calls (with its prose before them).
    """
    task_id = record["id"]
    turns = iter(record["turns"])
    out = []
    for msg in record["messages"]:
        if msg["role"] != "assistant":
            out.append({k: msg[k] for k in ("role", "content", "name") if k in msg})
            continue
        turn = next(turns, None)
        if turn is None:
            raise ExportError(f"{task_id}: more assistant messages than turn records")
        bad = next((c for c in turn["calls"] if c["malformed"]), None)
        if bad is not None:
            raise ExportError(f"{task_id}: malformed call in an expert turn: {bad['error']}")
        calls = [(c["name"], c["arguments"]) for c in turn["calls"]]
        text, body = msg["content"], format_assistant_turn(None, calls)
        content = text[: len(text) - len(body)].strip() if body and text.endswith(body) else text.strip()
        if format_assistant_turn(content, calls) != text:
            raise ExportError(f"{task_id}: assistant turn is not in canonical form: {text[:80]!r}")
        out.append({"role": "assistant", "content": text})
    return out


class RenderError(ValueError):
    """SFT rows whose assistant turns, as a chat template renders them, do not parse in the harness."""


def load_tokenizer(spec: str):
    """`AutoTokenizer.from_pretrained(spec)` without the model's code (data/ imports nothing from nanocomposer,
    tests/test_layers.py). A checkpoint whose config.json names a model type transformers does not know (the
    project's smeared_llama, registered by nanocomposer.smeared_llama) has that config read as a plain
    PreTrainedConfig with the same model_type: AutoTokenizer picks its tokenizer class the same way as with the type
    registered (nothing maps smeared_llama to a tokenizer), minus the warning of its own fallback for such a type."""
    from transformers import AutoTokenizer, PreTrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_file = Path(spec) / "config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if config.get("model_type") not in CONFIG_MAPPING:
            return AutoTokenizer.from_pretrained(spec, config=PreTrainedConfig.from_dict(config))
    return AutoTokenizer.from_pretrained(spec)


def _renderer(spec: str):
    """(label, render) for a template spec: "project" (env/chat_template.jinja) or a tokenizer
    directory / hub id, whose own template and, when it has no {% generation %} markers, the training
    template TRL's SFTTrainer swaps in for assistant-only loss, are both checked."""
    from transformers.utils.chat_template_utils import render_jinja_template

    if spec == "project":
        from env.protocol import load_chat_template

        templates = [("project", load_chat_template())]
    else:
        from trl.chat_template_utils import get_training_chat_template, has_generation_markers

        tok = load_tokenizer(spec)
        if not tok.chat_template:
            raise RenderError(f"--verify-template {spec}: the tokenizer has no chat template")
        templates = [(spec, tok.chat_template)]
        if not has_generation_markers(tok.chat_template):
            try:
                templates.append((f"{spec} (TRL training template)", get_training_chat_template(tok)))
            except (ValueError, NotImplementedError) as e:  # TRL cannot patch it: SFTTrainer would refuse too
                raise RenderError(f"--verify-template {spec}: no training template for assistant-only loss: {e}")
    return [(label, lambda msgs, tools, gen, t=t: render_jinja_template(
        [msgs], tools=tools, chat_template=t, add_generation_prompt=gen)[0][0]) for label, t in templates]


def assistant_renderings(messages: list[dict], tools: list[dict], render) -> list[str]:
    """The text `render` (messages, tools, add_generation_prompt) -> str gives each assistant turn: the
    rendering through that turn minus the rendering of the turns before it with the assistant header."""
    out = []
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = render(messages[:i], tools, True)
        through = render(messages[: i + 1], tools, False)
        if not through.startswith(before):
            raise RenderError(f"the template is not prefix-preserving at message {i}")
        out.append(through[len(before):])
    return out


def check_rows_render(rows: list[dict], specs: list[str]) -> dict:
    """Refuse (RenderError) rows whose assistant turns, rendered by any template of `specs`, are not the harness
    text followed by the template's end of turn, or hold a call the harness would reject; else
    {label: assistant turns checked}."""
    from env.protocol import parse_turn

    checked = {}
    for spec in specs:
        for label, render in _renderer(spec):
            n = 0
            for row in rows:
                tools = json.loads(row["tools"]) if row["tools"] else None
                schemas = {t["function"]["name"]: t["function"] for t in tools or []}
                wanted = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
                for text, rendered in zip(wanted, assistant_renderings(row["messages"], tools, render), strict=True):
                    body, sep, _ = rendered.partition("<|im_end|>")
                    turn = parse_turn(body, schemas)
                    if not sep or body != text or turn.malformed_calls:
                        why = (turn.malformed_calls[0].error if turn.malformed_calls else
                               "the rendered turn is not the harness text" if body != text else "no <|im_end|>")
                        raise RenderError(f"{row['task_id']}: template {label}: an assistant turn would train "
                                          f"text the harness rejects ({why}): {body[:120]!r}")
                    n += 1
            checked[label] = n
    return checked


def sft_row(record: dict, meta: dict) -> dict:
    return {"messages": sft_messages(record), "tools": json.dumps(record["tools"], ensure_ascii=False),
            "task_id": record["id"], "family": meta.get("family", ""), "tier": meta.get("tier", ""),
            "variant": record["seed"]}


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


def distribution(records: list[dict]) -> dict:
    turns = Counter(r["n_turns"] for r in records)
    return {**summarize(records), "turns_histogram": dict(sorted(turns.items())),
            "recovered_edit_errors": sum(any(c["error"] for t in r["turns"] for c in t["calls"]) for r in records),
            "linted_before_submit": sum(any(c["name"] == "lint" for t in r["turns"] for c in t["calls"])
                                        for r in records)}


def oracle_rows(tasks: list[Task], variants: int, seed: int, concurrency: int, desc: str,
                config: EpisodeConfig | None = None) -> tuple[list, list, Counter]:
    """(SFT rows, the kept records, why the others were dropped): `variants` oracle episodes per task (seeds
    seed..seed+variants-1), `concurrency` at once through env.runner.run_tasks, under `config`."""
    meta = {t.id: t.meta for t in tasks}
    records = run_tasks(tasks, OraclePolicy, config or EpisodeConfig(), samples=variants, seed=seed,
                        concurrency=concurrency, desc=desc)
    rows, kept, dropped = [], [], Counter()
    for record in records:
        if not (record["solved"] and record["exit_status"] == "submitted"):
            dropped[f"unsolved:{record['exit_status']}"] += 1
            continue
        # A model imitates every action, peeking included: an episode with one call its context does not
        # justify (its deliberate, marked mistakes aside) is not training data.
        if (ungrounded := trajectory_report(record).ungrounded):
            dropped["ungrounded"] += 1
            print(f"warning: {record['id']}: dropped, turn {ungrounded[0].turn} {ungrounded[0].name} is not "
                  f"grounded in its context ({ungrounded[0].reason})", file=sys.stderr)
            continue
        try:
            rows.append(sft_row(record, meta.get(record["id"], {})))
        except ExportError as e:
            dropped["export_error"] += 1
            print(f"warning: {e}", file=sys.stderr)
            continue
        kept.append(record)
    return rows, kept, dropped


def build(tasks_dir: Path, out: Path, variants: int, seed: int, workers: int, limit: int | None,
          tokenizer_path: str | None = None, overwrite: bool = False, val_tasks: int | None = None,
          budget: Budget | None = None, verify_templates: list[str] | None = None) -> dict:
    """Build the SFT dataset; `workers`: oracle episodes played at once (run_tasks concurrency); `budget`: the
    episodes' budgets (a preset's budget.yaml); every row checked with `verify_templates` besides the
    project's template (check_rows_render) before anything is written."""
    import datasets

    from data.common import environment_info, prepare_output_dir, sha256_file, write_manifest
    from env.tasks import spread_subset

    t0 = time.perf_counter()
    if out.is_dir() and any(out.iterdir()) and not overwrite:  # fail before the episodes, not after
        raise ValueError(f"output directory {out} exists and is not empty; pass --overwrite to replace it")
    splits = {"train": tasks_dir / "train", "validation": tasks_dir / "val"}
    if not splits["train"].is_dir():  # a plain task set: everything is training data
        splits = {"train": tasks_dir}
    result, stats = {}, {}
    for split, path in splits.items():
        if not path.is_dir():
            continue
        tasks = spread_subset(load_task_set(path), limit) if limit else load_task_set(path)  # every family
        if split == "validation" and val_tasks:  # a loss curve needs few; the held-out split may be large
            tasks = spread_subset(tasks, val_tasks)
        config = EpisodeConfig.from_budget(budget) if budget else EpisodeConfig()
        rows, kept, dropped = oracle_rows(tasks, variants, seed, workers, f"oracle {split}", config)
        if not rows:
            raise TaskError(f"no solved oracle episodes in {path}: nothing to train on")
        rendered = check_rows_render(rows, ["project", *(verify_templates or [])])
        result[split] = datasets.Dataset.from_list(rows)
        stats[split] = {"tasks": len(tasks), "episodes": len(tasks) * variants, "kept": len(rows),
                        "dropped": dict(dropped), "distribution": distribution(kept),
                        "assistant_turns_parsed": rendered}
        if tokenizer_path:
            stats[split]["tokens"] = _token_stats(rows, tokenizer_path)
    dataset = datasets.DatasetDict(result)
    prepare_output_dir(out, overwrite, marker_files=["manifest.json"])
    dataset.save_to_disk(str(out / "dataset"))
    (out / "bad_examples.json").write_text(json.dumps(bad_examples(random.Random(seed)), indent=1))
    manifest = {"builder": "data.build_sft", "tasks": str(tasks_dir), "variants": variants, "seed": seed,
                "val_tasks": val_tasks, "budget": (budget or Budget()).episode(),
                "splits": stats, "sha256": {split: sha256_file(f) for split in result
                                            for f in sorted((out / "dataset" / split).glob("*.arrow"))[:1]},
                "environment": environment_info("datasets", "transformers"),
                "build_s": round(time.perf_counter() - t0, 1)}
    write_manifest(out / "manifest.json", manifest)
    return manifest


def _token_stats(rows: list[dict], tokenizer_path: str) -> dict:
    tok = load_tokenizer(tokenizer_path)
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
    p.add_argument("--concurrency", "--workers", dest="concurrency", type=int, default=2,
                   help="oracle episodes played at once (threads; --workers is the old name)")
    p.add_argument("--limit", type=int, default=None, help="at most N tasks per split, spread over the set")
    p.add_argument("--val-tasks", type=int, default=None,
                   help="at most N validation tasks, evenly spaced over the val split (loss curve only)")
    p.add_argument("--tokenizer", default=None, help="count tokens with this tokenizer's chat template")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier output at --out")
    p.add_argument("--budget", default=None,
                   help="a preset's budget file (recipes/<preset>/budget.yaml): the episodes' budgets")
    p.add_argument("--verify-template", action="append", default=[], metavar="TOKENIZER",
                   help="also check every row rendered by this tokenizer's chat template (and TRL's training "
                        "variant of it) parses in the harness; repeatable")
    args = p.parse_args(argv)
    if not Path(args.tasks).is_dir():
        p.error(f"--tasks {args.tasks!r} is not a directory")
    if args.variants < 1 or args.concurrency < 1:
        p.error("--variants and --concurrency must be >= 1")
    if args.val_tasks is not None and args.val_tasks < 1:
        p.error(f"--val-tasks must be >= 1 (or left out for the whole val split), got {args.val_tasks}")
    try:
        budget = Budget(**load_budget_file(args.budget)) if args.budget else None
    except BudgetError as e:
        p.error(str(e))
    try:
        manifest = build(Path(args.tasks), Path(args.out), args.variants, args.seed, args.concurrency, args.limit,
                         args.tokenizer, args.overwrite, args.val_tasks, budget, args.verify_template)
    except (TaskError, ValueError) as e:
        print(f"build_sft: error: {e}", file=sys.stderr)
        return 2
    for split, s in manifest["splits"].items():
        d = s["distribution"]
        print(f"{split}: kept {s['kept']}/{s['episodes']} episodes | mean turns {d['mean_turns']:.2f} | "
              f"parallel-call rate {d['parallel_call_rate']:.1%} | tool mix {d['tool_mix']}")
        print(f"{split}: assistant turns that parse in the harness as each template renders them: "
              + ", ".join(f"{label} {n}/{n}" for label, n in s["assistant_turns_parsed"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
