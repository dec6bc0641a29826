"""`agent.py serve`: the local agent server process (uvicorn + the session manager).

Who it serves (docs/agent-server.md): the server acts for the user who started it. It runs agents on copies of
directories it can read, so every client needs its token: `--token` (or $NANOCOMPOSER_TOKEN) sets it, else one
is generated at each start; either way it is written to `<db stem>.token` next to the database, 0600, and the
path is printed. /admin/* needs the admin token (`<db stem>.admin-token`, generated, 0600) or the client token
on a connection whose peer is the server's own uid (or root). Bound to 127.0.0.1 by default; `--unix PATH`
listens on a unix socket (0600) instead. Binding anything else (another address, 0.0.0.0, a LAN interface)
requires an explicit `--token`: the server runs code on this machine on behalf of whoever can reach it.

The peer's uid is taken from the connection, never from the request: SO_PEERCRED on a unix socket, the
kernel's socket table (/proc/net/tcp, tcp6) for a loopback TCP client. Another local user (a peer uid that is
neither the server's nor root) may only submit what it could read itself, sees only its own sessions and never
reaches /admin (api.py, manager.py).

At start the database is checked (`PRAGMA quick_check`): a damaged one is one line naming the file and exit
status 2. SIGTERM (and Ctrl-C) stop it gracefully: running sessions are marked interrupted and their episodes
end (`SessionManager.stop`); queued ones stay queued for the next server; the database is checkpointed and
closed (after a stop, sessions.db alone is the whole database). At start the staged sessions a killed server
left in the temp directory are removed (`sweep_stale_sessions`: only those whose owning process is dead, so
servers sharing the machine keep theirs).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import sqlite3
import stat
import struct
import sys
import tempfile
from pathlib import Path

from nanocomposer.agent.api import create_app
from nanocomposer.agent.episodes import sweep_stale_sessions
from nanocomposer.agent.manager import ServerConfig, SessionManager
from nanocomposer.agent.registry import Registry
from nanocomposer.agent.store import SessionStore, StoreError

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_bind(host: str, token: str | None) -> None:
    if host not in LOCAL_HOSTS and not token:
        raise ValueError(f"refusing to listen on {host!r} without a token: anything that can reach it could run "
                         "agents on this machine; pass --token or set $NANOCOMPOSER_TOKEN (or bind 127.0.0.1)")


def token_paths(db: str | Path) -> tuple[Path, Path]:
    """(client token file, admin token file) of the server on database `db`: next to it, named after it."""
    db = Path(db)
    return db.with_name(db.stem + ".token"), db.with_name(db.stem + ".admin-token")


def read_token(db: str | Path, admin: bool = False) -> str:
    """The token a client of the server on `db` sends (readable only by the server's user and root)."""
    return token_paths(db)[1 if admin else 0].read_text().strip()


def write_secret(path: Path, value: str) -> None:
    """`value` into `path`, mode 0600, atomically (a reader sees the old file or the new one; a link or file
    someone planted at `path` is replaced, never written through)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)  # mkstemp: 0600, O_EXCL
    try:
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one), so the address printed is the address served."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def bind_unix(path: str) -> socket.socket:
    """A listening unix socket at `path`, mode 0600 from its creation (umask), never replacing anything but a
    dead server's socket."""
    target = Path(path)
    try:
        st = target.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise ValueError(f"--unix {path!r}: exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            target.unlink()  # a dead server's socket
        except OSError as e:
            raise ValueError(f"--unix {path!r}: cannot check the existing socket ({e.strerror or e})") from None
        else:
            raise ValueError(f"--unix {path!r}: another server is listening there")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


# ------------------------------------------------------------------------------------------ peer identity
def _proc_address(text: str) -> tuple[ipaddress._BaseAddress, int]:
    hexaddr, hexport = text.split(":")
    raw = bytes.fromhex(hexaddr)
    packed = b"".join(int.from_bytes(raw[i:i + 4], "big").to_bytes(4, sys.byteorder) for i in range(0, len(raw), 4))
    return _normal(ipaddress.ip_address(packed)), int(hexport, 16)


def _normal(address):
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def tcp_peer_uid(client: tuple, server: tuple) -> int | None:
    """The uid owning the loopback TCP socket at `client` connected to `server` (this process's end), from the
    kernel's socket table; None when not loopback or not found."""
    try:
        client_ip, server_ip = _normal(ipaddress.ip_address(client[0])), _normal(ipaddress.ip_address(server[0]))
    except (ValueError, IndexError, TypeError):
        return None
    if not client_ip.is_loopback:
        return None
    wanted_local, wanted_remote = (client_ip, int(client[1])), (server_ip, int(server[1]))
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) < 8:
                        continue
                    try:
                        if _proc_address(fields[1]) == wanted_local and _proc_address(fields[2]) == wanted_remote:
                            return int(fields[7])
                    except ValueError:
                        continue
        except OSError:
            continue
    return None


def connection_peer(sock) -> tuple[int | None, int | None]:
    """(uid, gid) of the process at the other end of an accepted connection, when the kernel says."""
    try:
        if sock.family == socket.AF_UNIX:
            _pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                 struct.calcsize("3i")))
            return uid, gid
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return tcp_peer_uid(sock.getpeername(), sock.getsockname()), None
    except (OSError, struct.error, ValueError):
        pass
    return None, None


def peer_protocol():
    """uvicorn's h11 protocol, recording each connection's peer uid/gid in the scope's state."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class PeerH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            uid, gid = connection_peer(sock) if sock is not None else (None, None)
            self.app_state = {**self.app_state, "peer_uid": uid, "peer_gid": gid}

    return PeerH11Protocol


def serve(*, host: str, port: int, token: str | None, db: str, registry: str, config: ServerConfig,
          model: str | None = None, version: str | None = None, unix: str | None = None) -> None:
    import uvicorn

    if unix is None:
        check_bind(host, token)
    reg = Registry(registry)
    if model is not None:
        reg.ensure(model, version)
    if reg.current() is None:
        raise ValueError(f"registry {registry!r} has no current version: pass --model SPEC (a checkpoint "
                         "directory or a scripted policy) or promote one")
    reg.spec(reg.current())
    store = SessionStore(db, check=True)  # StoreError (one line naming the file) when damaged
    try:
        # hex, not urlsafe base64: one token in 64 of those starts with "-", and `--token -x...` on a command
        # line (env.users, agent.py) is then read as a flag
        token = token or secrets.token_hex(32)
        admin_token = secrets.token_hex(32)
        token_file, admin_file = token_paths(db)
        write_secret(token_file, token)
        write_secret(admin_file, admin_token)
        sock = bind_unix(unix) if unix is not None else bind(host, port)
    except BaseException:
        store.close()
        raise
    swept = sweep_stale_sessions()
    if swept:
        print(f"agent server: removed {len(swept)} staged sessions left by dead processes", file=sys.stderr,
              flush=True)
    manager = SessionManager(store, reg, config)
    app = create_app(manager, token, admin_token, allowed_hosts=() if unix is not None or host in
                     ("0.0.0.0", "::") else (host,))
    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            manager.drain()  # long-polls answer now instead of holding the shutdown for up to a minute
            await super().shutdown(sockets)

    server = Server(uvicorn.Config(app, log_level="warning", access_log=False, http=peer_protocol(),
                                   timeout_graceful_shutdown=10))
    # uvicorn takes SIGTERM while it serves, and once shut down raises it again under the handler it found:
    # the default one would end this process before manager.stop() below. This one asks uvicorn to stop
    # (a SIGTERM before it serves makes it stop at once) and ignores repeats (a parent's death signal
    # comes once per thread of the parent), so the stop always runs to its end.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: setattr(server, "should_exit", True))
    try:
        manager.start()
    except sqlite3.Error as e:
        store.close()
        raise StoreError(f"session database {db!r} is unusable ({' '.join(str(e).split())})") from None
    if unix is not None:
        where = f"unix:{unix}"
    else:
        where = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
    print(f"agent server on {where} (model {reg.current()}, {config.workers} workers, db {db}, resumed "
          f"{len(manager.resumed)} queued, token file {token_file}, admin token file {admin_file})", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        manager.stop()
        store.close()  # checkpointed: the database file alone is complete
        if unix is not None:
            with contextlib.suppress(OSError):
                os.unlink(unix)
        print("agent server stopped", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, previous)
