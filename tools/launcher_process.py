"""Start, wait for and stop servers on a free loopback port: the launcher (./entrypoint.sh serve -> the real
engine), or any command that answers a readiness path with 200 (/ping: the engine bench's vLLM arms; SGLang's
/health).

Shared by the tests' fixtures (tests/conftest.py), the load generators (bench/http/) and
the engine bench (bench/e2e); no pytest here, so a plain script can import it.
"""
from __future__ import annotations

import http.client
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping
from urllib.parse import urlsplit

from serving.paths import ROOT


# Ports are picked below the kernel's ephemeral range: a port the kernel hands out for bind(0) or an outgoing
# connection (every client socket, vLLM's own free ports for its engine processes) can be taken by another process
# between the pick and the server's bind, which then fails with "Address already in use".
_PICKED: set[int] = set()
_PICK_LOCK = threading.Lock()
PORTS_BELOW_EPHEMERAL = 8000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux; elsewhere the IANA range)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def free_port() -> int:
    """A loopback port nothing listens on, below the ephemeral range and never handed out twice by this process;
    bind(0)'s port where the range leaves no room below it."""
    low, _ = ephemeral_range()
    first = max(1024, low - PORTS_BELOW_EPHEMERAL)
    with _PICK_LOCK:
        for port in random.sample(range(first, low), low - first) if low - first >= 64 else ():
            if port in _PICKED:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _PICKED.add(port)
            return port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path
    model: str = ""
    started: float = 0.0  # time.monotonic() at spawn
    ready_s: float = 0.0  # spawn to /ping 200 (0 until then)
    name: str = ""  # what progress lines and reports call it
    failed: str | None = None  # why it will not serve: "exited with N", "not ready by the deadline"
    ready_path: str = "/ping"  # the GET that answers 200 once the server serves

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def failure_log(self, tail: int = 2500) -> str:
        """The lines of its log that name a cause, then its last `tail` characters: a server that dies in its
        engine's start ends its log with the API server's generic traceback, thousands of characters after the
        cause (CUDA running out of memory in a warm-up, on the H200)."""
        log = self.log()
        causes = cause_lines(log)
        return (f"cause lines:\n{chr(10).join(causes)}\n" if causes else "") + f"log tail:\n{log[-tail:]}"


# A log line that names why a process died, as CUDA, PyTorch, the kernel and Python word it; vLLM's own DEBUG, INFO
# and WARNING lines (level, then the date) are not causes, whatever they mention
_CAUSE = re.compile(r"out of memory|with OOM|CUDA error|No space left on device|\bKilled\b|\b\w*(Error|Exception): ")
_NOT_CAUSE = re.compile(r"\b(DEBUG|INFO|WARNING) \d\d-\d\d ")
CAUSE_LINES = 4


def cause_lines(log: str, limit: int = CAUSE_LINES) -> list[str]:
    """The first `limit` distinct lines of a log that name a cause (_CAUSE), each cut to 300 characters."""
    out: list[str] = []
    for line in log.splitlines():
        line = line.strip()[:300]
        if _CAUSE.search(line) and not _NOT_CAUSE.search(line) and line not in out:
            out.append(line)
            if len(out) == limit:
                break
    return out


SESSION_GUARD = Path(__file__).resolve().parent / "session_guard.py"


def guarded(command: list[str], nice: int | None = None) -> list[str]:
    """command, run through tools/session_guard.py: started with Popen(start_new_session=True), it keeps the Popen's
    pid, and every process of its session ends when this process dies (SIGKILL included) or shortly after the
    command's own process exits. nice: the command's absolute CPU priority, set before it starts."""
    return [sys.executable, "-I", "-S", str(SESSION_GUARD), str(os.getpid()),
            *(["--nice", str(nice)] if nice is not None else []), "--", *command]


def start_session(command: list[str], env: Mapping[str, str], stdout, cwd: Path | None = None,
                  nice: int = 0) -> subprocess.Popen:
    """Start command in a session of its own whose life is tied to this process's (guarded: stop() ends it and
    every process it started; so does this process's death), stdout and stderr into the open file stdout. nice > 0
    runs the whole session at that much lower CPU priority than the caller's (see yield_cpu): a session is never
    less nice than the process that started it."""
    session_nice = min(19, nice + os.getpriority(os.PRIO_PROCESS, 0))
    proc = subprocess.Popen(guarded(command, session_nice if nice else None), stdout=stdout,
                            stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    if nice:  # at once, as the guard sets it itself: the session's first process runs at it from its start
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, session_nice)
        except OSError:
            pass
    if session_nice:
        yield_cpu(proc.pid, session_nice)
    return proc


def spawn(command: list[str], env: dict[str, str], log_path: Path, port: int, *, name: str = "", model: str = "",
          cwd: Path | None = None, nice: int = 0, ready_path: str = "/ping") -> Server:
    """Start a server's command, its output into log_path, in a session of its own at CPU priority `nice`
    (start_session), without waiting for it: wait_ready does (GET ready_path until 200)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = start_session(command, env, log, cwd, nice)
    return Server(f"http://127.0.0.1:{port}", proc, log_path, model=model, started=started, name=name,
                  ready_path=ready_path)


def ping_status(srv: Server) -> int | None:
    """One GET of the server's ready_path (/ping unless spawn was told otherwise): its HTTP status, None when nothing
    answers (http.client, not urllib: no proxy variable of the host can reroute loopback)."""
    # SGLang's /health can run a one-token generation before it answers: more than /ping's 2 s at a cold start
    conn = http.client.HTTPConnection(srv.host, timeout=2 if srv.ready_path == "/ping" else 30)
    try:
        conn.request("GET", srv.ready_path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def answers_ping(srv: Server) -> bool:
    """True when the server's ready_path answers 200 (ping_status)."""
    return ping_status(srv) == 200


def wait_ready(servers: list[Server], timeout: float, report: Callable[[str], None] | None = None,
               min_ready: int = 0) -> None:
    """Poll each server's ready_path (/ping) until every one answers 200 or has failed, recording its ready_s or why it
    failed: its process exited, or it was not ready `timeout` seconds from now (servers that start together
    share the deadline). `report` gets a line on each server's outcome (a failure's with its log tail).

    With min_ready, once the failures leave fewer than min_ready servers that can still be ready, the rest are not
    waited for (failed: "not waited for: ..."): a comparison short of its arms is not worth their start."""
    end = time.monotonic() + timeout
    while waiting := [s for s in servers if not s.ready_s and s.failed is None]:
        if len(servers) - sum(s.failed is not None for s in servers) < min_ready:
            for s in waiting:
                s.failed = f"not waited for: fewer than {min_ready} of the {len(servers)} servers can be ready"
                if report:
                    report(f"{s.name}: {s.failed}")
            return
        for s in waiting:
            if s.proc.poll() is not None:
                s.failed = f"exited with {s.proc.returncode}"
            elif answers_ping(s):
                s.ready_s = time.monotonic() - s.started
                if report:
                    report(f"{s.name}: ready after {s.ready_s:.0f} s")
                continue
            elif time.monotonic() >= end:
                s.failed = "not ready by the deadline"
            else:
                continue
            if report:
                report(f"{s.name}: {s.failed}; {s.failure_log()}")
        if any(not s.ready_s and s.failed is None for s in servers):
            time.sleep(1)


def require_ready(srv: Server, timeout: float = 420) -> Server:
    """wait_ready for one server; RuntimeError with its log tail if it fails."""
    wait_ready([srv], timeout)
    if srv.failed:
        raise RuntimeError(f"server {srv.failed} (waited up to {timeout:.0f} s): {srv.failure_log(4000)}")
    return srv


def spawn_launcher(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None,
                   nice: int = 0, base_env: Mapping[str, str] | None = None) -> Server:
    """Run ./entrypoint.sh serve with no model directory (the embedded model unless env_extra names one), without
    waiting for it: await_ready does.

    nice > 0 runs the server's whole session at that lower CPU priority (see yield_cpu). The server's
    environment is base_env (default: this process's) with the launcher's loopback settings and env_extra."""
    port = free_port()
    env = dict(os.environ if base_env is None else base_env)
    env.update({
        "SERVING_MODEL_DIR": str(tmp / "no-model-dir"),  # no /opt/ml/model here: the embedded model is served
        "OPTION_HOST": "127.0.0.1",
        "OPTION_PORT": str(port),
        "VLLM_CPU_OMP_THREADS_BIND": "auto",
        # sticky sessions in a folder of this server's own: servers of one host would otherwise share
        # /dev/shm/sagemaker_sessions, where one server's session bookkeeping removes another's sessions
        "OPTION_SESSIONS_PATH": str(tmp / f"sessions-{port}"),
    })
    env.update(env_extra or {})
    command = [str(ROOT / "entrypoint.sh"), "serve", *(args or [])]
    return spawn(command, env, tmp / f"server-{port}.log", port, model=env.get("OPTION_MODEL_ID", ""), nice=nice)


def await_ready(srv: Server, timeout: float = 420, stop_grace: float = 30) -> Server:
    """Wait for a spawned server's /ping 200 (stopping it if it fails), and record its time to ready."""
    try:
        return require_ready(srv, timeout)
    except BaseException:
        stop(srv.proc, stop_grace)
        raise


def start_launcher(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None,
                   timeout: float = 420, stop_grace: float = 30, nice: int = 0) -> Server:
    """spawn_launcher, then await_ready."""
    return await_ready(spawn_launcher(tmp, env_extra, args, nice), timeout, stop_grace)


def yield_cpu(pid: int, nice: int) -> None:
    """Give the session led by pid (the server and the engine processes it starts) a lower CPU
    priority than the tests' own process.

    On a 2-core machine the CPU engine's busy processes kept the test process off the CPU for
    seconds while they generated: the hang-up test in tests/test_lmi_invocations.py read its first
    streamed line only after all 2,000 tokens (up to 7.3 s), so there was nothing left to abort.
    Linux schedules each session as one group (autogroup): the group's nice is what weighs against
    the test process; the `nice` the server is started under covers kernels without autogroup.
    """
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass  # not Linux, or no autogroup: the per-process nice is what we have


def stop(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM the server's process group; SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
