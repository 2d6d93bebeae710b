"""Each arm's KV pool as its engine's log gives it, and the summary's tables of the pools and the workload shapes.

vLLM logs its pool once its memory profile (or --kv-cache-memory-bytes) has sized it: 'GPU KV cache size: N tokens'
(the device's name first), 'Available KV cache memory: X GiB', and after its capture 'Graph capturing finished in S
secs, took Y GiB'; before them 'Model loading took W GiB memory' and, where it sizes the pool itself,
'--gpu-memory-utilization=U is equivalent to --gpu-memory-utilization=V without CUDA graph memory profiling' (the
share its profile set aside for the graphs), with 'Desired GPU memory utilization is (U, R GiB)' at the end. SGLang
logs 'KV Cache is allocated. ... #tokens: N, K size: A GB, V size: B GB' and, per kind of graph it captures,
'Capture target decode CUDA graph end. ... mem usage=Y GB'. pool_facts reads them (servers.log_facts keeps them per
server in e2e.json); summary_lines sets them beside every workload's figures (e2e.md, after report.summarize's
tables; report code may call it)."""
from __future__ import annotations

import re
import statistics

VLLM_TOKENS = re.compile(r"\b\w+(?: \+ host)? KV cache size: ([\d,]+) tokens")
VLLM_KV_GIB = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
VLLM_GRAPHS_GIB = re.compile(r"Graph capturing finished in [\d.]+ secs?, took ([\d.]+) GiB")
VLLM_WEIGHTS_GIB = re.compile(r"Model loading took ([\d.]+) GiB memory")
# What the memory profile set aside for CUDA graphs, as vLLM 0.32 says it: the share of the GPU it took off
# --gpu-memory-utilization, and (after the capture) the share's size in GiB
VLLM_GRAPH_SHARE = re.compile(r"--gpu-memory-utilization=([\d.]+) is equivalent to --gpu-memory-utilization=([\d.]+) "
                              r"without CUDA graph memory profiling")
VLLM_REQUESTED = re.compile(r"Desired GPU memory utilization is \(([\d.]+), ([\d.]+) GiB\)")
SGLANG_POOL = re.compile(r"KV Cache is allocated\..*?#tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB")
SGLANG_GRAPHS_GB = re.compile(r"Capture (?:\w+ )*?cuda graph end\..*?mem usage=([\d.]+) GB", re.I)
BLOCK = 16  # vLLM's KV block, the unit a request's tokens are held in


def pool_facts(log: str) -> dict:
    """The KV pool an engine's log reports: kv_tokens (None where the log names none yet), kv_gib, graphs_gib,
    weights_gib and graphs_estimate_gib where it gives them (SGLang's in GB, as it logs them). The last report
    counts: an engine logs its pool once."""
    facts: dict = {"kv_tokens": None}
    if found := VLLM_TOKENS.findall(log):
        facts["kv_tokens"] = int(found[-1].replace(",", ""))
    if found := VLLM_KV_GIB.findall(log):
        facts["kv_gib"] = float(found[-1])
    if found := SGLANG_POOL.findall(log):
        tokens, k, v = found[-1]
        facts.update(kv_tokens=int(tokens), kv_gib=round(float(k) + float(v), 2))
    if found := VLLM_WEIGHTS_GIB.findall(log):
        facts["weights_gib"] = float(found[-1])
    if (share := VLLM_GRAPH_SHARE.findall(log)) and (requested := VLLM_REQUESTED.findall(log)):
        (util, without), (util_again, gib) = share[-1], requested[-1]
        facts["graphs_estimate_gib"] = round((float(util) - float(without)) * float(gib) / float(util_again), 2)
    if found := VLLM_GRAPHS_GIB.findall(log):
        facts["graphs_gib"] = float(found[-1])
    elif found := SGLANG_GRAPHS_GB.findall(log):  # one line per graph kind it captures (prefill, decode)
        facts["graphs_gib"] = round(sum(map(float, found)), 2)
    return facts


def held_at_once(kv_tokens: int, seq_tokens: int, block: int = BLOCK) -> int:
    """How many requests of seq_tokens (prompt and output) a pool of kv_tokens holds at once, each in whole blocks."""
    return kv_tokens // (-(-seq_tokens // block) * block)


def _model_of(server: str, results: dict) -> str | None:
    model = server.rsplit(".", 1)[0]
    return model if model in results.get("models", {}) else None


def pool_table(results: dict) -> list[str]:
    """Every server's KV pool: its tokens, its KV and CUDA-graph memory where logged, its tokens against stock's of
    the same model, and how many of the run's longest requests it holds at once."""
    servers = {n: s for n, s in results.get("servers", {}).items() if s.get("kv_tokens")}
    if not servers:
        return []
    args = results.get("args", {})
    longest = max((w["shape"]["prompt_tokens"][1] + w["shape"]["output_tokens"][1]
                   for m in results["models"].values() for w in m.get("workloads", {}).values()), default=None)
    out = ["", f"| server | KV pool ({args.get('kv_pool', 'fixed')}, context {args.get('max_model_len', '-')}) | "
           "KV tokens | KV memory (GiB) | CUDA graphs (GiB) | graphs set aside (GiB) | weights (GiB) | "
           "tokens / stock's | longest requests held at once |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in servers.items():
        model = _model_of(name, results)
        stock = results["servers"].get(f"{model}.stock", {}).get("kv_tokens") if model else None
        ratio = f"{s['kv_tokens'] / stock:.3f}" if stock else "-"
        held = held_at_once(s["kv_tokens"], longest) if longest else "-"
        out.append(f"| {name} | {'sized by its engine' if args.get('kv_pool') == 'sized' else 'fixed'} | "
                   f"{s['kv_tokens']:,} | {s.get('kv_gib', '-')} | {s.get('graphs_gib', '-')} | "
                   f"{s.get('graphs_estimate_gib', '-')} | {s.get('weights_gib', '-')} | {ratio} | {held} |")
    return out


def _figures(r: dict) -> dict[str, dict]:
    """clients -> the figures of one repetition's result: the throughput run's tok/s and the streamed run's
    latencies at the same concurrency, or the burst's."""
    if "burst" in r:
        return {c: {"tok_s": b["stream_tok_s"], "ttft": b["ttft_p50_ms"], "itl": b["itl_p50_ms"]}
                for c, b in r["burst"].items()}
    out: dict[str, dict] = {}
    for c, t in r.get("throughput", {}).items():
        out.setdefault(c, {})["tok_s"] = t["tok_s"]
    for c, t in r.get("latency", {}).items():
        out.setdefault(c, {}).update(ttft=t["ttft_p50_ms"], itl=t["itl_p50_ms"])
    return out


def _median(reps: list[dict], c: str, key: str) -> float | None:
    xs = [f[c][key] for r in reps if key in (f := _figures(r)).get(c, {})]
    return statistics.median(xs) if xs else None


def workload_reps(m: dict) -> dict[str, dict[str, list]]:
    """A model's results by workload: name -> arm -> its repetitions; today's shape ("default") is the model's reps."""
    out = {name: w.get("reps", {}) for name, w in m.get("workloads", {}).items()}
    if m.get("reps"):
        out["default"] = m["reps"]
    return out


def workload_table(results: dict) -> list[str]:
    """Each workload shape's medians per arm and concurrency (output tok/s; TTFT and ITL p50 of the streamed runs),
    and each arm's paired ratio of tok/s over the base arm's (stock where measured, else the image): repetition r's
    figure over the base's of the same repetition."""
    rows = []
    for mname, m in results.get("models", {}).items():
        shapes = m.get("workloads", {})
        by_workload = workload_reps(m)
        if set(by_workload) <= {"default"}:
            continue  # today's shape alone: report.summarize's tables cover it
        for name, arms in by_workload.items():
            base = "stock" if arms.get("stock") else "image"
            what = shapes.get(name, {}).get("shape", {})
            label = name if not what else (f"{name} (prompts {'-'.join(map(str, dict.fromkeys(what['prompt_tokens'])))}"
                                           f", outputs {'-'.join(map(str, dict.fromkeys(what['output_tokens'])))})")
            for arm, reps in arms.items():
                for c in sorted({c for r in reps for c in _figures(r)}, key=int):
                    tok_s, ttft, itl = (_median(reps, c, k) for k in ("tok_s", "ttft", "itl"))
                    pairs = [(_figures(ra).get(c, {}), _figures(rb).get(c, {}))
                             for ra, rb in zip(reps, arms.get(base, []))]
                    ratios = [a["tok_s"] / b["tok_s"] for a, b in pairs if a.get("tok_s") and b.get("tok_s")]
                    vs = f"{statistics.median(ratios):.3f}" if ratios and arm != base else "-"
                    cell = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
                    rows.append(f"| {mname} | {label} | {c} | {arm} | {cell(tok_s, '.0f')} | {cell(ttft, '.1f')} | "
                                f"{cell(itl, '.2f')} | {vs} ({base}) |")
    if not rows:
        return []
    return ["", "| model | workload | clients | arm | output tok/s (median) | TTFT p50 (ms) | ITL p50 (ms) | "
            "tok/s over the base arm's, paired (base) |", "|---|---|---|---|---|---|---|---|", *rows]


def summary_lines(results: dict) -> list[str]:
    """The tables e2e.md adds after report.summarize's: every arm's KV pool and every workload shape's figures."""
    return pool_table(results) + workload_table(results)
