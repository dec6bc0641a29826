"""`agent.py serve`: the local agent server process (uvicorn + the session manager).

Bound to 127.0.0.1 by default. Binding anything else (another address, 0.0.0.0, a LAN interface) requires a
token: the server runs code on this machine on behalf of whoever can reach it.

SIGTERM (and Ctrl-C) stop it gracefully: running sessions are marked interrupted and their episodes end
(`SessionManager.stop`); queued ones stay queued for the next server. At start the staged sessions a killed
server left in the temp directory are removed (`sweep_stale_sessions`: only those whose owning process is
dead, so servers sharing the machine keep theirs).
"""

from __future__ import annotations

import signal
import socket
import sys

from nanocomposer.agent.api import create_app
from nanocomposer.agent.episodes import sweep_stale_sessions
from nanocomposer.agent.manager import ServerConfig, SessionManager
from nanocomposer.agent.registry import Registry
from nanocomposer.agent.store import SessionStore

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_bind(host: str, token: str | None) -> None:
    if host not in LOCAL_HOSTS and not token:
        raise ValueError(f"refusing to listen on {host!r} without a token: anything that can reach it could run "
                         "agents on this machine; pass --token or set $NANOCOMPOSER_TOKEN (or bind 127.0.0.1)")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one), so the address printed is the address served."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(*, host: str, port: int, token: str | None, db: str, registry: str, config: ServerConfig,
          model: str | None = None, version: str | None = None) -> None:
    import uvicorn

    check_bind(host, token)
    reg = Registry(registry)
    if model is not None:
        reg.ensure(model, version)
    if reg.current() is None:
        raise ValueError(f"registry {registry!r} has no current version: pass --model SPEC (a checkpoint "
                         "directory or a scripted policy) or promote one")
    reg.spec(reg.current())
    swept = sweep_stale_sessions()
    if swept:
        print(f"agent server: removed {len(swept)} staged sessions left by dead processes", file=sys.stderr,
              flush=True)
    store = SessionStore(db)
    manager = SessionManager(store, reg, config)
    sock = bind(host, port)
    server = uvicorn.Server(uvicorn.Config(create_app(manager, token), log_level="warning", access_log=False))
    # uvicorn takes SIGTERM while it serves, and once shut down raises it again under the handler it found:
    # the default one would end this process before manager.stop() below. This one asks uvicorn to stop
    # (a SIGTERM before it serves makes it stop at once) and ignores repeats (a parent's death signal
    # comes once per thread of the parent), so the stop always runs to its end.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: setattr(server, "should_exit", True))
    manager.start()
    address = sock.getsockname()
    print(f"agent server on http://{host if ':' not in host else f'[{host}]'}:{address[1]} "
          f"(model {reg.current()}, {config.workers} workers, db {db}, resumed {len(manager.resumed)} queued)",
          flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        manager.stop()
        print("agent server stopped", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, previous)
