"""How eval results are reported: per-set summaries, the policy comparison (paired statistics), its Markdown
table and plots, the console table, and W&B runs. Metric definitions live in env/metrics.py.

    results = results_file(records, task_sets, policy_spec, config_facts, wall_s)   # results.json
    comparison = build_comparison({label: results, ...})                              # compare.json
    comparison_markdown(comparison); plot_comparison(comparison, out_dir)             # compare.md, *.png
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from env.metrics import BOOTSTRAP_RESAMPLES, CATEGORIES, compare_paired, summarize

WANDB_PROJECT = "nanocomposer"


def results_file(records: list[dict], task_sets: list, policy: str, label: str, config: dict,
                 wall_s: float) -> dict:
    """results.json of one policy: overall and per-task-set summaries, then one record per episode."""
    per_set = {}
    for ts in task_sets:
        recs = [r for r in records if r.get("task_set") == ts.name]
        per_set[ts.name] = {**summarize(recs, sum(r["wall_s"] for r in recs)), "kind": ts.kind, "label": ts.label,
                            "source": ts.source}
    summary = {**summarize(records, wall_s), "policy": policy, "label": label,
               "tasks": " ".join(ts.name for ts in task_sets), "task_sets": per_set, "config": config}
    return {"summary": summary, "tasks": records}


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temp file beside `path`, then rename: a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
    os.replace(tmp, path)


def print_table(results: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=title)
    for col in ("task", "set", "sample", "solved", "exit", "turns", "calls", "malformed", "wall s"):
        table.add_column(col)
    for r in results["tasks"]:
        table.add_row(r["id"], r["task_set"], str(r["sample"]), "yes" if r["solved"] else "no", r["exit_status"],
                      str(r["n_turns"]), str(r["tool_calls"]), str(r["malformed_calls"]), f"{r['wall_s']:.2f}")
    console.print(table)
    for name, s in [*results["summary"]["task_sets"].items(), ("all", results["summary"])]:
        label = s.get("label", name)
        lo, hi = s["solve_rate_ci95"]
        console.print(
            f"[bold]{label}[/bold]: solved {s['solved']}/{s['n']} ({s['solve_rate']:.1%}, 95% CI {lo:.1%}-{hi:.1%})"
            f" | validity {s['tool_call_validity']:.1%} | mean turns {s['mean_turns']:.2f} | parallel "
            f"{s['parallel_call_rate']:.1%} | malformed {s['malformed_calls']} | exits {s['exit_statuses']} | "
            f"{s['wall_s']:.1f} s")


# --------------------------------------------------------------------------- comparison


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def build_comparison(results: dict[str, dict], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict:
    """compare.json: per-policy summaries and, for every other policy, its difference from the first one."""
    labels = list(results)
    baseline = labels[0]
    set_names = list(results[baseline]["summary"]["task_sets"])
    scopes = ["all", *set_names]

    def records(label: str, scope: str) -> list[dict]:
        recs = results[label]["tasks"]
        return [dict(r, id=f"{r['task_set']}::{r['id']}") for r in recs if scope == "all" or r["task_set"] == scope]

    def summary(label: str, scope: str) -> dict:
        s = results[label]["summary"]
        return s if scope == "all" else s["task_sets"][scope]

    keep = ("n", "n_tasks", "solved", "solve_rate", "solve_rate_ci95", "tool_call_validity", "mean_turns",
            "mean_turns_solved", "tested_before_submit_rate",
            "mean_completion_tokens", "parallel_call_rate", "parallel_read_rate", "ask_user_rate", "malformed_calls",
            "exit_statuses", "tool_mix", "turn_share", "episode_wall_s", "wall_s", "kind", "label")
    return {
        "baseline": baseline,
        "task_sets": {name: results[baseline]["summary"]["task_sets"][name]["label"] for name in set_names},
        "config": results[baseline]["summary"]["config"],
        "policies": {label: {"spec": results[label]["summary"]["policy"],
                             "metrics": {scope: {k: v for k, v in summary(label, scope).items()
                                                 if k in keep or k.startswith("pass@")} for scope in scopes}}
                     for label in labels},
        "differences": {label: {scope: compare_paired(records(baseline, scope), records(label, scope), resamples, seed)
                                for scope in scopes}
                        for label in labels[1:]},
    }


def comparison_markdown(comparison: dict) -> str:
    labels = list(comparison["policies"])
    base = comparison["baseline"]
    lines = [f"# Eval comparison (baseline: {base})", "",
             (f"Same tasks and seeds for every policy ({comparison['config']['samples']} sample(s) per task, "
              f"seed {comparison['config']['seed']}). Solve rates with Wilson 95% intervals; differences from "
              f"{base} with paired-bootstrap 95% intervals over tasks."), ""]
    scopes = ["all", *comparison["task_sets"]]
    scope_label = {"all": "all tasks", **comparison["task_sets"]}
    lines += ["## Solve rate", "", "| task set | " + " | ".join(labels) + " |",
              "|---|" + "---|" * len(labels)]
    for scope in scopes:
        cells = []
        for label in labels:
            m = comparison["policies"][label]["metrics"][scope]
            lo, hi = m["solve_rate_ci95"]
            cell = f"{_pct(m['solve_rate'])} [{_pct(lo)}, {_pct(hi)}]"
            if label != base:
                d = comparison["differences"][label][scope]
                cell += f"<br>Δ {d['diff']:+.1%} [{d['ci95'][0]:+.1%}, {d['ci95'][1]:+.1%}]"
            cells.append(cell)
        lines.append(f"| {scope_label[scope]} (n={comparison['policies'][base]['metrics'][scope]['n_tasks']}) | "
                     + " | ".join(cells) + " |")
    rows = [("tool-call validity", lambda m: _pct(m["tool_call_validity"])),
            ("mean turns", lambda m: _num(m["mean_turns"])),
            ("mean turns, solved episodes", lambda m: _num(m.get("mean_turns_solved"))),
            ("tests run before submit", lambda m: _pct(m.get("tested_before_submit_rate"))),
            ("mean completion tokens", lambda m: _num(m["mean_completion_tokens"], 0)),
            ("parallel-call rate", lambda m: _pct(m["parallel_call_rate"])),
            ("parallel-read rate", lambda m: _pct(m.get("parallel_read_rate"))),
            ("ask_user rate", lambda m: _pct(m["ask_user_rate"])),
            ("malformed calls", lambda m: str(m["malformed_calls"])),
            ("wall s / episode", lambda m: _num(m["episode_wall_s"].get("mean"))),
            ("exit statuses", lambda m: ", ".join(f"{k} {v}" for k, v in m["exit_statuses"].items())),
            *[(f"turns: {c}", lambda m, c=c: _pct(m["turn_share"].get(c, 0.0))) for c in CATEGORIES]]
    extra = sorted({k for label in labels for k in comparison["policies"][label]["metrics"]["all"]
                    if k.startswith("pass@") and k != "pass@1"}, key=lambda k: int(k[5:]))
    rows[1:1] = [(k, lambda m, k=k: _pct(m.get(k))) for k in extra]
    lines += ["", "## Behaviour (all tasks)", "", "| metric | " + " | ".join(labels) + " |",
              "|---|" + "---|" * len(labels)]
    for name, fmt in rows:
        cells = [fmt(comparison["policies"][label]["metrics"]["all"]) for label in labels]
        if name == "malformed calls":
            cells = [cell if label == base else cell + _malformed_difference(comparison["differences"][label]["all"])
                     for cell, label in zip(cells, labels)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _malformed_difference(difference: dict) -> str:
    """`<br>Δ ... per episode [lo, hi]` from compare_paired; empty for a compare.json written before it existed."""
    m = difference.get("malformed_per_episode")
    return "" if m is None else f"<br>Δ {m['diff']:+.2f} per episode [{m['ci95'][0]:+.2f}, {m['ci95'][1]:+.2f}]"


def plot_comparison(comparison: dict, out_dir: Path) -> list[Path]:
    """solve_rate.png (per policy, one line per task set, Wilson error bars) and tool_mix.png (turn shares)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(comparison["policies"])
    x = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(3.6 + 1.3 * len(labels), 3.6), dpi=110)
    scopes = ["all", *comparison["task_sets"]] if len(comparison["task_sets"]) > 1 else list(comparison["task_sets"])
    for j, scope in enumerate(scopes):
        offset = 0.06 * (j - (len(scopes) - 1) / 2)  # side by side, so the error bars do not hide each other
        ms = [comparison["policies"][label]["metrics"][scope] for label in labels]
        rates = [m["solve_rate"] for m in ms]
        err = [[r - m["solve_rate_ci95"][0] for r, m in zip(rates, ms)],
               [m["solve_rate_ci95"][1] - r for r, m in zip(rates, ms)]]
        ax.errorbar([i + offset for i in x], rates, yerr=err, marker="o", capsize=3,
                    label="all tasks" if scope == "all" else comparison["task_sets"][scope])
    ax.set_xticks(x, labels, rotation=20, ha="right")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("solve rate (95% CI)")
    ax.set_title("Solve rate per policy")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    solve_png = out_dir / "solve_rate.png"
    fig.savefig(solve_png, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.45 * len(labels)), dpi=110)
    left = [0.0] * len(labels)
    for category in CATEGORIES:
        shares = [comparison["policies"][label]["metrics"]["all"]["turn_share"].get(category, 0.0) for label in labels]
        if any(shares):
            ax.barh(labels, shares, left=left, label=category)
            left = [a + b for a, b in zip(left, shares)]
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of turns")
    ax.set_title("How turns are spent")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    mix_png = out_dir / "tool_mix.png"
    fig.savefig(mix_png, bbox_inches="tight")
    plt.close(fig)
    return [solve_png, mix_png]


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label.replace("/", "__")).strip("_") or "policy"


# --------------------------------------------------------------------------- W&B


def flatten_metrics(summary: dict, prefix: str = "") -> dict:
    """Numeric leaves of a summary as `a/b/c` keys (W&B charts and run comparison read these)."""
    out = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_metrics(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
        elif isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
            out[f"{name}_lo"], out[f"{name}_hi"] = value
    return out


def wandb_log(run_group: str, name: str, directory: Path, config: dict, summary: dict,
              tables: dict[str, tuple[list[str], list[list]]] | None = None, images: list[Path] = ()) -> str:
    """One offline (unless WANDB_MODE says otherwise) W&B run, job_type eval; returns the run directory."""
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    run = wandb.init(project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), group=run_group, job_type="eval",
                     name=name, dir=str(directory), config=config, reinit="finish_previous")
    try:
        metrics = flatten_metrics({k: v for k, v in summary.items() if k != "config"})
        run.summary.update(metrics)
        log = {key: wandb.Table(columns=columns, data=rows) for key, (columns, rows) in (tables or {}).items()}
        log.update({p.stem: wandb.Image(str(p)) for p in images})
        if log:
            run.log(log)
        return str(Path(run.dir).parent)
    finally:
        run.finish()


def task_table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["task_set", "id", "sample", "solved", "exit_status", "n_turns", "tool_calls", "malformed_calls", "wall_s"]
    return columns, [[r.get(c) for c in columns] for r in results["tasks"]]


def compare_table(comparison: dict) -> tuple[list[str], list[list]]:
    columns = ["policy", "scope", "solve_rate", "ci_lo", "ci_hi", "diff_vs_baseline", "diff_lo", "diff_hi",
               "tool_call_validity", "mean_turns", "parallel_call_rate"]
    rows = []
    for label, p in comparison["policies"].items():
        for scope, m in p["metrics"].items():
            d = comparison["differences"].get(label, {}).get(scope)
            rows.append([label, scope, m["solve_rate"], *m["solve_rate_ci95"],
                         d["diff"] if d else 0.0, *(d["ci95"] if d else [0.0, 0.0]),
                         m["tool_call_validity"], m["mean_turns"], m["parallel_call_rate"]])
    return columns, rows


def report_comparison(results: dict[str, dict], out_dir: Path, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                      quiet: bool = False, wandb_group: str | None = None) -> dict:
    """compare.json, compare.md and the plots in `out_dir` for per-policy results.json dicts (the first is the
    baseline); printed unless `quiet`, and logged to W&B (one run per policy plus the comparison) when a
    `wandb_group` is given."""
    comparison = build_comparison(results, resamples=resamples, seed=seed)
    write_json_atomic(out_dir / "compare.json", comparison)
    markdown = comparison_markdown(comparison)
    (out_dir / "compare.md").write_text(markdown, encoding="utf-8")
    plots = plot_comparison(comparison, out_dir)
    if not quiet:
        print(markdown)
        print(f"wrote {out_dir}/compare.json, compare.md, {', '.join(p.name for p in plots)}")
    if wandb_group is not None:
        labels = list(results)
        for label in labels:  # one run per policy: W&B's run comparison lines them up
            wandb_log(wandb_group, f"{wandb_group}-eval-{label}", out_dir, {**comparison["config"], "policy": label},
                      results[label]["summary"])
        wandb_log(wandb_group, f"{wandb_group}-eval-compare", out_dir, {**comparison["config"], "policies": labels},
                  {"differences": comparison["differences"]}, {"compare": compare_table(comparison)}, plots)
    return comparison
