"""The real-time RL loop: serve -> collect -> update -> gate -> promote, one cycle after another, resumable.

    <runs_dir>/<run>/realtime/
      state.json                  cycle, phase, current/parent version (nanocomposer/realtime/state.py)
      registry/versions/v0 -> the starting checkpoint; v1, v2, ... one candidate per cycle (+ gate.json/.md)
      registry/current            what the server serves
      sessions.db                 the server's sessions (token ids, logprobs, feedback)
      cycles/<k>/                 traffic.json (the tasks its users draw from), users-<first conversation>.json,
                                  collect.json (sessions, counts, live metrics, rewards), update.json,
                                  gate.json, gate.md, cycle.json; server.log, users.log
      gate_evals/<version>.<tasks>.json   each version's benchmark records (once per version, task list and
                                  weights: the sha256 of its weight files is recorded and checked)
      report.md                   one line per finished cycle

A killed loop restarts in the phase it died in (state.json is written after each phase's outputs): the serve
phase plays only the conversations the cycle still lacks (from the next conversation index on: the users,
tasks and sample keys an uncut cycle would have had), collection is a pure function of the database and
the recorded cut-off, sessions used by an earlier cycle are never used again, and a candidate enters the
registry by one rename once complete (a leftover temporary directory is removed).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sqlite3
import time
from pathlib import Path

from env.budget import Budget
from env.rewards import get_reward_funcs
from nanocomposer.agent.registry import Registry
from nanocomposer.agent.store import SessionStore
from nanocomposer.base_model import sha256_of
from nanocomposer.realtime.collect import collect
from nanocomposer.realtime.gate import decide, drift_warnings, evaluate, gate_markdown
from nanocomposer.realtime.live import live_metrics, rollback_decision
from nanocomposer.realtime.rewards import reward_by_behaviour, reward_summary, session_facts
from nanocomposer.realtime.server import AgentServer, run_users
from nanocomposer.realtime.state import LoopState
from nanocomposer.realtime.traffic import training_draw
from nanocomposer.reporting import write_json_atomic


class CandidateError(ValueError):
    """A candidate version that cannot be served; the message names the directory and the problem."""


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def weights_fingerprint(spec: str) -> str:
    """What a policy spec plays: for a checkpoint directory the sha256 of its weight files (names and bytes),
    else the spec itself (a scripted or remote policy)."""
    path = Path(spec)
    if not path.is_dir():
        return spec
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin"))
    listing = "\n".join(f"{file.name} {sha256_of(file)}" for file in files)
    return "sha256:" + hashlib.sha256(listing.encode()).hexdigest()


def facts_of_sessions(db: Path, sessions: list[dict], args) -> list[dict]:
    """session_facts of collected sessions (collect.json's `sessions`: id and the user's `live` outcome), with the
    loop's budgets and malformed handling (RealtimeArguments)."""
    budget = args.budget()
    token_budget = budget.max_tokens or budget.max_turns * budget.max_new_tokens  # as RL's `length` (rollout.py)
    store = SessionStore(db)
    try:
        return [session_facts(store.export_record(x["id"]), x["live"], max_turns=budget.max_turns,
                              token_budget=token_budget, max_wall_s=budget.max_wall_s,
                              malformed_handling=args.malformed_handling) for x in sessions]
    finally:
        store.close()


class Loop:
    def __init__(self, args, training_args, model_args, log=print):
        self.args, self.training_args, self.model_args, self.log = args, training_args, model_args, log
        self.state_path = self.state_file(args)
        self.dir = self.state_path.parent
        self.registry = Registry(self.dir / "registry")
        self.db = self.dir / "sessions.db"
        self.funcs = get_reward_funcs(args.reward_funcs, malformed_handling=args.malformed_handling,
                                      ask_user_handling=args.ask_user_handling)
        self.server: AgentServer | None = None
        self.wandb = None
        self.state = self._load_or_start()

    # ------------------------------------------------------------------ setup
    @staticmethod
    def state_file(args) -> Path:
        return Path(args.runs_dir) / args.run / "realtime" / "state.json"

    def _load_or_start(self) -> LoopState:
        if self.state_path.is_file():
            state = LoopState.load(self.state_path)
            self.log(f"[realtime] resuming {self.dir}: cycle {state.cycle}, phase {state.phase}, "
                     f"current {state.current}")
            return state
        self.dir.mkdir(parents=True, exist_ok=True)
        if "v0" not in self.registry.versions():
            self.registry.add("v0", self.model_args.model_name_or_path)
        self.registry.promote("v0")
        state = LoopState(current="v0")
        state.save(self.state_path)
        return state

    def cycle_dir(self, cycle: int | None = None) -> Path:
        path = self.dir / "cycles" / str(cycle or self.state.cycle)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start_server(self) -> AgentServer:
        if self.server is None:
            a = self.args
            self.server = AgentServer(self.registry.root, self.db, workers=a.server_workers, budget=self.serve_budget(),
                                      backend=a.backend, log=self.dir / "server.log")
        return self.server

    def serve_budget(self) -> Budget:
        """The served sessions' budget: the preset's episode budget, sampled as the trainer scores (its
        temperature, top_p and seed)."""
        t = self.training_args
        return self.args.budget(temperature=t.temperature, top_p=t.top_p, seed=t.seed)

    def gate_budget(self) -> Budget:
        """The gate episodes' budget: the same episode budget as the sessions, at gate_temperature."""
        return self.args.budget(temperature=self.args.gate_temperature, seed=self.training_args.seed)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def wandb_log(self, metrics: dict) -> None:
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=self.state.cycle)

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[dict]:
        try:
            while self.state.cycle <= self.args.cycles:
                self.run_cycle()
        finally:
            self.close()
        return self.state.history

    def run_cycle(self) -> dict:
        timing_file = self.cycle_dir() / "timing.json"
        timing = _read(timing_file) if timing_file.is_file() else {}
        while self.state.phase != "done":
            phase, started = self.state.phase, time.perf_counter()
            getattr(self, f"phase_{phase}")()
            timing[f"timing/{phase}_s"] = timing.get(f"timing/{phase}_s", 0.0) + time.perf_counter() - started
            write_json_atomic(timing_file, timing)
        summary = {**_read(self.cycle_dir() / "cycle.json"), **timing}
        write_json_atomic(self.cycle_dir() / "cycle.json", summary)
        self.wandb_log(summary)
        self.state.history.append(summary)
        self.state.advance(self.state_path, "serve", cycle=self.state.cycle + 1, cycle_start=None, cutoff=None)
        self.write_report()
        return summary

    def finish_cycle(self, **summary) -> None:
        collected = self.cycle_dir() / "collect.json"
        served_by = _read(collected)["current"] if collected.is_file() else self.state.current
        summary = {"cycle": self.state.cycle, "served_by": served_by, "traffic": self.traffic_draw(), **summary}
        write_json_atomic(self.cycle_dir() / "cycle.json", summary)
        self.log(f"[realtime] cycle {self.state.cycle} done: " + json.dumps(
            {k: v for k, v in summary.items() if not isinstance(v, dict)}))
        self.state.advance(self.state_path, "done")

    # ------------------------------------------------------------------ phases
    def users_seed(self) -> int:
        """The cycle's population seed: each cycle's users (and their sample keys) differ."""
        return self.training_args.seed * 1000 + self.state.cycle

    def next_conversation(self) -> int:
        """The index the cycle's next conversation takes: one past the highest among the cycle's sessions
        (env.users keys conversation i of population seed S `users:S:i:<task id>`), 0 before any. A resumed
        cycle starts there; a conversation below it that never got a session (its users were killed before
        its POST) stays unplayed rather than risk a later one being played twice."""
        if not self.db.is_file():
            return 0
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            keys = conn.execute("SELECT sample_key FROM sessions WHERE parent_id IS NULL AND created_at >= ? AND "
                                "sample_key LIKE ?", (self.state.cycle_start, f"users:{self.users_seed()}:%"))
            return max((int(key.split(":")[2]) + 1 for (key,) in keys), default=0)
        finally:
            conn.close()

    def traffic_draw(self) -> dict:
        """The tasks this cycle's users draw from (nanocomposer/realtime/traffic.py), fixed at the cycle's first
        serve phase (cycles/<k>/traffic.json) so a resumed cycle keeps its range."""
        from env.task_sets import resolve_task_set

        path = self.cycle_dir() / "traffic.json"
        if not path.is_file():
            a = self.args
            size = len(resolve_task_set(a.traffic_tasks).tasks)
            write_json_atomic(path, {"task_set": a.traffic_tasks, **training_draw(size, a.traffic_task_limit),
                                     "seed": self.users_seed()})
        return _read(path)

    def phase_serve(self) -> None:
        a, s = self.args, self.state
        if s.cycle_start is None:
            s.advance(self.state_path, "serve", cycle_start=time.time())
        server = self.start_server()
        if server.current() != s.current:  # e.g. a rollback recorded before a crash
            server.promote(s.current)
        draw = self.traffic_draw()
        done = self.next_conversation()
        remaining = a.sessions_per_cycle - done
        out = self.cycle_dir()
        if remaining > 0:
            self.log(f"[realtime] cycle {s.cycle}: {s.current} serves {remaining} conversations "
                     f"({done} already played) on tasks [{draw['offset']}, {draw['offset'] + draw['task_limit']}) "
                     f"of {draw['task_set']}")
            report = run_users(server.url, draw["task_set"], remaining, recipe=a.users_recipe, seed=draw["seed"],
                               offset=draw["offset"], task_limit=draw["task_limit"], start=done,
                               report=out / f"users-{done}.json", log=out / "users.log", token=server.token,
                               timeout_s=a.serve_minutes * 60 if a.serve_minutes else None)
            write_json_atomic(out / f"users-{done}.json", {k: v for k, v in report.items() if k != "latencies"})
        if not server.wait_idle(a.session_timeout_s + 60):
            self.log(f"[realtime] cycle {s.cycle}: sessions still running at the cut-off; they wait for a later cycle")
        s.advance(self.state_path, "collect", cutoff=time.time())

    def consumed(self) -> tuple[set[str], float | None]:
        """Sessions used by earlier cycles, and the previous cycle's cut-off."""
        ids, previous = set(), None
        for k in range(1, self.state.cycle):
            path = self.dir / "cycles" / str(k) / "collect.json"
            if path.is_file():
                data = _read(path)
                ids |= {x["id"] for x in data["sessions"]} | set(data["skipped_ids"])
                previous = data["cutoff"]
        return ids, previous

    def facts_of(self, sessions: list[dict]) -> list[dict]:
        return facts_of_sessions(self.db, sessions, self.args)

    def phase_collect(self) -> None:
        a, s = self.args, self.state
        consumed, previous_cutoff = self.consumed()
        data = collect(self.db, current=s.current, cutoff=s.cutoff, previous_cutoff=previous_cutoff,
                       consumed=consumed, stale_sessions=a.stale_sessions)
        facts = self.facts_of(data["sessions"])
        on_policy = [(x, f) for x, f in zip(data["sessions"], facts, strict=True) if not x["stale"]]
        data["live"] = live_metrics([x for x, _ in on_policy], [f for _, f in on_policy])
        data["rewards"] = reward_summary(self.funcs, self.training_args.reward_weights, facts)
        data["rewards"].update(reward_by_behaviour(self.funcs, self.training_args.reward_weights, facts))
        write_json_atomic(self.cycle_dir() / "collect.json", data)
        self.log(f"[realtime] cycle {s.cycle}: collected {data['counts']}; late feedback {data['late_feedback']}; "
                 f"persisting edits {data['live']['persisting_edit_rate']['rate']:.1%}, dissatisfied "
                 f"{data['live']['dissatisfied_rate']['rate']:.1%}; rewards {data['rewards']}")
        if s.promoted_cycle == s.cycle - 1 and s.parent is not None:
            parent_live = _read(self.dir / "cycles" / str(s.cycle - 1) / "collect.json")["live"]
            decision = rollback_decision(parent_live, data["live"], a.rollback_margin)
            write_json_atomic(self.cycle_dir() / "rollback.json", decision)
            if decision["rollback"]:
                self.rollback(decision)
                return
        s.advance(self.state_path, "update")

    def rollback(self, decision: dict) -> None:
        s = self.state
        child, parent = s.current, s.parent
        self.start_server().promote(parent)
        grandparent = self.lineage().get(parent)
        self.log(f"[realtime] cycle {s.cycle}: ROLLBACK {child} -> {parent}: {'; '.join(decision['reasons'])}")
        # This cycle's sessions were generated by the rolled-back version: no update for its parent from them.
        s.advance(self.state_path, s.phase, current=parent, parent=grandparent, promoted_cycle=None)
        self.finish_cycle(served_by=child, rolled_back=child, restored=parent, reasons=decision["reasons"], **self.cycle_metrics())

    def lineage(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {"v0": None}
        for name in self.registry.versions():
            meta = self.registry.versions_dir / name / "version.json"
            if meta.is_file():
                out[name] = _read(meta).get("parent")
        return out

    def cycle_metrics(self) -> dict:
        data = _read(self.cycle_dir() / "collect.json")
        live = data["live"]
        out = {f"counts/{k}": v for k, v in data["counts"].items()}
        out.update({f"late_feedback/{k}": v for k, v in data["late_feedback"].items()})
        out.update({f"live/{k}": v["rate"] for k, v in live.items() if isinstance(v, dict) and "rate" in v})
        out["live/latency_s"] = live["latency_s"]["mean"]
        out.update({k: v for k, v in data["rewards"].items() if not (isinstance(v, float) and math.isnan(v))})
        return out

    def phase_update(self) -> None:
        from nanocomposer.realtime.update import session_samples, train_candidate
        from nanocomposer.rollout_tokens import RolloutError

        a, s = self.args, self.state
        name = f"v{s.cycle}"
        out = self.registry.versions_dir / name
        update_file = self.cycle_dir() / "update.json"
        for leftover in self.registry.versions_dir.glob(f".tmp-{name}-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a save the last run did not finish
        if not (out.is_dir() and update_file.is_file()):
            if out.exists():
                raise CandidateError(f"{out} exists but this cycle's update.json does not: not written by this "
                                     "loop's update; move it away")
            data = _read(self.cycle_dir() / "collect.json")
            facts = self.facts_of(data["sessions"])
            for x, f in zip(data["sessions"], facts, strict=True):
                f["stale"] = x["stale"]  # the on-policy check leaves stale sessions out
            store = SessionStore(self.db)
            from transformers import AutoTokenizer

            import nanocomposer.smeared_llama  # noqa: F401  (registers the model type the checkpoint names)

            eos = AutoTokenizer.from_pretrained(self.registry.spec(s.current)).eos_token_id
            items = []
            try:
                for x, f in zip(data["sessions"], facts, strict=True):
                    if f["turns"] == 0:
                        continue
                    record = store.export_record(x["id"])
                    for sample in session_samples(record, eos, mask_episode=f["dropped"] or (
                                f["truncated"] and a.truncated_sessions == "mask")):
                        items.append({"sample": sample, "facts": f, "family": x["family"], "session": x["id"]})
            except RolloutError as e:
                raise CandidateError(f"cycle {s.cycle}: {e}") from None
            finally:
                store.close()
            meta = {"parent": s.current, "cycle": s.cycle, "sessions": len(data["sessions"])}
            metrics = train_candidate(items, model_path=self.registry.spec(s.current), out_dir=out,
                                      training_args=self.training_args, model_args=self.model_args,
                                      reward_funcs=self.funcs, baseline=a.baseline, meta=meta)
            write_json_atomic(update_file, metrics)
        metrics = _read(update_file)
        if not metrics["trained"]:
            self.log(f"[realtime] cycle {s.cycle}: no update ({metrics['reason']})")
            self.finish_cycle(candidate=None, decision="no update", reasons=[metrics["reason"]], **self.cycle_metrics())
            return
        # The mean, not the max, is checked: in bf16 the max grows with the tokens compared (0.35-0.57 a cycle
        # on SmolLM2, where the mean stays near 4e-3; bench/onpolicy_logprobs.py), while a wrong model moves both.
        mean = metrics["logprob_checks"][0]["mean_abs_diff"]  # (update.json files of older runs have no onpolicy_diff_mean)
        flag = "" if mean <= a.on_policy_tolerance else f" WARNING: above on_policy_tolerance {a.on_policy_tolerance}"
        self.log(f"[realtime] cycle {s.cycle}: {metrics['steps']} GRPO steps on {metrics['samples']} samples "
                 f"({metrics['unused_samples']} unused); on-policy check at the first step: |sampling - trainer "
                 f"logprob| mean {mean:.2e}{flag}, max {metrics['onpolicy_diff_max']:.2e}; later steps' drift "
                 f"(own updates, importance-weighted) max {metrics['drift_diff_max']:.2e}")
        s.advance(self.state_path, "gate")

    # ------------------------------------------------------------------ gate, promote
    def check_candidate(self, name: str) -> None:
        """CandidateError unless version `name` is a servable checkpoint (or a scripted policy)."""
        from nanocomposer.inputs import model_dir_problem
        from nanocomposer.policies import is_scripted

        try:
            spec = self.registry.spec(name)
        except ValueError as e:
            raise CandidateError(str(e)) from None
        if is_scripted(spec):
            return
        problem = model_dir_problem(Path(spec), chat_template=True)
        if problem:
            raise CandidateError(f"candidate {name} ({spec}): {problem}; refused, still serving {self.state.current}")

    def version_eval(self, name: str, tasks: list) -> dict:
        a = self.args
        # Keyed by the tasks too: a loop resumed with other gate tasks must not pair a version's old records
        # with its candidate's new ones.
        tasks_key = hashlib.sha256("\n".join(sorted(t.id for t in tasks)).encode()).hexdigest()[:12]
        path = self.dir / "gate_evals" / f"{name}.{tasks_key}.json"
        spec = self.registry.spec(name)
        weights = weights_fingerprint(spec)
        if path.is_file():
            cached = _read(path)
            # A name is not an identity: v1 of a loop restarted in the same directory, or records copied from
            # another loop, are other weights. Files written before the fingerprint carry none and are reused.
            if cached.get("weights", weights) == weights:
                return cached
            self.log(f"[realtime] {path}: recorded for other weights than {name}'s ({spec}); playing it again")
        result = evaluate(spec, tasks, budget=self.gate_budget(), samples=a.gate_samples,
                          workers=a.gate_workers, backend=a.backend)
        result = {**result, "weights": weights}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, result)
        return result

    def gate(self, candidate: str, tasks: list) -> dict:
        """The gate report of `candidate` vs current (also written beside the version)."""
        a, current = self.args, self.state.current
        try:
            self.check_candidate(candidate)
        except CandidateError as e:
            report = {"promote": False, "reasons": [f"corrupt candidate: {e}"], "candidate_name": candidate,
                      "current_name": current}
            markdown = f"# Gate: {candidate} vs {current}\n\n**Decision: refuse** — {report['reasons'][0]}\n"
        else:
            candidate_eval = self.version_eval(candidate, tasks)
            report = decide(self.version_eval(current, tasks), candidate_eval,
                            solve_margin=a.gate_solve_margin, max_malformed_increase=a.gate_max_malformed_increase,
                            max_ask_user_increase=a.gate_max_ask_user_increase,
                            max_edit_rate_drop=a.gate_max_edit_rate_drop)
            # the monitor: drift from the starting version (v0's gate records are cached after cycle 1)
            monitor = drift_warnings(self.version_eval("v0", tasks)["summary"], candidate_eval["summary"],
                                     max_malformed_increase=a.monitor_max_malformed_increase,
                                     max_ask_user_increase=a.monitor_max_ask_user_increase,
                                     max_edit_rate_drop=a.monitor_max_edit_rate_drop)
            report.update(candidate_name=candidate, current_name=current, monitor=monitor)
            markdown = gate_markdown(report, current, candidate)
        for folder in (self.cycle_dir(), self.registry.versions_dir / candidate):
            if folder.is_dir():
                write_json_atomic(folder / "gate.json", report)
                (folder / "gate.md").write_text(markdown)
        return report

    def gate_tasks(self) -> list:
        """The gate's tasks: `gate_task_limit` of them spread over the set's families, as the SFT stage's harness
        eval picks them. The first N in id order would be N of the family whose ids sort first."""
        from env.task_sets import resolve_task_set
        from nanocomposer.harness_eval import spread_over_families

        tasks = sorted(resolve_task_set(self.args.gate_tasks).tasks, key=lambda t: t.id)
        return spread_over_families(tasks, self.args.gate_task_limit)

    def phase_gate(self) -> None:
        report = self.gate(f"v{self.state.cycle}", self.gate_tasks())
        self.log(f"[realtime] cycle {self.state.cycle}: gate {'PROMOTE' if report['promote'] else 'REFUSE'}: "
                 f"{'; '.join(report['reasons'])}")
        for warning in report.get("monitor", []):
            self.log(f"[realtime] cycle {self.state.cycle}: MONITOR WARNING: v{self.state.cycle} {warning}")
        deltas = report.get("deltas") or {}
        self.wandb_log({"gate/promote": float(report["promote"]), "monitor/warnings": len(report.get("monitor", [])),
                        **{f"gate/delta_{k}": v for k, v in deltas.items() if isinstance(v, float)},
                        **({"gate/delta_solve_rate": deltas["solve_rate"]["diff"],
                            "gate/delta_solve_rate_low": deltas["solve_rate"]["ci95"][0],
                            "gate/delta_solve_rate_high": deltas["solve_rate"]["ci95"][1]} if deltas else {})})
        self.state.advance(self.state_path, "promote")

    def promote(self, name: str) -> None:
        """Serve `name` from the next session on (no restart); CandidateError (nothing changed) if it is broken."""
        self.check_candidate(name)
        self.start_server().promote(name)
        self.state.advance(self.state_path, self.state.phase, parent=self.state.current, current=name,
                           promoted_cycle=self.state.cycle)

    def phase_promote(self) -> None:
        s = self.state
        name = f"v{s.cycle}"
        report = _read(self.cycle_dir() / "gate.json")
        if report["promote"] and s.current != name:
            try:
                self.promote(name)
            except CandidateError as e:
                report = {**report, "promote": False, "reasons": [f"corrupt candidate: {e}"]}
        self.finish_cycle(candidate=name, decision="promoted" if report["promote"] else "refused",
                          reasons=report["reasons"], monitor=report.get("monitor", []), **self.cycle_metrics(),
                          **{f"update/{k}": v for k, v in _read(self.cycle_dir() / "update.json").items()
                             if isinstance(v, (int, float))})

    # ------------------------------------------------------------------ report
    def write_report(self) -> None:
        lines = ["# Real-time RL loop", "", f"`{self.dir}`; one row per finished cycle.", "",
                 ("| cycle | served by | sessions (on-policy) | persisting edits | dissatisfied | latency s | "
                  "malformed sessions | ask_user | decision |"), "|---|---|---|---|---|---|---|---|---|"]
        for h in self.state.history:
            def rate(key, h=h):
                value = h.get(f"live/{key}")
                return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.1%}"
            decision = h.get("decision") or (f"rolled back {h.get('rolled_back')}" if h.get("rolled_back") else "-")
            lines.append(f"| {h['cycle']} | {h['served_by']} | {h.get('counts/on_policy', 0)} | "
                         f"{rate('persisting_edit_rate')} | {rate('dissatisfied_rate')} | "
                         f"{h.get('live/latency_s', float('nan')):.1f} | {rate('malformed_session_rate')} | "
                         f"{rate('ask_user_rate')} | {decision}: {'; '.join(h.get('reasons', []))} |")
        (self.dir / "report.md").write_text("\n".join(lines) + "\n")
