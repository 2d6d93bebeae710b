"""A suite killed from outside (a CI timeout, a SIGKILL of pytest) leaves no server running: every server the tests
start (tools/launcher_process.start_session, which tests/conftest.py's fixtures use) lives in a session tied to the
life of the process that started it (tools/session_guard.py).

Each test starts servers the suite's way in a child Python, SIGKILLs that child, and checks that no process of the
server's session is left within a bound. Processes are identified by their session id, never by name.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tools.session_guard import KILL_BOUND_S, TERM_GRACE_S, session_members

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
GONE_BOUND_S = TERM_GRACE_S + KILL_BOUND_S + 5  # the guard's SIGTERM grace, its SIGKILL rounds, and slack


def _starter(code: str, tmp: Path) -> subprocess.Popen:
    """A child Python that runs `code` (which prints the started server's pid, its session's id) and then sleeps
    until it is killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    return subprocess.Popen([sys.executable, "-c", code + "\nimport time; time.sleep(600)", str(tmp)], cwd=TESTS,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_pid(starter: subprocess.Popen) -> int:
    line = starter.stdout.readline()
    if not line.strip().isdigit():
        starter.kill()
        pytest.fail(f"the starter printed no pid: {line!r}\n{starter.communicate(timeout=10)[1][-3000:]}")
    return int(line)


def _kill_and_check_session_ends(starter: subprocess.Popen, sid: int) -> None:
    assert len(session_members(sid)) >= 2, "the session held fewer processes than started"
    starter.send_signal(signal.SIGKILL)
    starter.wait(10)
    t0 = time.monotonic()
    while (left := session_members(sid)) and time.monotonic() - t0 < GONE_BOUND_S:
        time.sleep(0.2)
    if left:  # do not leave them running for the rest of the suite
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not left, f"processes of the server's session {sid} outlived their starter by {GONE_BOUND_S} s: {left}"


def test_a_session_ends_with_the_process_that_started_it(tmp_path):
    """A server with a child in a process group of its own, as a shell's job control or an engine may put one: all
    of its session goes when its starter is SIGKILLed."""
    server = ("import subprocess, time; subprocess.Popen(['sleep', '600'], process_group=0); "
              "subprocess.Popen(['sleep', '600']); time.sleep(600)")
    code = ("import sys; from pathlib import Path; from tools.launcher_process import start_session; "
            f"p = start_session([sys.executable, '-c', {server!r}], {{'PATH': '/usr/bin:/bin'}}, "
            "open(Path(sys.argv[1]) / 'server.log', 'wb'), nice=5); print(p.pid, flush=True)")
    starter = _starter(code, tmp_path)
    sid = _read_pid(starter)
    t0 = time.monotonic()
    while len(session_members(sid)) < 4 and time.monotonic() - t0 < 30:  # the server, the guard, two sleeps
        time.sleep(0.1)
    groups = {os.getpgid(pid) for pid in session_members(sid)}
    assert len(groups) >= 2, f"the sleeps did not get process groups of their own: {groups}"
    _kill_and_check_session_ends(starter, sid)


ENGINE_PID = re.compile(r"\(EngineCore\w* pid=(\d+)\)")  # vLLM's prefix on the engine core process's log lines


@pytest.mark.engine
def test_an_engine_server_ends_with_the_suite(tmp_path):
    """The launcher started by conftest's spawn_server (the fixtures' helper) on the real CPU engine: once vLLM's
    engine core process runs (its pid in the server's log), SIGKILL the process that spawned the server; the
    launcher, the engine core and every other process of its session are gone within the bound."""
    code = ("import sys; from pathlib import Path; from conftest import EAGER, spawn_server; "
            "s = spawn_server(Path(sys.argv[1]), EAGER); print(s.proc.pid, flush=True)")
    starter = _starter(code, tmp_path)
    sid = _read_pid(starter)
    engine, log = None, ""
    t0 = time.monotonic()
    while engine is None and time.monotonic() - t0 < 240 and sid in session_members(sid):
        logs = list(tmp_path.glob("server-*.log"))
        log = logs[0].read_text(errors="replace") if logs else ""
        if (m := ENGINE_PID.search(log)) and int(m[1]) in session_members(sid):
            engine = int(m[1])
        time.sleep(0.5)
    try:
        assert engine is not None, f"no engine core process ran in the server's session within 240 s:\n{log[-3000:]}"
    finally:
        _kill_and_check_session_ends(starter, sid)
    assert not psutil.pid_exists(engine) or psutil.Process(engine).status() == psutil.STATUS_ZOMBIE
