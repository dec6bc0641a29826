"""Which tasks the simulated users ask for: the loop's training traffic and the live A/B never share one.

The traffic set, in its fixed order (env.users.interleaved_by_family: the families taken in turn, so both
sides of the split get every kind of task in proportion), is split at K (`traffic_task_limit`; None: half the
set, rounded down): every cycle's users draw from tasks [0, K), the arms of `bench/realtime.py ab` from
[K, end), so an A/B measures versions on tasks no cycle trained on, of the same kinds. Within its range a
run's order is env.users.draw_tasks' (shuffled by the run's seed); the users themselves are env.users' CLI
(nanocomposer/realtime/server.py::run_users).
"""

from __future__ import annotations


def split_point(set_size: int, task_limit: int | None, name: str = "traffic_task_limit") -> int:
    """K: training traffic takes the first K tasks of the ordered set, the A/B the rest. ValueError (naming the
    argument as `name`) unless both ranges are non-empty."""
    k = set_size // 2 if task_limit is None else task_limit
    if not 1 <= k < set_size:
        raise ValueError(f"{name} {task_limit}: the traffic set has {set_size} tasks; training traffic "
                         f"takes the first K and the A/B the rest, so K must be in [1, {set_size - 1}]")
    return k


def training_draw(set_size: int, task_limit: int | None) -> dict:
    """The range training traffic draws from, as env.users' --offset / --task-limit."""
    return {"offset": 0, "task_limit": split_point(set_size, task_limit), "set_size": set_size}


def ab_draw(set_size: int, task_limit: int | None, name: str = "traffic_task_limit") -> dict:
    """The range both A/B arms draw from: the tasks training traffic never asks for."""
    k = split_point(set_size, task_limit, name)
    return {"offset": k, "task_limit": set_size - k, "set_size": set_size}
