"""Start and stop the launcher (./entrypoint.sh serve -> the real engine) on a free loopback port.

Shared by the tests' fixtures (tests/conftest.py) and the load generator
(bench/lmi_vs_openai.py); no pytest here, so a plain script can import it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from serving.paths import ROOT



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path
    model: str
    started: float = 0.0  # time.monotonic() at spawn
    ready_s: float = 0.0  # spawn to /ping 200

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 420) -> None:
    """Poll /ping (bounded) until 200; fail with the server's log tail if it dies or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/ping", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not ready after {timeout}s:\n{log_path.read_text()[-4000:]}")


def spawn_launcher(tmp: Path, env_extra: dict[str, str] | None = None, args: list[str] | None = None,
                   nice: int = 0) -> Server:
    """Run ./entrypoint.sh serve with no model directory (the embedded model unless env_extra names one), without
    waiting for it: await_ready does.

    nice > 0 runs the server's whole session at that lower CPU priority (see yield_cpu)."""
    port = free_port()
    env = dict(os.environ)
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
    log_path = tmp / f"server-{port}.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        command = [str(ROOT / "entrypoint.sh"), "serve", *(args or [])]
        proc = subprocess.Popen((["nice", "-n", str(nice)] if nice else []) + command, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    if nice:
        yield_cpu(proc.pid, nice)
    return Server(f"http://127.0.0.1:{port}", proc, log_path, model=env.get("OPTION_MODEL_ID", ""), started=started)


def await_ready(srv: Server, timeout: float = 420, stop_grace: float = 30) -> Server:
    """Wait for a spawned server's /ping 200 (stopping it if it fails), and record its time to ready."""
    try:
        wait_ready(srv.url, srv.proc, srv.log_path, timeout)
    except BaseException:
        stop(srv.proc, stop_grace)
        raise
    srv.ready_s = srv.ready_s or time.monotonic() - srv.started
    return srv


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
