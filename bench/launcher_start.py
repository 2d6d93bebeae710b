"""Start to /ping 200 through the launcher, vLLM's CLI in the launcher's own process against an exec of a fresh
interpreter (`engine_in_process`), the arms alternating on one machine; then the time each server takes for the
same sequential requests; prints each figure and the ratios.

    python -m bench.launcher_start --reps 3          # the embedded tiny model on the CPU engine

The launcher imports vLLM to check the settings with vLLM's parser; run in its process, vLLM's CLI does not import
it again, and serves as the exec'd one does (the requests' time). Each start is cold for the launcher and warm for
the OS file cache after the first (both arms alike).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tools.launcher_process import await_ready, spawn_launcher, stop

ARMS = {"in-process": "true", "exec": "false"}


def start_and_serve_s(tmp: Path, in_process: str, timeout: float, requests: int, tokens: int) -> tuple[float, float]:
    """(spawn to /ping 200, then the time of `requests` sequential LMI requests of `tokens` new tokens each)."""
    srv = await_ready(spawn_launcher(tmp, {"SERVING_ENGINE_IN_PROCESS": in_process, "HF_HUB_OFFLINE": "1"}), timeout)
    try:
        body = json.dumps({"inputs": "Hello", "parameters": {"max_new_tokens": tokens, "do_sample": False}}).encode()
        t = time.monotonic()
        for _ in range(requests):
            req = urllib.request.Request(srv.url + "/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()
        return srv.ready_s, time.monotonic() - t
    finally:
        stop(srv.proc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.launcher_start", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="starts of each arm, alternating (default 3)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds a start may take (default 420)")
    ap.add_argument("--requests", type=int, default=80, help="sequential requests after each start (default 80)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens a request (default 64)")
    args = ap.parse_args(argv)
    figures = {what: {arm: [] for arm in ARMS} for what in ("start to ready", f"{args.requests} requests")}
    with tempfile.TemporaryDirectory(prefix="launcher-start-") as tmp:
        for rep in range(args.reps):
            for arm in list(ARMS) if rep % 2 == 0 else list(reversed(ARMS)):
                measured = start_and_serve_s(Path(tmp), ARMS[arm], args.timeout, args.requests, args.tokens)
                for by_arm, seconds in zip(figures.values(), measured):
                    by_arm[arm].append(seconds)
                print(f"rep {rep} {arm}: ready after {measured[0]:.1f} s, {args.requests} requests in "
                      f"{measured[1]:.1f} s", flush=True)
    for what, by_arm in figures.items():
        for arm, ts in by_arm.items():
            print(f"{what}, {arm}: median {statistics.median(ts):.1f} s ({min(ts):.1f}-{max(ts):.1f})")
        ratios = [a / b for a, b in zip(by_arm["in-process"], by_arm["exec"])]
        print(f"{what}, in-process/exec: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) "
              f"of {len(ratios)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
