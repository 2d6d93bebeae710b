"""The cross-check: every measured arm measured again, after the bench's own repetitions, by a client this project
did not write: vLLM's own serving benchmark (`vllm bench serve`, the module vllm.benchmarks.serve of the image's
Python), on its random dataset at the run's prompt and output lengths with ignore_eos and greedy sampling (as the
bench's own requests), at each measured concurrency, `waves` requests per client, the arms alternating as in the
bench's own repetitions (repetition, arm, concurrency).

Its output tokens/s, median TTFT and median inter-token latency are kept per arm and repetition in the shape of the
bench's own figures (e2e.json: models.MODEL.cross_check.ARM, a list like reps.ARM), so the same paired ratios come
out of both, and e2e.md sets them side by side (report.cross_check_table).

One child Python runs every measurement of a model in turn (the client's import takes seconds; once per model):

    PY -m bench.e2e.crosscheck PLAN.json RESULTS.jsonl    # PLAN: a list of {arm, rep, clients, argv}
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from serving.paths import ROOT

CLIENT = "vLLM's `vllm bench serve` (vllm.benchmarks.serve)"
# The client's figure -> the bench's own name for the same figure (workload.Workload's throughput and latency).
FIGURES = {"output_throughput": ("throughput", "tok_s"), "median_ttft_ms": ("latency", "ttft_p50_ms"),
           "median_itl_ms": ("latency", "itl_p50_ms")}


def client_args(url: str, model_id: str, tokenizer: Path, in_tokens: int, out_tokens: int, clients: int,
                waves: int, seed: int) -> list[str]:
    """The client's command line for one measurement, its prompts drawn from `seed`. Greedy, as the bench's own
    requests (workload.completion_body): without --temperature the client leaves sampling to the server, whose
    default is temperature 1, a sampler of another cost."""
    return ["--backend", "openai", "--base-url", url, "--model", model_id, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(in_tokens), "--random-output-len", str(out_tokens),
            "--random-range-ratio", "0", "--num-prompts", str(waves * clients), "--max-concurrency", str(clients),
            "--ignore-eos", "--temperature", "0", "--seed", str(seed), "--disable-tqdm"]


def measurement_seed(rep: int, clients: int) -> int:
    """The random dataset's seed of one measurement: the same for every arm of a repetition at one concurrency, and
    another for every other (repetition, concurrency), so that no server is sent a prompt twice."""
    return 1000 * (rep + 1) + clients


def plan(urls: dict[str, str], model_id: str, tokenizer: Path, in_tokens: int, out_tokens: int,
         clients: tuple[int, ...], waves: int, reps: int) -> list[dict]:
    """Every measurement of one model (urls: arm -> its server's http://host:port), in the order they run:
    repetition, then arm (in the order given), then concurrency."""
    return [{"arm": arm, "rep": rep, "clients": c,
             "argv": client_args(url, model_id, tokenizer, in_tokens, out_tokens, c, waves, measurement_seed(rep, c))}
            for rep in range(reps) for arm, url in urls.items() for c in clients]


def as_reps(rows: list[dict]) -> dict[str, list[dict]]:
    """The client's results as the bench's own repetitions are kept: arm -> [{"throughput": {clients: {"tok_s"}},
    "latency": {clients: {"ttft_p50_ms", "itl_p50_ms"}}, "requests": {clients: {"completed", "failed"}}}]."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        reps = out.setdefault(row["arm"], [])
        while len(reps) <= row["rep"]:
            reps.append({"throughput": {}, "latency": {}, "requests": {}})
        rep, c = reps[row["rep"]], str(row["clients"])
        rep["requests"][c] = {k: row[k] for k in ("completed", "failed", "error") if k in row}
        if "error" not in row:
            for name, (kind, metric) in FIGURES.items():
                rep[kind].setdefault(c, {})[metric] = row[name]
    return out


def cross_check(python: str, entries: list[dict], work: Path, timeout: float) -> dict[str, list[dict]]:
    """Run `entries` (plan) with the client of `python`, in one child; their results as_reps. The client's own
    report of each measurement goes to work/crosscheck.log."""
    work.mkdir(parents=True, exist_ok=True)
    plan_path, results = work / "crosscheck-plan.json", work / "crosscheck.jsonl"
    plan_path.write_text(json.dumps(entries))
    results.unlink(missing_ok=True)
    with open(work / "crosscheck.log", "ab") as log:
        done = subprocess.run([python, "-m", "bench.e2e.crosscheck", str(plan_path), str(results)], cwd=ROOT,
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    if done.returncode or len(rows) != len(entries):
        raise RuntimeError(f"the cross-check client exited {done.returncode} after {len(rows)} of {len(entries)} "
                           f"measurements (its log: {work / 'crosscheck.log'})")
    return as_reps(rows)


def main(argv: list[str]) -> int:
    """The child: each planned measurement with vLLM's client, one JSON line each into RESULTS."""
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    entries = json.loads(Path(argv[0]).read_text())
    with open(argv[1], "a") as out:
        for e in entries:
            parser = FlexibleArgumentParser()
            add_cli_args(parser)
            row = {k: e[k] for k in ("arm", "rep", "clients")}
            try:
                r = bench_main(parser.parse_args(e["argv"]))
                row.update(completed=int(r["completed"]), failed=int(r["failed"]))
                if row["completed"]:
                    row.update({k: float(r[k]) for k in FIGURES})
                else:  # no figure to keep: the client's log says why each request failed
                    row["error"] = f"no request completed ({row['failed']} failed)"
            except Exception as ex:  # noqa: BLE001 -- one measurement's failure is recorded; the others still run
                row["error"] = repr(ex)[:300]
            out.write(json.dumps(row) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
