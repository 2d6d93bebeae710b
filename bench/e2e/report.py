"""The tables of e2e.md: paired arm/stock ratios per figure (each image arm and each peer), each image arm against
each peer (SGLang, the newest vLLM), the cross-check's ratios beside the bench's own, GPU time by kernel class, each
profile window's largest kernels, passes and GPU occupancy, each server's start."""
from __future__ import annotations

import json
import statistics

from .crosscheck import CLIENT
from .crosscheck import FIGURES as CROSS_FIGURES
from .models import PEER_ARMS
from .traces import profile_steps
from .workload import LATENCY_CONCURRENCY, THROUGHPUT_CONCURRENCY

PROFILE_CLASSES = (("moe_w13", "MoE w13"), ("moe_w2", "MoE w2"), ("attention", "attention"),
                   ("other_gemm", "other GEMMs"), ("other", "everything else"))


def prefix_cache_cell(server: dict) -> str:
    """A server's prefix-cache hits as e2e.md shows them: '-' where the run did not record them, 'not counted' where
    the server exports no counter (SGLang); then, where the run counted them again after its cross-check, those."""
    if "prefix_cache_tokens" not in server:
        return "-"
    cells = []
    for key, said in (("prefix_cache_tokens", ""), ("prefix_cache_tokens_cross_check", "after the cross-check ")):
        if key in server:
            pc = server[key]
            cells.append(said + ("not counted" if pc is None else f"{pc.get('hits', 0)} of {pc.get('queries', 0)}"))
    return "; ".join(cells)


def profile_windows(results: dict):
    """(model name, model record, arm, clients, window record, the window's engine steps) of each profile window; the
    steps as recorded (a record without them ran --out-tokens a request)."""
    out_tokens = int(results["args"]["out_tokens"])
    for mname, m in results["models"].items():
        for key, p in (m.get("profile") or {}).items():
            arm, _, conc = key.rpartition(".c")
            yield mname, m, arm, conc, p, p.get("steps", profile_steps(int(conc), out_tokens))


def profile_table(results: dict) -> list[str]:
    """GPU time per engine step by kernel class, from each profile window (--profile)."""
    rows = []
    for mname, _, arm, conc, p, steps in profile_windows(results):
        if "share" not in p:
            rows.append(f"| {mname} | {arm}.c{conc} | {p.get('error', 'no trace')} |"
                        + " |" * (len(PROFILE_CLASSES) + 1))
            continue
        rows.append(f"| {mname} | {arm} | {conc} | {p['total_gpu_ms']:.1f} | {p['total_gpu_ms'] / steps:.3f} | "
                    + " | ".join(f"{100 * p['share'].get(c, 0):.1f}%" for c, _ in PROFILE_CLASSES) + " |")
    if not rows:
        return []
    return ["", "| model | arm | clients | GPU ms in window | GPU ms per step | "
            + " | ".join(name for _, name in PROFILE_CLASSES) + " |",
            "|---|---|---|---|---|" + "---|" * len(PROFILE_CLASSES)] + rows


KERNELS_A_WINDOW = 10  # the largest kernels of each profile window that kernel_table lists
# Wrappers that open many kernels' names and say nothing of the kernel (CUTLASS's launch template, FlashAttention's
# architecture guard): left out of the names kernel_table shows
KERNEL_NAME_WRAPPERS = ("void ", "cutlass::device_kernel<", "flash::enable_sm90_or_later<")
KERNEL_LABEL_CHARS = 64


def kernel_label(name: str) -> str:
    """A kernel's name as kernel_table shows it: its wrappers left out, cut to KERNEL_LABEL_CHARS, a code span."""
    for w in KERNEL_NAME_WRAPPERS:
        name = name.removeprefix(w)
    return "`" + name[:KERNEL_LABEL_CHARS].replace("|", "\\|").replace("`", "'") + "`"


def kernel_table(results: dict) -> list[str]:
    """Each profile window's largest kernels: launches a step and µs a launch, so that two arms or two servers can be
    set side by side kernel by kernel (one launch a layer a step reads as the model's layer count)."""
    rows = [f"| {mname} | {arm} | {conc} | {kernel_label(name)} | {calls / steps:.1f} | {us / calls:.2f} | "
            f"{100 * us / 1000 / p['total_gpu_ms']:.1f}% |"
            for mname, _, arm, conc, p, steps in profile_windows(results)
            for name, calls, us in p.get("top_kernels", [])[:KERNELS_A_WINDOW]]
    if not rows:
        return []
    return ["", "| model | arm | clients | kernel (largest GPU time first) | launches a step | µs a launch | share of the "
            "window's GPU time |", "|---|---|---|---|---|---|---|"] + rows


def window_table(results: dict) -> list[str]:
    """Each profile window's forward passes and how busy it kept the GPU (windows recorded with them). Passes are
    counted from the MoE GEMMs, two a layer, whatever the server names its steps; beside them the decode steps the
    window's requests needed, so the difference is the passes that ran prompts alone (SGLang's prefill batches).
    GPU busy is the share of the GPU's span in which some work ran; the rest it waited on the host."""
    rows = []
    for mname, m, arm, conc, p, _ in profile_windows(results):
        if "gpu_busy_ms" not in p:
            continue
        passes = p["moe_launches"] / (2 * m["layers"]) if m.get("layers") else None
        w = p["window"]
        rows.append(f"| {mname} | {arm} | {conc} | {'-' if passes is None else f'{passes:.0f}'} | "
                    f"{p.get('steps', '-')} | {100 * p['gpu_busy_ms'] / (p['gpu_span_ms'] or 1):.1f}% | "
                    f"{p['total_gpu_ms'] / p['out_tokens']:.3f} | {w['stream_tok_s']:.1f} | "
                    f"{w['ttft_p50_ms']:.1f} | {w['itl_p50_ms']:.2f} | {w['itl_p99_ms']:.2f} |")
    if not rows:
        return []
    return ["", "| model | arm | clients | forward passes (MoE GEMMs / 2 a layer) | decode steps needed | GPU busy, "
            "share of its span | GPU ms per output token | streamed tok/s | TTFT p50 (ms) | ITL p50 (ms) | "
            "ITL p99 (ms) |", "|---|---|---|---|---|---|---|---|---|---|---|"] + rows


def step_table(results: dict) -> list[str]:
    """Each kind of engine step in the vLLM arms' profile windows: count and mean span on the GPU and the host."""
    rows = [f"| {mname} | {arm} | {conc} | {name} | {k['n']} | {k.get('gpu_ms', '-')} | {k.get('host_ms', '-')} |"
            for mname, _, arm, conc, p, _ in profile_windows(results)
            for name, k in (p.get("step_kinds") or {}).items()]
    if not rows:
        return []
    return ["", "| model | arm | clients | step (requests(tokens) prefilled, decoded) | steps | GPU ms each | "
            "host ms each |", "|---|---|---|---|---|---|---|"] + rows


def server_phase_table(results: dict) -> list[str]:
    """vLLM's own split of the time to first token (workload.server_phases), the median over the repetitions of
    each measured run's means, beside the client's: what the HTTP path, the scheduler's queue and the prefill each
    take at each concurrency; the cross-check's measurements too (vLLM's client: text prompts, every request
    streamed)."""
    def med(values) -> str:
        known = [v for v in values if v is not None]
        return f"{statistics.median(known):.1f}" if known else "-"

    rows = []
    for mname, m in results["models"].items():
        for section, kinds in (("reps", {"throughput": "throughput", "latency": "latency"}),
                               ("cross_check", {"latency": "vLLM's client"})):
            arms = m.get(section) or {}
            for arm, reps in ({} if "error" in arms else arms).items():
                for kind, run in kinds.items():
                    for c in sorted({c for r in reps for c in r.get(kind, {})}, key=int):
                        runs = [r[kind][c] for r in reps if (r.get(kind, {}).get(c) or {}).get("server")]
                        if runs:
                            rows.append(f"| {mname} | {arm} | {run} | {c} | "
                                        f"{med(x.get('ttft_p50_ms') for x in runs)} | "
                                        + " | ".join(med(x["server"][k] for x in runs)
                                                     for k in ("ttft_ms", "queue_ms", "prefill_ms")) + " |")
    if not rows:
        return []
    return ["", "| model | arm | run | clients | client TTFT p50 (ms) | server TTFT mean, from arrival (ms) | "
            "queue wait mean (ms) | prefill mean (ms) |", "|---|---|---|---|---|---|---|---|"] + rows


def autotune_table(results: dict) -> list[str]:
    """Generated kernels (the same source) for which the servers of one model recorded different autotuner picks
    (servers.inductor_picks): a difference between arms that none of their settings made."""
    by_model: dict[str, dict[str, dict]] = {}
    for name, s in results["servers"].items():
        by_model.setdefault(name.rpartition(".")[0], {})[name.rpartition(".")[2]] = s.get("inductor_picks") or {}
    rows = []
    for model, arms in by_model.items():
        for source in sorted({src for picks in arms.values() for src in picks}):
            seen = {arm: picks[source] for arm, picks in arms.items() if source in picks}
            if len(seen) > 1 and len({json.dumps(p["config"], sort_keys=True) for p in seen.values()}) > 1:
                kernel = next(iter(seen.values()))["kernel"]
                cells = "; ".join(f"{arm}: " + ", ".join(f"{k} {v}" for k, v in p["config"].items())
                                  for arm, p in seen.items())
                rows.append(f"| {model} | {kernel} | {source} | {cells} |")
    if not rows:
        return []
    return ["", "| model | generated kernel, picked differently by the autotuner | source hash | each server's pick |",
            "|---|---|---|---|"] + rows


def paired_ratios(runs: list[dict], model: str, kind: str, metric: str, clients: str,
                  arm: str = "image", base: str = "stock", section: str = "reps") -> list[float]:
    """Every repetition's arm/base ratio for one figure (the arm's figure over the base arm's figure of the same
    repetition: stock is measured just before every other arm), over the recorded runs that measured it; section
    "cross_check": the same from the cross-check's repetitions (crosscheck)."""
    out = []
    for res in runs:
        reps = res["models"].get(model, {}).get(section, {})
        if not isinstance(reps, dict) or "error" in reps:
            continue
        for st, im in zip(reps.get(base, []), reps.get(arm, [])):
            # a zero base has no ratio (the cross-check's client reports an inter-token latency of 0 where a
            # server sends the whole output in one chunk); a figure a run did not record has none either
            if clients in st[kind] and clients in im[kind] and st[kind][clients].get(metric) \
                    and metric in im[kind][clients]:
                out.append(im[kind][clients][metric] / st[kind][clients][metric])
    return out


# The figures the cross-check's client reports too (crosscheck.FIGURES), in the bench's names.
CROSS_CHECK_FIGURES = tuple(CROSS_FIGURES.values())
FIGURES = ([("throughput", "tok_s", c) for c in THROUGHPUT_CONCURRENCY]
           + [("latency", k, c) for c in LATENCY_CONCURRENCY
              for k in ("stream_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")])


def ratio_rows(results: dict, mname: str, arm: str, base: str, label: str) -> list[str]:
    """One model's rows of arm against base, figure by figure (those measured: --clients): the medians of each
    arm's figure, and the median and range of the repetitions' paired arm/base ratios."""
    reps, rows = results["models"][mname]["reps"], []
    for kind, metric, conc in FIGURES:
        ratios = paired_ratios([results], mname, kind, metric, str(conc), arm, base)
        if not ratios:
            continue
        b = [r[kind][str(conc)][metric] for r in reps[base] if metric in r[kind].get(str(conc), {})]
        a = [r[kind][str(conc)][metric] for r in reps[arm] if metric in r[kind].get(str(conc), {})]
        rows.append(f"| {mname} | {label} | {metric} | {conc} | {statistics.median(b):.1f} | "
                    f"{statistics.median(a):.1f} | {statistics.median(ratios):.3f} | "
                    f"{min(ratios):.3f}-{max(ratios):.3f} |")
    return rows


def pairs_table(results: dict, header: str, pairs) -> list[str]:
    """A table of ratio_rows under `header`, for each model the (arm, base, label) triples pairs(reps) gives for its
    recorded repetitions; nothing where no row was measured."""
    rows = [row for mname, m in results["models"].items() for arm, base, label in pairs(m.get("reps", {}))
            for row in ratio_rows(results, mname, arm, base, label)]
    return ["", header, "|---|---|---|---|---|---|---|---|", *rows] if rows else []


def stock_table(results: dict) -> list[str]:
    """Each other arm against stock, where stock was measured: the image arms, then each peer (stock vLLM 0.32 is
    the baseline of the comparison with the peers)."""
    def pairs(reps: dict) -> list[tuple[str, str, str]]:
        return [(a, "stock", a) for a, _ in stock_pairs(reps)]
    return pairs_table(results, "| model | arm | metric | clients | stock | arm | arm/stock median | "
                       "paired ratio range |", pairs)


def peer_table(results: dict) -> list[str]:
    """Each image arm against each peer measured beside it: per figure the median of the repetitions' arm/peer
    ratios (output tokens/s above 1.0, times below 1.0 favour the image) and their range."""
    def pairs(reps: dict) -> list[tuple[str, str, str]]:
        return [(a, p, f"{a}/{p}") for a, p in image_peer_pairs(reps)]
    return pairs_table(results, "| model | versus | metric | clients | peer | image arm | arm/peer median | "
                       "paired ratio range |", pairs)


def without_stock_table(results: dict) -> list[str]:
    """A model measured without stock (one switch against the image): every other image arm against the image arm,
    paired by repetition as against stock."""
    def pairs(reps: dict) -> list[tuple[str, str, str]]:
        return [(a, b, f"{a}/{b}") for a, b in image_variant_pairs(reps)]
    return pairs_table(results, "| model | versus | metric | clients | image | arm | arm/image median | "
                       "paired ratio range |", pairs)


def _median_range(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else "-"


def cross_check_table(results: dict) -> list[str]:
    """The cross-check (vLLM's own client) beside the bench's own figures: per pair of arms (each arm against stock,
    the image against each peer, without stock each image arm against the image) and figure, the median paired
    ratio and range of each; they agree where the two ranges overlap."""
    rows, errors = [], []
    for mname, m in results["models"].items():
        cc = m.get("cross_check")
        if not cc:
            continue
        if "error" in cc:
            errors.append(f"{mname}: the cross-check failed: {cc['error']}")
            continue
        for arm, reps in cc.items():  # measurements with failed requests: named under the table
            for i, rep in enumerate(reps):
                for conc, req in sorted(rep.get("requests", {}).items(), key=lambda kv: int(kv[0])):
                    if req.get("failed") or "error" in req:
                        errors.append(f"{mname} {arm} repetition {i}, {conc} clients: "
                                      f"{req.get('error') or str(req['failed']) + ' requests failed'}")
        pairs = stock_pairs(cc) + image_peer_pairs(cc) + image_variant_pairs(cc)
        for arm, base in pairs:
            for kind, metric in CROSS_CHECK_FIGURES:
                for conc in sorted({c for rep in cc[arm] for c in rep[kind]}, key=int):
                    own = paired_ratios([results], mname, kind, metric, conc, arm, base)
                    theirs = paired_ratios([results], mname, kind, metric, conc, arm, base, "cross_check")
                    if not theirs:
                        continue
                    agree = "-" if not own else (
                        "yes" if min(theirs) <= max(own) and min(own) <= max(theirs) else "no")
                    rows.append(f"| {mname} | {arm}/{base} | {metric} | {conc} | {_median_range(own)} | "
                                f"{_median_range(theirs)} | {agree} |")
    if not rows and not errors:
        return []
    return (["", f"Cross-check with {CLIENT} (paired ratios: median (range)):", "",
             "| model | ratio | metric | clients | this bench | cross-check | ranges overlap |",
             "|---|---|---|---|---|---|---|"] + rows + [f"- {e}" for e in errors])


def image_arms(recorded: dict) -> list[str]:
    """The arms set against stock, as recorded (an arm a later tree renamed or dropped stays readable)."""
    return [a for a in recorded if a != "stock" and a not in PEER_ARMS]


def stock_pairs(recorded: dict) -> list[tuple[str, str]]:
    """(arm, "stock") for every other arm with recorded repetitions, where stock has them: the image arms, then
    each peer."""
    if not recorded.get("stock"):
        return []
    return [(arm, "stock") for arm in image_arms(recorded) + list(PEER_ARMS) if recorded.get(arm)]


def image_peer_pairs(recorded: dict) -> list[tuple[str, str]]:
    """(image arm, peer) for every image arm and peer with recorded repetitions: each image arm is set against each
    peer measured beside it."""
    return [(arm, peer) for arm in image_arms(recorded) if recorded.get(arm)
            for peer in PEER_ARMS if recorded.get(peer)]


def image_variant_pairs(recorded: dict) -> list[tuple[str, str]]:
    """(image arm, "image") for every other image arm with recorded repetitions, where the image has them and stock
    was not measured: one switch against the image as it ships."""
    if recorded.get("stock") or not recorded.get("image"):
        return []
    return [(arm, "image") for arm in image_arms(recorded) if arm != "image" and recorded.get(arm)]


def kv_notes(results: dict) -> list[str]:
    """A line for each model measured at more clients than its KV budget holds requests (models recorded with
    kv_sequences): its figures there include requests waiting for blocks, which a deployment's larger budget
    would not make wait."""
    notes = []
    for mname, m in results["models"].items():
        fit = m.get("kv_sequences")
        measured = {int(c) for reps in m.get("reps", {}).values() for r in reps for c in r.get("throughput", {})}
        if fit is not None and (over := sorted(c for c in measured if c > fit)):
            notes.append(f"- {mname}: the KV budget holds {fit} requests at once; at {', '.join(map(str, over))} "
                         "clients the others waited for their blocks (raise --kv-bytes to measure the engine alone)")
    return [""] + notes if notes else []


def moe_config_notes(results: dict) -> list[str]:
    """A line for each server that ran a default fused-MoE config: no tuned file of its GPU held the shape (servers
    recorded with moe_configs_not_found)."""
    notes = [f"- {name}: no tuned fused-MoE file found, the engine's default config ran: {', '.join(missing)}"
             for name, s in results["servers"].items() if (missing := s.get("moe_configs_not_found"))]
    return [""] + notes if notes else []


def nvcc_notes(results: dict) -> list[str]:
    """A line for each server recorded with the nvcc its environment showed a JIT (DeepGEMM's, FlashInfer's)."""
    notes = [f"- {name}: " + (f"nvcc visible ({s['nvcc']})" if s["nvcc"] else "no nvcc visible")
             for name, s in results["servers"].items() if "nvcc" in s]
    return [""] + notes if notes else []


def how_started(args: dict) -> str:
    """How a run's servers started, from e2e.json's args: "each served alone" (--one-at-a-time: once the one before
    had stopped), "each started alone" (--start-alone: once the one before was ready), or "together"."""
    if args.get("one_at_a_time") == "True":
        return "each served alone"
    return "each started alone" if args.get("start_alone") == "True" else "together"


def summarize(results: dict) -> str:
    """e2e.md from e2e.json's results."""
    out = stock_table(results)
    out += kv_notes(results)
    out += without_stock_table(results)
    out += peer_table(results)
    out += cross_check_table(results)
    out += profile_table(results)
    out += kernel_table(results)
    out += window_table(results)
    out += step_table(results)
    out += server_phase_table(results)
    out += autotune_table(results)
    mode = how_started(results.get("args", {}))
    alone = "" if mode == "together" else f", {mode}"
    out += ["", f"| server | start to ready (s){alone}: /ping 200, SGLang /health 200 | first request TTFT (ms) | JIT "
            "warnings | FlashInfer JIT builds | prefix-cache hits (tokens found of looked up, after the repetitions) |",
            "|---|---|---|---|---|---|"]
    for name, s in results["servers"].items():
        jit = s.get("jit_warnings", "-")
        out.append(f"| {name} | {s.get('ready_s') or s.get('failed')} | {s.get('first_ttft_ms', '-')} | "
                   f"{'not counted' if jit is None else jit} | {s.get('flashinfer_jit_builds', '-')} | "
                   f"{prefix_cache_cell(s)} |")
    out += moe_config_notes(results)
    out += nvcc_notes(results)
    return "\n".join(out).lstrip("\n") + "\n"
