"""Real-time RL (realtime_rl.py): the served checkpoint learns from its own users, one cycle at a time.

    serve     the registry's `current` version serves simulated users through `agent.py serve` (processes)
    collect   the cycle's finished sessions from the server's SQLite, on-policy (served by `current`), with the
              feedback that arrived by the cut-off; no session is used by two cycles
    rewards   session facts + the user's feedback -> env/rewards.py components (weights in the recipe)
    update    one GRPO pass of TRL's GRPOTrainer over the logged token ids and sampling logprobs
    gate      candidate vs current on held-out tasks (env.runner.run_tasks): solve rate and behaviour rates
    promote   POST /admin/promote (no restart); the next cycle's live metrics can roll it back

Modules: config.py (the recipe's arguments), state.py (the per-loop state file), server.py (server and user
processes), traffic.py (which tasks training traffic and the A/B draw from), collect.py, rewards.py, update.py,
gate.py, live.py (live metrics and the rollback rule), loop.py (the cycle).
"""
