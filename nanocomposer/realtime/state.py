"""The loop's state file: which cycle, which phase, which versions. A killed loop resumes from it.

    <loop>/state.json    {"cycle": k, "phase": "serve", "current": "v3", "parent": "v2", "promoted_cycle": 3,
                          "cycle_start": t, "cutoff": t | null, "history": [one line per finished cycle]}

Every write replaces the file atomically (temp file + rename), after the phase's own outputs are on disk:
a phase is redone from its start if the loop died inside it, and never redone once recorded as past.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nanocomposer.reporting import write_json_atomic

PHASES = ("serve", "collect", "update", "gate", "promote", "done")


class StateError(ValueError):
    """A state file that cannot be resumed; the message names the file."""


@dataclass
class LoopState:
    cycle: int = 1
    phase: str = "serve"
    current: str | None = None  # the registry version serving this cycle
    parent: str | None = None  # the version `current` was trained from (None for the initial one)
    promoted_cycle: int | None = None  # the cycle whose gate promoted `current`
    cycle_start: float | None = None  # sessions created from here on belong to this cycle
    cutoff: float | None = None  # end of this cycle's serve phase: later sessions and feedback wait
    history: list[dict] = field(default_factory=list)

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self))

    @classmethod
    def load(cls, path: Path) -> LoopState:
        try:
            data = json.loads(path.read_text())
            state = cls(**data)
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise StateError(f"loop state {str(path)!r} cannot be read ({e}); move it away to start a new loop") from None
        if state.phase not in PHASES:
            raise StateError(f"loop state {str(path)!r}: unknown phase {state.phase!r} (phases: {', '.join(PHASES)})")
        return state

    def advance(self, path: Path, phase: str, **changes) -> None:
        """Record that `phase` is next (with `changes`), atomically."""
        assert phase in PHASES, phase
        for key, value in changes.items():
            setattr(self, key, value)
        self.phase = phase
        self.save(path)
