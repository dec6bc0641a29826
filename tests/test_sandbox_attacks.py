"""Attacks on the host through env/sandbox.py, each checked ON THE HOST, not only by a return code.

The table below runs every attack as a real command in a bwrap Sandbox over a real workspace (made by
env.workspace.make_workspace, as episodes and grading make them). It runs as root in CI and, through
`make test-sandbox-user`, as a normal user; where the two differ, the case checks what the module
docstring of env/sandbox.py promises for that identity.
"""

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from env.sandbox import Sandbox
from env.sandbox_cgroups import pids_cgroup_parent, sweep_stale
from env.sandbox_launch import Limits, backend_unavailable_reason, bwrap_host_uid
from env.workspace import (
    _our_mounts,
    make_workspace,
    remove_workspace,
    sweep_stale_workspaces,
    workspaces_root,
)

ROOT = os.geteuid() == 0
HAS_CGROUP = pids_cgroup_parent() is not None
REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.skipif(backend_unavailable_reason("bwrap") is not None,
                                 reason=f"bwrap unavailable: {backend_unavailable_reason('bwrap')}"),
              pytest.mark.slow]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod.py").write_text("X = 1\n")
    return repo


@dataclass
class Attack:
    name: str
    command: str
    check: object  # check(ws, result, host_before) -> None; asserts on the host
    limits: Limits = field(default_factory=Limits)
    before: object = None  # before() -> state of the host to compare after the attack


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


SYSCTLS = ("/proc/sys/vm/stat_interval", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/printk_ratelimit",
           "/proc/sys/vm/drop_caches", "/proc/sys/fs/file-max")


def _check_sysctls(ws, result, before):
    after = {p: _read(p) for p in SYSCTLS}
    changed = {p for p in SYSCTLS if after[p] != before[p]}
    for p in changed:  # put the host back before failing
        Path(p).write_text(before[p])
    assert not changed, f"sandboxed command changed host sysctls {changed}: {result.output}"
    assert result.output.count("WRITE-FAILED") == len(SYSCTLS), result.output
    assert result.output.split("MOUNT:")[-1].split()[0].split(",")[0] == "ro", result.output  # mounted read-only


def _check_sysrq(ws, result, before):
    assert "SYSRQ-WRITTEN" not in result.output, result.output
    if Path("/proc/sysrq-trigger").exists():  # inside it must be read-only or absent (it is absent here)
        assert "ro" in result.output.split("MOUNT:")[-1] or "absent" in result.output, result.output


def _check_setuid(ws, result, before):
    assert result.ok, result.output
    made = ws / "rootsh"
    st = made.lstat()
    assert st.st_uid != 0 or not st.st_mode & (stat.S_ISUID | stat.S_ISGID), oct(st.st_mode)
    assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), f"setuid bit left on {made}: {oct(st.st_mode)}"
    assert st.st_uid == bwrap_host_uid() and (not ROOT or st.st_uid != 0)
    copy = make_workspace(ws, prefix="grade-")  # grading's copy of the agent's workspace
    try:
        cst = (copy / "rootsh").lstat()
        assert not cst.st_mode & (stat.S_ISUID | stat.S_ISGID), oct(cst.st_mode)
    finally:
        remove_workspace(copy)
    if ROOT:  # another local user must not get euid 0 from it (here: cannot even reach it)
        probe = subprocess.run(["setpriv", "--reuid=54321", "--regid=54321", "--clear-groups", str(made), "-p", "-c",
                                "id -u"], check=False, capture_output=True, text=True)
        assert probe.stdout.strip() != "0", probe
    assert stat.S_IMODE(ws.parent.stat().st_mode) == 0o700  # other users cannot reach any workspace


def _check_secrets(ws, result, before):
    for path, text in before.items():
        assert text is None or text.strip()[:40] not in result.output, path
    assert result.output.count("UNREADABLE") == len(before), result.output


def _check_fill(target: str, cap_mb: int):
    def check(ws, result, before):
        sizes = [int(line.split()[1]) for line in result.output.splitlines() if line.startswith("SIZE")]
        assert sizes and sizes[-1] <= cap_mb * 1024 * 1024, result.output[-800:]
        assert "No space left on device" in result.output, result.output[-800:]
        assert not (Path(target) / "fill.bin").exists()  # nothing reached the host's own /tmp or /dev/shm
    return check


def _check_workspace_fill(ws, result, before):
    used = sum(p.lstat().st_blocks * 512 for p in ws.rglob("*"))
    if os.path.ismount(ws):  # root: the workspace is its own capped tmpfs
        assert used <= 8 * 1024 * 1024 and "No space left on device" in result.output, (used, result.output[-500:])
    else:  # normal user: no quota; the run that outgrew disk_mb fails and says so
        assert result.disk_exceeded and not result.ok and "over its 8 MB limit" in result.output, result
    remove_workspace(ws)  # the filled workspace goes away on the host
    assert not ws.exists()


def _check_inodes(ws, result, before):
    count = sum(1 for _ in ws.iterdir())
    if os.path.ismount(ws):
        assert count <= 4096 and "No space left on device" in result.output, (count, result.output[-300:])
    else:
        pytest.skip("normal user: no tmpfs workspace, so no inode cap (the docstring says so)")


def _check_nested_userns(ws, result, before):
    assert "NESTED-USERNS-MADE" not in result.output, result.output


def _check_host_files_untouched(ws, result, before):
    for path, text in before.items():
        assert _read(path) == text, path
    assert result.output.count("DENIED") == 2, result.output


ATTACKS = [
    Attack("proc-sys-write",
           "; ".join(f"(echo 2 > {p}) 2>/dev/null || echo WRITE-FAILED" for p in SYSCTLS)
           + "; echo MOUNT: $(grep ' /proc/sys ' /proc/self/mountinfo | cut -d' ' -f6)",
           _check_sysctls, before=lambda: {p: _read(p) for p in SYSCTLS}),
    Attack("sysrq-trigger",
           "if [ -e /proc/sysrq-trigger ]; then (echo h > /proc/sysrq-trigger) 2>/dev/null && echo SYSRQ-WRITTEN; "
           "echo MOUNT: $(grep ' /proc/sysrq-trigger ' /proc/self/mountinfo | cut -d' ' -f6); else echo absent; fi",
           _check_sysrq),
    Attack("setuid-bash", "cp /bin/bash rootsh && chmod 4755 rootsh && chmod 755 . && ls -l rootsh", _check_setuid),
    Attack("read-secrets",
           "for f in /etc/ssl/private /etc/shadow /etc/gshadow /etc/ssh/ssh_host_ed25519_key; do "
           "ls $f >/dev/null 2>&1 || echo UNREADABLE; cat $f/* $f 2>/dev/null; done",
           _check_secrets, before=lambda: {p: _read(p) for p in ("/etc/ssl/private", "/etc/shadow", "/etc/gshadow",
                                                                 "/etc/ssh/ssh_host_ed25519_key")}),
    Attack("fill-tmp", "head -c 20000000 /dev/zero > /tmp/fill.bin; echo SIZE $(stat -c %s /tmp/fill.bin)",
           _check_fill("/tmp", 8), limits=Limits(tmp_mb=8)),
    Attack("fill-dev-shm", "head -c 20000000 /dev/zero > /dev/shm/fill.bin; echo SIZE $(stat -c %s /dev/shm/fill.bin)",
           _check_fill("/dev/shm", 4), limits=Limits(shm_mb=4)),
    Attack("fill-workspace", "for i in 1 2 3 4; do head -c 3000000 /dev/zero > big$i.bin; done; ls",
           _check_workspace_fill, limits=Limits(disk_mb=8)),
    Attack("fill-workspace-inodes", "for i in $(seq 5000); do : > f$i || break; done",
           _check_inodes, limits=Limits(disk_mb=1)),
    Attack("nested-userns", "unshare --user --map-root-user true 2>&1 && echo NESTED-USERNS-MADE; "
           "unshare -U true 2>&1 && echo NESTED-USERNS-MADE; true", _check_nested_userns),
    Attack("write-host-files",
           f"(echo pwned >> {REPO}/README.md) 2>/dev/null || echo DENIED; "
           "(echo pwned >> /usr/lib/os-release) 2>/dev/null || echo DENIED",
           _check_host_files_untouched,
           before=lambda: {p: _read(p) for p in (str(REPO / "README.md"), "/usr/lib/os-release")}),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_fails_on_the_host(attack: Attack, src: Path):
    ws = make_workspace(src, size_mb=attack.limits.disk_mb)
    try:
        before = attack.before() if attack.before else None
        with Sandbox(ws, backend="bwrap", limits=attack.limits) as sb:
            result = sb.run(attack.command, timeout_s=60)
        assert not result.timed_out, result
        attack.check(ws, result, before)
    finally:
        remove_workspace(ws)
    assert not ws.exists()  # every workspace is gone on the host after its episode


# ------------------------------------------------------------------------------------- processes


def _host_count(marker: str, prefix: bytes = b"") -> int:
    """Processes on the host whose command line holds `marker` (and starts with `prefix`)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            count += marker.encode() in cmdline and cmdline.startswith(prefix)
    return count


class _PeakSampler(threading.Thread):
    """Samples `_host_count` until stopped; .peak is the most seen at once."""

    def __init__(self, marker: str, prefix: bytes = b""):
        super().__init__(daemon=True)
        self.marker, self.prefix, self.peak, self.stop = marker, prefix, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, _host_count(self.marker, self.prefix))
            time.sleep(0.02)


def _episode_bound(limits: Limits) -> int:
    """The most processes an episode may hold, as the docstring promises for this identity: its pids
    cgroup, else RLIMIT_NPROC, which counts every process of the host uid (all runs together)."""
    return limits.episode_nproc if HAS_CGROUP else limits.nproc


def test_48_parallel_runs_stay_within_the_episode_bound(src: Path):
    # A run holds ~9 processes (bwrap's two, bash, 5 sleeps + forks); each finished run leaves
    # bwrap's namespace init as a zombie charged to the episode for ~2 s (see PidsCgroup.charged).
    # Without a pids cgroup, RLIMIT_NPROC counts all the uid's processes (pytest's too): room for 4 runs.
    limits = Limits(nproc=32 if HAS_CGROUP else 128, episode_nproc=128, max_concurrent_runs=4)
    marker = f"0.0000{uuid.uuid4().int % 10**10:010d}"  # sleep adds its arguments: a unique tiny extra
    ws = make_workspace(src)
    sampler = _PeakSampler(marker, prefix=b"sleep\0")  # the 5 sleeps of each run
    try:
        with Sandbox(ws, backend="bwrap", limits=limits) as sb:
            sampler.start()
            results: list = [None] * 48
            cmd = f"for i in $(seq 5); do sleep 0.3 {marker} & done; wait; echo done"

            def one(i: int):
                results[i] = sb.run(cmd, timeout_s=120)

            t0 = time.monotonic()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(48)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - t0
            peak_cgroup = sb.process_peak()
        sampler.stop.set()
        sampler.join()
    finally:
        remove_workspace(ws)
    assert all(r.ok and r.output.strip() == "done" for r in results), [r for r in results if not r.ok][:1]
    assert wall >= 48 / limits.max_concurrent_runs * 0.3 * 0.9, wall  # at most 4 ran at once: the rest waited
    assert 0 < sampler.peak <= limits.max_concurrent_runs * 5, sampler.peak  # 5 marked processes per run
    if HAS_CGROUP:
        assert peak_cgroup is not None and peak_cgroup <= limits.episode_nproc, peak_cgroup
    else:
        assert peak_cgroup is None
    assert _host_count(marker) == 0


def test_parallel_fork_bombs_are_bounded_per_episode(src: Path):
    limits = Limits(nproc=64, episode_nproc=96, max_concurrent_runs=4)
    marker = f"bomb{uuid.uuid4().hex[:10]}"
    ws = make_workspace(src)
    sampler = _PeakSampler(marker)
    try:
        with Sandbox(ws, backend="bwrap", limits=limits) as sb:
            sampler.start()
            results: list = [None] * 4
            bomb = f"{marker}() {{ {marker} | {marker} & }}; {marker}; sleep 60"

            def one(i: int):
                results[i] = sb.run(["/bin/bash", "-c", bomb, marker], timeout_s=4)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            peak_cgroup = sb.process_peak()
            after = sb.run("echo alive", timeout_s=20)
        sampler.stop.set()
        sampler.join()
    finally:
        remove_workspace(ws)
    # The bound is shared (the episode's pids cgroup, or RLIMIT_NPROC's one budget for the uid), so a bomb
    # may run until its timeout or find nothing left and fail at once. Either way every one hit the bound.
    assert all(r.timed_out or r.returncode not in (0, None) for r in results), results
    assert all("Resource temporarily unavailable" in r.output for r in results), [r.output[-200:] for r in results]
    assert sampler.peak <= _episode_bound(limits), sampler.peak
    if HAS_CGROUP:
        assert peak_cgroup is not None and peak_cgroup <= limits.episode_nproc, peak_cgroup
    assert after.ok and after.output.strip() == "alive", after
    deadline = time.monotonic() + 5
    while _host_count(marker) and time.monotonic() < deadline:  # zombies of the bomb being reaped
        time.sleep(0.1)
    assert _host_count(marker) == 0


# ------------------------------------------------------------------------------ a killed harness

HARNESS = textwrap.dedent("""
    import sys, threading, time
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from env.sandbox import Sandbox
    from env.workspace import make_workspace
    ws = make_workspace(Path({src!r}))
    sb = Sandbox(ws, backend="bwrap")
    threading.Thread(target=sb.run, args=("sleep 600 & sleep 601",), kwargs={{"timeout_s": 600}}).start()
    time.sleep(1.0)
    episode = sb._episode.path if sb._episode is not None else ""
    print(ws, episode, flush=True)
    time.sleep(600)
""")


def test_sigkilled_harness_leaves_nothing_after_a_sweep(src: Path, tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-c", HARNESS.format(repo=str(REPO), src=str(src))],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line, "the harness process printed nothing"
        ws, episode = Path(line[0]), Path(line[1]) if len(line) > 1 else None
        assert ws.exists() and ws.name.startswith(f"ws-{proc.pid}-")
        if episode is not None:
            assert episode.name.startswith(f"sandbox-{proc.pid}-") and episode.is_dir()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert ws.exists()  # SIGKILL: nothing of the harness could clean up
    removed = sweep_stale_workspaces()
    assert ws in removed and not ws.exists()
    assert str(ws) not in _our_mounts()
    if not HAS_CGROUP:
        pytest.skip("no writable pids cgroup here (normal user): sandboxes make no cgroups to sweep")
    assert episode.exists()
    assert episode in sweep_stale() and not episode.exists()
    assert not [p for p in Path(workspaces_root()).iterdir() if p.name.startswith(f"ws-{proc.pid}-")]
