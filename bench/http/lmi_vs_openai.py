"""The same streamed workload through /invocations with an LMI body and with an OpenAI body.

    .venv/bin/python -m bench.http.lmi_vs_openai                 # starts the launcher's engine itself
    .venv/bin/python -m bench.http.lmi_vs_openai --url http://127.0.0.1:8080

Bounded: a fixed number of requests per round, a fixed concurrency, greedy decoding with a
fixed number of output tokens (EOS ignored), so both bodies ask the engine for exactly the
same work. Rounds alternate A/B then B/A to spread warm-up and drift over both. Prints
requests/s, output tokens/s and p50/p99 time to first token for each body, and LMI/OpenAI.
Not a test: figures depend on the machine and whatever else runs on it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from serving.paths import ROOT
from tools import launcher_process  # starts/stops the launcher; shared with the tests



def lmi_body(prompt: str, max_tokens: int) -> dict:
    return {"inputs": prompt, "stream": True,
            "parameters": {"max_new_tokens": max_tokens, "do_sample": False, "ignore_eos_token": True}}


def openai_body(prompt: str, max_tokens: int) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def count_lmi(buf: bytes) -> int:
    """Output tokens: the last record's details (the server's own count)."""
    last = buf.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    try:
        return json.loads(last)["details"]["generated_tokens"]
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"LMI stream did not end with a final record ({len(buf)} bytes); last line: "
                           f"{last[:300]!r}") from None


def count_openai(buf: bytes) -> int:
    """Output tokens: the usage event before [DONE] (an event may carry several tokens)."""
    events = [e for e in buf.split(b"\n\n") if e.startswith(b"data: {")]
    return json.loads(events[-1][len(b"data: "):])["usage"]["completion_tokens"]


def openai_logprobs_body(prompt: str, max_tokens: int) -> dict:
    """The OpenAI body asking for what every LMI stream record carries: token id and logprob."""
    return {**openai_body(prompt, max_tokens), "logprobs": 0, "return_token_ids": True}


KINDS = {"lmi": (lmi_body, count_lmi), "openai": (openai_body, count_openai),
         "openai+logprobs": (openai_logprobs_body, count_openai)}


@dataclass
class Round:
    kind: str
    wall_s: float
    ttft_s: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    api_cpu_s: float = float("nan")     # CPU time of vLLM's API server process (where LMI work runs)
    engine_cpu_s: float = float("nan")  # CPU time of the engine core process(es)
    client_cpu_s: float = float("nan")  # CPU time of this load generator (it shares the machine)


async def one(client: httpx.AsyncClient, body: dict, counter) -> tuple[float, int]:
    t0 = time.perf_counter()
    ttft = None
    parts = []
    async with client.stream("POST", "/invocations", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:200]!r}")
        async for chunk in r.aiter_raw():
            if ttft is None and chunk.strip():
                ttft = time.perf_counter() - t0
            parts.append(chunk)
    return ttft or float("nan"), counter(b"".join(parts))


def cpu_times(pid: int | None) -> tuple[float, float]:
    """(API server, engine) CPU seconds: less sensitive to other load on the machine than wall time."""
    if pid is None:
        return float("nan"), float("nan")
    api = psutil.Process(pid)
    t = api.cpu_times()
    engine = 0.0
    for child in api.children(recursive=True):
        try:
            ct = child.cpu_times()
            engine += ct.user + ct.system
        except psutil.NoSuchProcess:
            pass
    return t.user + t.system, engine


async def run_round(url: str, kind: str, prompts: list[str], concurrency: int, max_tokens: int,
                    pid: int | None = None) -> Round:
    make, counter = KINDS[kind]
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def task(p):
            async with sem:
                return await one(client, make(p, max_tokens), counter)
        cpu0, client0 = cpu_times(pid), time.process_time()
        t0 = time.perf_counter()
        results = await asyncio.gather(*(task(p) for p in prompts), return_exceptions=True)
        wall = time.perf_counter() - t0
        cpu1, client1 = cpu_times(pid), time.process_time()
    rnd = Round(kind, wall, api_cpu_s=cpu1[0] - cpu0[0], engine_cpu_s=cpu1[1] - cpu0[1],
                client_cpu_s=client1 - client0)
    for res in results:
        if isinstance(res, BaseException):
            rnd.errors += 1
            print(f"  {kind} error: {res}", file=sys.stderr)
            continue
        rnd.ttft_s.append(res[0])
        rnd.tokens += res[1]
    return rnd


async def run_mixed_round(url: str, prompts: list[str], concurrency: int, max_tokens: int) -> list[Round]:
    """Both bodies at once, half the streams each: they share every engine batch and every
    burst of outside load, so a difference is the path's own. Each body's wall time ends at
    its own last answer."""
    half = concurrency // 2
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()

        async def body_kind(kind: str) -> Round:
            make, counter = KINDS[kind]
            sem = asyncio.Semaphore(half)

            async def task(p):
                async with sem:
                    return await one(client, make(p, max_tokens), counter)
            results = await asyncio.gather(*(task(p) for p in prompts), return_exceptions=True)
            rnd = Round(kind, time.perf_counter() - t0)
            for res in results:
                if isinstance(res, BaseException):
                    rnd.errors += 1
                    print(f"  {kind} error: {res}", file=sys.stderr)
                else:
                    rnd.ttft_s.append(res[0])
                    rnd.tokens += res[1]
            return rnd
        return list(await asyncio.gather(body_kind("lmi"), body_kind("openai")))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def summary(rounds: list[Round], kind: str) -> dict:
    rs = [r for r in rounds if r.kind == kind]
    wall = sum(r.wall_s for r in rs)
    n = sum(len(r.ttft_s) for r in rs)
    ttft = [t for r in rs for t in r.ttft_s]
    return {"requests": n, "errors": sum(r.errors for r in rs), "wall_s": wall,
            "req_per_s": n / wall, "tok_per_s": sum(r.tokens for r in rs) / wall,
            "tokens": sum(r.tokens for r in rs),
            "ttft_p50_ms": 1000 * statistics.median(ttft), "ttft_p99_ms": 1000 * pct(ttft, 0.99),
            "api_cpu_ms_per_req": 1000 * sum(r.api_cpu_s for r in rs) / n,
            "engine_cpu_ms_per_req": 1000 * sum(r.engine_cpu_s for r in rs) / n,
            "client_cpu_ms_per_req": 1000 * sum(r.client_cpu_s for r in rs) / n,
            "round_req_per_s": [round(len(r.ttft_s) / r.wall_s, 2) for r in rs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="use this running server instead of starting one")
    ap.add_argument("--server-pid", type=int, help="with --url: the server's pid, to report CPU time per request")
    ap.add_argument("--requests", type=int, default=64, help="requests per round (default 64)")
    ap.add_argument("--concurrency", type=int, default=32, help="streams in flight (default 32)")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per body kind, alternating (default 20)")
    ap.add_argument("--mixed-rounds", type=int, default=10,
                    help="then rounds with both bodies at once, half the streams each (default 10)")
    ap.add_argument("--also-openai-logprobs", action="store_true",
                    help="add a third body: OpenAI asking for token ids and logprobs, as LMI records carry")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    proc = None
    url = args.url
    pid = args.server_pid
    if url is None:
        tmp = Path(tempfile.mkdtemp(prefix="lmi-bench-"))
        print(f"starting the engine (log in {tmp}) ...", flush=True)
        try:
            server = launcher_process.start_launcher(
                tmp, {"VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")},
                timeout=600, stop_grace=60)
        except RuntimeError as e:
            raise SystemExit(str(e)) from None
        proc = server.proc
        pid = proc.pid  # the launcher execs the engine's API server: same pid
        url = server.url
    try:
        # distinct prompts of equal length, the same list for both bodies
        prompts = [f"Request {i:05d}: tell me about deep learning." for i in range(args.requests)]
        warm = prompts[: args.concurrency]
        kinds = ["lmi", "openai"] + (["openai+logprobs"] if args.also_openai_logprobs else [])
        for kind in kinds:  # warm-up, not counted
            asyncio.run(run_round(url, kind, warm, args.concurrency, args.max_tokens))
        order = []
        for i in range(args.rounds):
            order += kinds if i % 2 == 0 else kinds[::-1]
        rounds = []
        for kind in order:
            r = asyncio.run(run_round(url, kind, prompts, args.concurrency, args.max_tokens, pid))
            print(f"  round {kind:15s} {len(r.ttft_s) / r.wall_s:7.2f} req/s  {r.tokens / r.wall_s:8.1f} tok/s  "
                  f"p50 TTFT {1000 * statistics.median(r.ttft_s):7.1f} ms", flush=True)
            rounds.append(r)
        mixed = []
        for i in range(args.mixed_rounds):
            pair = asyncio.run(run_mixed_round(url, prompts, args.concurrency, args.max_tokens))
            print(f"  mixed round: LMI {pair[0].tokens / pair[0].wall_s:7.1f} tok/s, OpenAI "
                  f"{pair[1].tokens / pair[1].wall_s:7.1f} tok/s", flush=True)
            mixed += pair
    finally:
        if proc is not None:
            launcher_process.stop(proc, grace=60)

    sums = {k: summary(rounds, k) for k in kinds}
    lmi, oai = sums["lmi"], sums["openai"]
    print(f"\nworkload: {args.rounds} rounds x {args.requests} requests per body, {args.concurrency} concurrent "
          f"streams, {args.max_tokens} greedy tokens each (EOS ignored), rounds alternating")
    print(f"{'':16s}{'req/s':>9s}{'out tok/s':>11s}{'TTFT p50 ms':>13s}{'TTFT p99 ms':>13s}{'tokens':>9s}{'errors':>8s}"
          f"{'API CPU ms/req':>16s}{'engine CPU ms/req':>19s}{'client CPU ms/req':>19s}")
    for name, s in sums.items():
        print(f"{name:16s}{s['req_per_s']:9.2f}{s['tok_per_s']:11.1f}{s['ttft_p50_ms']:13.1f}"
              f"{s['ttft_p99_ms']:13.1f}{s['tokens']:9d}{s['errors']:8d}"
              f"{s['api_cpu_ms_per_req']:16.2f}{s['engine_cpu_ms_per_req']:19.2f}{s['client_cpu_ms_per_req']:19.2f}")
    ratio = {k: lmi[k] / oai[k] for k in ("req_per_s", "tok_per_s", "ttft_p50_ms", "ttft_p99_ms",
                                            "api_cpu_ms_per_req", "engine_cpu_ms_per_req",
                                            "client_cpu_ms_per_req")}
    print(f"{'LMI/OpenAI':16s}{ratio['req_per_s']:9.3f}{ratio['tok_per_s']:11.3f}{ratio['ttft_p50_ms']:13.3f}"
          f"{ratio['ttft_p99_ms']:13.3f}{'':17s}{ratio['api_cpu_ms_per_req']:16.3f}"
          f"{ratio['engine_cpu_ms_per_req']:19.3f}{ratio['client_cpu_ms_per_req']:19.3f}   (all rounds pooled)")
    # Each LMI round against the OpenAI round next to it: robust to load that drifts over the run.
    la = [r for r in rounds if r.kind == "lmi"]
    oa = [r for r in rounds if r.kind == "openai"]
    pair_tok = [(a.tokens / a.wall_s) / (b.tokens / b.wall_s) for a, b in zip(la, oa)]
    pair_ttft = [statistics.median(a.ttft_s) / statistics.median(b.ttft_s) for a, b in zip(la, oa)]
    ratio["pair_median_tok_per_s"] = statistics.median(pair_tok)
    ratio["pair_median_ttft_p50"] = statistics.median(pair_ttft)
    print(f"{'LMI/OpenAI':16s}{'':9s}{ratio['pair_median_tok_per_s']:11.3f}{ratio['pair_median_ttft_p50']:13.3f}"
          f"{'':13s}   (median over adjacent round pairs)")
    # The least disturbed rounds of each body: what the path costs when nothing else interferes.
    def quartile(xs, best_high):
        xs = sorted(xs, reverse=best_high)
        return statistics.median(xs[: max(1, len(xs) // 4)])
    best_tok = {k: quartile([r.tokens / r.wall_s for r in rounds if r.kind == k], True) for k in ("lmi", "openai")}
    best_ttft = {k: quartile([statistics.median(r.ttft_s) for r in rounds if r.kind == k], False)
                 for k in ("lmi", "openai")}
    ratio["best_quartile_tok_per_s"] = best_tok["lmi"] / best_tok["openai"]
    ratio["best_quartile_ttft_p50"] = best_ttft["lmi"] / best_ttft["openai"]
    print(f"{'LMI/OpenAI':16s}{'':9s}{ratio['best_quartile_tok_per_s']:11.3f}{ratio['best_quartile_ttft_p50']:13.3f}"
          f"{'':13s}   (best quartile of rounds: LMI {best_tok['lmi']:.0f} vs OpenAI {best_tok['openai']:.0f} tok/s, "
          f"p50 TTFT {1000 * best_ttft['lmi']:.0f} vs {1000 * best_ttft['openai']:.0f} ms)")
    if mixed:
        ms = {k: summary(mixed, k) for k in ("lmi", "openai")}
        print(f"\nmixed: {args.mixed_rounds} rounds, each {args.requests} LMI + {args.requests} OpenAI requests at once, "
              f"{args.concurrency // 2} streams each")
        for name, s in ms.items():
            print(f"{name:16s}{s['req_per_s']:9.2f}{s['tok_per_s']:11.1f}{s['ttft_p50_ms']:13.1f}{s['ttft_p99_ms']:13.1f}"
                  f"{s['tokens']:9d}{s['errors']:8d}")
        mr = {k: ms["lmi"][k] / ms["openai"][k] for k in ("req_per_s", "tok_per_s", "ttft_p50_ms", "ttft_p99_ms")}
        mr["round_median_tok_per_s"] = statistics.median(
            (a.tokens / a.wall_s) / (b.tokens / b.wall_s) for a, b in zip(mixed[0::2], mixed[1::2]))
        print(f"{'LMI/OpenAI':16s}{mr['req_per_s']:9.3f}{mr['tok_per_s']:11.3f}{mr['ttft_p50_ms']:13.3f}"
              f"{mr['ttft_p99_ms']:13.3f}   (median over rounds: tok/s {mr['round_median_tok_per_s']:.3f})")
        ratio["mixed"] = mr
        sums["mixed_lmi"], sums["mixed_openai"] = ms["lmi"], ms["openai"]
    per_round = args.requests * args.max_tokens
    ok = all(s["tokens"] == per_round * (args.mixed_rounds if k.startswith("mixed") else args.rounds)
             and not s["errors"] for k, s in sums.items())
    print(f"token counts {'match' if ok else 'DIFFER'} ({args.max_tokens} per request)")
    if args.json:
        Path(args.json).write_text(json.dumps({**sums, "ratio": ratio, "args": vars(args)},
                                              indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
