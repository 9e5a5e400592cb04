"""Run a command where it cannot see the processes that started it: ``python -m bridges.runtime.isolate -- CMD...``.

Why: an agent being trained is untrusted code, and starting it with a clean environment
(``bridges.agents.agent_run.agent_environment``) is not enough: ``/proc/<pid>/environ`` of its parent,
the trainer, and of every ancestor (the shell that exported the user's keys) holds their secrets, and a
process of the same user may read them (root reads them whatever the owner). So the command runs in new
PID and mount namespaces with a ``/proc`` of their own: it sees only its own processes, no ancestor at all.

How: this launcher unshares (as root: PID + mount; otherwise a user namespace too, mapping the user to
itself), forks the namespace's first process (PID 1: it mounts ``/proc``, starts the command as PID 2,
reaps, and exits with the command's status), and waits for it. Whatever ends (the command, PID 1, this
launcher, the trainer: each child asks for SIGKILL when its parent dies), the kernel ends every process
in the namespace with its PID 1: nothing the agent starts outlives its rollout. Standard input and
output pass through unchanged.

Where namespaces are not permitted (a kernel or container that forbids them) the launcher exits with
``UNAVAILABLE``; ``available()`` asks once, so the caller decides (``agent_run`` then runs the command
directly, with the trainer marked non-dumpable, and says so once: its own environment and memory are
then unreadable to a process of the same user, but not its ancestors', and py-spy cannot attach to it
without root).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER = 0x00020000, 0x20000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
UNAVAILABLE = 125  # the launcher's exit status when this kernel refuses the namespaces


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _enter_namespaces() -> None:
    """New PID and mount namespaces (and a user namespace when not root, mapping this user to itself)."""
    libc = _libc()
    if os.geteuid() == 0:
        _check(libc.unshare(CLONE_NEWPID | CLONE_NEWNS), "unshare")
        return
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS), "unshare")
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        with open(path, "w") as handle:
            handle.write(text)


def _first_process(argv: list[str]) -> int:
    """PID 1 of the new namespace: its own /proc, the command as PID 2, every orphan reaped."""
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    child = subprocess.Popen(argv)  # inherits stdin, stdout, stderr and the environment
    while True:
        pid, status = os.wait()
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code  # killed by signal k: 128 + k, as a shell says


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m bridges.runtime.isolate -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        _enter_namespaces()
    except OSError as exc:
        print(f"isolate: namespaces are not available here ({exc.strerror}).", file=sys.stderr)
        return UNAVAILABLE
    pid = os.fork()
    if pid == 0:  # PID 1 of the new namespace
        try:
            os._exit(_first_process(argv[1:]))
        except BaseException as exc:  # noqa: BLE001 - a failed mount or exec: one line, then out
            print(f"isolate: {exc}", file=sys.stderr, flush=True)
            os._exit(UNAVAILABLE)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


@functools.cache
def available() -> bool:
    """Whether a command can run isolated here (asked once: a launcher runs ``true``)."""
    if not sys.platform.startswith("linux"):
        return False
    done = subprocess.run([sys.executable, "-m", "bridges.runtime.isolate", "--", "true"], capture_output=True,
                          timeout=30, check=False)
    return done.returncode == 0


def mark_undumpable() -> None:
    """This process's environment and memory unreadable to other processes of its user (no root)."""
    _libc().prctl(PR_SET_DUMPABLE, 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
