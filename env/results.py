"""Results files: reading and writing the JSON-lines files of episode records, and the run facts beside them.

A results file holds one record per episode (`Trajectory.to_record` plus task_set/sample/seed/... fields), one
JSON object a line. `append_record` writes a line as its episode finishes, flushed and fsynced, so a SIGKILL
loses at most the partial last line, which `read_results` ignores (and with `repair=True` cuts off);
`rewrite_results` replaces the file atomically once a run completes. An episode is identified in a file by
`record_key` (task set, task id, sample). The settings a file's episodes were played under are kept in
`<file>.run.json` (`run_facts_path`); `check_run_facts` refuses to add episodes played under others.
env.runner writes these files; eval.py, RL and the data builders read them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

KEY_FIELDS = ("task_set", "id", "sample")  # what identifies an episode in a results file


class ResultsFileError(ValueError):
    """A results file that cannot be resumed; the message names the file and the line."""


def record_key(record: dict) -> tuple:
    return tuple(record.get(k) for k in KEY_FIELDS)


def read_results(path: str | Path, repair: bool = False) -> list[dict]:
    """The complete records of a JSONL results file. A partial last line (a run killed mid-write) is
    ignored, and with `repair` cut off so later appends start on a fresh line; a bad line before the end
    is an error naming the file and the line."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    records, offset = [], 0
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        last = number == len(lines)
        if line.strip():
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "id" not in record:
                    raise ValueError("not an episode record")
            except ValueError as e:
                if not (last or (number == len(lines) - 1 and not lines[-1])):
                    raise ResultsFileError(f"results file {str(path)!r}, line {number}: {e}") from None
                if repair:  # the partial last line of a killed run
                    with open(path, "r+b") as f:
                        f.truncate(offset)
                break
            if not last:
                records.append(record)
            elif repair:  # complete JSON but no newline: the write was cut just before it
                with open(path, "ab") as f:
                    f.write(b"\n")
                records.append(record)
            else:
                records.append(record)
        offset += len(line) + 1
    return records


def append_record(f: IO[str], record: dict) -> None:
    """Write `record` as one line of the open results file `f`, on disk before this returns."""
    f.write(json.dumps(record, ensure_ascii=False) + "\n")
    f.flush()
    os.fsync(f.fileno())


def rewrite_results(path: Path, records: list[dict]) -> None:
    """Replace `path` with `records`, one per line, atomically (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_facts_path(path: Path) -> Path:
    """Where the run facts of the results file `path` are kept."""
    return path.with_name(path.name + ".run.json")


def write_run_facts(path: Path, facts: dict) -> None:
    run_facts_path(path).write_text(json.dumps(facts, indent=1, sort_keys=True))


def check_run_facts(path: Path, facts: dict) -> None:
    """Refuse to resume `path` under settings other than those its episodes were played with."""
    try:
        saved = json.loads(run_facts_path(path).read_text())
    except FileNotFoundError:
        return  # nothing recorded (a file from elsewhere): the runner's policy check still applies
    except (OSError, ValueError) as e:
        raise ResultsFileError(f"{run_facts_path(path)}: {e}") from None

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    before, now = flat(saved), flat(facts)
    for key in sorted(before.keys() | now.keys()):
        if before.get(key) != now.get(key):
            raise ResultsFileError(f"results file {str(path)!r} was played with {key}={before.get(key)!r}, this run "
                                   f"has {key}={now.get(key)!r}: resume with the same settings, or start a new file")
