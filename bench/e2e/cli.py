"""The bench's command line (python -m bench.e2e): parsed once into a Config, checked before anything starts."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from . import __doc__ as DESCRIPTION
from .capacity import disk_shortfall, gpu_problems
from .config import CONTEXT_SPARE, DEPLOYMENT_MODEL_LEN, KV_POOLS, PEER_RUNTIMES, Config
from .models import (ARMS, CANDIDATES_ARM, CPU_CHECK, DEFAULT_LAYERS, MODELS, PEER_ARMS, Model, chosen_models,
                     make_model, parse_layers, with_layers)
from .run import log, run, summary
from .workload import LATENCY_CONCURRENCY, THROUGHPUT_CONCURRENCY, WORKLOADS


def parser() -> argparse.ArgumentParser:
    d = Config.default
    p = argparse.ArgumentParser(prog="python -m bench.e2e", description=DESCRIPTION.split("\n\n")[0])
    p.add_argument("--stock-site", required=True, help="folder holding the pristine vllm package (stock arm)")
    p.add_argument("--image-python", default=d("image_python"),
                   help="Python with the patched vLLM (both arms run it)")
    for arm, (field, what) in PEER_RUNTIMES.items():
        p.add_argument("--" + field.replace("_", "-"), default=d(field), metavar="PY",
                       help=f"the {arm} arm's Python: {what}; --arms {arm} is refused without it")
    p.add_argument("--models-dir", type=Path, required=True,
                   help="where the models are made (kept between runs); a run whose checkpoints its disk cannot "
                        "hold is refused before anything starts, naming the layers that fit")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=d("work"))
    p.add_argument("--models", nargs="*", default=d("models"), choices=[m.name for m in MODELS + (CPU_CHECK,)])
    p.add_argument("--arms", nargs="*", default=d("arms"), choices=ARMS,
                   help="start only these of each model's arms (default: all but the peers, "
                        + ", ".join(PEER_ARMS) + ")")
    p.add_argument("--layers", nargs="+", default=d("layers"), metavar="N|MODEL=N",
                   help="decoder layers: N for every model, MODEL=N for one (enough that the layers, not the "
                        "host's per-step work, set the step)")
    p.add_argument("--drop-models", action="store_true",
                   help="delete each model's folder once its servers stop (the H200 host's 64 GB disk holds one "
                        "deep shard at a time)")
    p.add_argument("--reps", type=int, default=d("reps"))
    p.add_argument("--waves", type=int, default=d("waves"),
                   help="requests per client in each measured run (2 gave ±35%% swings between repetitions)")
    p.add_argument("--in-tokens", type=int, default=d("in_tokens"))
    p.add_argument("--out-tokens", type=int, default=d("out_tokens"))
    p.add_argument("--gpu-mem", type=float, default=d("gpu_mem"), help="each server's gpu-memory-utilization")
    p.add_argument("--kv-bytes", type=int, default=d("kv_bytes"),
                   help="each server's KV cache (default 1.5 GiB; the log and e2e.md name each measured concurrency "
                        "above the requests it holds at once: 130 of 256 tokens on the 235B EP8 shard at 94 layers, "
                        "42 on the Coder EP8 shard at 36)")
    p.add_argument("--kv-pool", choices=KV_POOLS, default=d("kv_pool"),
                   help="fixed: every arm's KV pool is --kv-bytes; sized: each engine sizes its own from --gpu-mem "
                        "and the context length (vLLM's memory profile, SGLang's --mem-fraction-static), as a "
                        "deployment's is, the arms started one at a time (--start-alone); every arm's KV tokens are "
                        "recorded either way")
    p.add_argument("--max-model-len", dest="model_len", type=int, default=d("model_len"), metavar="N",
                   help="every arm's context length (default: the longest request of --workload and "
                        f"{CONTEXT_SPARE} to spare; with --kv-pool sized at least {DEPLOYMENT_MODEL_LEN}, a "
                        "deployment's). A shard is made with as many positions where its preset has fewer")
    p.add_argument("--workload", dest="workloads", nargs="+", default=list(d("workloads")), choices=WORKLOADS,
                   help="the workload shapes measured, in this order (default: default): default (--in-tokens and "
                        "--out-tokens), long (prompts of 2-4k tokens), mixed (prompts and outputs drawn around a "
                        "mean, seeded), decode-heavy (128-token prompts, 1,024 output tokens), burst (128 streamed "
                        "requests at once); each result in e2e.json names its shape")
    p.add_argument("--ready-timeout", type=float, default=d("ready_timeout"))
    p.add_argument("--start-alone", action="store_true",
                   help="start a model's arms one at a time, each ready (or failed) before the next starts, so that "
                        "each start to ready is measured without the others' load; the run waits their sum instead "
                        "of the longest (default: together)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="serve a model's arms one at a time: each started alone on the GPU, measured and stopped "
                        "before the next starts, so each may take a deployment's share of the GPU (--kv-pool sized "
                        "--gpu-mem 0.9); an arm's repetitions then run after the one before's, not interleaved with "
                        "them, and a ratio pairs repetitions by their number")
    p.add_argument("--profile", action="store_true",
                   help="a torch-profiler window per arm at each --profile-clients concurrency, after the repetitions")
    p.add_argument("--profile-clients", type=int, nargs="+", default=d("profile_clients"),
                   choices=sorted(set(THROUGHPUT_CONCURRENCY + LATENCY_CONCURRENCY)),
                   help="the concurrencies profiled (default: 1 32)")
    p.add_argument("--profile-tokens", type=int, default=d("profile_tokens"), metavar="N",
                   help="output tokens of each request in a profile window (default: --out-tokens). Fewer steps, a "
                        "smaller trace: at 94 layers a one-client window of 128-token requests is about a million "
                        "GPU events to write and parse")
    p.add_argument("--profile-arms", nargs="+", default=d("profile_arms"), metavar="ARM",
                   help="profile only these of the measured arms (default: every one)")
    p.add_argument("--clients", type=int, nargs="+", choices=sorted(set(THROUGHPUT_CONCURRENCY + LATENCY_CONCURRENCY)),
                   help="measure only these concurrencies (default: all); the warm-up pass still covers every one")
    p.add_argument("--cross-check", type=int, default=d("cross_check"), metavar="N",
                   help="after the bench's own repetitions, N more of every measured arm by vLLM's own client "
                        "(vllm bench serve, the image's Python) at the same concurrencies and lengths; e2e.md "
                        "sets its ratios beside the bench's own (default 0: none)")
    p.add_argument("--candidate-configs", type=Path, default=d("candidate_configs"), metavar="DIR",
                   help="config files (fused-MoE or small-M) laid over configs/ for the image-candidates arm, "
                        "e.g. bench/data/h200_block_17/small_m_candidates; --arms image-candidates needs it")
    p.add_argument("--image-no-nvcc", action="store_true",
                   help="start every image arm as the image's container runs it: no nvcc on PATH or under CUDA_HOME "
                        "(the image-no-nvcc arm alone by default; stock and the peers keep the host's nvcc); its "
                        "launcher chooses the same kernels either way")
    p.add_argument("--models-only", action="store_true",
                   help="make the chosen models at their --layers in --models-dir and stop, for a later run to "
                        "reuse (a device session makes them while its wheelhouse is still arriving); no server "
                        "starts, so --arms and the runtimes are not checked; with --drop-models the first model only")
    return p


def missing_runtimes(cfg: Config) -> list[str]:
    """Why a peer arm named by --arms cannot start: its runtime's Python not given, or not a program there. A peer
    is never skipped in silence: a run that asks for it without its runtime does not start."""
    problems = []
    for arm in (a for a in cfg.arms if a in PEER_RUNTIMES):
        field, what = PEER_RUNTIMES[arm]
        py, option = cfg.peer_python(arm), "--" + field.replace("_", "-")
        if not py:
            problems.append(f"--arms {arm}: its runtime is not given; {option} PY names the Python of {what}")
        elif not (Path(py).is_file() and os.access(py, os.X_OK)):
            problems.append(f"--arms {arm}: {option} {py} is not a program here ({what})")
    if CANDIDATES_ARM in cfg.arms and not (cfg.candidate_configs and list(cfg.candidate_configs.glob("*.json"))):
        problems.append(f"--arms {CANDIDATES_ARM}: --candidate-configs DIR must name a folder of config files "
                        f"(given: {cfg.candidate_configs})")
    return problems


def arms_no_model_has(cfg: Config, chosen: list[Model]) -> list[str]:
    """An arm that --arms names and none of the chosen models has would be left out in silence: it is refused.
    (An arm some chosen models lack is left out of those; the run's log names it per model.)"""
    if cfg.arms == Config.default("arms"):
        return []
    offered = {arm for m in chosen for arm in m.arms}
    return [f"--arms {arm}: none of the chosen models ({', '.join(m.name for m in chosen)}) has this arm; "
            f"their arms: {', '.join(sorted(offered))}" for arm in cfg.arms if arm not in offered]


def contexts_too_long(cfg: Config, chosen: list[Model]) -> list[str]:
    """A context shorter than the longest request of --workload would refuse that request, and a model whose
    checkpoint has fewer positions than the run's context length (Config.max_model_len) would make every server of
    it exit at its start: both are refused before anything starts. (A shard is made with the positions of a context
    the run names: with_positions.)"""
    problems = []
    if cfg.max_model_len < cfg.longest_request:
        problems.append(f"--max-model-len {cfg.max_model_len}: the workloads ({', '.join(cfg.workloads)}) send "
                        f"requests of up to {cfg.longest_request} tokens")
    beside_prompt = cfg.max_model_len - cfg.in_tokens  # the output and what Config.max_model_len keeps to spare
    for m in chosen:
        if m.spec.max_position >= cfg.max_model_len:
            continue
        if cfg.workloads == ("default",) and not cfg.model_len and cfg.kv_pool == "fixed":
            problems.append(
                f"--in-tokens {cfg.in_tokens} and --out-tokens {cfg.out_tokens} need a context of "
                f"{cfg.max_model_len} tokens ({beside_prompt - cfg.out_tokens} to spare); {m.name} has "
                f"{m.spec.max_position} positions: give --in-tokens {m.spec.max_position - beside_prompt} or less")
        else:
            problems.append(f"the context of {cfg.max_model_len} tokens (--workload {' '.join(cfg.workloads)}"
                            + (f", --max-model-len {cfg.model_len}" if cfg.model_len else "")
                            + (", --kv-pool sized" if cfg.kv_pool == "sized" else "")
                            + f") is longer than {m.name}'s {m.spec.max_position} positions")
    return problems


def with_positions(m: Model, cfg: Config) -> Model:
    """A shard with the positions (its checkpoint's max_position_embeddings; its weights do not depend on them) of a
    context the run names longer than its preset's: --max-model-len, or --kv-pool sized's deployment context. The
    embedded model's are fixed; a context from the workloads alone stays within the preset's (contexts_too_long)."""
    named = cfg.model_len or cfg.kv_pool == "sized"
    if not m.preset or not named or m.spec.max_position >= cfg.max_model_len:
        return m
    return replace(m, positions=cfg.max_model_len)


def one_at_a_time_problems(cfg: Config) -> list[str]:
    """The cross-check measures the arms of a model side by side, which --one-at-a-time does not serve."""
    if cfg.one_at_a_time and cfg.cross_check:
        return ["--one-at-a-time serves one arm at a time; --cross-check measures the arms side by side: give one"]
    return []


def profile_arms_problems(cfg: Config) -> list[str]:
    """--profile-arms names arms the run measures, and only with --profile."""
    if cfg.profile_arms is None:
        return []
    if not cfg.profile:
        return ["--profile-arms without --profile: nothing is profiled"]
    if lacks := [a for a in cfg.profile_arms if a not in cfg.arms]:
        return [f"--profile-arms: {', '.join(lacks)} not among --arms ({', '.join(cfg.arms)})"]
    return []


def run_problems(cfg: Config, chosen: list[Model]) -> list[str]:
    """What refuses a run before anything starts, the GPU's memory aside: a peer runtime not given, an arm no chosen
    model has, a context longer than a checkpoint's positions, the cross-check with --one-at-a-time, a profiled arm
    not run."""
    return (missing_runtimes(cfg) + arms_no_model_has(cfg, chosen) + contexts_too_long(cfg, chosen)
            + one_at_a_time_problems(cfg) + profile_arms_problems(cfg))


def models_at_depth(cfg: Config) -> dict[str, Model]:
    """The models of --models, in their order, each at its --layers depth; a ValueError names a --layers that
    cannot be."""
    depth = parse_layers(list(cfg.layers), list(dict.fromkeys(cfg.models)))
    chosen = chosen_models(list(cfg.models))
    for m in chosen:
        if not m.preset and depth[m.name] != DEFAULT_LAYERS:
            raise ValueError(f"--layers: {m.name} is the embedded model, its depth is fixed; give the others' as "
                             "MODEL=N")
    return {m.name: with_positions(with_layers(m, depth[m.name]), cfg) for m in chosen}


def main(argv: list[str] | None = None) -> int:
    p = parser()
    cfg = Config.from_args(p.parse_args(argv))
    try:
        models = models_at_depth(cfg)
    except ValueError as e:
        p.error(str(e))
    if not cfg.models_only:
        for problem in run_problems(cfg, list(models.values())):
            p.error(problem)
        for problem in gpu_problems(cfg, models, log=log):
            p.error(problem)
    for problem in disk_shortfall(cfg, models):
        p.error(problem)
    if cfg.models_only:
        # With --drop-models the disk holds one checkpoint at a time (disk_shortfall checks the largest): the first
        # model only, the run makes each later one when its turn comes, after deleting the one before.
        chosen = list(models.values())
        for m in chosen[:1] if cfg.drop_models else chosen:
            print(make_model(m, cfg.models_dir))
        if cfg.drop_models and len(chosen) > 1:
            log(f"--drop-models: made {chosen[0].name} only; the run makes "
                f"{', '.join(m.name for m in chosen[1:])} in turn")
        return 0
    # A SIGTERM (bench/e2e/runbook.sh stop) unwinds through run's cleanup, so the servers, each in a session of
    # its own, are stopped too: without it an engine core outlives the bench and keeps the GPU's memory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = run(cfg, list(models.values()))
    print(summary(results))
    return 0
