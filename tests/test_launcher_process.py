"""tools/launcher_process.py's server handling, shared by the tests, the load generators and the engine bench:
spawn, wait_ready (servers started together, one deadline), require_ready, stop. Plain processes, no engine."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import launcher_process
from tools.launcher_process import Server, free_port, require_ready, spawn, stop, wait_ready


def _spawn(tmp_path: Path, name: str, command: list[str]) -> Server:
    port = free_port()
    return spawn([c.format(port=port) for c in command], dict(os.environ), tmp_path / "logs" / f"{name}.log", port,
                 name=name, cwd=tmp_path)


def _ping_server(tmp_path: Path, name: str) -> Server:
    """A server that answers GET /ping 200: Python's file server over a folder holding a file named ping."""
    (tmp_path / "ping").write_text("ok")
    return _spawn(tmp_path, name, [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"])


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


def test_servers_started_together_get_their_outcome_each(tmp_path):
    ok = _ping_server(tmp_path, "ok")
    dead = _spawn(tmp_path, "dead", ["sh", "-c", "echo engine failed; exit 3"])
    slow = _spawn(tmp_path, "slow", ["sleep", "60"])
    lines: list[str] = []
    try:
        wait_ready([ok, dead, slow], timeout=4, report=lines.append)
    finally:
        for s in (ok, dead, slow):
            stop(s.proc, grace=5)
    assert ok.ready_s > 0 and ok.failed is None
    assert dead.failed == "exited with 3" and not dead.ready_s
    assert slow.failed == "not ready by the deadline" and not slow.ready_s
    assert f"ok: ready after {ok.ready_s:.0f} s" in lines
    assert any(ln.startswith("dead: exited with 3; log tail:") and "engine failed" in ln for ln in lines)
    assert ok.host == ok.url.removeprefix("http://")


def test_servers_short_of_min_ready_are_not_waited_for(tmp_path):
    """Two servers to compare, one dead at start: the other is not waited for until the deadline."""
    dead = _spawn(tmp_path, "dead", ["sh", "-c", "exit 1"])
    slow = _spawn(tmp_path, "slow", ["sleep", "60"])
    lines: list[str] = []
    t0 = time.monotonic()
    try:
        wait_ready([dead, slow], timeout=50, report=lines.append, min_ready=2)
    finally:
        for s in (dead, slow):
            stop(s.proc, grace=5)
    assert time.monotonic() - t0 < 20
    assert dead.failed == "exited with 1"
    assert slow.failed == "not waited for: fewer than 2 of the 2 servers can be ready" and not slow.ready_s
    assert lines[-1] == f"slow: {slow.failed}"


def test_a_failed_server_is_reported_with_the_lines_that_name_its_cause(tmp_path):
    """A vLLM engine that dies in its warm-up logs the cause (CUDA out of memory) thousands of characters before its
    last lines, the API server's generic traceback: the report names the cause lines first, then the tail."""
    script = ("import sys\n"
              "print('(APIServer pid=1) WARNING 12-04 12:17:38 [system_utils.py:255] Found ulimit of 20000 and failed"
              " to increase it. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`.')\n"
              "print('[W1204 12:19:25 CUDACachingAllocator.cpp:3933] memory allocation failed with OOM on device 0')\n"
              "print('(EngineCore pid=1) ERROR [core.py:1510] RuntimeError: torch_call_dispatcher API call failed')\n"
              "for i in range(200): print(f'  File frame{{i}}.py, line {{i}}, in f')\n"  # {{ }}: _spawn formats
              "print('RuntimeError: Engine core initialization failed. See root cause above.')\n"
              "sys.exit(1)\n")
    dead = _spawn(tmp_path, "engine", [sys.executable, "-c", script])
    lines: list[str] = []
    try:
        wait_ready([dead], timeout=30, report=lines.append)
    finally:
        stop(dead.proc, grace=5)
    assert dead.failed == "exited with 1"
    (report,) = lines
    cause, tail = report.split("log tail:\n")
    assert cause.startswith("engine: exited with 1; cause lines:\n")
    assert cause.splitlines()[1:] == [
        "[W1204 12:19:25 CUDACachingAllocator.cpp:3933] memory allocation failed with OOM on device 0",
        "(EngineCore pid=1) ERROR [core.py:1510] RuntimeError: torch_call_dispatcher API call failed",
        "RuntimeError: Engine core initialization failed. See root cause above."]
    assert "with OOM" not in tail and tail.rstrip().endswith("See root cause above.")


def test_require_ready_raises_with_the_log_tail(tmp_path):
    dead = _spawn(tmp_path, "dead", ["sh", "-c", "echo no GPU found; exit 1"])
    with pytest.raises(RuntimeError, match="(?s)server exited with 1.*no GPU found"):
        require_ready(dead, timeout=10)


def test_stop_ends_the_servers_whole_session(tmp_path):
    # a child of the server (as the engine core is the launcher's) goes with it
    srv = _spawn(tmp_path, "parent", ["sh", "-c", "sleep 60 & echo $! > child.tmp && mv child.tmp child; wait"])
    for _ in range(100):
        if (tmp_path / "child").exists():
            break
        time.sleep(0.05)
    child = int((tmp_path / "child").read_text())
    stop(srv.proc, grace=5)
    assert srv.proc.poll() is not None
    for _ in range(50):
        if _gone(child):
            break
        time.sleep(0.1)
    assert _gone(child), "the server's child outlived stop()"


def test_a_server_is_ready_on_its_own_path(tmp_path):
    """A server told another readiness path (SGLang's /health) is ready when that path answers 200, whatever /ping
    says; one left at /ping waits for /ping."""
    (tmp_path / "health").write_text("ok")  # the file server answers /health, and /ping with 404
    cmd = [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
    health_port, ping_port = free_port(), free_port()
    health = spawn([c.format(port=health_port) for c in cmd], dict(os.environ), tmp_path / "logs" / "h.log",
                   health_port, name="health", cwd=tmp_path, ready_path="/health")
    ping = spawn([c.format(port=ping_port) for c in cmd], dict(os.environ), tmp_path / "logs" / "p.log", ping_port,
                 name="ping", cwd=tmp_path)
    try:
        wait_ready([health, ping], timeout=4)
    finally:
        for s in (health, ping):
            stop(s.proc, grace=5)
    assert health.ready_s > 0 and health.failed is None and health.ready_path == "/health"
    assert ping.failed == "not ready by the deadline" and ping.ready_path == "/ping"


def test_a_servers_session_is_never_less_nice_than_its_spawner(tmp_path):
    """spawn from a process at nice 5: the server runs at 5 plus what spawn was asked for, and so does its session's
    scheduling group (Linux autogroup, where the kernel has it), which is what weighs against other sessions."""
    code = ("import os, sys, time; from pathlib import Path; from tools.launcher_process import spawn, stop; "
            "os.nice(5); s = spawn(['sleep', '30'], dict(os.environ), Path(sys.argv[1]), 1, nice=int(sys.argv[2])); "
            "time.sleep(0.3); g = Path(f'/proc/{s.proc.pid}/autogroup'); "
            "print(os.getpriority(os.PRIO_PROCESS, s.proc.pid), g.read_text().split()[-1] if g.exists() else '-'); "
            "stop(s.proc, grace=1)")
    autogroup = Path("/proc/self/autogroup").exists()
    for asked, expected in ((0, "5"), (3, "8"), (30, "19")):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"{asked}.log"), str(asked)],
                             capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1])
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == [expected, expected if autogroup else "-"], (asked, out.stdout)


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice():
    """A server's port is one the kernel never hands out for bind(0) or a client socket (vLLM's own free ports, every
    HTTP connection of the suite): none can take it between the pick and the server's bind."""
    low, _ = launcher_process.ephemeral_range()
    ports = [launcher_process.free_port() for _ in range(100)]
    assert len(set(ports)) == 100
    assert all(low - launcher_process.PORTS_BELOW_EPHEMERAL <= p < low for p in ports), (low, min(ports), max(ports))
    with socket.socket() as s:  # and it is free: a listener can take it
        s.bind(("127.0.0.1", ports[-1]))
        s.listen()
