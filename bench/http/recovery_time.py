"""Time to serve again after the engine dies: in place (engine_auto_recovery) against a fresh start.

    .venv/bin/python -m bench.http.recovery_time            # compiled, as the container serves by default
    .venv/bin/python -m bench.http.recovery_time --eager    # option.enforce_eager

Starts the launcher with the embedded tiny model on the CPU engine (a free loopback port), times its start to
/ping 200 (a fresh start: what a replaced container costs, less the platform's own start), then SIGKILLs the engine
core process `--kills` times and times each from the kill to /ping 200 again, checking /ping answered 503 between
and that a request is served after. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tools import launcher_process


def generate(srv: launcher_process.Server) -> int:
    """The status of one LMI request (http.client: no proxy variable of the host can reroute loopback)."""
    conn = http.client.HTTPConnection(srv.host, timeout=120)
    try:
        conn.request("POST", "/invocations", json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": 8}}),
                     {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def engine_core(pid: int) -> psutil.Process:
    procs = [p for p in psutil.Process(pid).children(recursive=True) if "EngineCore" in " ".join(p.cmdline())
             or p.name().startswith("VLLM::EngineCore")]
    if not procs:
        raise SystemExit("no engine core process under the server")
    return procs[0]


def measure(eager: bool, kills: int, bound_s: float) -> dict:
    env = {"ENGINE_AUTO_RECOVERY": "true", "ENGINE_MAX_START_RETRIES": str(kills), "HF_HUB_OFFLINE": "1"}
    if eager:
        env["OPTION_ENFORCE_EAGER"] = "true"
    with tempfile.TemporaryDirectory() as tmp:
        srv = launcher_process.spawn_launcher(Path(tmp), env)
        try:
            launcher_process.require_ready(srv, bound_s)
            result = {"eager": eager, "fresh_start_s": round(srv.ready_s, 1), "in_place_s": []}
            assert generate(srv) == 200
            for _ in range(kills):
                victim, t0 = engine_core(srv.proc.pid), time.monotonic()
                victim.kill()
                seen_503 = False
                while time.monotonic() - t0 < bound_s:
                    if srv.proc.poll() is not None:
                        raise SystemExit(f"the server exited with {srv.proc.returncode}:\n{srv.log()[-3000:]}")
                    status = launcher_process.ping_status(srv)
                    seen_503 |= status == 503
                    if status == 200 and seen_503:
                        break
                    time.sleep(0.2)
                else:
                    raise SystemExit(f"not serving again {bound_s} s after the kill:\n{srv.log()[-3000:]}")
                result["in_place_s"].append(round(time.monotonic() - t0, 1))
                assert generate(srv) == 200
            return result
        finally:
            launcher_process.stop(srv.proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.http.recovery_time", description=__doc__.split("\n\n")[0])
    p.add_argument("--eager", action="store_true", help="serve eager (no torch.compile), as option.enforce_eager")
    p.add_argument("--kills", type=int, default=1, help="engine deaths to time, each followed by a start in place")
    p.add_argument("--bound", type=float, default=900, help="seconds any start may take")
    a = p.parse_args(argv)
    if a.kills < 1:
        p.error("--kills must be at least 1")
    print(json.dumps(measure(a.eager, a.kills, a.bound)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
