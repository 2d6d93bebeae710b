"""When an engine process dies under load, /ping stops saying healthy, every stream in flight
ends (no client hangs), and the engine starts again in place (engine_auto_recovery, serving/recovery.py) or, where
that is spent or cannot apply, the container exits non-zero within a stated bound.

Each test kills a server started by the launcher like the container does: at TP=1 the session's own server (every
default: the engine starts again in place), after every other test that uses it; at TP=2 a server of its own with no
start left (engine_max_start_retries 0); with two API server processes (the GPU build runs four) the session's
api_servers_server, and with vLLM exec'd and two API server processes its adapter server, each after every other test
that uses it.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import psutil
import pytest

from conftest import EAGER, Server, await_server, early, spawn_server, starts_early, stop
from tools.launcher_process import ping_status

pytestmark = pytest.mark.engine

ENGINE_DEAD_EXIT = 4  # serving/exit_codes.py
EXIT_BOUND_S = 10  # engine watch: a poll, a second's grace for a stop signal, vLLM's clean-up
# A dead worker rank: vLLM's executor gives the surviving rank 5 s to exit, then SIGTERM and 4 s more,
# before it declares the engine dead (about 9 s here); only then /ping turns 503 and the watch exits.
TP2_EXIT_BOUND_S = 30
PING_BOUND_S = 2  # /ping turns 503 as soon as the engine client sees its engine gone
TP2_PING_BOUND_S = 15
STREAMS = 4


def _streams(url: str, n: int) -> list[dict]:
    """n long LMI streams in threads; each dict gets 'first' (an Event), then 'raw' and 'error'."""
    out = []
    for i in range(n):
        s = {"first": threading.Event(), "raw": b"", "error": None, "done": threading.Event()}

        def run(s=s, i=i):
            body = {"inputs": f"stream {i}", "stream": True, "parameters": {"max_new_tokens": 2000,
                                                                             "ignore_eos_token": True}}
            try:
                with httpx.stream("POST", url + "/invocations", json=body, timeout=httpx.Timeout(10, read=120)) as r:
                    for chunk in r.iter_raw():
                        s["raw"] += chunk
                        s["first"].set()
            except Exception as e:  # noqa: BLE001 -- a cut connection is an acceptable end here
                s["error"] = e
            finally:
                s["first"].set()
                s["done"].set()

        threading.Thread(target=run, daemon=True).start()
        out.append(s)
    return out


def _kill_mid_load(srv, pick, bound: float) -> tuple[int, float, list[int | None], list[dict]]:
    """Start streams, SIGKILL the process `pick` chooses, and return (exit status, seconds to exit,
    /ping answers seen after the kill, streams)."""
    streams = _streams(srv.url, STREAMS)
    assert all(s["first"].wait(120) for s in streams) and all(s["raw"] for s in streams), \
        [s["error"] for s in streams]
    victim = pick(psutil.Process(srv.proc.pid).children(recursive=True))
    t0 = time.monotonic()
    victim.kill()
    pings = []  # (seconds after the kill, /ping status or None)
    while srv.proc.poll() is None and time.monotonic() - t0 < bound + 30:
        pings.append((round(time.monotonic() - t0, 1), ping_status(srv)))
        time.sleep(0.2)
    rc = srv.proc.wait(timeout=5)
    elapsed = time.monotonic() - t0
    for s in streams:
        assert s["done"].wait(10), "a stream was still open after the server exited"
    return rc, elapsed, pings, streams


def _assert_ends_with_error_record(s: dict) -> None:
    assert s["error"] is None, f"the stream was cut instead of ended: {s['error']}"
    lines = [json.loads(line) for line in s["raw"].decode().splitlines()]  # every line complete JSON
    last = lines[-1]
    assert "error" in last and last["code"] == 500 and "generation failed" in last["error"], lines[-3:]


def _last_healthy(pings) -> float:
    """Seconds after the kill of the last /ping that answered 200 (0: none did)."""
    return max((t for t, status in pings if status == 200), default=0.0)


def _engine_process_killed(srv: Server, what: str, names: tuple[str, ...] = ("EngineCore",),
                           exit_bound: float = EXIT_BOUND_S, ping_bound: float = PING_BOUND_S) -> str:
    """SIGKILL srv's first process named one of `names` mid-load and stop srv; assert the container exited with the
    engine's status within exit_bound, /ping stopped answering 200 within ping_bound and every stream ended with an
    error record (never cut, never hung). Returns srv's log."""
    try:
        rc, elapsed, pings, streams = _kill_mid_load(srv, lambda ps: _named(ps, *names)[0], exit_bound)
    finally:
        stop(srv.proc)
    log = srv.log()
    print(f"{names[0]} killed ({what}): last /ping 200 at {_last_healthy(pings)}s, exit {rc} at {elapsed:.1f}s")
    assert rc == ENGINE_DEAD_EXIT, f"exit status {rc}\n{log[-3000:]}"
    assert elapsed < exit_bound, f"took {elapsed:.1f}s to exit\n{log[-3000:]}"
    assert _last_healthy(pings) < ping_bound, pings
    for s in streams:  # each stream ended with a complete record naming the error -- never a hang
        _assert_ends_with_error_record(s)
    return log


def _assert_both_api_servers_were_told(log: str) -> None:
    assert "ending the API server processes" in log and log.count("the engine process died; exiting") == 2, \
        log[-3000:]


def _named(procs, *names):
    found = [p for p in procs if any(n in " ".join(p.cmdline()) or p.name().startswith("VLLM::" + n) for n in names)]
    assert found, f"no {names} process under the server: {[p.name() for p in procs]}"
    return found


RECOVERY_BOUND_S = 300  # an engine start in place on 2 shared cores, compiled as the session's server runs


def _generate(url: str) -> dict:
    body = json.dumps({"inputs": "again", "parameters": {"max_new_tokens": 4}}).encode()
    req = urllib.request.Request(url + "/invocations", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        return json.loads(r.read())


@pytest.mark.ends_shared_server
def test_engine_death_under_load_starts_the_engine_again_in_place(server):
    """Every default, as the container starts (engine_auto_recovery on): SIGKILL the engine core mid-load; /ping
    answers 503 promptly, every stream ends with its error record, then the same server process serves again with a
    new engine core (this test runs last of the session server's users)."""
    srv = server
    assert ping_status(srv) == 200
    streams = _streams(srv.url, STREAMS)
    try:
        assert all(s["first"].wait(120) for s in streams) and all(s["raw"] for s in streams), \
            [s["error"] for s in streams]
        victim = _named(psutil.Process(srv.proc.pid).children(recursive=True), "EngineCore")[0]
        t0 = time.monotonic()
        victim.kill()
        pings = []  # (seconds after the kill, /ping status or None)
        while time.monotonic() - t0 < RECOVERY_BOUND_S:
            assert srv.proc.poll() is None, f"the server exited with {srv.proc.returncode}\n{srv.log()[-3000:]}"
            pings.append((round(time.monotonic() - t0, 1), ping_status(srv)))
            if pings[-1][1] == 200 and any(status == 503 for _, status in pings):
                break
            time.sleep(0.2)
        again_s = time.monotonic() - t0
        for s in streams:
            assert s["done"].wait(10), "a stream was still open after the engine started again"
            _assert_ends_with_error_record(s)
        first_503 = min((t for t, status in pings if status == 503), default=None)
        assert first_503 is not None and first_503 < PING_BOUND_S, pings
        assert pings[-1][1] == 200, f"not serving again {RECOVERY_BOUND_S} s after the kill: {pings[-5:]}"
        assert None not in {status for _, status in pings}, f"the server stopped listening: {pings}"
        assert _generate(srv.url)["generated_text"]
        engines = _named(psutil.Process(srv.proc.pid).children(recursive=True), "EngineCore")
        assert victim.pid not in {p.pid for p in engines}
        log = srv.log()
        assert "starting it again in place (start 1 of 3)" in log and "the engine serves again" in log, log[-3000:]
        print(f"engine core killed: /ping 503 at {first_503} s, serving again in place after {again_s:.1f} s")
    finally:
        stop(srv.proc)


@starts_early("tp2_server")
def _tp2_server(tmp: Path, nice: int) -> Server:
    return spawn_server(tmp, {"OPTION_TENSOR_PARALLEL_DEGREE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0|1",
                              "OPTION_KV_CACHE_MEMORY_BYTES": "268435456", "ENGINE_MAX_START_RETRIES": "0",
                              **EAGER}, nice=nice)


@pytest.fixture
def tp2_server(request) -> Server:
    return await_server(early(request, "tp2_server"), "tp2_server")


def test_tp2_worker_rank_death_does_not_hang(tp2_server):
    """Tensor parallel 2 on the CPU engine (one core per rank), no engine start left (ENGINE_MAX_START_RETRIES=0,
    the AWS vLLM image's name); SIGKILL rank 1's worker mid-load: the container exits with the engine's status."""
    assert "tensor_parallel_size=2" in tp2_server.log()
    log = _engine_process_killed(tp2_server, "TP=2, rank 1", ("Worker_TP1", "TP1"), TP2_EXIT_BOUND_S,
                                 TP2_PING_BOUND_S)
    assert "not starting it again: the engine was started again 0 time(s)" in log, log[-3000:]


@pytest.mark.ends_shared_server
def test_engine_death_with_several_api_servers_ends_every_stream_and_exits_nonzero(api_servers_server):
    """Two API server processes, where only the launcher's process watches the engine core: it tells both, whose
    streams end with their error record, and the container exits with the engine's status, not vLLM's 1 (the
    session's server of two API servers, after every other test that uses it)."""
    assert "'api_server_count': 2" in api_servers_server.log()
    _assert_both_api_servers_were_told(_engine_process_killed(api_servers_server, "2 API servers"))


@pytest.mark.ends_shared_server
def test_engine_death_with_vllm_execd_and_several_api_servers_ends_every_stream(adapter_server):
    """Where the launcher execs vLLM (the adapter server: engine_in_process=false, two API server processes), it execs
    it through serving.engine_cli, which installs the same handling in the exec'd process: both API server processes
    end their streams with an error record, and the container exits with the engine's status."""
    srv = adapter_server  # shared by the session: this test runs after every other that uses it
    assert "starting engine (exec: engine_in_process=false, through serving.engine_cli)" in srv.log()
    main = psutil.Process(srv.proc.pid)
    assert main.cmdline()[1:4] == ["-m", "serving.engine_cli", "serve"], main.cmdline()
    _assert_both_api_servers_were_told(_engine_process_killed(srv, "2 API servers, vLLM exec'd"))
