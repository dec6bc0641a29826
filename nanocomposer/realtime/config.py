"""realtime_rl.py's own arguments (the trainer's are TRL's GRPOConfig, the model's trl.ModelConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field

from env.budget import Budget
from nanocomposer.config import ArgumentError, StageArguments, budget_from_arguments
from nanocomposer.policies import POLICY_BACKENDS

STALE_SESSIONS = ("drop", "importance_weight")
BASELINES = ("family", "batch")


@dataclass
class RealtimeArguments(StageArguments):
    """The loop: traffic, collection, rewards, update, gate, rollback (nanocomposer/realtime)."""

    cycles: int = field(default=5, metadata={"help": "Cycles to run (a resumed loop counts the ones done)."})
    traffic_tasks: str = field(default="factory:val", metadata={
        "help": "What the simulated users ask for (env/task_sets.py names or a directory); never the gate's."})
    traffic_task_limit: int | None = field(default=None, metadata={
        "help": "K: training traffic draws from the first K tasks of traffic_tasks (families interleaved), bench/realtime.py "
                "ab from the rest, so an A/B never measures on a trained task (None: half the set)."})
    gate_tasks: str = field(default="factory:test", metadata={
        "help": "Held-out tasks of the gate (harness-native benchmark); must not overlap traffic_tasks."})
    gate_task_limit: int | None = field(default=None, metadata={
        "help": "Gate on N of the gate tasks, spread over their families."})
    users_recipe: str = field(default="recipes/tiny/users.yaml", metadata={"help": "env/users.py population."})
    sessions_per_cycle: int = field(default=40, metadata={"help": "User conversations per cycle (follow-ups on top)."})
    serve_minutes: float | None = field(default=None, metadata={
        "help": "Stop the cycle's traffic after this many minutes even if sessions remain (None: no limit)."})
    server_workers: int = field(default=2, metadata={"help": "agent.py serve --workers."})
    # The episode budget of every served session and every gate episode: env.budget.Budget's fields and defaults
    # (its max_wall_s is session_timeout_s here), set by the preset's budget.yaml like every stage's (`budget`).
    max_turns: int = field(default=Budget.max_turns, metadata={"help": "Turn budget per session and per gate episode."})
    max_tokens: int | None = field(default=Budget.max_tokens, metadata={
        "help": "Completion-token budget per session and gate episode (None: no cap; the `length` reward then "
                "divides by max_turns x max_new_tokens)."})
    max_new_tokens: int = field(default=Budget.max_new_tokens, metadata={"help": "Generated tokens per turn."})
    max_context: int | None = field(default=Budget.max_context, metadata={
        "help": "Context window of the server and the gate (None: the model's max_position_embeddings)."})
    session_timeout_s: float = field(default=Budget.max_wall_s, metadata={
        "help": "Wall-clock budget per session and gate episode (the budget file's max_wall_s); also what the "
                "`latency` reward divides by."})
    max_malformed_turns: int = field(default=Budget.max_malformed_turns, metadata={
        "help": "Consecutive turns with malformed calls (and no valid one) that end a session."})
    max_output_chars: int = field(default=Budget.max_output_chars, metadata={
        "help": "Per tool result (head and tail kept)."})
    command_timeout_s: float = field(default=Budget.command_timeout_s, metadata={"help": "Per sandboxed command."})
    backend: str = field(default="auto", metadata={"help": "Generation backend of server and gate.",
                                                   "choices": list(POLICY_BACKENDS)})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["edit_kept", "edit_reverted", "dissatisfied", "latency", "malformed",
                                 "failed_actions", "needless_question"],
        metadata={"help": "Components from env/rewards.py's REWARDS; weights in `reward_weights`."})
    malformed_handling: str = field(default="penalize", metadata={
        "help": "penalize: each malformed call is an explicit negative. drop: sessions with one leave training "
                "(malformed calls dropped).", "choices": ["penalize", "drop"]})
    ask_user_handling: str = field(default="penalize", metadata={
        "help": "penalize: ask_user costs like a failed edit, and needless_question (where named) charges a "
                "question the user did not need. free: questions cost nothing while reverted edits do (free "
                "questions).", "choices": ["penalize", "free"]})
    stale_sessions: str = field(default="drop", metadata={
        "help": "Sessions served by another version than current: drop them (counted), or train on them with "
                "their sampling logprobs as the PPO ratio's denominator (importance_weight).",
        "choices": list(STALE_SESSIONS)})
    truncated_sessions: str = field(default="keep", metadata={
        "help": "Sessions cut by a token limit: keep (trained; the user's verdict already scores them) or mask "
                "(no loss on them, train_rl.py's default).", "choices": ["keep", "mask"]})
    baseline: str = field(default="family", metadata={
        "help": "Who a session is compared with (one sample per prompt): sessions of its task family (family) "
                "or of its step (batch).", "choices": list(BASELINES)})
    on_policy_tolerance: float = field(default=1e-3, metadata={
        "help": "Largest mean |sampling logprob - trainer logprob| over the model's tokens before the cycle warns."})
    gate_samples: int = field(default=1, metadata={"help": "Episodes per gate task."})
    gate_workers: int = field(default=4, metadata={"help": "Gate episodes live at once."})
    gate_temperature: float = field(default=0.0, metadata={"help": "Gate sampling temperature (0: greedy)."})
    gate_solve_margin: float = field(default=0.0, metadata={
        "help": "Refuse when the solve-rate difference's 95%% interval lies wholly below -margin."})
    gate_max_malformed_increase: float = field(default=0.02, metadata={"help": "Malformed-call rate may rise this much."})
    gate_max_ask_user_increase: float = field(default=0.05, metadata={"help": "ask_user rate may rise this much."})
    gate_max_edit_rate_drop: float = field(default=0.05, metadata={"help": "Edit rate may fall this much."})
    monitor_max_malformed_increase: float = field(default=0.02, metadata={
        "help": "The monitor warns when a candidate's malformed-call rate is this much above the starting version's."})
    monitor_max_ask_user_increase: float = field(default=0.05, metadata={
        "help": "The monitor warns when a candidate's ask_user rate is this much above the starting version's."})
    monitor_max_edit_rate_drop: float = field(default=0.05, metadata={
        "help": "The monitor warns when a candidate's edit rate is this much below the starting version's."})
    rollback_margin: float = field(default=0.0, metadata={
        "help": "Roll back when a promoted version's persisting-edit rate is below its parent's (or its "
                "dissatisfied or malformed-session rate above) with the 95%% interval of the difference beyond "
                "this margin."})

    def __post_init__(self):
        super().__post_init__()
        self.budget()  # checked by Budget (ArgumentError naming the argument)
        for name in ("cycles", "sessions_per_cycle", "server_workers", "gate_samples", "gate_workers"):
            if getattr(self, name) < 1:
                raise ArgumentError(name, getattr(self, name), "must be at least 1")
        for name in ("gate_task_limit", "traffic_task_limit"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ArgumentError(name, getattr(self, name), "must be at least 1 (or null)")
        if not self.on_policy_tolerance > 0:
            raise ArgumentError("on_policy_tolerance", self.on_policy_tolerance, "must be > 0")
        if self.serve_minutes is not None and not self.serve_minutes > 0:
            raise ArgumentError("serve_minutes", self.serve_minutes, "must be > 0 (or null: no limit)")
        for name in ("gate_temperature", "gate_solve_margin", "gate_max_malformed_increase",
                     "gate_max_ask_user_increase", "gate_max_edit_rate_drop", "rollback_margin",
                     "monitor_max_malformed_increase", "monitor_max_ask_user_increase", "monitor_max_edit_rate_drop"):
            if not getattr(self, name) >= 0:
                raise ArgumentError(name, getattr(self, name), "must be >= 0")

    def budget(self, **sampling) -> Budget:
        """The sessions' and the gate's env.budget.Budget, with `sampling` (temperature, top_p, seed: the server
        samples with the trainer's, the gate with gate_temperature); Budget's otherwise."""
        return budget_from_arguments(self, **sampling)
