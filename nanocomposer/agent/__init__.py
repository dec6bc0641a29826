"""The self-hosted agent: `agent.py run` (one session at the terminal) and `agent.py serve` (the local server).

    episodes.py   a user's repository or a task directory staged as a harness Task; one session = run_episode
    changes.py    what a session changed: snapshot, diff, exact application with a dirty-file check
    registry.py   model versions and the `current` pointer the server serves
    store.py      sessions in SQLite (turns with token ids and logprobs, tool calls, diffs, feedback)
    manager.py    the server's queue, workers and ask_user round trips
    api.py        the HTTP API (FastAPI); serve.py the process (uvicorn)
    terminal.py   what `agent.py run` prints
"""
