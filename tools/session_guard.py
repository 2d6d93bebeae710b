"""Run a command so that its whole session ends when the process that started it dies.

    python -I -S tools/session_guard.py STARTER_PID [--nice N] -- COMMAND [ARGS...]

Started in a session of its own (Popen(start_new_session=True), as tools/launcher_process.start_session does), this
script forks a guard and then execs COMMAND, so COMMAND keeps this process's pid (the caller's Popen.pid, the
session's id). The guard, a member of the same session but no child of COMMAND, waits until either

- the starter (STARTER_PID, which must be this process's parent) dies, by any means, SIGKILL included: it sends
  SIGTERM to every process of the session, gives them TERM_GRACE_S, then SIGKILLs what is left; or
- COMMAND's process exits: it gives the session's other processes EXIT_GRACE_S to exit on their own, then SIGKILLs
  them.

and then exits. --nice N sets the session's CPU priority (absolute, as setpriority does) before anything else.
Processes are found by their session id (/proc/PID/stat), never by name. The guard ignores SIGTERM,
SIGINT and SIGHUP, so a stop signal sent to the process group reaches COMMAND's processes only; a SIGKILL of the group
ends the guard with them.

A parent-death signal (PR_SET_PDEATHSIG) would not do: it fires when the starter's *thread* exits, and the tests
start servers from a thread that ends long before the servers should. Standard library only: `-I -S` start it fast.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time

TERM_GRACE_S = 5.0
EXIT_GRACE_S = 10.0
KILL_BOUND_S = 5.0
POLL_S = 0.1


def session_members(sid: int) -> list[int]:
    """The pids of the processes whose session id is sid, this process left out."""
    out = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != b"Z":
            out.append(int(name))
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_empty(sid: int, seconds: float) -> list[int]:
    """Wait up to `seconds` for the session to have no member but this process; what is left."""
    end = time.monotonic() + seconds
    while (left := session_members(sid)) and time.monotonic() < end:
        time.sleep(POLL_S)
    return left


def end_session(sid: int, grace: float, term: bool) -> None:
    """SIGTERM the session's processes (if term), wait up to grace for them to exit, SIGKILL the rest until none is
    left (bounded: a process can fork while it is killed)."""
    if term:
        _signal_all(session_members(sid), signal.SIGTERM)
    left = _wait_empty(sid, grace)
    end = time.monotonic() + KILL_BOUND_S
    while left and time.monotonic() < end:
        _signal_all(left, signal.SIGKILL)
        left = _wait_empty(sid, POLL_S * 5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _wait_either(starter_fd: int | None, starter: int, command_fd: int | None, command: int) -> bool:
    """Block until the starter or the command's process exits; True when it was the starter."""
    if starter_fd is not None and command_fd is not None:
        ready, _, _ = select.select([starter_fd, command_fd], [], [])
        return starter_fd in ready
    while True:  # no pidfd (a kernel before 5.3): poll
        if not _alive(starter):
            return True
        if not _alive(command):
            return False
        time.sleep(0.5)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def guard(sid: int, starter: int, starter_fd: int | None, command: int, command_fd: int | None) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # hold no end of a pipe the starter reads the command's output from
        os.dup2(devnull, fd)
    os.close(devnull)
    if _wait_either(starter_fd, starter, command_fd, command):
        end_session(sid, TERM_GRACE_S, term=True)
    else:
        end_session(sid, EXIT_GRACE_S, term=False)


def main(argv: list[str]) -> None:
    nice = None
    if len(argv) > 2 and argv[1] == "--nice" and argv[2].isdigit():
        nice, argv = int(argv[2]), argv[:1] + argv[3:]
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        sys.exit("usage: session_guard.py STARTER_PID [--nice N] -- COMMAND [ARGS...]")
    if nice is not None:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    starter, command = int(argv[0]), argv[2:]
    starter_fd = _pidfd(starter)  # opened before the check below: the pid cannot be reused under it after that
    if os.getppid() != starter:
        sys.exit(f"session_guard: the starter {starter} is gone (parent now {os.getppid()}); not starting the command")
    me = os.getpid()
    command_fd = _pidfd(me)  # this process, which becomes COMMAND at the exec below
    first = os.fork()
    if first == 0:  # a child that forks the guard and exits at once: the guard is then no child of COMMAND
        try:
            if os.fork() == 0:
                guard(os.getsid(0), starter, starter_fd, me, command_fd)
        finally:
            os._exit(0)
    os.waitpid(first, 0)
    os.execvp(command[0], command)  # the pidfds close here (pidfd_open sets close-on-exec)


if __name__ == "__main__":
    main(sys.argv[1:])
