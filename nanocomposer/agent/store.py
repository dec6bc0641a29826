"""Agent sessions in SQLite (stdlib sqlite3, WAL): what real-time RL learns from.

Per session: the model version that served it, the task and instruction, the sample key its sampling seeds
derive from (the client's `sample_key`, else the session id), every turn with its exact prompt and
completion token ids and sampling logprobs, every tool call (arguments, malformed flag, error, the result the
model saw, wall time), the exit status, per-turn latency, the final diff, the user's messages (answers to
ask_user, follow-ups) and every feedback event with its timestamp.

The schema is plain SQL (TEXT for JSON, REAL for seconds since the epoch, INTEGER for flags) so Postgres
could replace SQLite. Every write is one transaction: a killed process leaves whole rows or none. A session
that was `running` or `waiting` when its server died is marked `interrupted` by the next server's `recover`;
`queued` ones are handed back to be run again.

Numbers are finite: a non-finite float (inf, NaN) is stored as NULL, in REAL columns and inside JSON, so every
row reads back as valid JSON (`json.dumps(allow_nan=False)`). A new database file is created 0600 (it holds
instructions, diffs and file contents); SQLite gives its -wal and -shm files the same mode. `close()`
checkpoints the WAL into the main file (`PRAGMA wal_checkpoint(TRUNCATE)`), so after a clean stop the database
is one self-contained file. Opened with `check=True` (the server does), `PRAGMA quick_check` runs first and a
damaged or non-SQLite file is a `StoreError` naming it, not a server that starts and answers 500.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from env.episode import Trajectory

STATUSES = ("queued", "running", "waiting", "finished", "timed_out", "failed", "interrupted")
TERMINAL = frozenset({"finished", "timed_out", "failed", "interrupted"})
# Every write of a status matches only a session that has not ended: an ended session keeps its end (a server
# stopping while a worker records a finished episode must not make it `interrupted`, nor the reverse).
_NOT_ENDED = "status IN ({})".format(", ".join(f"'{s}'" for s in STATUSES if s not in TERMINAL))
FEEDBACK_KINDS = ("applied", "kept", "reverted", "followup_dissatisfied", "rating", "abandoned", "question_needless")

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    parent_id TEXT,
    status TEXT NOT NULL,
    status_reason TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    model_version TEXT,
    policy TEXT,
    source TEXT NOT NULL,
    repo TEXT,
    task_dir TEXT,
    task_id TEXT,
    instruction TEXT NOT NULL,
    test_command TEXT,
    timeout_s REAL,
    client TEXT,
    sample_key TEXT,
    exit_status TEXT,
    solved INTEGER,
    submission TEXT,
    error TEXT,
    grade TEXT,
    diff TEXT,
    changed_files INTEGER,
    messages TEXT,
    tools TEXT,
    wall_s REAL,
    gen_s REAL,
    env_s REAL,
    grade_s REAL,
    command_s REAL
);
CREATE INDEX IF NOT EXISTS sessions_status ON sessions (status);
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    turn INTEGER NOT NULL,
    text TEXT NOT NULL,
    prompt_ids TEXT,
    completion_ids TEXT,
    logprobs TEXT,
    completion_tokens INTEGER,
    truncated INTEGER NOT NULL,
    gen_s REAL NOT NULL,
    env_s REAL NOT NULL,
    finished_at REAL NOT NULL,
    PRIMARY KEY (session_id, turn)
);
CREATE TABLE IF NOT EXISTS tool_calls (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    turn INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    name TEXT,
    arguments TEXT,
    malformed INTEGER NOT NULL,
    error TEXT,
    raw TEXT,
    result TEXT,
    wall_s REAL,
    PRIMARY KEY (session_id, turn, idx)
);
CREATE TABLE IF NOT EXISTS user_messages (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    kind TEXT NOT NULL,
    value REAL,
    text TEXT,
    created_at REAL NOT NULL
);
"""
# Columns added after the first release of the schema: (name, type), added to older databases when opened.
ADDED_COLUMNS = (("sample_key", "TEXT"), ("owner_uid", "INTEGER"), ("owner_gids", "TEXT"))
PREVIEW_CHARS = 200  # list views carry this much of each instruction (the full text: `session()`)
_TRAJECTORY_COLUMNS = ("messages", "tools", "grade", "submission", "error", "exit_status", "solved", "wall_s",
                       "gen_s", "env_s", "grade_s", "command_s", "task_id", "policy")
_JSON_COLUMNS = ("grade", "messages", "tools", "arguments", "prompt_ids", "completion_ids", "logprobs",
                 "owner_gids")


class StoreError(ValueError):
    """The session database cannot be used (not SQLite, damaged, unreadable); the message names the file."""


def finite(value):
    """`value` with every non-finite float (inf, -inf, NaN), at any depth, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _dumps(value) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a non-finite number somewhere: stored as null, so the row stays valid JSON
        return json.dumps(finite(value), ensure_ascii=False, allow_nan=False)


def _row(row: sqlite3.Row) -> dict:
    out = dict(row)
    for key in _JSON_COLUMNS:
        if out.get(key) is not None:
            out[key] = json.loads(out[key])
    return finite(out)  # rows written before values were checked (an `inf` feedback value) read back as null


def valid_text(value: str) -> str:
    """`value` as valid Unicode: each lone surrogate (which SQLite cannot store as UTF-8) becomes U+FFFD."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)


class _Writer:
    """The connection as a transaction sees it: every str parameter made valid Unicode, every float finite
    (NULL otherwise), so no caller's value can fail a write or store what would not read back as JSON."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def execute(self, sql: str, params=()):
        return self._conn.execute(sql, tuple(valid_text(v) if isinstance(v, str) else finite(v) for v in params))


def _seconds(value) -> float:
    value = finite(value)
    return 0.0 if value is None else value


def _create_private(path: Path) -> None:
    """Create an empty database file readable by its owner only (no-op when it exists; never follows a link)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    os.close(fd)


class SessionStore:
    """One connection shared by the server's threads, writes serialised by a lock (SQLite has one writer)."""

    def __init__(self, path: str | Path, *, check: bool = False):
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _create_private(self.path)
        except OSError as e:
            raise StoreError(f"session database {str(self.path)!r}: cannot create it: {e.strerror or e}") from None
        try:
            self._open(check)
        except sqlite3.Error as e:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            raise StoreError(f"session database {str(self.path)!r} is unusable ({' '.join(str(e).split())}); "
                             "restore it from a backup or move it away to start a new one") from None

    def _open(self, check: bool) -> None:
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._conn.row_factory = sqlite3.Row
        if check:
            rows = [r[0] for r in self._conn.execute("PRAGMA quick_check").fetchall()]
            if rows != ["ok"]:
                problems = "; ".join(" ".join(str(r).split()) for r in rows[:3])
                raise sqlite3.DatabaseError(f"quick_check: {problems[:300]}")
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a killed process loses no commit
        with self.transaction() as db:
            for statement in filter(str.strip, SCHEMA.split(";")):  # executescript would commit on its own
                db.execute(statement)
            columns = {r["name"] for r in db.execute("PRAGMA table_info(sessions)")}
            for column, kind in ADDED_COLUMNS:  # a database made before the column existed
                if column not in columns:
                    db.execute(f"ALTER TABLE sessions ADD COLUMN {column} {kind}")

    def close(self) -> None:
        """Checkpoint the WAL into the database file and close: after this the file alone is the database
        (copy it, or `sqlite3 FILE .backup OUT` while a server runs). A second close does nothing."""
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # another process still reading: its last close checkpoints
                pass
            self._conn.close()
            self._conn = None

    @contextmanager
    def transaction(self):
        with self._lock:
            if self._conn is None:
                raise StoreError(f"session database {str(self.path)!r} is closed")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield _Writer(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, args: tuple = ()) -> list[dict]:
        with self._lock:
            if self._conn is None:
                raise StoreError(f"session database {str(self.path)!r} is closed")
            return [_row(r) for r in self._conn.execute(sql, args).fetchall()]

    # ----------------------------------------------------------------- writes
    def create(self, *, source: str, instruction: str, repo: str | None = None, task_dir: str | None = None,
               task_id: str | None = None, test_command: str | None = None, timeout_s: float | None = None,
               client: str | None = None, parent_id: str | None = None, sample_key: str | None = None,
               owner_uid: int | None = None, owner_gids: list[int] | None = None,
               followup_text: str | None = None) -> str:
        """A queued session; its `sample_key` (what its sampling seeds derive from) is the given one, else its id.

        With `followup_text` it is the follow-up of `parent_id`: in the same transaction (BEGIN IMMEDIATE, so
        concurrent follow-ups are serialised, across processes too) the parent's follow-ups are counted, the
        text is recorded as the parent's next `followup` message and the key is `<parent key>/followup<n>`:
        two follow-ups can never get the same key."""
        session_id = uuid.uuid4().hex
        timeout_s = timeout_s if timeout_s is None or math.isfinite(timeout_s) else None
        with self.transaction() as db:
            if followup_text is not None:
                parent = db.execute("SELECT id, sample_key FROM sessions WHERE id = ?", (parent_id,)).fetchone()
                if parent is None:
                    raise KeyError(parent_id)
                earlier = db.execute("SELECT COUNT(*) FROM user_messages WHERE session_id = ? AND kind = 'followup'",
                                     (parent_id,)).fetchone()[0]
                sample_key = f"{parent['sample_key'] or parent_id}/followup{earlier + 1}"
                db.execute("INSERT INTO user_messages (session_id, kind, text, created_at) VALUES (?, 'followup', ?, ?)",
                           (parent_id, followup_text, time.time()))
            db.execute("INSERT INTO sessions (id, parent_id, status, created_at, source, repo, task_dir, task_id, "
                       "instruction, test_command, timeout_s, client, sample_key, owner_uid, owner_gids) "
                       "VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (session_id, parent_id, time.time(), source, repo, task_dir, task_id, instruction,
                        test_command, timeout_s, client, sample_key or session_id, owner_uid, _dumps(owner_gids)))
        return session_id

    def start(self, session_id: str, version: str | None, policy: str | None) -> None:
        with self.transaction() as db:
            db.execute("UPDATE sessions SET status = 'running', started_at = ?, model_version = ?, policy = ? "
                       f"WHERE id = ? AND {_NOT_ENDED}", (time.time(), version, policy, session_id))

    def set_status(self, session_id: str, status: str, reason: str | None = None) -> None:
        assert status in STATUSES, status
        with self.transaction() as db:
            db.execute(f"UPDATE sessions SET status = ?, status_reason = ? WHERE id = ? AND {_NOT_ENDED}",
                       (status, reason, session_id))

    def add_turn(self, session_id: str, record: dict, results: list[str]) -> None:
        """One finished turn and its tool calls, in one transaction."""
        with self.transaction() as db:
            db.execute("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (session_id, record["turn"], record["text"], _dumps(record.get("prompt_ids")),
                        _dumps(record.get("completion_ids")), _dumps(record.get("logprobs")),
                        record.get("completion_tokens"), int(bool(record.get("truncated"))),
                        _seconds(record.get("gen_s", 0.0)), _seconds(record.get("env_s", 0.0)), time.time()))
            for i, call in enumerate(record["calls"]):
                db.execute("INSERT INTO tool_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (session_id, record["turn"], i, call.get("name"), _dumps(call.get("arguments")),
                            int(bool(call.get("malformed"))), call.get("error"), call.get("raw"),
                            results[i] if i < len(results) else None, finite(call.get("wall_s"))))

    def finish(self, session_id: str, status: str, traj: Trajectory | None, diff: str | None,
               changed_files: int | None, reason: str | None = None) -> bool:
        """The session's end: status and, when an episode ran, its trajectory fields and diff, atomically.
        False when the session had already ended (it keeps that end)."""
        fields = {"status": status, "status_reason": reason, "finished_at": time.time(), "diff": diff,
                  "changed_files": changed_files}
        if traj is not None:
            fields.update(exit_status=traj.exit_status, solved=None if traj.grade.get("solved") is None
                          else int(traj.solved), submission=traj.submission, error=traj.error,
                          grade=_dumps(traj.grade), messages=_dumps(traj.messages), tools=_dumps(traj.tools),
                          wall_s=traj.wall_s, gen_s=traj.gen_s, env_s=traj.env_s, grade_s=traj.grade_s,
                          command_s=traj.command_s)
        fields = finite(fields)
        with self.transaction() as db:
            cur = db.execute(f"UPDATE sessions SET {', '.join(f'{k} = ?' for k in fields)} "
                             f"WHERE id = ? AND {_NOT_ENDED}", (*fields.values(), session_id))
            return cur.rowcount == 1

    def add_message(self, session_id: str, kind: str, text: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO user_messages (session_id, kind, text, created_at) VALUES (?, ?, ?, ?)",
                       (session_id, kind, text, time.time()))

    def add_feedback(self, session_id: str, kind: str, value: float | None = None, text: str | None = None) -> int:
        assert kind in FEEDBACK_KINDS, kind
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ValueError(f"feedback value must be a finite number, got {value!r}")
        with self.transaction() as db:
            cur = db.execute("INSERT INTO feedback (session_id, kind, value, text, created_at) VALUES (?, ?, ?, ?, ?)",
                             (session_id, kind, value, text, time.time()))
            return cur.lastrowid

    def recover(self) -> list[str]:
        """At server start-up: sessions a dead server was running become `interrupted`; returns queued ids."""
        with self.transaction() as db:
            db.execute("UPDATE sessions SET status = 'interrupted', finished_at = ?, status_reason = "
                       "'the server stopped while this session was running' WHERE status IN ('running', 'waiting')",
                       (time.time(),))
            return [r["id"] for r in db.execute("SELECT id FROM sessions WHERE status = 'queued' ORDER BY created_at")]

    # ------------------------------------------------------------------ reads
    def session(self, session_id: str) -> dict | None:
        rows = self._query("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return rows[0] if rows else None

    def turns(self, session_id: str, after: int = 0) -> list[dict]:
        turns = self._query("SELECT * FROM turns WHERE session_id = ? AND turn >= ? ORDER BY turn", (session_id, after))
        calls = self._query("SELECT * FROM tool_calls WHERE session_id = ? AND turn >= ? ORDER BY turn, idx",
                            (session_id, after))
        by_turn: dict[int, list] = {}
        for c in calls:
            by_turn.setdefault(c["turn"], []).append(
                {"name": c["name"], "arguments": c["arguments"], "malformed": bool(c["malformed"]),
                 "error": c["error"], "raw": c["raw"], "result": c["result"], "wall_s": c["wall_s"]})
        for t in turns:
            t.pop("session_id")
            t["truncated"] = bool(t["truncated"])
            t["calls"] = by_turn.get(t["turn"], [])
        return turns

    def count_turns(self, session_id: str) -> int:
        return self._query("SELECT COUNT(*) AS n FROM turns WHERE session_id = ?", (session_id,))[0]["n"]

    def feedback(self, session_id: str | None = None) -> list[dict]:
        if session_id is None:
            return self._query("SELECT * FROM feedback ORDER BY id")
        return self._query("SELECT * FROM feedback WHERE session_id = ? ORDER BY id", (session_id,))

    def user_messages(self, session_id: str) -> list[dict]:
        return self._query("SELECT * FROM user_messages WHERE session_id = ? ORDER BY id", (session_id,))

    def sessions(self, status: str | None = None, limit: int | None = None, *, preview: bool = False,
                 owner_uid: int | None = None) -> list[dict]:
        """Sessions oldest first; `preview`: `instruction` is its first PREVIEW_CHARS characters (with
        `instruction_chars`, the full length), as list views carry; `owner_uid`: only that uid's sessions."""
        instruction = f"substr(instruction, 1, {PREVIEW_CHARS}) AS instruction, length(instruction) AS " \
                      "instruction_chars" if preview else "instruction"
        sql = "SELECT id, parent_id, status, status_reason, created_at, started_at, finished_at, model_version, " \
              f"policy, source, task_id, {instruction}, client, sample_key, exit_status, solved, changed_files, " \
              "wall_s FROM sessions"
        where, args = [], ()
        if status:
            where, args = [*where, "status = ?"], (*args, status)
        if owner_uid is not None:
            where, args = [*where, "owner_uid = ?"], (*args, owner_uid)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at"
        if limit:
            sql, args = sql + " LIMIT ?", (*args, int(limit))
        return self._query(sql, args)

    def counts(self) -> dict[str, int]:
        return {r["status"]: r["n"] for r in self._query("SELECT status, COUNT(*) AS n FROM sessions GROUP BY status")}

    def export_record(self, session_id: str) -> dict:
        """One session as the episode record eval writes (Trajectory.to_record, token ids and logprobs kept),
        with the session's own fields (status, model version, diff, feedback, user messages) after the identity."""
        s = self.session(session_id)
        traj = Trajectory(task_id=s["task_id"] or "", policy=s["policy"] or "", messages=s["messages"] or [],
                          tools=s["tools"] or [], turns=self.turns(session_id), exit_status=s["exit_status"] or "",
                          solved=bool(s["solved"]), submission=s["submission"] or "", grade=s["grade"] or {},
                          error=s["error"] or "", wall_s=s["wall_s"] or 0.0, gen_s=s["gen_s"] or 0.0,
                          env_s=s["env_s"] or 0.0, grade_s=s["grade_s"] or 0.0, command_s=s["command_s"] or 0.0,
                          episode_key=s["sample_key"] or session_id)
        own = {k: v for k, v in s.items() if k not in _TRAJECTORY_COLUMNS}
        return finite(traj.to_record(token_ids=True, session_id=own.pop("id"), **own, feedback=self.feedback(session_id),
                              user_messages=self.user_messages(session_id)))
