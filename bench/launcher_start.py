"""Start to /ping 200 through the launcher, vLLM's CLI in the launcher's own process against an exec of a fresh
interpreter (`engine_in_process`), the arms alternating on one machine; prints each start and the ratio.

    python -m bench.launcher_start --reps 3          # the embedded tiny model on the CPU engine

The launcher imports vLLM to check the settings with vLLM's parser; run in its process, vLLM's CLI does not import
it again. Each start is cold for the launcher and warm for the OS file cache after the first (both arms alike).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from tools.launcher_process import await_ready, spawn_launcher, stop

ARMS = {"in-process": "true", "exec": "false"}


def start_s(tmp: Path, in_process: str, timeout: float) -> float:
    srv = await_ready(spawn_launcher(tmp, {"SERVING_ENGINE_IN_PROCESS": in_process, "HF_HUB_OFFLINE": "1"}), timeout)
    try:
        return srv.ready_s
    finally:
        stop(srv.proc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.launcher_start", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="starts of each arm, alternating (default 3)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds a start may take (default 420)")
    args = ap.parse_args(argv)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="launcher-start-") as tmp:
        for rep in range(args.reps):
            order = list(ARMS) if rep % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                times[arm].append(start_s(Path(tmp), ARMS[arm], args.timeout))
                print(f"rep {rep} {arm}: ready after {times[arm][-1]:.1f} s", flush=True)
    ratios = [a / b for a, b in zip(times["in-process"], times["exec"])]
    for arm, ts in times.items():
        print(f"{arm}: median {statistics.median(ts):.1f} s ({min(ts):.1f}-{max(ts):.1f})")
    print(f"in-process/exec start to ready: median {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f}) of {len(ratios)} paired starts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
