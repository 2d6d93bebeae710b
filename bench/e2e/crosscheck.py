"""The cross-check: every measured arm measured again, after the bench's own repetitions, by a client this project
did not write: vLLM's own serving benchmark (`vllm bench serve`, the module vllm.benchmarks.serve of the image's
Python), at the run's prompt and output lengths with ignore_eos and greedy sampling (as the bench's own requests), at
each measured concurrency, `waves` requests per client, the arms alternating as in the bench's own repetitions
(repetition, arm, concurrency).

Its prompts are fresh, as the bench's own are: no server is sent a prompt, or a prompt's first cache block, twice,
so no prefix cache serves one. The client's random dataset cannot give that on the shards: its prompts are runs of
consecutive token ids from a random start, their byte-level tokenizer (serving.tiny_model) has 256 such starts, and
decoded to text many collapse into the same replacement characters (drawn for run 28's plan, 88 of the 128 prompts
at 32 clients had been sent before). So each measurement's prompts are this module's own (fresh_prompts: random
letters and digits, one token a character on that tokenizer), given to the client as its `custom` dataset, a JSONL
file written before the measurement; and the client's one-prompt test run before a measurement, which would send
its first prompt twice, is skipped (the servers are ready).

Its output tokens/s, median TTFT and median inter-token latency are kept per arm and repetition in the shape of the
bench's own figures (e2e.json: models.MODEL.cross_check.ARM, a list like reps.ARM), so the same paired ratios come
out of both, and e2e.md sets them side by side (report.cross_check_table). Around each measurement of a vLLM arm the
child reads the server's own split of the first token (workload.server_phases), kept as the bench's own runs keep it
(latency.CLIENTS.server): the client sends text, which the serving layer tokenizes, and streams every request, so
its TTFT less the server's is the HTTP path under that client's load.

One child Python runs every measurement of a model in turn (the client's import takes seconds; once per model):

    PY -m bench.e2e.crosscheck PLAN.json RESULTS.jsonl    # PLAN: a list of {arm, rep, clients, argv}
"""
from __future__ import annotations

import json
import random
import string
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from serving.paths import ROOT

from .workload import phases_between, repetition_order, server_phases

CLIENT = "vLLM's `vllm bench serve` (vllm.benchmarks.serve)"
# The client's figure -> the bench's own name for the same figure (workload.Workload's throughput and latency).
FIGURES = {"output_throughput": ("throughput", "tok_s"), "median_ttft_ms": ("latency", "ttft_p50_ms"),
           "median_itl_ms": ("latency", "itl_p50_ms")}


PROMPT_ALPHABET = string.ascii_letters + string.digits


def fresh_prompts(n: int, in_tokens: int, seed: int) -> list[str]:
    """n prompts of in_tokens random letters and digits drawn from `seed`, each character one token on the shards'
    byte-level tokenizer. Two prompts share their first 16 characters (about a vLLM cache block) with a chance of
    62^-16."""
    rng = random.Random(seed)
    return ["".join(rng.choices(PROMPT_ALPHABET, k=in_tokens)) for _ in range(n)]


def client_args(url: str, model_id: str, tokenizer: Path, dataset: Path, out_tokens: int, clients: int,
                waves: int, seed: int) -> list[str]:
    """The client's command line for one measurement, its prompts the lines of `dataset` (fresh_prompts of `seed`)
    in order, as they are (no chat template). Greedy, as the bench's own requests (workload.completion_body):
    without --temperature the client leaves sampling to the server, whose default is temperature 1, a sampler of
    another cost."""
    return ["--backend", "openai", "--base-url", url, "--model", model_id, "--tokenizer", str(tokenizer),
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", str(out_tokens),
            "--skip-chat-template", "--disable-shuffle", "--ready-check-timeout-sec", "0",
            "--num-prompts", str(waves * clients), "--max-concurrency", str(clients),
            "--ignore-eos", "--temperature", "0", "--seed", str(seed), "--disable-tqdm"]


def measurement_seed(rep: int, clients: int) -> int:
    """The prompts' seed of one measurement: the same for every arm of a repetition at one concurrency, and
    another for every other (repetition, concurrency), so that no server is sent a prompt twice."""
    return 1000 * (rep + 1) + clients


def plan(urls: dict[str, str], model_id: str, tokenizer: Path, in_tokens: int, out_tokens: int,
         clients: tuple[int, ...], waves: int, reps: int, prompts_dir: Path) -> list[dict]:
    """Every measurement of one model (urls: arm -> its server's http://host:port), in the order they run:
    repetition, then arm (in the order given, reversed in odd repetitions: workload.repetition_order), then
    concurrency. Each names its prompts (`dataset`: the JSONL file in prompts_dir, its seed, how many, how long),
    which the child writes before it runs the measurement, and its server's host:port, whose /metrics it reads
    around it."""
    entries = []
    for rep in range(reps):
        for arm in repetition_order(list(urls), rep):
            url = urls[arm]
            for c in clients:
                seed = measurement_seed(rep, c)
                dataset = {"path": str(prompts_dir / f"prompts-{seed}.jsonl"), "seed": seed, "prompts": waves * c,
                           "tokens": in_tokens, "tokenizer": str(tokenizer)}
                entries.append({"arm": arm, "rep": rep, "clients": c, "dataset": dataset,
                                "host": urlsplit(url).netloc,
                                "argv": client_args(url, model_id, tokenizer, Path(dataset["path"]), out_tokens, c,
                                                    waves, seed)})
    return entries


def write_dataset(dataset: dict) -> None:
    """A measurement's prompts as the client's custom dataset reads them: one {"prompt": ...} line each, each the
    run's prompt length as the server counts it, the special tokens its tokenizer adds to a text prompt included (the
    bench's own prompts are token ids, to which none are added)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dataset["tokenizer"])
    added = len(tok("a").input_ids) - len(tok("a", add_special_tokens=False).input_ids)
    path = Path(dataset["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    prompts = fresh_prompts(dataset["prompts"], dataset["tokens"] - added, dataset["seed"])
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))


def as_reps(rows: list[dict]) -> dict[str, list[dict]]:
    """The client's results as the bench's own repetitions are kept: arm -> [{"throughput": {clients: {"tok_s"}},
    "latency": {clients: {"ttft_p50_ms", "itl_p50_ms", "server" where read}},
    "requests": {clients: {"completed", "failed", "input_tokens"}}}]."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        reps = out.setdefault(row["arm"], [])
        while len(reps) <= row["rep"]:
            reps.append({"throughput": {}, "latency": {}, "requests": {}})
        rep, c = reps[row["rep"]], str(row["clients"])
        rep["requests"][c] = {k: row[k] for k in ("completed", "failed", "input_tokens", "error") if k in row}
        if "error" not in row:
            for name, (kind, metric) in FIGURES.items():
                rep[kind].setdefault(c, {})[metric] = row[name]
            if row.get("server"):
                rep["latency"][c]["server"] = row["server"]
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
    written: set[str] = set()  # the arms of a repetition share a concurrency's prompts: each file is written once
    # each server's last /metrics reading: no request reaches a server between its measurements, so the reading
    # after one is the reading before its next (dropped when a measurement fails, as its requests may have run)
    last: dict[str, dict | None] = {}
    with open(argv[1], "a") as out:
        for e in entries:
            parser = FlexibleArgumentParser()
            add_cli_args(parser)
            row = {k: e[k] for k in ("arm", "rep", "clients")}
            try:
                if e["dataset"]["path"] not in written:
                    write_dataset(e["dataset"])
                    written.add(e["dataset"]["path"])
                host = e["host"]
                before = last.pop(host) if host in last else server_phases(host)
                r = bench_main(parser.parse_args(e["argv"]))
                last[host] = server_phases(host)
                row["server"] = phases_between(before, last[host])
                row.update(completed=int(r["completed"]), failed=int(r["failed"]),
                           input_tokens=int(r["total_input_tokens"]))
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
