"""nanocomposer's self-hosted agent: the harness the model was trained in, pointed at your own repository.

    python agent.py run --repo PATH [--model CKPT|oracle|replay:FILE|openai:MODEL@BASE_URL] [--test-command CMD] "instruction"
    python agent.py serve [--host 127.0.0.1] [--port 8765 | --unix PATH] [--workers 4] [--model SPEC] [--token TOKEN]
        [--temperature T] [--top-p P] [--seed S] [--max-new-tokens N] [--max-turns N] [--session-timeout-s S] ...
    python agent.py sessions [--status S] [--export FILE.jsonl]
    python agent.py registry {list | add NAME SPEC | promote NAME}

`run` plays one episode (the same system prompt, tools, parsing, budgets and exit statuses as training and
eval: env/episode.py) on a sandboxed copy of the repository, shows each turn, asks you the agent's ask_user
questions, shows the diff and applies it only when you say so (`--yes`), byte for byte, refusing (exit 2,
nothing changed) if a file it would touch changed in the repository meanwhile. `serve` runs the same sessions
behind a local HTTP API (nanocomposer/agent/api.py) with every session logged to SQLite for real-time RL.
Nothing leaves the machine: the model runs locally and tool commands run in the sandbox with no network.

Budgets and sampling settings are every field of env/budget.py's `Budget`, one flag each (the wall clock is `run
--max-wall-s` and `serve --session-timeout-s`), default to its values (the one source of their defaults) and are
checked by it: a bad value exits 2 with one line naming the flag. realtime_rl.py starts `serve` with its
preset's budget (recipes/<preset>/budget.yaml), so served sessions play under the budget the model trained with. A checkpoint samples each turn with a seed
derived from `--seed`, the episode key and the turn (nanocomposer/policy.py): `run` keys its one episode by the
repository's name (same seed, repository name and conversation: the same sample); `serve` keys a session by its
`sample_key` (else its id; nanocomposer/agent/manager.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from env.budget import Budget, BudgetError
from env.workspace import DEFAULT_STAGE_MAX_BYTES, DEFAULT_STAGE_MAX_FILES
from nanocomposer.policies import POLICY_BACKENDS

DEFAULT_HOME = Path("runs") / "agent"
EXIT_ERROR = 2


def fail(message: str) -> int:
    print(f"agent.py: error: {message}", file=sys.stderr)
    return EXIT_ERROR


# Budget fields -> (type, help) of the flag that sets each one: `--` and the field with `-` for `_` (every field of
# Budget; the wall clock's flag is the subcommand's).
EPISODE_FLAGS = {
    "max_turns": (int, "turns per session (default: %(default)s)"),
    "max_tokens": (int, "completion tokens per session, checkpoint policies (default: no cap)"),
    "max_new_tokens": (int, "tokens generated per turn, checkpoint policies (default: %(default)s)"),
    "max_context": (int, "context window in tokens, checkpoint policies (default: the model's)"),
    "max_malformed_turns": (int, ("consecutive turns with malformed calls (and no valid one) that end the "
                                  "session (default: %(default)s)")),
    "max_output_chars": (int, ("characters per tool result shown to the model, head and tail kept "
                               "(default: %(default)s)")),
    "command_timeout_s": (float, "seconds per sandboxed command (default: %(default)s)"),
    "temperature": (float, "sampling temperature, checkpoint policies; 0 = greedy (default: %(default)s)"),
    "top_p": (float, "nucleus sampling in (0, 1], checkpoint policies; 1 = off (default: %(default)s)"),
    "seed": (int, ("sampling seed (>= 0): each turn samples with a seed derived from it, the session's sample "
                   "key and the turn, so the same seed and session sample the same tokens; also the oracle's "
                   "scripted variety (default: %(default)s)")),
}

# Budget keys -> the flags that set them, so a bad value's error names the flag the user typed.
BUDGET_FLAGS = {key: "--" + key.replace("_", "-") for key in EPISODE_FLAGS}


def _episode_args(p: argparse.ArgumentParser) -> None:
    # Defaults come from env/budget.py's Budget (the one source of budgets and sampling settings); the flags
    # are checked by Budget too (`_budget`), so a bad value is the same one-line error here as in every stage.
    for key, (kind, help_text) in EPISODE_FLAGS.items():
        p.add_argument(BUDGET_FLAGS[key], type=kind, default=getattr(Budget, key), help=help_text)
    p.add_argument("--backend", default="auto", choices=POLICY_BACKENDS)
    p.add_argument("--registry", default=str(DEFAULT_HOME / "registry"),
                   help="model registry (versions/<name>/ + current); the default model is its current version")


def _budget(args, wall_s: float, wall_flag: str) -> Budget:
    """The Budget the flags describe, validated by Budget; a bad value is a ValueError naming its flag."""
    flags = {**BUDGET_FLAGS, "max_wall_s": wall_flag}
    try:
        return Budget(max_wall_s=wall_s, **{key: getattr(args, key) for key in EPISODE_FLAGS})
    except BudgetError as e:  # "budget: top_p=1.5: must be in (0, 1]"
        if e.key in flags:
            raise ValueError(f"{flags[e.key]} {e.value!r}: {e.problem}") from None
        raise ValueError(str(e)) from None


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="one task on your repository")
    run.add_argument("instruction")
    run.add_argument("--repo", required=True, help="the repository directory (copied; never edited in place)")
    run.add_argument("--model", default=None, help="checkpoint dir | oracle | gold | noop | replay:FILE | "
                     "openai:MODEL@BASE_URL (default: the registry's current version)")
    run.add_argument("--test-command", default=None, help="what run_tests runs (default: none)")
    run.add_argument("--max-wall-s", type=float, default=Budget.max_wall_s,
                     help="wall-clock budget of the session in seconds (default: %(default)s)")
    run.add_argument("--no-input", action="store_true", help="answer ask_user with the scripted no-information reply")
    decide = run.add_mutually_exclusive_group()
    decide.add_argument("--yes", action="store_true", help="apply the changes without asking")
    decide.add_argument("--no-apply", action="store_true", help="only show the diff")
    run.add_argument("--output", default=None, help="also write the diff to this file")
    run.add_argument("--max-files", type=int, default=DEFAULT_STAGE_MAX_FILES,
                     help="refuse a repository with more entries (files, directories, symlinks) than this, before "
                          "copying anything (default: %(default)s)")
    run.add_argument("--max-mb", type=int, default=DEFAULT_STAGE_MAX_BYTES // (1024 * 1024),
                     help="refuse a repository whose files hold more MiB than this, before copying anything "
                          "(default: %(default)s)")
    run.add_argument("--gold-patch", default=None, help=argparse.SUPPRESS)  # tests: the gold policy's patch
    _episode_args(run)

    serve = sub.add_parser("serve", help="the local agent server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765, help="0 = a free port (printed)")
    serve.add_argument("--unix", default=None, metavar="PATH",
                       help="listen on a unix socket at PATH (mode 0600) instead of TCP")
    serve.add_argument("--token", default=os.environ.get("NANOCOMPOSER_TOKEN"),
                       help="the bearer token every client sends ($NANOCOMPOSER_TOKEN; default: a new one at each "
                            "start); written 0600 to <db stem>.token next to --db; required to bind beyond localhost")
    serve.add_argument("--workers", type=int, default=4)
    serve.add_argument("--max-queue", type=int, default=64)
    serve.add_argument("--session-timeout-s", type=float, default=Budget.max_wall_s,
                       help="wall-clock budget per session in seconds; longer requests are capped to it "
                            "(default: %(default)s)")
    serve.add_argument("--answer-timeout-s", type=float, default=120.0)
    serve.add_argument("--db", default=str(DEFAULT_HOME / "sessions.db"))
    serve.add_argument("--model", default=None, help="register this spec and make it current")
    serve.add_argument("--version", default=None, help="the registry name for --model")
    _episode_args(serve)

    sessions = sub.add_parser("sessions", help="list or export logged sessions")
    sessions.add_argument("--db", default=str(DEFAULT_HOME / "sessions.db"))
    sessions.add_argument("--status", default=None)
    sessions.add_argument("--limit", type=int, default=None)
    sessions.add_argument("--export", default=None, metavar="FILE.jsonl", help="one trajectory record per session")

    registry = sub.add_parser("registry", help="model versions the server can serve")
    registry.add_argument("--registry", default=str(DEFAULT_HOME / "registry"))
    registry.add_argument("action", choices=("list", "add", "promote"))
    registry.add_argument("names", nargs="*", help="add: NAME SPEC; promote: NAME")
    return parser


def _model_spec(args) -> str:
    from nanocomposer.agent.registry import Registry

    if args.model:
        return args.model
    reg = Registry(args.registry)
    if reg.current() is None:
        raise ValueError(f"no model: pass --model (a checkpoint directory, oracle, replay:FILE), or promote a "
                         f"version in {args.registry}")
    return reg.spec(reg.current())


def _build_policy(spec: str, budget: Budget, backend: str):
    from nanocomposer.policies import build_policy, is_remote, is_scripted, seed_policy

    # local directories only: nothing is fetched (an openai:<model>@<base_url> endpoint is one the user named)
    if not is_scripted(spec) and not is_remote(spec) and not Path(spec).is_dir():
        raise ValueError(f"checkpoint {spec!r} not found (not a directory, and not a scripted policy: "
                         "oracle, gold, noop, replay:FILE, nor openai:<model>@<base_url>)")
    try:
        policy = build_policy(spec, budget.sampling(), backend)
    except Exception as e:  # noqa: BLE001  (a missing or broken checkpoint is one line, not a traceback)
        raise ValueError(f"model {spec!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    seed_policy(policy, budget.seed)  # build_policy leaves the seed out of SamplingConfig: set it here
    return policy


def cmd_run(args) -> int:
    from rich.console import Console
    from rich.text import Text

    from env.episode import EpisodeConfig
    from env.workspace import StagingError
    from nanocomposer.agent.changes import ApplyError, apply_changes
    from nanocomposer.agent.episodes import run_session, stage_repo, sweep_stale_sessions
    from nanocomposer.agent.terminal import TurnPrinter, confirm, print_diff, printable, terminal_answerer

    def error(message: str) -> int:  # one line, nothing in it a terminal would act on
        return fail(printable(message, newlines=False))

    repo = Path(args.repo)
    try:
        budget = _budget(args, args.max_wall_s, "--max-wall-s")
    except ValueError as e:
        return error(str(e))
    for flag, value in (("--max-files", args.max_files), ("--max-mb", args.max_mb)):
        if value < 1:
            return error(f"{flag} {value}: must be at least 1")
    if not repo.is_dir():
        return error(f"--repo {args.repo!r} is not a directory")
    try:
        policy = _build_policy(_model_spec(args), budget, args.backend)
        gold = Path(args.gold_patch).read_text() if args.gold_patch else None
    except (ValueError, OSError) as e:
        return error(str(e))
    sweep_stale_sessions()  # what killed runs and servers left behind (dead owners only)
    console = Console(highlight=False)
    interactive = sys.stdin.isatty() and not args.no_input
    config = EpisodeConfig.from_budget(budget, ask_user=terminal_answerer(console, interactive))
    try:  # env.workspace.stage_tree: caps checked before copying; FIFOs, sockets, devices skipped
        task = stage_repo(repo, args.instruction, args.test_command, gold, max_bytes=args.max_mb * 1024 * 1024,
                          max_files=args.max_files, bytes_flag="--max-mb", files_flag="--max-files")
    except (StagingError, OSError) as e:
        return error(f"cannot stage --repo {str(repo)!r}: {e}")
    shown_repo = printable(str(repo.resolve()), newlines=False)
    console.print(Text("nanocomposer agent", style="bold"),
                  Text(f"on {shown_repo} (a sandboxed copy; model {printable(policy.name, newlines=False)})"),
                  soft_wrap=True)
    staged = task.meta.get("staged", {})
    if staged.get("skipped"):
        listed = ", ".join(f"{printable(path, newlines=False)} ({why})" for path, why in staged["skipped"][:5])
        more = staged["skipped_count"] - min(5, len(staged["skipped"]))
        console.print(Text(f"not copied (not regular files, or unreadable): {listed}"
                           + (f" and {more} more" if more > 0 else ""), style="yellow"), soft_wrap=True)
    try:
        result = run_session(task, policy, config, on_turn=TurnPrinter(console))
    except KeyboardInterrupt:
        print("agent.py: interrupted; the repository is unchanged", file=sys.stderr)
        return 130
    try:
        traj = result.trajectory
        tests = "no test command" if not args.test_command else ("pass" if traj.solved else "fail")
        console.print(Text("exit status", style="bold"),
                      Text(printable(f"{traj.exit_status}; tests: {tests}; {len(traj.turns)} turns, {traj.wall_s:.1f} s"
                                     + (f"; error: {traj.error}" if traj.error else ""))), soft_wrap=True)
        if traj.submission:
            console.print(Text("summary", style="bold"), Text(printable(traj.submission)), soft_wrap=True)
        if args.output:
            Path(args.output).write_text(result.diff, encoding="utf-8")
        if not result.changes:
            console.print("no changes")
            return 0
        console.print(Text("diff", style="bold"), Text(f"({len(result.changes)} files)"))
        print_diff(console, result.diff)
        if args.no_apply or not (args.yes or confirm(console, f"Apply these changes to {shown_repo}? [y/N] ")):
            console.print("not applied; the repository is unchanged")
            return 0
        try:
            left = apply_changes(repo, result.workspace, result.changes)
        except ApplyError as e:
            return error(str(e) if e.partial or str(e).startswith("not applied") else f"not applied: {e}")
        except OSError as e:  # before the first write (apply_changes rolls back its own failures)
            return error(f"not applied: {e}")
        console.print(Text(f"applied {len(result.changes)} changed files to {shown_repo}"), soft_wrap=True)
        if left:
            console.print(Text(printable(f"could not remove leftovers: {', '.join(left)}", newlines=False),
                               style="yellow"), soft_wrap=True)
        return 0
    finally:
        result.cleanup()


def server_config(args):
    """The server's nanocomposer.agent.manager.ServerConfig from `serve`'s flags: its sessions play under the
    whole Budget the flags describe; a bad flag is a ValueError naming it (before the server's imports)."""
    budget = _budget(args, args.session_timeout_s, "--session-timeout-s")
    for flag, value in (("--workers", args.workers), ("--max-queue", args.max_queue)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be at least 1")
    if not args.answer_timeout_s >= 0:
        raise ValueError(f"--answer-timeout-s {args.answer_timeout_s}: must be >= 0 seconds")
    from nanocomposer.agent.manager import ServerConfig  # after the checks: bad flags fail before the imports

    return ServerConfig.from_budget(budget, workers=args.workers, max_queue=args.max_queue,
                                    answer_timeout_s=args.answer_timeout_s, backend=args.backend)


def cmd_serve(args) -> int:
    try:
        config = server_config(args)
    except ValueError as e:
        return fail(str(e))
    from nanocomposer.agent.registry import RegistryError
    from nanocomposer.agent.serve import serve

    try:
        serve(host=args.host, port=args.port, token=args.token, db=args.db, registry=args.registry, config=config,
              model=args.model, version=args.version, unix=args.unix)
    except (ValueError, RegistryError, OSError) as e:
        return fail(str(e))
    return 0


def cmd_sessions(args) -> int:
    import sqlite3

    from nanocomposer.agent.store import SessionStore, StoreError

    if not Path(args.db).is_file():
        return fail(f"--db {args.db!r}: no session database there")
    try:  # a damaged or foreign file is one line naming it, as at the server's start
        store = SessionStore(args.db, check=True)
        rows = store.sessions(args.status, args.limit)
    except (StoreError, sqlite3.DatabaseError) as e:
        return fail(f"--db {args.db!r}: {' '.join(str(e).split())[:300]}")
    if args.export:
        with open(args.export, "w") as f:
            f.writelines(json.dumps(store.export_record(row["id"]), ensure_ascii=False) + "\n" for row in rows)
        print(f"exported {len(rows)} sessions to {args.export}")
        return 0
    print(f"{'id':12}  {'status':11}  {'version':14}  {'exit status':18}  {'solved':6}  {'files':5}  "
          f"{'wall s':7}  {'task':28}  instruction")
    for r in rows:
        solved = "" if r["solved"] is None else str(bool(r["solved"]))
        wall = f"{r['wall_s']:.1f}" if r["wall_s"] is not None else ""
        print(f"{r['id'][:12]:12}  {r['status']:11}  {(r['model_version'] or '')[:14]:14}  "
              f"{r['exit_status'] or '':18}  {solved:6}  {r['changed_files'] or 0!s:5}  {wall:7}  "
              f"{(r['task_id'] or '')[:28]:28}  {' '.join(r['instruction'].split())[:60]}")
    print(f"{len(rows)} sessions; by status: {store.counts()}")
    return 0


def cmd_registry(args) -> int:
    from nanocomposer.agent.registry import Registry, RegistryError

    reg = Registry(args.registry)
    need = {"list": 0, "add": 2, "promote": 1}[args.action]
    if len(args.names) != need:
        return fail(f"registry {args.action} takes {need} argument(s), got {len(args.names)}")
    try:
        if args.action == "add":
            reg.add(*args.names)
        elif args.action == "promote":
            reg.promote(args.names[0])
    except RegistryError as e:
        return fail(str(e))
    current = reg.current()
    for name in reg.versions():
        print(f"{'*' if name == current else ' '} {name}  {reg.spec(name)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    return {"run": cmd_run, "serve": cmd_serve, "sessions": cmd_sessions, "registry": cmd_registry}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
