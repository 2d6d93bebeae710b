"""The group link: the launchers of a group watch each other, so a host that dies ends the whole group.

vLLM's multi-node engine notices a lost host only at its next step (a collective that fails), and a headless worker
outlives its leader. So each launcher runs this link beside its engine, in a process of its own:

- the leader's link listens on group_port; each worker's link connects to it, says its rank, and both send a byte
  every HEARTBEAT_S (the leader's says whether its /ping answers 200);
- a worker whose connection ends, or is silent for SILENCE_S (a host that died sends nothing), makes the leader's
  link end the leader's engine: its engine core is killed, so the launcher's engine-death handling ends the streams in
  flight, /ping answers 503 and the leader exits 4 (a worker lost while the engine starts fails the start, non-zero);
  so does a group whose workers have not all joined within group_join_timeout;
- a leader whose connection ends or goes silent makes each worker's link stop that worker's engine (SIGTERM, then
  SIGKILL after STOP_GRACE_S), so the worker exits;
- a worker's link answers GET /ping on the worker's port: 200 while it is joined and the leader's /ping answers 200,
  else 503, which `python -m serving --healthcheck` and a platform's HTTP probe read.

Each link ends when the engine process it watches is gone.

    python -m serving.group_link leader --port P --workers N --watch PID --join-timeout S --ping-url URL
    python -m serving.group_link worker --leader HOST --port P --rank R --watch PID --host H --health-port Q
"""
from __future__ import annotations

import argparse
import select
import http.server
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

log = logging.getLogger("serving.group")

HEARTBEAT_S = 1.0
PING_POLL_S = 5.0     # how often the leader's link reads the leader's /ping (each read is a line of its access log)
SILENCE_S = 10.0      # nothing from the other side this long: it is gone
STOP_GRACE_S = 10.0   # SIGTERM to SIGKILL of an engine the link stops
LISTEN_BOUND_S = 30.0  # from the leader's link started to its port listening
LISTENING = b"listening"  # the leader's link's one line on its stdout, once its port listens
ENDING_S = 30.0       # from the leader's engine core killed to the launcher stopped, where it has not exited
SERVING, JOINING, WORKER_BEAT = b"S", b"J", b"H"
ENGINE_CORE_TITLE = "VLLM::EngineCor"  # vLLM's engine core process title, as /proc/PID/comm cuts it (15 bytes)


def reachable(host: str, port: int, timeout: float) -> bool:
    """Whether host:port accepts a TCP connection within timeout seconds (tried once a second)."""
    end = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(0.1, end - time.monotonic()))):
                return True
        except OSError:
            if time.monotonic() + 1 > end:
                return False
            time.sleep(1)


def spawn(args: list[str], stdout=None) -> subprocess.Popen:
    """This module in a child process of the caller (its process group: a stop of the group reaches it)."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x))
    return subprocess.Popen([sys.executable, "-m", "serving.group_link", *args], env=env, stdout=stdout)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def descendants(pid: int) -> list[int]:
    """Every live process under pid (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def end_leader_engine(pid: int, why: str) -> None:
    """Kill the engine core under the leader's launcher pid (its engine-death handling then exits 4); where no engine
    core runs yet, SIGTERM the launcher, then SIGKILL."""
    log.error("group: %s; ending the leader's engine", why)
    cores = [c for c in descendants(pid) if _comm(c).startswith(ENGINE_CORE_TITLE)]
    for c in cores:
        _signal(c, signal.SIGKILL)
    if not cores:
        _stop(pid)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _stop(pid: int) -> None:
    _signal(pid, signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.2)
    if alive(pid):
        for c in [pid, *descendants(pid)]:
            _signal(c, signal.SIGKILL)


def _local_ping(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class Leader:
    """The leader's side: every worker's connection, and the leader's /ping to tell them."""

    def __init__(self, port: int, host: str, workers: int, watch: int, join_timeout: float, ping_url: str):
        self.workers, self.watch, self.ping_url = workers, watch, ping_url
        self.join_deadline = time.monotonic() + join_timeout
        self.joined: set[int] = set()
        self.state = JOINING
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.server = socket.create_server((host, port), reuse_port=False)
        self.server.settimeout(1.0)

    def fail(self, why: str) -> None:
        with self.lock:
            if self.done.is_set():
                return
            self.done.set()
        end_leader_engine(self.watch, why)

    def run(self) -> int:
        threading.Thread(target=self._poll_ping, daemon=True).start()
        while not self.done.is_set():
            if not alive(self.watch):
                return 0
            with self.lock:
                missing = self.workers - len(self.joined)
            if missing and time.monotonic() > self.join_deadline:
                self.fail(f"{missing} of {self.workers} worker(s) did not join within the group's join timeout")
                break
            try:
                conn, addr = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()
        # the engine is ending: stay until it is gone, so no worker rejoins this leader; stop it past the bound
        end = time.monotonic() + ENDING_S
        while alive(self.watch) and time.monotonic() < end:
            time.sleep(0.5)
        if alive(self.watch):
            log.error("group: the leader's engine did not end within %.0f s of the group's failure; stopping it",
                      ENDING_S)
            _stop(self.watch)
        return 0

    def _poll_ping(self) -> None:
        while not self.done.is_set():
            self.state = SERVING if _local_ping(self.ping_url) else JOINING
            self.done.wait(PING_POLL_S)

    def _serve(self, conn: socket.socket, addr) -> None:
        conn.settimeout(SILENCE_S)
        rank = None
        try:
            hello = conn.recv(64)
            if not hello.startswith(b"R"):
                return
            rank = int(hello[1:].split(b"\n")[0])
            with self.lock:
                if rank in self.joined:  # a second connection of a rank that joined: the group has changed
                    rank = None
                    return
                self.joined.add(rank)
            log.info("group: worker rank %d joined from %s (%d of %d)", rank, addr[0], len(self.joined), self.workers)
            heard = last = time.monotonic()
            conn.settimeout(HEARTBEAT_S)
            while not self.done.is_set():
                if time.monotonic() - last >= HEARTBEAT_S:
                    conn.sendall(self.state)
                    last = time.monotonic()
                try:
                    got = conn.recv(64)
                except TimeoutError:
                    got = None
                if got == b"":
                    raise ConnectionError("its connection closed")
                if got:
                    heard = time.monotonic()
                if time.monotonic() - heard > SILENCE_S:
                    raise ConnectionError(f"silent for {SILENCE_S:.0f} s")
        except (OSError, ValueError, ConnectionError) as e:
            if rank is not None:
                self.fail(f"worker rank {rank} left the group ({e})")
        finally:
            conn.close()


class Worker:
    """A worker's side: its connection to the leader, and its /ping."""

    def __init__(self, leader: str, port: int, rank: int, watch: int):
        self.leader, self.port, self.rank, self.watch = leader, port, rank, watch
        self.joined = False
        self.leader_serving = False

    def serving(self) -> bool:
        return self.joined and self.leader_serving and alive(self.watch)

    def health_server(self, host: str, port: int) -> http.server.ThreadingHTTPServer:
        link = self

        class Ping(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 -- http.server's name
                if self.path.split("?")[0] != "/ping":
                    self.send_error(404)
                    return
                ok = link.serving()
                body = (b'{"status": "serving"}' if ok else
                        b'{"status": "joining"}' if link.joined else b'{"status": "not joined"}')
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # the platform probes every few seconds: no line each
                pass

        srv = http.server.ThreadingHTTPServer((host, port), Ping)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def run(self) -> int:
        try:
            conn = socket.create_connection((self.leader, self.port), timeout=SILENCE_S)
            conn.sendall(f"R{self.rank}\n".encode())
        except OSError as e:
            return self._leader_gone(f"the leader's group link {self.leader}:{self.port} did not answer ({e})")
        self.joined = True
        log.info("group: rank %d joined the leader's group link at %s:%d", self.rank, self.leader, self.port)
        heard = last = time.monotonic()
        conn.settimeout(HEARTBEAT_S)
        while True:
            if not alive(self.watch):
                conn.close()
                return 0
            try:
                got = conn.recv(64)
            except TimeoutError:
                got = None
            except OSError as e:
                return self._leader_gone(f"the connection to the leader failed ({e})")
            if got == b"":
                return self._leader_gone("the leader closed the group link")
            if got:
                heard = time.monotonic()
                self.leader_serving = got[-1:] == SERVING
            if time.monotonic() - heard > SILENCE_S:
                return self._leader_gone(f"the leader was silent for {SILENCE_S:.0f} s")
            if time.monotonic() - last >= HEARTBEAT_S:
                try:
                    conn.sendall(WORKER_BEAT)
                except OSError as e:
                    return self._leader_gone(f"the connection to the leader failed ({e})")
                last = time.monotonic()

    def _leader_gone(self, why: str) -> int:
        self.joined = False
        log.error("group: %s; stopping this worker (rank %d)", why, self.rank)
        _stop(self.watch)
        return 0


def loopback_if_wildcard(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host


def start(g, host: str, port: int) -> str | None:
    """Start this host's link beside the engine about to start in this process (g: a serving.group.Group; host and
    port: the HTTP server's, which a worker's /ping takes). None when started; for a worker whose leader's link does
    not answer within the group's join timeout, the one-line configuration error."""
    watch = str(os.getpid())
    if g.is_leader:
        local = loopback_if_wildcard(host)
        url = f"http://{'[' + local + ']' if ':' in local else local}:{port}/ping"
        args = ["leader", "--host", host or "0.0.0.0", "--port", str(g.port), "--workers", str(g.size - 1),
                "--watch", watch, "--join-timeout", str(g.join_timeout), "--ping-url", url]
        link = spawn(args, stdout=subprocess.PIPE)
        ready, _, _ = select.select([link.stdout], [], [], LISTEN_BOUND_S)
        said = (link.stdout.readline().decode(errors="replace").strip() if ready
                else f"no answer in {LISTEN_BOUND_S:.0f} s")
        if said == LISTENING.decode():
            return None
        link.kill()
        return (f"group_port: the leader's group link cannot listen on {host or '0.0.0.0'}:{g.port} "
                f"({said or 'it exited'})")
    log.info("group: waiting up to %d s for the leader's group link at %s:%d", g.join_timeout, g.leader, g.port)
    if not reachable(g.leader, g.port, g.join_timeout):
        return (f"group_leader_address: the leader's group link {g.leader}:{g.port} did not answer within "
                f"{g.join_timeout} s (group_join_timeout); is the leader started, and group_port the same on "
                "every host?")
    spawn(["worker", "--leader", g.leader, "--port", str(g.port), "--rank", str(g.rank), "--watch", watch,
           "--host", host or "0.0.0.0", "--health-port", str(port)])
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.group_link")
    sub = ap.add_subparsers(dest="role", required=True)
    lead = sub.add_parser("leader")
    lead.add_argument("--host", default="0.0.0.0")
    lead.add_argument("--port", type=int, required=True)
    lead.add_argument("--workers", type=int, required=True)
    lead.add_argument("--watch", type=int, required=True)
    lead.add_argument("--join-timeout", type=float, required=True)
    lead.add_argument("--ping-url", required=True)
    work = sub.add_parser("worker")
    work.add_argument("--leader", required=True)
    work.add_argument("--port", type=int, required=True)
    work.add_argument("--rank", type=int, required=True)
    work.add_argument("--watch", type=int, required=True)
    work.add_argument("--host", default="0.0.0.0")
    work.add_argument("--health-port", type=int, required=True)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if a.role == "leader":
        try:
            leader = Leader(a.port, a.host, a.workers, a.watch, a.join_timeout, a.ping_url)
        except OSError as e:  # the launcher, reading this line, names the setting
            print(os.strerror(e.errno) if e.errno else e, flush=True)
            return 1
        sys.stdout.buffer.write(LISTENING + b"\n")
        sys.stdout.flush()
        return leader.run()
    w = Worker(a.leader, a.port, a.rank, a.watch)
    w.health_server(a.host, a.health_port)
    return w.run()


if __name__ == "__main__":
    sys.exit(main())
