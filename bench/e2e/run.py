"""One run: model by model, its arms started together, measured in turn and stopped; the figures saved after
every step (OUT/e2e.json, OUT/e2e.md), so that a run cut short keeps what it measured."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tools.launcher_process import Server, stop, wait_ready

from .config import Config
from .crosscheck import cross_check, plan
from .models import MEASURED_ARMS, Model, make_model
from .kv_pool import summary_lines
from .report import summarize
from .servers import inductor_picks, kv_sequences, log_facts, server_name, start_server
from .traces import profile, profile_steps
from .workload import (BURST_PROMPTS, THROUGHPUT_CONCURRENCY, Workload, completion_body, first_pass,
                       prefix_cache_tokens, repetition_order, repetition_start, request_json, requests_for, streamed,
                       sweep)


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def summary(results: dict) -> str:
    """e2e.md: report.summarize's tables, then every arm's KV pool and every workload shape's figures."""
    extra = summary_lines(results)
    return summarize(results) + ("\n".join(extra) + "\n" if extra else "")


class Run:
    """One run's results and what it measured of each server, saved to OUT as they grow."""

    def __init__(self, cfg: Config, vocab: int):
        self.cfg = cfg
        self.vocab = vocab  # prompts' token ids stay below every model's vocabulary
        self.results = {"args": cfg.record(), "servers": {}, "models": {}}
        self.facts: dict[str, dict] = {}  # per server: what the run measured of it (its first request's TTFT)

    def save(self) -> None:
        (self.cfg.out / "e2e.json").write_text(json.dumps(self.results, indent=1))
        (self.cfg.out / "e2e.md").write_text(summary(self.results))

    def record_facts(self, s: Server) -> None:
        self.results["servers"].setdefault(s.name, {}).update(
            log_facts(s), inductor_picks=inductor_picks(self.cfg.home(s.name)), **self.facts.get(s.name, {}))

    def record_prefix_caches(self, servers, key: str) -> None:
        """Each server's prefix-cache counters as they are now, kept under `key` with its other facts, and saved."""
        for s in servers:
            self.facts.setdefault(s.name, {})[key] = prefix_cache_tokens(s.host)
            self.record_facts(s)
        self.save()

    def model(self, m: Model) -> None:
        """One model: its arms start (together, or with --start-alone one at a time: Run.start), are measured,
        and are stopped before the next model starts; with --one-at-a-time each arm in turn alone. Never all
        models at once: up to 9 cold starts and their JIT builds (FlashInfer's fused_moe_90, DeepGEMM's warm-up)
        on 16 cores put the load at 60, skew every figure, and get the bench itself killed for memory."""
        cfg = self.cfg
        t0 = time.monotonic()
        model_dir = make_model(m, cfg.models_dir)
        log(f"model {m.name}: {time.monotonic() - t0:.0f} s")
        lacks = [arm for arm in cfg.arms if arm not in m.arms]
        if m.preset and lacks and cfg.arms != Config.default("arms"):
            log(f"{m.name}: has no arm {', '.join(lacks)} (its arms: {', '.join(m.arms)}); those are not run on it")
        try:
            for arms in cfg.serving_groups(m):
                self.serve(m, model_dir, arms)
        finally:
            if cfg.drop_models:
                shutil.rmtree(model_dir, ignore_errors=True)

    def serve(self, m: Model, model_dir: Path, arms: list[str]) -> None:
        """One group of the model's arms: started, measured, stopped; their logs kept under OUT/logs."""
        cfg = self.cfg
        group: dict[str, Server] = {}  # every server started, for the `finally` to stop (a later start may raise)
        try:
            self.start(m, model_dir, arms, group)
            for s in group.values():
                self.results["servers"][s.name] = {"ready_s": round(s.ready_s, 1) if s.ready_s else None,
                                                   "failed": s.failed}
            self.save()
            self.measure(m, {arm: s for arm, s in group.items() if not s.failed}, model_dir)
        except Exception as e:  # one model's failure (a server died mid-run) keeps the others' figures
            log(f"{m.name}: failed: {e!r}")
            self.results["models"].setdefault(m.name, {})["error"] = repr(e)[:500]
        finally:
            for s in group.values():
                self.record_facts(s)
                stop(s.proc, grace=20)
                (cfg.out / "logs").mkdir(exist_ok=True)
                shutil.copy(s.log_path, cfg.out / "logs" / f"{s.name}.log")
            self.save()

    def start(self, m: Model, model_dir: Path, arms: list[str], group: dict[str, Server]) -> None:
        """Start `arms` of the model into `group` and wait for them: together (each start to ready under the others'
        load, as a host serving several models would see it), or with --start-alone one at a time, each ready (or
        failed) before the next starts, so that each start to ready is its own (the run waits their sum)."""
        cfg = self.cfg
        for arm in arms:
            group[arm] = start_server(cfg, m, arm, model_dir, self.facts.setdefault(server_name(m, arm), {}))
            if cfg.start_alone:
                wait_ready([group[arm]], cfg.ready_timeout, report=log)
        if not cfg.start_alone:
            # two arms at least, or nothing to compare: the others are not waited for once that cannot be
            wait_ready(list(group.values()), cfg.ready_timeout, report=log, min_ready=min(2, len(group)))

    def measure_shape(self, m: Model, arms: dict[str, Server], measured: list[str], wl: Workload, mres: dict,
                      model_dir: Path) -> None:
        """One workload shape: its warm-up pass per measured arm, then its alternating repetitions. Today's shape
        ("default") keeps its results where the report reads them (the model's first_pass and reps); every other
        shape under the model's workloads.NAME; each result names its shape, and workloads.NAME.shape its lengths."""
        cfg, shape = self.cfg, wl.shape
        entry = mres.setdefault("workloads", {}).setdefault(shape.name, {"shape": shape.record()})
        where = mres if shape.name == "default" else entry
        if cfg.kv_pool == "fixed":
            entry["kv_sequences"] = fit = kv_sequences(cfg.kv_bytes, model_dir, shape.longest)
            clients = (BURST_PROMPTS,) if shape.burst else cfg.clients or THROUGHPUT_CONCURRENCY
            if over := [c for c in clients if c > fit]:
                log(f"{m.name} {shape.name}: the KV budget (--kv-bytes {cfg.kv_bytes}) holds {fit} of its longest "
                    f"requests at once; at {', '.join(map(str, over))} clients the others wait for their blocks")
        for arm in measured:  # the default shape's prompt 0 was the first request's
            where.setdefault("first_pass", {})[arm] = first_pass(wl, arms[arm].host,
                                                                 first=1 if shape.name == "default" else 0)
        for rep in range(cfg.reps):
            for arm in repetition_order(measured, rep):
                r = sweep(wl, arms[arm].host, cfg.waves, cfg.clients, first=repetition_start(rep))
                where.setdefault("reps", {}).setdefault(arm, []).append(r)
                log(f"{m.name}{'' if shape.name == 'default' else ' ' + shape.name} rep {rep} {arm}: " + ", ".join(
                    f"c{c} {v.get('tok_s', v.get('stream_tok_s')):.0f} tok/s"
                    for c, v in (r.get("throughput") or r.get("burst", {})).items()))
            self.save()

    def measure(self, m: Model, arms: dict[str, Server], model_dir: Path) -> None:
        """One model's warm-up pass per arm, the alternating repetitions, the profiles, and the cross-check (the
        profiles first: a few seconds each, where the cross-check repeats every measurement, so a lease that ends
        early keeps them)."""
        if not arms:
            return
        cfg = self.cfg
        model_id = request_json(next(iter(arms.values())).host, "GET", "/v1/models")["data"][0]["id"]
        wl = Workload(model_id, cfg.in_tokens, cfg.out_tokens, self.vocab)
        mres = self.results["models"].setdefault(m.name, {"layers": m.layers, "first_pass": {}, "reps": {},
                                                          "profile": {}})
        if cfg.kv_pool == "fixed":  # a sized pool's tokens are each server's own (kv_pool.pool_facts)
            mres["kv_sequences"] = kv_sequences(cfg.kv_bytes, model_dir, cfg.in_tokens + cfg.out_tokens)
        measured = [arm for arm in MEASURED_ARMS if arm in arms]
        for arm, s in arms.items():
            first = streamed(s.host, completion_body(model_id, wl.prompt(0), 16, True))["ttft"]
            self.facts.setdefault(s.name, {})["first_ttft_ms"] = round(1e3 * first, 1)
            log(f"{s.name}: first request TTFT {self.facts[s.name]['first_ttft_ms']} ms")
            self.record_facts(s)  # its KV pool, logged at its start, in e2e.json from now on
        for shape in cfg.shapes:
            self.measure_shape(m, arms, measured, Workload.of(model_id, shape, self.vocab), mres, model_dir)
        # the servers' facts now, not only at the end: a run cut short during the profiles (its device lease
        # ending) still keeps each server's first TTFT and JIT counts. The prefix-cache counters now, before the
        # profiles and the cross-check send prompts of their own: 0 hits says no measured prefill was a cache hit
        self.record_prefix_caches(arms.values(), "prefix_cache_tokens")
        if cfg.profile:
            tokens = cfg.profile_tokens or cfg.out_tokens
            window = Workload(model_id, cfg.in_tokens, tokens, self.vocab)  # wl's prompts, shorter outputs
            for arm in (a for a in measured if cfg.profile_arms is None or a in cfg.profile_arms):
                first = repetition_start(cfg.reps)  # the profiles' own prompts, after the last rep's
                for c in cfg.profile_clients:
                    try:
                        mres["profile"][f"{arm}.c{c}"] = {
                            **profile(arms[arm], window, c, cfg.profile_dir(arms[arm].name), first),
                            "steps": profile_steps(c, tokens)}
                    except Exception as e:  # a profile is extra: record why it failed, keep the figures
                        mres["profile"][f"{arm}.c{c}"] = {"error": repr(e)[:300]}
                    first += requests_for(c, 1)
            self.save()
        if cfg.cross_check:
            clients = tuple(c for c in THROUGHPUT_CONCURRENCY if not cfg.clients or c in cfg.clients)
            work = cfg.work / "crosscheck" / m.name
            entries = plan({arm: arms[arm].url for arm in measured}, model_id, model_dir, cfg.in_tokens,
                           cfg.out_tokens, clients, cfg.waves, cfg.cross_check, work / "prompts")
            try:
                mres["cross_check"] = cross_check(cfg.image_python, entries, work,
                                                  timeout=cfg.ready_timeout + 60 * len(entries))
            except Exception as e:  # the cross-check is extra: record why it failed, keep the figures
                mres["cross_check"] = {"error": repr(e)[:500]}
            log(f"{m.name}: cross-check with {len(entries)} measurements")
            # the counters again: still 0 hits says the client's prompts were fresh too
            self.record_prefix_caches(arms.values(), "prefix_cache_tokens_cross_check")
            self.save()


def run(cfg: Config, models: list[Model]) -> dict:
    """The whole run over `models` (in their order); its results, as e2e.json holds them."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.work.exists():
        shutil.rmtree(cfg.work)
    r = Run(cfg, min(m.vocab for m in models))
    for m in models:
        r.model(m)
    return r.results
