"""Pool the paired image/stock ratios of several recorded engine runs (the e2e.json of python -m bench.e2e).

A paired ratio is a repetition's image figure over the stock figure measured just before it on the same
host, so ratios from runs on different hosts can be pooled where the absolute figures cannot.

    python -m bench.e2e.pool bench/data/h200_engine_3/e2e.json bench/data/h200_engine_4/e2e.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.e2e.report import paired_ratios

METRICS = (("throughput", "tok_s"), ("latency", "ttft_p50_ms"), ("latency", "itl_p50_ms"))


def table(runs: list[dict]) -> list[str]:
    rows = ["| model | metric | clients | paired ratios | image/stock median | range |", "|---|---|---|---|---|---|"]
    models = dict.fromkeys(m for res in runs for m in res["models"])
    for model in models:
        for kind, metric in METRICS:
            clients = sorted({c for res in runs for r in res["models"].get(model, {}).get("reps", {}).get("stock", [])
                              for c in r[kind]}, key=int)
            for c in clients:
                xs = paired_ratios(runs, model, kind, metric, c)
                if xs:
                    rows.append(f"| {model} | {metric} | {c} | {len(xs)} | {statistics.median(xs):.3f} | "
                                f"{min(xs):.3f}-{max(xs):.3f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.e2e.pool", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="e2e.json files of python -m bench.e2e")
    a = p.parse_args(argv)
    print("\n".join(table([json.loads(f.read_text()) for f in a.runs])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
