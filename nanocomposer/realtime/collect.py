"""A cycle's training data from the agent server's database: on-policy sessions and the feedback on time.

Which sessions: those that ended (finished or timed out: an episode ran) by the cycle's cut-off and that no
earlier cycle used. Served by `current` -> on-policy samples; served by another version (a session that was
still running when the previous cycle was cut) -> stale: dropped, or kept for importance weighting, by config;
both counted. Sessions that failed or were interrupted have no episode to learn from (counted); sessions
still open at the cut-off wait for a later cycle, where they are stale.

Which feedback: only events stored by the cut-off. Later events stay in the database: the next cycle counts
them as `late_feedback` (by kind) and no reward changes after its cycle trained on it.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

from env.tasks import TaskError, load_task

USABLE = ("finished", "timed_out")
TERMINAL = ("finished", "timed_out", "failed", "interrupted")


def _rows(db: Path, sql: str, args: tuple = ()) -> list[dict]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args).fetchall()]
    finally:
        conn.close()


def live_outcome(feedback: list[dict]) -> dict:
    """What the user did with a session, from its feedback events (env/rewards.py's `live` facts)."""
    kinds = Counter(f["kind"] for f in feedback)
    ratings = [f["value"] for f in feedback if f["kind"] == "rating" and f["value"] is not None]
    return {"applied": kinds["applied"] > 0, "kept": kinds["kept"] > 0, "reverted": kinds["reverted"] > 0,
            "followup": kinds["followup_dissatisfied"] > 0, "abandoned": kinds["abandoned"] > 0,
            "dissatisfied": kinds["followup_dissatisfied"] > 0 or kinds["abandoned"] > 0,
            "needless_question": kinds["question_needless"] > 0,
            "rating": sum(ratings) / len(ratings) if ratings else None}


_FAMILIES: dict[str, str] = {}


def task_family(task_dir: str | None) -> str:
    """The task's family (the per-family baseline groups by it); "unknown" when it cannot be read."""
    if not task_dir:
        return "unknown"
    if task_dir not in _FAMILIES:
        try:
            _FAMILIES[task_dir] = str(load_task(task_dir).meta.get("family") or "unknown")
        except (TaskError, OSError):
            _FAMILIES[task_dir] = "unknown"
    return _FAMILIES[task_dir]


def collect(db: Path, *, current: str, cutoff: float, previous_cutoff: float | None, consumed: set[str],
            stale_sessions: str) -> dict:
    """The cycle's sessions (ids, versions, families, live outcomes by the cut-off) and every count;
    `skipped_ids` (no episode, stale and dropped) are settled too: no later cycle counts them again."""
    rows = _rows(db, "SELECT id, parent_id, status, model_version, task_dir, created_at, finished_at, wall_s "
                     "FROM sessions ORDER BY created_at, id")
    counts: Counter = Counter()
    chosen, skipped = [], []
    for s in rows:
        if s["id"] in consumed:
            continue
        if s["created_at"] > cutoff:
            counts["after_cutoff"] += 1
            continue
        if s["status"] not in TERMINAL or s["finished_at"] is None or s["finished_at"] > cutoff:
            counts["open_at_cutoff"] += 1
            continue
        if s["status"] not in USABLE:
            counts[f"no_episode_{s['status']}"] += 1
            skipped.append(s["id"])
            continue
        stale = s["model_version"] != current
        if stale and stale_sessions == "drop":
            counts["stale_dropped"] += 1
            skipped.append(s["id"])
            continue
        counts["stale_kept" if stale else "on_policy"] += 1
        chosen.append(s)
    feedback = _rows(db, "SELECT session_id, kind, value, created_at FROM feedback ORDER BY id")
    on_time: dict[str, list[dict]] = {}
    late: Counter = Counter()
    for f in feedback:
        if f["created_at"] <= cutoff:
            on_time.setdefault(f["session_id"], []).append(f)
        if f["session_id"] in consumed and f["created_at"] > (previous_cutoff or 0.0) and f["created_at"] <= cutoff:
            late[f["kind"]] += 1  # arrived after the cut-off of the cycle that used its session
    sessions = [{"id": s["id"], "version": s["model_version"], "stale": s["model_version"] != current,
                 "status": s["status"], "followup_of": s["parent_id"], "family": task_family(s["task_dir"]),
                 "wall_s": s["wall_s"], "live": live_outcome(on_time.get(s["id"], []))} for s in chosen]
    return {"cutoff": cutoff, "current": current, "stale_sessions": stale_sessions, "counts": dict(counts),
            "late_feedback": dict(late), "sessions": sessions,
            "skipped_ids": skipped}
