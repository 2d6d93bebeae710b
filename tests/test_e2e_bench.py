"""The engine bench (bench/e2e) itself, on the CPU engine: its tiny-cpu check starts both arms, measures them in
turn and writes the figures (the H200 runs use the same code with the FP8 models); and its summary of
a recorded H200 run."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.e2e import capacity, cli, models, report, servers, traces, workload
from bench.e2e.config import Config
from conftest import READY_TIMES, SESSION_ENV, early, starts_early
from tools.launcher_process import start_session

ROOT = Path(__file__).resolve().parent.parent
H200_RUN_3 = ROOT / "bench" / "data" / "h200_engine_3" / "e2e.json"
H200_RUN_4 = ROOT / "bench" / "data" / "h200_engine_4" / "e2e.json"
H200_RUN_5 = ROOT / "bench" / "data" / "h200_engine_5" / "e2e.json"
H200_RUN_6 = ROOT / "bench" / "data" / "h200_engine_6" / "e2e.json"


def _model(name: str, layers: int | None = None) -> models.Model:
    """The bench's model of that --models name, at `layers` if given."""
    m = models.chosen_models([name])[0]
    return m if layers is None else models.with_layers(m, layers)


# The CPU check proves the bench's mechanics, not the CPU's speed: a short workload at two concurrencies
# (the warm-up pass still covers every one), two repetitions to show the arms alternate. Prompts longer than one
# KV block of the CPU engine (128 tokens): a prompt sent twice would be a prefix-cache hit the servers count.
# Its figures are no speeds: on a 2-core host vLLM's thread binding puts both arms' engines on core 0 (it keeps the
# last core for the rest), so one arm's requests can wait on the other's engine, and a stream's tokens can arrive
# together (ITL of about 0 ms).
CLIENTS = (1, 8)
TOKENS = 16
PROMPT_TOKENS = 144


@starts_early("run")
def _bench_check(tmp: Path, nice: int) -> SimpleNamespace:
    stock_site = tmp / "stock-site"  # empty: the stock arm runs vLLM's own server on this venv's vLLM
    stock_site.mkdir()
    cmd = [sys.executable, "-m", "bench.e2e", "--stock-site", str(stock_site), "--models-dir",
           str(tmp / "models"), "--out", str(tmp / "out"), "--work", str(tmp / "work"), "--models", "tiny-cpu",
           "--reps", "2", "--waves", "1", "--ready-timeout", "600", "--in-tokens", str(PROMPT_TOKENS), "--out-tokens",
           str(TOKENS), "--clients", *map(str, CLIENTS), "--cross-check", "1"]
    # in a session of its own (stop() ends it and its servers), at `nice`: its servers' sessions inherit that
    with open(tmp / "stdout.txt", "wb") as out:
        proc = start_session(cmd, SESSION_ENV, out, ROOT, nice)
    return SimpleNamespace(proc=proc, tmp=tmp)


@pytest.fixture(scope="module")
def run(request):
    check = early(request, "run")
    rc = check.proc.wait(1200)
    stdout = (check.tmp / "stdout.txt").read_text()
    assert rc == 0, stdout[-6000:]
    for name, s in json.loads((check.tmp / "out" / "e2e.json").read_text())["servers"].items():
        READY_TIMES.append((f"bench.e2e {name}", s["ready_s"] or 0.0))
    return check.tmp / "out", stdout


@pytest.mark.engine
def test_both_arms_measured_alternately(run):
    out, stdout = run
    res = json.loads((out / "e2e.json").read_text())
    reps = res["models"]["tiny-cpu"]["reps"]
    assert len(reps["stock"]) == len(reps["image"]) == 2
    for r in reps["stock"] + reps["image"]:
        assert set(r["throughput"]) == {str(c) for c in workload.THROUGHPUT_CONCURRENCY if c in CLIENTS}
        assert set(r["latency"]) == {str(c) for c in workload.LATENCY_CONCURRENCY if c in CLIENTS} != set()
        for c, t in r["throughput"].items():
            assert t["tokens"] == t["requests"] * TOKENS and t["tok_s"] > 0
        for c, t in r["latency"].items():
            assert t["stream_tok_s"] > 0  # the streamed requests' output tokens/s
            assert 0 < t["ttft_p50_ms"] <= t["ttft_p99_ms"]
            assert 0 < t["itl_p50_ms"] <= t["itl_p90_ms"] <= t["itl_p99_ms"] <= t["itl_p999_ms"] <= t["itl_max_ms"]
            assert 0 < t["itl_gaps"] <= t["requests"] * TOKENS and 0 <= t["itl_over_2x_median"] < t["itl_gaps"]
    every = {str(c) for c in workload.THROUGHPUT_CONCURRENCY + workload.LATENCY_CONCURRENCY}
    for arm in ("stock", "image"):  # the unmeasured warm-up pass: every concurrency's first request
        assert set(res["models"]["tiny-cpu"]["first_pass"][arm]) == every
    order = [ln.split(" rep ")[1].split(":")[0] for ln in stdout.splitlines() if " rep " in ln]
    assert order == ["0 stock", "0 image", "1 image", "1 stock"]  # every other repetition the other way round


@pytest.mark.engine
def test_servers_started_cold_and_stopped(run):
    out, _ = run
    res = json.loads((out / "e2e.json").read_text())
    for name in ("tiny-cpu.stock", "tiny-cpu.image"):
        s = res["servers"][name]
        assert s["failed"] is None and s["ready_s"] > 0 and s["first_ttft_ms"] > 0
        assert s["jit_warnings"] == 0
        # no prompt reached a server twice: its prefix cache looked up every measured prompt and found none
        assert s["prefix_cache_tokens"]["queries"] > 0 and s["prefix_cache_tokens"]["hits"] == 0, s
        # nor did vLLM's client's prompts (the cross-check): more looked up since, still none found
        after = s["prefix_cache_tokens_cross_check"]
        assert after["queries"] > s["prefix_cache_tokens"]["queries"] and after["hits"] == 0, s
        # every compile logged, not only a kernel's first (vLLM's monitor warns once per kernel otherwise)
        assert "jit_monitor_verbose=True" in (out / "logs" / f"{name}.log").read_text()
    image_log = (out / "logs" / "tiny-cpu.image.log").read_text()
    assert "setting flashinfer_sampler=False" in image_log  # the image arm is the launcher, not plain vLLM
    # its cold cache folder got the venv's model-info files (serving.modelinfo_cache), so vLLM skipped its inspection
    assert re.search(r"vLLM's model-info cache: [1-9]\d* file\(s\)", image_log)
    md = (out / "e2e.md").read_text()
    for name in ("tiny-cpu.stock", "tiny-cpu.image"):
        row = next(ln for ln in md.splitlines() if ln.startswith(f"| {name} |")).split("|")
        assert row[6].strip().startswith("0 of "), row  # e2e.md shows the hits beside the start figures


@pytest.mark.engine
def test_each_measured_run_splits_vllms_time_to_first_token_on_the_server(run):
    """Every measured run of a vLLM arm carries the server's own means over exactly its requests (the /metrics
    histograms read before and after it): time to first token from the request's arrival, its queue wait and its
    prefill, the wait and the prefill within the first."""
    out, _ = run
    res = json.loads((out / "e2e.json").read_text())
    for arm, reps in res["models"]["tiny-cpu"]["reps"].items():
        for r in reps:
            for kind in ("throughput", "latency"):
                for c, m in r[kind].items():
                    srv = m["server"]
                    assert srv["requests"] == m["requests"], (arm, kind, c, srv)
                    assert 0 <= srv["queue_ms"] < srv["ttft_ms"] and 0 < srv["prefill_ms"] < srv["ttft_ms"], srv


def test_server_phases_are_none_without_vllms_histograms():
    """A server whose /metrics lacks vLLM's histograms (SGLang's, or none at all) gives no phases, not zeros."""
    assert workload.phases_between(None, {"ttft_count": 1}) is None
    text = "vllm:time_to_first_token_seconds_sum{engine=\"0\"} 2.0\nvllm:time_to_first_token_seconds_count 4\n"
    assert workload._summed(text, {"n": "vllm:time_to_first_token_seconds_count",
                                   "s": "vllm:time_to_first_token_seconds"}) == {"n": 4.0}



def test_the_cross_checks_rows_keep_the_servers_split_where_it_was_read():
    """The child's row of one measurement becomes the bench's shape, the server's split under latency beside the
    client's TTFT; a server without vLLM's histograms (SGLang) adds none."""
    from bench.e2e import crosscheck
    srv = {"requests": 8, "ttft_ms": 60.0, "queue_ms": 0.0, "prefill_ms": 35.0}
    row = {"arm": "image", "rep": 0, "clients": 8, "completed": 8, "failed": 0, "input_tokens": 1024,
           "output_throughput": 800.0, "median_ttft_ms": 63.0, "median_itl_ms": 9.0}
    reps = crosscheck.as_reps([{**row, "server": srv}, {**row, "arm": "sglang", "server": None}])
    assert reps["image"][0]["latency"]["8"] == {"ttft_p50_ms": 63.0, "itl_p50_ms": 9.0, "server": srv}
    assert reps["sglang"][0]["latency"]["8"] == {"ttft_p50_ms": 63.0, "itl_p50_ms": 9.0}


def test_the_summary_sets_vllms_split_of_the_first_token_beside_the_clients():
    """e2e.md's server-phase table: per arm, run kind and concurrency the median over repetitions of the server's
    means, beside the client's TTFT p50 where the run streamed; a run recorded without the split adds no table."""
    def rep(ttft, queue):
        srv = {"requests": 8, "ttft_ms": ttft, "queue_ms": queue, "prefill_ms": 20.0}
        return {"throughput": {"128": {"requests": 512, "tok_s": 1.0, "server": srv}},
                "latency": {"8": {"requests": 32, "ttft_p50_ms": ttft + 5, "server": srv}}}
    results = {"args": {}, "servers": {},
               "models": {"m": {"reps": {"image": [rep(100.0, 10.0), rep(300.0, 30.0), rep(200.0, 20.0)]}}}}
    # the cross-check's measurements, split around each by the client's child (crosscheck.main)
    client = [{"throughput": {"128": {"tok_s": 1.0}}, "requests": {"128": {"completed": 512}},
               "latency": {"128": {"ttft_p50_ms": 330.0, "server": {"requests": 512, "ttft_ms": t,
                                                                   "queue_ms": 0.5, "prefill_ms": 110.0}}}}
              for t in (150.0, 160.0)]
    results["models"]["m"]["cross_check"] = {"image": client}
    rows = [ln for ln in report.server_phase_table(results) if ln.startswith("| m |")]
    assert rows == ["| m | image | throughput | 128 | - | 200.0 | 20.0 | 20.0 |",
                    "| m | image | latency | 8 | 205.0 | 200.0 | 20.0 | 20.0 |",
                    "| m | image | vLLM's client | 128 | 330.0 | 155.0 | 0.5 | 110.0 |"]
    results["models"]["m"]["cross_check"] = {"error": "RuntimeError('the client exited 1')"}
    for r in results["models"]["m"]["reps"]["image"]:
        for kind in r.values():
            for m in kind.values():
                del m["server"]
    assert report.server_phase_table(results) == []


@pytest.mark.engine
def test_summary_gives_a_ratio_per_metric(run):
    out, _ = run
    md = (out / "e2e.md").read_text()
    ratio_table = md.split("\n\n")[0]  # e2e.md opens with the image/stock ratios; other tables follow
    rows = [ln for ln in ratio_table.splitlines() if ln.startswith("| tiny-cpu | image |")]
    measured = [c for c in workload.THROUGHPUT_CONCURRENCY if c in CLIENTS]
    assert len(rows) == len(measured) + 5 * len([c for c in workload.LATENCY_CONCURRENCY if c in CLIENTS])
    assert any("| stream_tok_s | 1 |" in r for r in rows)
    tok1 = next(r for r in rows if "| tok_s | 1 |" in r).split("|")
    assert float(tok1[7]) > 0  # the median image/stock ratio


@pytest.mark.engine
def test_cross_check_measures_each_arm_with_vllms_own_client(run):
    """After the bench's own repetitions, vLLM's `vllm bench serve` (its module, from the image's Python) measured
    each arm at each measured concurrency, every request completed, and e2e.md sets its ratios beside the bench's."""
    out, stdout = run
    cc = json.loads((out / "e2e.json").read_text())["models"]["tiny-cpu"]["cross_check"]
    measured = {str(c) for c in workload.THROUGHPUT_CONCURRENCY if c in CLIENTS}
    assert set(cc) == {"stock", "image"}
    for arm, reps in cc.items():
        assert len(reps) == 1, arm
        rep = reps[0]
        assert set(rep["requests"]) == set(rep["throughput"]) == measured, rep
        for c, req in rep["requests"].items():
            # --waves 1: one request per client, each of the run's prompt length in the model's own tokenizer
            assert req == {"completed": int(c), "failed": 0, "input_tokens": int(c) * PROMPT_TOKENS}
            assert rep["throughput"][c]["tok_s"] > 0 and rep["latency"][c]["ttft_p50_ms"] > 0
            # vLLM's own split of the first token over exactly this measurement's requests
            srv = rep["latency"][c]["server"]
            assert srv["requests"] == int(c) and 0 < srv["prefill_ms"] < srv["ttft_ms"], (arm, c, srv)
    md = (out / "e2e.md").read_text()
    assert "Cross-check with vLLM's `vllm bench serve`" in md
    assert any(ln.startswith("| tiny-cpu | image | vLLM's client | 8 |") for ln in md.splitlines())
    row = next(ln for ln in md.splitlines() if ln.startswith("| tiny-cpu | image/stock | tok_s | 1 |")).split("|")
    assert float(row[5].split()[0]) > 0 and float(row[6].split()[0]) > 0 and row[7].strip() in ("yes", "no")
    assert "cross-check with 4 measurements" in stdout  # 2 arms x 2 concurrencies, one repetition


def tok_s_rep(tok_s: float, clients: str = "1") -> dict:
    """One repetition's record holding only its output tokens/s at one concurrency, as report.summarize reads it."""
    return {"throughput": {clients: {"tok_s": tok_s}}, "latency": {}}


def test_a_run_without_stock_sets_each_arm_against_the_image():
    """One switch measured against the image, no stock arm: e2e.md pairs each other arm with the image by
    repetition, and has no empty stock table."""
    res = {"args": {"out_tokens": "16"}, "servers": {}, "models": {"m": {
        "reps": {"image": [tok_s_rep(250), tok_s_rep(200)], "image-no-nvcc": [tok_s_rep(255), tok_s_rep(210)]}}}}
    md = report.summarize(res)
    assert "| m | image-no-nvcc/image | tok_s | 1 | 225.0 | 232.5 | 1.035 | 1.020-1.050 |" in md
    assert "arm/stock" not in md
    res["models"]["m"]["reps"]["stock"] = [tok_s_rep(200), tok_s_rep(200)]  # with stock: every arm against stock only
    md = report.summarize(res)
    assert "| m | image-no-nvcc | tok_s | 1 | 200.0 | 232.5 | 1.163 | 1.050-1.275 |" in md
    assert "image-no-nvcc/image" not in md


def test_cross_check_table_sets_the_clients_ratios_beside_the_benchs():
    """Paired ratios of the cross-check's repetitions beside the bench's own; 'ranges overlap' says whether they
    agree within their spread; a failed cross-check is named, not dropped."""
    res = {"args": {"out_tokens": "16"}, "servers": {}, "models": {"m": {
        "reps": {"stock": [tok_s_rep(100), tok_s_rep(100)], "image": [tok_s_rep(120), tok_s_rep(125)]},
        "cross_check": {"stock": [tok_s_rep(100), tok_s_rep(100)], "image": [tok_s_rep(122), tok_s_rep(130)]}}}}
    md = report.summarize(res)
    assert "| m | image/stock | tok_s | 1 | 1.225 (1.200-1.250) | 1.260 (1.220-1.300) | yes |" in md
    res["models"]["m"]["cross_check"]["image"] = [tok_s_rep(90), tok_s_rep(95)]
    assert "| m | image/stock | tok_s | 1 | 1.225 (1.200-1.250) | 0.925 (0.900-0.950) | no |" in report.summarize(res)
    zero = tok_s_rep(0.0)  # no ratio over a zero: the pair is left out
    res["models"]["m"]["cross_check"] = {"stock": [zero, tok_s_rep(100)], "image": [tok_s_rep(110), tok_s_rep(124)]}
    assert "| m | image/stock | tok_s | 1 | 1.225 (1.200-1.250) | 1.240 (1.240-1.240) | yes |" in report.summarize(res)
    failed = {"throughput": {}, "latency": {}, "requests": {"1": {"completed": 0, "failed": 1,
                                                               "error": "no request completed (1 failed)"}}}
    res["models"]["m"]["cross_check"]["image"] = [tok_s_rep(110), failed]
    md = report.summarize(res)
    assert "- m image repetition 1, 1 clients: no request completed (1 failed)" in md
    # neither repetition pairs (a zero base, a failed measurement): no cross-check row for the figure
    assert not any(ln.startswith("| m | image/stock | tok_s | 1 |") for ln in md.splitlines())
    res["models"]["m"]["cross_check"] = {"error": "RuntimeError('the client exited 1')"}
    assert "- m: the cross-check failed: RuntimeError('the client exited 1')" in report.summarize(res)


def test_cross_check_table_sets_one_switch_against_the_image_where_stock_was_not_measured():
    """A run of image arms alone (run 40: one KV split against the image) is cross-checked as its own table pairs
    it, each other image arm against the image; with stock measured the pairs are against stock, as before."""
    def rep(*tok_s):
        return [tok_s_rep(t, clients="128") for t in tok_s]
    res = {"args": {"out_tokens": "16"}, "servers": {}, "models": {"m": {
        "reps": {"image": rep(100, 100), "image-attn-one-split": rep(101, 102)},
        "cross_check": {"image": rep(100, 100), "image-attn-one-split": rep(103, 101)}}}}
    md = report.summarize(res)
    assert "| m | image-attn-one-split/image | tok_s | 128 | 100.0 | 101.5 | 1.015 | 1.010-1.020 |" in md
    assert ("| m | image-attn-one-split/image | tok_s | 128 | 1.015 (1.010-1.020) | 1.020 (1.010-1.030) | yes |"
            in md)
    res["models"]["m"]["reps"]["stock"] = res["models"]["m"]["cross_check"]["stock"] = rep(50, 50)
    md = report.summarize(res)
    assert "image-attn-one-split/image" not in md
    assert "| m | image-attn-one-split/stock | tok_s | 128 | 2.030 (2.020-2.040) | 2.040 (2.020-2.060) | yes |" in md


def test_the_cross_check_plan_alternates_arms_on_the_same_fresh_prompts(tmp_path):
    """Repetition, then arm (every other repetition the other way round), then concurrency; each arm of a
    repetition gets the same prompts at a concurrency, every other measurement other prompts, none of them sharing a
    first cache block (16 tokens) with another; the client's arguments parse with vLLM's own parser, and its custom
    dataset reads the prompts as written, each the run's prompt length in the shards' tokenizer (the embedded
    model's, serving.tiny_model)."""
    from vllm.benchmarks.datasets.datasets import CustomDataset
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from bench.e2e import crosscheck
    from serving import tiny_model
    tokenizer = tiny_model.ensure(tmp_path / "model")
    entries = crosscheck.plan({"stock": "http://127.0.0.1:1", "image": "http://127.0.0.1:2"}, "m", tokenizer, 128,
                              128, (1, 8), 4, 2, tmp_path / "prompts")
    assert [(e["rep"], e["arm"], e["clients"]) for e in entries] == [
        (r, a, c) for r, arms in ((0, ("stock", "image")), (1, ("image", "stock"))) for a in arms for c in (1, 8)]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(entries[-1]["argv"])
    assert (args.base_url, args.max_concurrency, args.num_prompts) == ("http://127.0.0.1:1", 8, 32)
    paths = {(e["rep"], e["arm"], e["clients"]): parser.parse_args(e["argv"]).dataset_path for e in entries}
    assert all(paths[(r, "stock", c)] == paths[(r, "image", c)] for r in (0, 1) for c in (1, 8))
    assert len({paths[(r, "stock", c)] for r in (0, 1) for c in (1, 8)}) == 4
    assert (args.dataset_name, args.custom_output_len, args.ignore_eos, args.skip_chat_template) == (
        "custom", 128, True, True)
    assert args.ready_check_timeout_sec == 0  # its test run would send a measurement's first prompt twice
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer)
    blocks = []
    for e in entries[:2] + entries[4:6]:  # repetitions 0 and 1, both concurrencies, each repetition's first arm
        crosscheck.write_dataset(e["dataset"])
        a = parser.parse_args(e["argv"])
        sent = CustomDataset(dataset_path=a.dataset_path, disable_shuffle=True, random_seed=a.seed).sample(
            tok, a.num_prompts, output_len=a.custom_output_len, skip_chat_template=True)
        assert len(sent) == a.num_prompts
        ids = [tok(r.prompt).input_ids for r in sent]  # as the server counts a text prompt, its specials added
        assert all(len(i) == 128 for i in ids) and all(r.prompt_len == 128 for r in sent)
        blocks += [tuple(i[:16]) for i in ids]
    assert len(blocks) == len(set(blocks)) == 2 * (4 + 32)
    # greedy, as the bench's own requests: the client would otherwise leave sampling to the server (temperature 1)
    from bench.e2e.workload import completion_body
    assert args.temperature == completion_body("m", [300], 8, stream=False)["temperature"] == 0.0


def test_profile_windows_at_the_chosen_concurrencies_with_shorter_requests_count_their_own_steps(tmp_path):
    """--profile-clients and --profile-tokens reach the run's settings, and the summary divides a window's GPU time
    by the steps that window ran (recorded with it), not by the measured runs' output length."""
    cfg = Config.from_args(cli.parser().parse_args(
        ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path), "--out", str(tmp_path), "--profile",
         "--profile-clients", "1", "8", "32", "--profile-tokens", "16"]))
    assert (cfg.profile, cfg.profile_clients, cfg.profile_tokens) == (True, (1, 8, 32), 16)
    assert Config.from_args(cli.parser().parse_args(
        ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path), "--out", str(tmp_path)])).profile_clients == (
        1, 32)
    window = {"total_gpu_ms": 80.0, "share": {"moe_w13": 0.5}, "top_other": [], "trace": "t.json",
              "steps": traces.profile_steps(8, 16)}
    results = {"args": {"out_tokens": "128"}, "servers": {},
               "models": {"m": {"reps": {}, "first_pass": {}, "profile": {"image.c8": window}}}}
    row = next(ln for ln in report.summarize(results).splitlines() if ln.startswith("| m | image | 8 |")).split("|")
    assert float(row[5]) == pytest.approx(80.0 / 16)  # 8 requests side by side, 16 steps each


def test_profile_arms_are_measured_arms_of_a_profiled_run(tmp_path):
    """--profile-arms picks arms of the run, and is refused without --profile or naming an arm not run."""
    base = ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path), "--out", str(tmp_path),
            "--arms", "stock", "image"]

    def problems(*extra):
        return cli.profile_arms_problems(Config.from_args(cli.parser().parse_args(base + list(extra))))
    assert problems() == problems("--profile") == problems("--profile", "--profile-arms", "image") == []
    assert Config.from_args(cli.parser().parse_args(base + ["--profile", "--profile-arms", "image"])
                            ).profile_arms == ("image",)
    assert problems("--profile-arms", "image") == ["--profile-arms without --profile: nothing is profiled"]
    assert problems("--profile", "--profile-arms", "image-graph-estimate") == [
        "--profile-arms: image-graph-estimate not among --arms (stock, image)"]


def test_profile_steps_follow_the_window():
    # one wave at 1 client is 4 requests one after another; at 32 clients, 32 requests side by side
    assert traces.profile_steps(1, 128) == 4 * 128
    assert traces.profile_steps(32, 128) == 128
    assert traces.profile_steps(3, 10) == 2 * 10  # 4 requests, 3 at a time: two rounds


@pytest.mark.parametrize("recorded", [H200_RUN_3, H200_RUN_4, H200_RUN_5, H200_RUN_6],
                         ids=["run3", "run4", "run5", "run6"])
def test_summary_of_a_recorded_run_gives_gpu_time_per_step(recorded):
    """The summary's profile table, from H200 runs 3-6's recorded figures (bench/data/h200_engine_*)."""
    res = json.loads(recorded.read_text())
    md = report.summarize(res)
    profiled = 0
    for model, m in res["models"].items():
        rows = [ln.split("|")[1:-1] for ln in md.splitlines() if ln.startswith(f"| {model} | ") and ln.count("|") == 11]
        profiles = m["profile"]
        # runs 3 and 4 lost the second model's profiles (the lease ended): such a model gets no row;
        # run 6 profiled three arms
        assert len(rows) == len(profiles) in (0, 4, 6)
        profiled += bool(rows)
        for cells in rows:
            arm, conc = cells[1].strip(), int(cells[2])
            p = profiles[f"{arm}.c{conc}"]
            assert float(cells[3]) == round(p["total_gpu_ms"], 1)
            assert float(cells[4]) == pytest.approx(p["total_gpu_ms"] / traces.profile_steps(conc, 128), abs=1e-3)
            shares = [float(c.strip().rstrip("%")) for c in cells[5:]]
            assert sum(shares) == pytest.approx(100, abs=0.3)
    assert profiled == (2 if recorded == H200_RUN_5 else 1)


def test_summary_covers_only_the_measured_clients():
    """--clients 1 8: the repetitions hold those concurrencies only, and the summary rows follow them."""
    res = json.loads(H200_RUN_3.read_text())
    for m in res["models"].values():
        for reps in m["reps"].values():
            for r in reps:
                r["throughput"] = {c: v for c, v in r["throughput"].items() if c in ("1", "8")}
                r["latency"] = {c: v for c, v in r["latency"].items() if c == "1"}
    md = report.summarize(res)
    keys = {tuple(c.strip() for c in ln.split("|")[3:5]) for ln in md.splitlines()
            if ln.startswith("| qwen3-coder-480b-tp8-tensor | image |")}
    assert keys == {("tok_s", "1"), ("tok_s", "8"), ("ttft_p50_ms", "1"), ("ttft_p99_ms", "1"),
                    ("itl_p50_ms", "1"), ("itl_p99_ms", "1")}


def test_clients_outside_the_sweep_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--stock-site", str(tmp_path), "--models-dir", str(tmp_path), "--out", str(tmp_path),
                        "--clients", "1", "16"])
    assert e.value.code == 2
    assert "--clients: invalid choice: 16" in capsys.readouterr().err


def _latency_clients(res: dict) -> set[str]:
    """The concurrencies a recorded run measured latency at: run 3's are 1 and 32 (8 came later)."""
    return {c for m in res["models"].values() for reps in m["reps"].values() for rep in reps for c in rep["latency"]}


def test_pooled_ratios_of_one_run_are_its_summary():
    """bench.e2e.pool over one run gives the summary's median and range for every figure it pools."""
    from bench.e2e import pool as e2e_pool

    res = json.loads(H200_RUN_3.read_text())
    summary = {tuple(c.strip() for c in ln.split("|")[1:5]): ln.split("|")[7:9]
               for ln in report.summarize(res).splitlines() if ln.count("|") == 9}
    pooled = [[c.strip() for c in ln.split("|")[1:-1]] for ln in e2e_pool.table([res])[2:]]
    assert len(pooled) == 2 * (len(workload.THROUGHPUT_CONCURRENCY) + 2 * len(_latency_clients(res)))
    for model, metric, clients, n, median, spread in pooled:
        assert int(n) == 5
        assert [x.strip() for x in summary[(model, "image", metric, clients)]] == [median, spread]


def test_pool_of_runs_3_to_5_pools_the_model_all_three_measured():
    from bench.e2e import pool as e2e_pool

    runs = [json.loads(p.read_text()) for p in (H200_RUN_3, H200_RUN_4, H200_RUN_5)]
    # the Qwen3-Coder shard, the only model of all three runs: every row pools the three runs' repetitions
    rows = [r for r in e2e_pool.table(runs)[2:] if r.startswith("| qwen3-coder-480b-tp8-tensor |")]
    assert len(rows) == 8
    assert {r.split("|")[4].strip() for r in rows if r.split("|")[3].strip() == "1"} == {"14"}


def test_models_run_in_the_order_given():
    names = ["qwen3-coder-480b-tp8-tensor", "qwen3-235b-tp8-tensor", "qwen3-coder-480b-tp8-tensor"]
    assert [m.name for m in models.chosen_models(names)] == names[:2]


def _bench_config(tmp_path) -> Config:
    """The run's settings server_command reads, its work folder tmp_path."""
    return Config(stock_site=str(tmp_path / "stock"), models_dir=tmp_path / "models", out=tmp_path / "out",
                  work=tmp_path, kv_bytes=1 << 30)


def _image_launch_plan(image_env: dict, model: Path | None = None):
    """What the image's launcher makes of an image arm's settings (its OPTION_ variables and model folder), for the
    model folder `model` (default: a hub id, whose config.json the launcher does not read)."""
    from serving import launcher
    from serving.vllm_args import VllmArgs

    return launcher.plan({k: v for k, v in image_env.items() if k.startswith("OPTION_") or k == "SERVING_MODEL_DIR"}
                         | {"OPTION_MODEL_ID": str(model or "Qwen/Qwen3-0.6B")}, VllmArgs())


def test_the_image_arms_carry_the_workloads_settings_alone_and_stock_keeps_its_linear_backend(tmp_path, gpu_build):
    """A block-FP8 model's --linear-backend cutlass is a flag of the stock arm only. Every image arm's OPTION_
    variables are its settings, the model, host and port, and the workload's own engine settings (lengths, batch,
    memory) and the bench's instruments; its arm flag for the arms of one vLLM flag. The image's launcher then
    chooses CUTLASS and Triton itself, from the shard's config.json, and agrees with stock on the workload."""
    from serving.settings import TABLE

    m = _model("qwen3-235b-ep8-block")
    assert dict(m.engine_args) == {"linear-backend": "cutlass"}
    cfg = _bench_config(tmp_path)
    shard = _shard(tmp_path, "qwen3-235b-a22b-ep8", layers=2, fp8="block")
    assert json.loads((shard / "config.json").read_text())["quantization_config"]["weight_block_size"]
    stock_cmd, _ = servers.server_command(cfg, m, "stock", shard, 8001)
    assert _flag(stock_cmd, "--linear-backend") == "cutlass"
    allowed = {*models.WORKLOAD_ENGINE_ARGS, *models.INSTRUMENT_ENGINE_ARGS}
    for arm in models.IMAGE_ARM_SETTINGS:
        _, env = servers.server_command(cfg, m, arm, shard, 8002)
        own = {*models.CONTAINER_SETTINGS, *models.IMAGE_ARM_SETTINGS[arm], "model_id", "host", "port",
               *(("configs_dir",) if arm == models.CANDIDATES_ARM else ())}
        names = {n for key in own for n in (f"OPTION_{key.upper()}", *TABLE[key].env_names) if key in TABLE} | {
            f"OPTION_{k.replace('-', '_').upper()}" for k in (*allowed, *models.IMAGE_ARM_ENGINE_ARGS.get(arm, {}))}
        assert {k for k in env if k.startswith("OPTION_")} <= names, arm
    _, image_env = servers.server_command(cfg, m, "image", shard, 8002)
    assert "OPTION_LINEAR_BACKEND" not in image_env and "OPTION_MOE_BACKEND" not in image_env
    p = _image_launch_plan(image_env, shard)
    assert (_flag(p.argv, "--linear-backend"), _flag(p.argv, "--moe-backend")) == ("cutlass", "triton")
    assert p.resolved["linear_backend"].source.startswith("default (block FP8")
    for flag in ("--max-num-seqs", "--max-model-len", "--kv-cache-memory-bytes", "--gpu-memory-utilization"):
        assert _flag(p.argv, flag) == _flag(stock_cmd, flag), flag
    assert "--jit-monitor-verbose" in p.argv and "--jit-monitor-verbose" in stock_cmd
    # both arms start `vllm serve`, the model its positional argument
    assert stock_cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(shard)]
    assert p.argv[1:4] == stock_cmd[1:4]


def test_the_vllm_quant_arm_differs_from_the_image_by_patch_0006s_switch_alone(tmp_path):
    """image-vllm-quant: the image's launcher hands the engine LMI_FP8_MOE_ONE_LAUNCH_QUANT=0 (vLLM's own
    two-kernel quantization); the image arm leaves the patched default; the engine flags are the same."""
    m = _model("qwen3-235b-tp8-tensor")
    assert "image-vllm-quant" in m.arms and "image-vllm-quant" in models.MEASURED_ARMS
    cfg = _bench_config(tmp_path)
    plans = {arm: _image_launch_plan(servers.server_command(cfg, m, arm, tmp_path / "model", 8002)[1])
             for arm in ("image", "image-vllm-quant")}
    assert plans["image-vllm-quant"].env["LMI_FP8_MOE_ONE_LAUNCH_QUANT"] == "0"
    assert "LMI_FP8_MOE_ONE_LAUNCH_QUANT" not in plans["image"].env
    assert plans["image"].argv == plans["image-vllm-quant"].argv


def test_each_image_arm_switches_one_setting_of_the_table_and_no_arm_inherits_a_switch(tmp_path, monkeypatch,
                                                                                     gpu_build):
    """The image arms' switches are settings of serving/settings.py's table: each arm's reaches the image's launcher,
    and a switch left in the bench's own environment, under any of its names, reaches no arm."""
    from serving.settings import TABLE

    # one setting each ("image", "image-no-nvcc", "image-candidates" and the arms of one vLLM flag none; the two of
    # vLLM's own graph memory both); two arms may give one setting two values
    unset = {"image", "image-no-nvcc", "image-candidates", *models.IMAGE_ARM_ENGINE_ARGS}
    assert {arm for arm, own in models.IMAGE_ARM_SETTINGS.items() if not own} == unset
    assert models.IMAGE_ARM_SETTINGS["image-graph-estimate"] == {"cuda_graph_profile_all": False,
                                                                 "flash_attn_graph_split_tokens": 0}
    assert all(len(own) == 1 for arm, own in models.IMAGE_ARM_SETTINGS.items()
               if arm not in unset | {"image-graph-estimate"})
    switched = {key: value for arm in models.IMAGE_ARM_SETTINGS.values() for key, value in arm.items()}
    names = {n for key in switched for n in (*TABLE[key].env_names, TABLE[key].engine_env) if n}
    for name in names:
        monkeypatch.setenv(name, "1")
    cfg = _peer_config(tmp_path, kv_bytes=1 << 30)  # the peers' runtimes given
    shard = _shard(tmp_path)  # the peers read the model's config.json
    # the image's values: the table's defaults and what its launcher decides in the container
    image = {key: TABLE[key].default for key in switched} | models.CONTAINER_SETTINGS
    for arm in models.ARMS:
        _, env = servers.server_command(cfg, models.CPU_CHECK, arm, shard, 8002)
        image_arm = arm in models.IMAGE_ARM_SETTINGS
        own = {**models.CONTAINER_SETTINGS, **models.IMAGE_ARM_SETTINGS[arm]} if image_arm else {}
        inherited = names & set(env) - {n for key in own for n in TABLE[key].env_names}
        assert not inherited, arm
        if arm in models.IMAGE_ARM_SETTINGS:
            plan = _image_launch_plan(env)  # the GPU build's defaults (gpu_build), which the arms run with
            assert {key: getattr(plan.settings, key) for key in switched} == image | own, arm  # theirs, not "1"


def _one_flag_arm(tmp_path, model: str, arm: str, flag: str) -> dict:
    """vLLM's own parser's reading of the image arm's and `arm`'s `vllm serve` flags ({arm: namespace}), after
    checking that `arm` is a measured arm of `model` whose flags are the image arm's with `flag` and its value its
    own."""
    from serving.vllm_args import _raising_parser

    m = _model(model)
    assert arm in m.arms and arm in models.MEASURED_ARMS
    cfg = _bench_config(tmp_path)
    argv = {a: _image_launch_plan(servers.server_command(cfg, m, a, tmp_path / "model", 8002)[1]).argv
            for a in ("image", arm)}

    def without_flag(v: list[str]) -> list[str]:
        i = v.index(flag) if flag in v else len(v)
        return v[:i] + v[i + 2:]

    assert flag in argv[arm] and without_flag(argv[arm]) == without_flag(argv["image"])
    return {a: _raising_parser().parse_args(v[4:]) for a, v in argv.items()}  # after `PYTHON -m ... serve`


def test_the_one_split_attention_arm_is_the_image_with_vllms_split_cap_at_one(tmp_path):
    """image-attn-one-split: the image's launcher passes --attention-config through to vLLM, whose own parser reads
    FlashAttention's split cap for CUDA graphs as 1 (vLLM's default 32 in the image arm); every other flag is the
    image arm's."""
    from vllm.config import AttentionConfig

    arm = models.ATTN_ONE_SPLIT_ARM
    parsed = _one_flag_arm(tmp_path, "qwen3-coder-480b-ep8-block", arm, "--attention-config")
    configs = {a: ns.attention_config or AttentionConfig() for a, ns in parsed.items()}  # vLLM's default: unset
    assert {a: c.flash_attn_max_num_splits_for_cuda_graph for a, c in configs.items()} == {"image": 32, arm: 1}


def test_the_one_api_server_arm_is_the_image_with_vllms_one_api_server_process(tmp_path, gpu_build):
    """image-one-api-server: vLLM's own parser reads the image arm's API server count as 4 (the GPU build's default)
    and the arm's as 1; every other flag, the middleware included, is the image arm's."""
    arm = models.ONE_API_SERVER_ARM
    parsed = _one_flag_arm(tmp_path, "qwen3-235b-ep8-block", arm, "--api-server-count")
    assert {a: ns.api_server_count for a, ns in parsed.items()} == {"image": 4, arm: 1}
    assert all(ns.middleware == ["serving.lmi.middleware.LMIMiddleware"] for ns in parsed.values())


def test_the_piecewise_prompts_arm_is_the_image_with_vllms_cuda_graph_mode(tmp_path, gpu_build):
    """image-piecewise-prompts: vLLM's own parser reads the image arm's compilation config as cudagraph_mode FULL
    (option.cuda_graph_full_steps, the image's default) and the arm's as unset (vLLM's default FULL_AND_PIECEWISE),
    with the same capture sizes up to cuda_graph_max_tokens; every other flag is the image arm's. Only where the
    preset's attention is FlashAttention 3's (not MLA, where vLLM keeps FULL_AND_PIECEWISE in both)."""
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CUDAGraphMode

    from serving.vllm_args import _raising_parser

    m = _model("qwen3-235b-ep8-block")
    assert models.PIECEWISE_PROMPTS_ARM in m.arms and models.PIECEWISE_PROMPTS_ARM in models.MEASURED_ARMS
    assert models.PIECEWISE_PROMPTS_ARM not in _model("deepseek-v3-tp8-mla-block").arms
    cfg = _bench_config(tmp_path)
    argv = {arm: _image_launch_plan(servers.server_command(cfg, m, arm, tmp_path / "model", 8002)[1]).argv
            for arm in ("image", models.PIECEWISE_PROMPTS_ARM)}
    parsed = {arm: _raising_parser().parse_args(a[4:]).compilation_config or CompilationConfig()
              for arm, a in argv.items()}
    assert parsed["image"].cudagraph_mode == CUDAGraphMode.FULL
    assert parsed[models.PIECEWISE_PROMPTS_ARM].cudagraph_mode is None  # vLLM then picks FULL_AND_PIECEWISE
    sizes = {arm: c.cudagraph_capture_sizes for arm, c in parsed.items()}
    assert sizes["image"] == sizes[models.PIECEWISE_PROMPTS_ARM] and max(sizes["image"]) == 8192

    def without_config(a: list[str]) -> list[str]:
        i = a.index("--compilation-config")
        return a[:i] + a[i + 2:]
    assert without_config(argv[models.PIECEWISE_PROMPTS_ARM]) == without_config(argv["image"])


def test_the_no_nvcc_arm_is_the_image_as_its_container_runs_it(tmp_path, monkeypatch, gpu_build):
    """image-no-nvcc: the image's settings with nvcc off PATH and CUDA_HOME pointing where there is none, as in the
    image's runtime base; its launcher chooses the same kernels as the image arm's, started where the host's nvcc is
    found: DeepGEMM off (VLLM_USE_DEEP_GEMM=0), CUTLASS and Triton for the block-FP8 shard (serving/kernels.py)."""
    from serving import launcher
    from serving.vllm_args import VllmArgs

    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{cuda / 'bin'}{os.pathsep}/usr/bin")
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    m = _model("qwen3-coder-480b-ep8-block")
    assert models.NO_NVCC_ARM in m.arms and models.NO_NVCC_ARM in models.MEASURED_ARMS
    cfg = _bench_config(tmp_path)
    envs = {arm: servers.server_command(cfg, m, arm, tmp_path / "model", 8002)[1]
            for arm in ("image", models.NO_NVCC_ARM)}
    assert str(cuda / "bin") in envs["image"]["PATH"].split(os.pathsep) and envs["image"]["CUDA_HOME"] == str(cuda)
    assert str(cuda / "bin") not in envs[models.NO_NVCC_ARM]["PATH"].split(os.pathsep)
    assert not Path(envs[models.NO_NVCC_ARM]["CUDA_HOME"]).exists()
    shard = _shard(tmp_path, "qwen3-coder-480b-a35b-ep8", layers=2, fp8="block")
    plans = {arm: launcher.plan(env | {"OPTION_MODEL_ID": str(shard)}, VllmArgs()) for arm, env in envs.items()}
    for p in plans.values():
        assert p.env["VLLM_USE_DEEP_GEMM"] == "0"
        assert (_flag(p.argv, "--linear-backend"), _flag(p.argv, "--moe-backend")) == ("cutlass", "triton")
    assert plans["image"].argv == plans[models.NO_NVCC_ARM].argv
    # --image-no-nvcc: every image arm so, stock as before
    cfg = replace(cfg, image_no_nvcc=True)
    envs = {arm: servers.server_command(cfg, m, arm, tmp_path / "model", 8002)[1]
            for arm in ("image", models.COMPILE_SIZES_ARM, "stock")}
    for arm in ("image", models.COMPILE_SIZES_ARM):
        assert str(cuda / "bin") not in envs[arm]["PATH"].split(os.pathsep), arm
        assert not Path(envs[arm]["CUDA_HOME"]).exists(), arm
    assert str(cuda / "bin") in envs["stock"]["PATH"].split(os.pathsep) and envs["stock"]["CUDA_HOME"] == str(cuda)


def test_the_start_arms_are_the_image_with_one_of_vllms_start_defaults(tmp_path, gpu_build):
    """image-no-aot-compile, image-compile-cache and image-spawn: the image's command, and in the environment its
    launcher hands vLLM, VLLM_USE_AOT_COMPILE=0, VLLM_DISABLE_COMPILE_CACHE=0 or VLLM_WORKER_MULTIPROC_METHOD=spawn,
    which vLLM's own envs read as the AOT compile off, the cache on or the engine core spawned, where the image
    (as in its container, whose cache root lies on its overlay root) has the AOT compile on with the image's torch,
    the cache off and the engine core forked; stock-debug's variable comes from the bench's environment table."""
    from serving import launcher
    from serving.vllm_args import VllmArgs

    m = _model("qwen3-235b-tp8-tensor")
    arms = ("image", models.NO_AOT_COMPILE_ARM, models.COMPILE_CACHE_ARM, models.SPAWN_ARM)
    assert all(arm in m.arms and arm in models.MEASURED_ARMS for arm in arms)
    cfg = _bench_config(tmp_path)
    envs = {arm: servers.server_command(cfg, m, arm, tmp_path / "model", 8002)[1] for arm in (*arms, "stock-debug")}
    plans = {arm: launcher.plan(envs[arm] | {"OPTION_MODEL_ID": "Qwen/Qwen3-0.6B"}, VllmArgs()) for arm in arms}
    assert all(plans[arm].argv == plans["image"].argv for arm in arms)
    assert envs["stock-debug"]["VLLM_LOGGING_LEVEL"] == "DEBUG"
    # one interpreter reads every arm's environment in turn: vllm.envs evaluates a variable at each read (until
    # enable_envs_cache(), which only a started engine calls)
    read = ("import json, os, sys, vllm.envs as e\n"
            "assert not e._is_envs_cache_enabled()\n"
            "for env in json.load(sys.stdin):\n"
            "    os.environ.clear(); os.environ.update(env)\n"
            "    print('read:', e.VLLM_USE_AOT_COMPILE, e.VLLM_DISABLE_COMPILE_CACHE, e.VLLM_WORKER_MULTIPROC_METHOD)")
    done = subprocess.run([sys.executable, "-c", read], env=plans["image"].env, capture_output=True, text=True,
                          check=True, timeout=120, input=json.dumps([plans[arm].env for arm in plans]))
    lines = [ln.removeprefix("read: ") for ln in done.stdout.splitlines() if ln.startswith("read: ")]
    seen = dict(zip(plans, lines, strict=True))
    assert seen == {"image": "True True fork", models.NO_AOT_COMPILE_ARM: "False True fork",
                    models.COMPILE_CACHE_ARM: "True False fork", models.SPAWN_ARM: "True True spawn"}


def test_the_exec_arm_is_the_image_with_a_fresh_interpreter_for_vllms_cli(tmp_path, gpu_build):
    """image-exec: the image's command, environment and engine command, with `vllm serve` exec'd in a fresh
    interpreter where the image runs vLLM's CLI in the launcher's own process (engine_in_process, its default)."""
    from serving import launcher
    from serving.vllm_args import VllmArgs

    m = _model("qwen3-235b-ep8-block")
    assert models.EXEC_ARM in m.arms and models.EXEC_ARM in models.MEASURED_ARMS
    cfg = _bench_config(tmp_path)
    plans = {arm: launcher.plan(servers.server_command(cfg, m, arm, tmp_path / "model", 8002)[1]
                                | {"OPTION_MODEL_ID": "Qwen/Qwen3-0.6B"}, VllmArgs())
             for arm in ("image", models.EXEC_ARM)}
    assert plans["image"].argv == plans[models.EXEC_ARM].argv
    assert {arm: launcher.in_process_blocker(p) for arm, p in plans.items()} == {
        "image": None, models.EXEC_ARM: "engine_in_process=false"}


# A server that answers GET /ping 200 once DELAY seconds have passed since it started (404 before), for the bench's
# start-up orchestration: its own processes, ports and waits, without an engine's minutes.
_SLOW_PING = """
import http.server, sys, time
ready = time.monotonic() + float(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/ping" and time.monotonic() >= ready else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.parametrize("alone", [False, True])
def test_the_arms_start_together_or_one_at_a_time_with_start_alone(tmp_path, monkeypatch, alone):
    """Together, every arm starts before the first is ready; with --start-alone, each starts only once the one before
    is ready. e2e.md's server table says which."""
    from bench.e2e import run as e2e_run
    from tools.launcher_process import free_port, spawn, stop

    def slow_server(cfg, model, arm, model_dir, facts=None):
        port = free_port()
        return spawn([sys.executable, "-c", _SLOW_PING, str(port), "1.5"], dict(os.environ),
                     tmp_path / f"{arm}.log", port, name=f"{model.name}.{arm}")

    monkeypatch.setattr(e2e_run, "start_server", slow_server)
    m = replace(models.CPU_CHECK, arms=("stock", "image", "image-no-nvcc"))
    cfg = replace(_bench_config(tmp_path), start_alone=alone, ready_timeout=60)
    r = e2e_run.Run(cfg, 1000)
    group = {}
    try:
        r.start(m, tmp_path / "model", list(m.arms), group)
    finally:
        for s in group.values():
            stop(s.proc, grace=5)
    assert list(group) == list(m.arms) and all(s.failed is None for s in group.values())
    assert all(1.5 <= s.ready_s < 30 for s in group.values())
    servers_ = list(group.values())
    ready_at = [s.started + s.ready_s for s in servers_]
    if alone:
        assert all(later.started >= ready for later, ready in zip(servers_[1:], ready_at))
    else:
        assert max(s.started for s in servers_) < min(ready_at)
    r.results["servers"] = {s.name: {"ready_s": round(s.ready_s, 1)} for s in servers_}
    header = next(ln for ln in report.summarize(r.results).splitlines() if ln.startswith("| server |"))
    assert ("each started alone" in header) == alone


def test_the_candidates_arm_serves_configs_with_the_candidate_files_laid_over_them(tmp_path, monkeypatch):
    """image-candidates: the image with --candidate-configs' files over the image's configs (a file of the same name
    replaced, the others kept); refused without a folder of files."""
    shipped = tmp_path / "shipped"
    candidates = tmp_path / "candidates"
    for folder, names in ((shipped, ("a.json", "b.json")), (candidates, ("b.json", "c.json"))):
        folder.mkdir()
        for name in names:
            (folder / name).write_text(json.dumps({"from": folder.name}))
    monkeypatch.setenv("LMI_CONFIGS_DIR", str(shipped))  # as the H200 session sets it after a tune
    m = _model("qwen3-235b-ep8-block")
    assert "image-candidates" in m.arms and "image-candidates" in models.MEASURED_ARMS
    cfg = replace(_bench_config(tmp_path), candidate_configs=candidates, arms=("stock", "image", "image-candidates"))
    assert cli.missing_runtimes(cfg) == []
    _, env = servers.server_command(cfg, m, "image-candidates", tmp_path / "model", 8002)
    served = Path(env["LMI_CONFIGS_DIR"])
    assert {f.name: json.loads(f.read_text())["from"] for f in served.glob("*.json")} == {
        "a.json": "shipped", "b.json": "candidates", "c.json": "candidates"}
    _, image_env = servers.server_command(cfg, m, "image", tmp_path / "model", 8002)
    assert image_env.get("LMI_CONFIGS_DIR") == str(shipped)
    for given in (None, tmp_path / "empty"):
        problems = cli.missing_runtimes(replace(cfg, candidate_configs=given))
        assert problems and "--arms image-candidates: --candidate-configs DIR must name a folder" in problems[0]


def test_an_arm_none_of_the_chosen_models_has_is_refused_before_anything_starts(tmp_path, capsys):
    """--arms names arms; one that no chosen model has would be left out in silence (the Coder shard once lacked
    image-candidates and a lease measured without it), so it is refused. Every GPU model has the candidates arm."""
    assert all(models.CANDIDATES_ARM in m.arms for m in models.MODELS)
    base = ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
            "--work", str(tmp_path / "w")]
    with pytest.raises(SystemExit) as e:
        cli.main(base + ["--models", "qwen3-coder-480b-ep8-block", "deepseek-v3-ep8-block",
                         "--arms", "stock", "image", "image-vllm-quant"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--arms image-vllm-quant: none of the chosen models" in err
    assert "qwen3-coder-480b-ep8-block, deepseek-v3-ep8-block" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "m").exists()
    coder = [m for m in models.MODELS if m.name == "qwen3-coder-480b-ep8-block"]
    given = Config.from_args(cli.parser().parse_args(base + ["--arms", "stock", "image", "image-candidates"]))
    assert cli.arms_no_model_has(given, coder) == []
    # the default arms are every model's own: never refused
    assert cli.arms_no_model_has(Config.from_args(cli.parser().parse_args(base)), coder) == []


def test_a_context_longer_than_the_checkpoints_positions_is_refused_before_anything_starts(tmp_path, capsys):
    """--in-tokens 4096 on a 4096-position shard made both servers exit at their start (run 40b's first try, a lease's
    minute): the bench refuses it, naming the flags, the model and the longest prompt that fits, and makes nothing."""
    base = ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
            "--work", str(tmp_path / "w"), "--models", "qwen3-235b-ep8-block", "--layers", "94"]
    with pytest.raises(SystemExit) as e:
        cli.main(base + ["--in-tokens", "4096"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert ("--in-tokens 4096 and --out-tokens 128 need a context of 4288 tokens (64 to spare); "
            "qwen3-235b-ep8-block@94L has 4096 positions: give --in-tokens 3904 or less") in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "m").exists()
    fits = Config.from_args(cli.parser().parse_args(base + ["--in-tokens", "3904"]))
    assert cli.contexts_too_long(fits, list(cli.models_at_depth(fits).values())) == []


def test_each_servers_autotuner_picks_are_recorded_and_the_ones_that_differ_between_arms_are_reported(tmp_path):
    """Run 17's servers' Inductor caches (inductor-kernels.tar.gz): the arms compiled the same Q/K norm + RoPE kernel
    (triton_red_fused_1) and the autotuner picked R0_BLOCK 128 for stock, 64 for both image arms; the report names it
    and leaves out the kernels every arm picked alike."""
    import tarfile
    with tarfile.open(ROOT / "bench" / "data" / "h200_block_17" / "inductor-kernels.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    homes = sorted((tmp_path / "homes").iterdir())
    assert [h.name.rpartition(".")[2] for h in homes] == ["image", "image-fp32-router", "stock"]
    recorded = {"servers": {h.name: {"inductor_picks": servers.inductor_picks(h)} for h in homes}}
    qk = {h.name.rpartition(".")[2]: next(p["config"] for p in recorded["servers"][h.name]["inductor_picks"].values()
                                          if p["kernel"] == "triton_red_fused_1") for h in homes}
    assert qk["stock"]["R0_BLOCK"] == 128 and qk["image"]["R0_BLOCK"] == qk["image-fp32-router"]["R0_BLOCK"] == 64
    table = report.autotune_table(recorded)
    row = next(r for r in table if "| triton_red_fused_1 |" in r)
    assert "stock: XBLOCK 2, R0_BLOCK 128" in row and "image: XBLOCK 2, R0_BLOCK 64" in row
    alike = {src for src, p in recorded["servers"][homes[0].name]["inductor_picks"].items()
             if all(h2["inductor_picks"].get(src, {}).get("config") == p["config"]
                    for h2 in recorded["servers"].values())}
    assert alike and not any(src in r for src in alike for r in table)
    # a server without a compile cache (the CPU build, a peer) records none and adds no row
    assert servers.inductor_picks(tmp_path / "no-home") == {}
    assert report.autotune_table({"servers": {"m.stock": {"inductor_picks": {}}, "m.image": {}}}) == []


def test_pool_of_the_235b_shard_over_runs_3_4_and_6():
    from bench.e2e import pool as e2e_pool

    runs = [json.loads(p.read_text()) for p in (H200_RUN_3, H200_RUN_4, H200_RUN_6)]
    rows = [r for r in e2e_pool.table(runs)[2:] if r.startswith("| qwen3-235b-tp8-tensor |")]
    assert len(rows) == 8


def test_run_6_measured_patch_0006_alone_as_a_third_arm():
    """Run 6's arms: stock, the image, and the image with OPTION_FP8_MOE_ONE_LAUNCH_QUANT=false; the image's one-client
    profile runs the patch's kernel and none of vLLM's two, the arm without it runs vLLM's two and not the patch's."""
    res = json.loads(H200_RUN_6.read_text())
    m = res["models"]["qwen3-235b-tp8-tensor"]
    assert set(m["reps"]) == {"stock", "image", "image-vllm-quant"} and all(len(v) == 3 for v in m["reps"].values())

    def kernels(arm):
        return {name.split("<")[0].split("(")[0].removeprefix("void ").strip()
                for name, _ in m["profile"][arm]["top_other"]}
    vllms_op = {"vllm::absmax_reduction_flat", "vllm::scaled_fp8_quant_kernel_strided_dynamic"}
    assert "_per_tensor_fp8_quant_one_launch_kernel" in kernels("image.c1")
    assert not vllms_op & kernels("image.c1")
    assert vllms_op <= kernels("image-vllm-quant.c1")
    assert "_per_tensor_fp8_quant_one_launch_kernel" not in kernels("image-vllm-quant.c1")
    # every server compiled nothing while serving but stock
    assert {n: s["jit_warnings"] for n, s in res["servers"].items()} == {
        "qwen3-235b-tp8-tensor.stock": 5, "qwen3-235b-tp8-tensor.image": 0, "qwen3-235b-tp8-tensor.image-vllm-quant": 0}


def test_profile_classes_count_memsets_and_copies_as_gpu_work(tmp_path):
    """classify reads a torch-profiler trace: kernels by class, and memsets and copies under everything else
    (H200 run 6: the scale memset of vLLM's FP8 quantization, 13.9 ms of a one-client window, was not counted)."""
    import gzip

    events = [{"cat": "kernel", "name": "fused_moe_kernel", "ts": 0, "dur": 10},
              {"cat": "kernel", "name": "fused_moe_kernel", "ts": 20, "dur": 6},
              {"cat": "gpu_memset", "name": "Memset (Unknown)", "ts": 30, "dur": 1},
              {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 40, "dur": 2},
              {"cat": "kernel", "name": "void flash::flash_fwd_kernel<...>", "ts": 50, "dur": 5},
              {"cat": "cpu_op", "name": "aten::empty", "ts": 60, "dur": 100},
              {"cat": "user_annotation", "name": "execute_context_7(896)_generation_1(1)", "ts": 0, "dur": 175000},
              {"cat": "gpu_user_annotation", "name": "execute_context_7(896)_generation_1(1)", "ts": 9, "dur": 31000},
              {"cat": "gpu_user_annotation", "name": "execute_context_0(0)_generation_8(8)", "ts": 70, "dur": 10000},
              {"cat": "gpu_user_annotation", "name": "execute_context_0(0)_generation_8(8)", "ts": 80, "dur": 11000},
              {"cat": "user_annotation", "name": "execute_context_0(0)_generation_8(8)", "ts": 70, "dur": 500}]
    path = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    r = traces.classify(path)
    assert r["total_gpu_ms"] == pytest.approx(24 / 1e3)
    assert r["share"] == {"attention": round(5 / 24, 4), "moe_w13": round(10 / 24, 4), "moe_w2": round(6 / 24, 4),
                          "other": round(3 / 24, 4)}
    assert dict(r["top_other"]) == {"Memcpy HtoD (Pinned -> Device)": 2, "Memset (Unknown)": 1}
    assert r["step_kinds"] == {"execute_context_0(0)_generation_8(8)": {"n": 2, "gpu_ms": 10.5, "host_ms": 0.5},
                               "execute_context_7(896)_generation_1(1)": {"n": 1, "gpu_ms": 31.0, "host_ms": 175.0}}
    md = report.step_table({"args": {"out_tokens": "128"}, "models": {"m": {"profile": {"image.c8": r}}}})
    assert "| m | image | 8 | execute_context_7(896)_generation_1(1) | 1 | 31.0 | 175.0 |" in md
    assert r["top_kernels"][0] == ["fused_moe_kernel", 2, 16]
    assert [k[0] for k in r["top_kernels"]][1:] == ["void flash::flash_fwd_kernel<...>",
                                                    "Memcpy HtoD (Pinned -> Device)", "Memset (Unknown)"]
    # the GPU worked 24 of the 55 us from its first kernel's start to its last's end; two MoE GEMMs: one layer's pass
    assert (r["gpu_busy_ms"], r["gpu_span_ms"], r["moe_launches"]) == (pytest.approx(0.024), pytest.approx(0.055), 2)


def test_gpu_occupancy_counts_overlapping_work_once():
    work = [{"ts": 0, "dur": 10}, {"ts": 5, "dur": 10}, {"ts": 6, "dur": 2}, {"ts": 30, "dur": 10}]
    assert traces.gpu_occupancy(work) == {"gpu_busy_ms": pytest.approx(0.025), "gpu_span_ms": pytest.approx(0.040)}
    assert traces.gpu_occupancy([]) == {"gpu_busy_ms": 0.0, "gpu_span_ms": 0.0}


def test_the_window_table_counts_forward_passes_and_the_gpus_busy_share():
    """A window recorded with its passes and occupancy gets a row: forward passes from its MoE GEMMs (two a layer),
    beside the decode steps its requests needed; the GPU's busy share; GPU ms per output token; the window's own
    streamed figures. A window recorded without them (every stored run's) gets none."""
    window = {"total_gpu_ms": 64.0, "share": {"moe_w13": 0.5}, "top_other": [], "trace": "t.json",
              "steps": traces.profile_steps(32, 16), "moe_launches": 2 * 36 * 18, "gpu_busy_ms": 80.0,
              "gpu_span_ms": 100.0, "out_tokens": 32 * 16,
              "window": {"stream_tok_s": 1500.0, "ttft_p50_ms": 90.0, "itl_p50_ms": 13.1, "itl_p99_ms": 19.62}}
    results = {"args": {"out_tokens": "128"}, "servers": {},
               "models": {"m": {"layers": 36, "reps": {}, "first_pass": {}, "profile": {"sglang.c32": window}}}}
    md = report.summarize(results)
    assert "| m | sglang | 32 | 18 | 16 | 80.0% | 0.125 | 1500.0 | 90.0 | 13.10 | 19.62 |" in md.splitlines()
    del window["gpu_busy_ms"]
    assert "forward passes" not in report.summarize(results)


def test_the_kernel_table_lists_each_windows_largest_kernels_a_step_and_a_launch():
    """Each profile window's largest kernels (KERNELS_A_WINDOW, largest first, as traces.classify records them):
    launches a step over the steps the window ran, µs a launch, share of its GPU time; the names without CUTLASS's and
    FlashAttention's wrappers, cut short, a pipe escaped. Run 15's stored 235B windows show the combine kernel after
    each of the 94 layers in vLLM's windows and none in SGLang's."""
    flash = "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<a, b|c>>>(Params)"
    top = [[flash, 360, 3600.0]] + [[f"k{i}", 36, 36.0] for i in range(report.KERNELS_A_WINDOW + 2)]
    window = {"total_gpu_ms": 7.2, "share": {}, "top_kernels": top, "steps": 10}
    results = {"args": {"out_tokens": "128"}, "servers": {},
               "models": {"m": {"layers": 36, "reps": {}, "first_pass": {}, "profile": {"image.c1": window}}}}
    rows = [ln for ln in report.kernel_table(results) if ln.startswith("| m |")]
    assert len(rows) == report.KERNELS_A_WINDOW
    label = "`flash::FlashAttnFwdSm90<a, b\\|c>>>(Params)`"
    assert rows[0] == f"| m | image | 1 | {label} | 36.0 | 10.00 | 50.0% |"
    assert rows[1] == "| m | image | 1 | `k0` | 3.6 | 1.00 | 0.5% |"
    assert report.kernel_label("x" * 100) == "`" + "x" * report.KERNEL_LABEL_CHARS + "`"
    del window["top_kernels"]
    assert report.kernel_table(results) == []

    run_15 = json.loads((ROOT / "bench" / "data" / "h200_block_15" / "e2e.json").read_text())
    combine = {ln.split("|")[2].strip() + ".c" + ln.split("|")[3].strip(): float(ln.split("|")[5])
               for ln in report.kernel_table(run_15) if "FlashAttnFwdCombine" in ln}
    assert combine == {"stock.c1": 94.0, "stock.c8": 94.0, "image.c1": 94.0, "image.c8": 94.0}


def test_profile_classes_count_the_decode_gemvs_as_the_moe_gemms(tmp_path):
    """Patch 0011's matrix-vector kernel and 0012's w2 variant are a layer's w13 and w2 GEMMs, not "other GEMMs"
    (run 22's profile counted them there)."""
    import gzip

    events = [{"cat": "kernel", "name": "lmi_fused_moe_gemv_kernel", "ts": 0, "dur": 10},
              {"cat": "kernel", "name": "lmi_fused_moe_gemv_silu_kernel", "ts": 20, "dur": 13},
              {"cat": "kernel", "name": "lmi_fused_moe_gemv_kernel", "ts": 40, "dur": 10},
              {"cat": "kernel", "name": "fused_moe_kernel", "ts": 60, "dur": 7},
              {"cat": "kernel", "name": "void cutlass::device_kernel<vllm::cutlass_3x_gemm_fp8_blockwise<...>",
               "ts": 80, "dur": 24}]
    path = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert traces.classify(path)["share"] == {"moe_w13": round(20 / 64, 4), "moe_w2": round(20 / 64, 4),
                                              "other_gemm": round(24 / 64, 4)}


def _processes_naming(text: str) -> dict[int, str]:
    """pid -> command line of each process whose command line or environment holds text: stock's `vllm serve` names
    its model in its arguments, the image's launcher (which runs vLLM's CLI in its own process) in OPTION_MODEL_ID,
    which its engine processes inherit."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:  # exited while we looked
            continue
        if text in args or text in env:
            found[int(proc.name)] = args[:200]
    return found


@pytest.mark.engine
def test_sigterm_stops_the_bench_and_its_servers(tmp_path):
    # the servers run in sessions of their own; a SIGTERM to the bench must still stop them (an engine left behind
    # holds the GPU's memory)
    stock_site = tmp_path / "stock-site"
    stock_site.mkdir()
    models = tmp_path / "models"
    model = str(models / "tiny-cpu")  # in stock's command line and the image's environment

    def both_started() -> bool:  # stock's `vllm serve` and the image's launcher
        named = _processes_naming(model).values()
        return any(model in args for args in named) and any(model not in args for args in named)

    cmd = [sys.executable, "-m", "bench.e2e", "--stock-site", str(stock_site), "--models-dir", str(models),
           "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--models", "tiny-cpu",
           "--ready-timeout", "600"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if both_started() or p.poll() is not None:
                break
            time.sleep(0.5)
        assert p.poll() is None, "the bench exited before its servers started"
        assert both_started(), f"not both servers started: {_processes_naming(model)}"
        p.terminate()
        assert p.wait(120) == 143
    finally:
        if p.poll() is None:
            p.kill()
    for _ in range(40):
        if not _processes_naming(model):
            break
        time.sleep(0.5)
    left = _processes_naming(model)
    for pid in left:  # not to leak them into the rest of the suite
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left
    assert (tmp_path / "out" / "logs").is_dir()  # the bench's cleanup ran: the servers' logs were kept


def test_layers_per_model_and_names_that_say_the_depth():
    names = ["qwen3-235b-tp8-tensor", "qwen3-coder-480b-tp8-tensor"]
    assert models.parse_layers(["16"], names) == dict.fromkeys(names, 16)
    assert models.parse_layers(["94", "qwen3-coder-480b-tp8-tensor=40"], names) == {
        "qwen3-235b-tp8-tensor": 94, "qwen3-coder-480b-tp8-tensor": 40}
    coder = models.chosen_models(names[1:])[0]
    assert models.with_layers(coder, 16) is coder  # runs 3-8's names stay as recorded
    deep = models.with_layers(coder, 40)
    assert (deep.name, deep.layers, deep.preset) == ("qwen3-coder-480b-tp8-tensor@40L", 40, coder.preset)
    for bad, named in ((["deepseek-v3-tp8-block=8"], "deepseek-v3-tp8-block"), (["0"], "whole number"),
                       (["qwen3-235b-tp8-tensor=x"], "whole number")):
        with pytest.raises(ValueError, match=named):
            models.parse_layers(bad, names)


def test_a_bad_layers_token_is_refused_before_anything_starts(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--stock-site", str(tmp_path), "--models-dir", str(tmp_path / "m"), "--out",
                        str(tmp_path / "o"), "--work", str(tmp_path / "w"), "--models", "qwen3-235b-tp8-tensor",
                        "--layers", "qwen3-coder-480b-tp8-tensor=40"])
    assert e.value.code == 2 and "--layers qwen3-coder-480b-tp8-tensor=40" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # the embedded model has one depth
        cli.main(["--stock-site", str(tmp_path), "--models-dir", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
                  "--models", "tiny-cpu", "--layers", "5", "--models-only"])
    assert e.value.code == 2 and "tiny-cpu is the embedded model, its depth is fixed" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_run_9_deep_shards_as_recorded_and_as_the_summary_shows_them():
    """H200 run 9 (bench/data/h200_engine_9): the Qwen3 shards at 94 and 40 layers, kept apart from the 16-layer
    runs by their names; the summary shows every row, and its goal figures are the recorded ones."""
    from bench.e2e import pool as e2e_pool
    res = json.loads((ROOT / "bench" / "data" / "h200_engine_9" / "e2e.json").read_text())
    assert {m: r["layers"] for m, r in res["models"].items()} == {
        "qwen3-235b-tp8-tensor@94L": 94, "qwen3-coder-480b-tp8-tensor@40L": 40}
    rows = [ln for ln in report.summarize(res).splitlines() if ln.startswith("| qwen3-")]
    assert len(rows) == 2 * 6 + 4
    for model in res["models"]:
        one_client = report.paired_ratios([res], model, "throughput", "tok_s", "1")
        assert len(one_client) == 4 and min(one_client) >= 1.10  # the issue's one-client goal, every repetition
        assert all(s["jit_warnings"] == 0 for n, s in res["servers"].items() if n == f"{model}.image")
    # pooled with a 16-layer run, each depth keeps its own rows
    pooled = e2e_pool.table([json.loads(H200_RUN_6.read_text()), res])
    assert any(r.startswith("| qwen3-235b-tp8-tensor |") for r in pooled)
    assert any(r.startswith("| qwen3-235b-tp8-tensor@94L |") for r in pooled)


def test_the_embedded_models_depth_is_not_silently_ignored(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--stock-site", str(tmp_path), "--models-dir", str(tmp_path), "--out", str(tmp_path / "o"),
                        "--models", "tiny-cpu", "--layers", "4"])
    assert e.value.code == 2 and "tiny-cpu is the embedded model" in capsys.readouterr().err


# --- The peer arms (sglang, vllm-latest, sglang-latest): their commands, settings and runtimes, checked without an
# engine ---

def _shard(tmp_path: Path, preset: str = "qwen3-235b-a22b-tp8", layers: int = 94, fp8: str = "tensor") -> Path:
    """A model folder holding only the config.json the bench's make_model writes for a preset shard in FP8 scheme
    fp8 (the peers' commands read it for the KV budget in tokens, the image's launcher for its FP8 kernels)."""
    from bench.e2e.shards import preset_spec
    from serving.tiny_model import _config

    d = tmp_path / f"{preset}-{layers}-{fp8}"
    d.mkdir(parents=True, exist_ok=True)
    spec = preset_spec(preset, layers=layers, fp8=True, fp8_scheme=fp8)
    (d / "config.json").write_text(json.dumps(_config(spec, 1, 2)))
    return d


def _peer_config(tmp_path: Path, **kw) -> Config:
    return Config(stock_site=str(tmp_path / "stock"), models_dir=tmp_path / "models", out=tmp_path / "out",
                  work=tmp_path, sglang_python="/opt/sglang/bin/python", vllm_latest_python="/opt/v034/bin/python",
                  sglang_latest_python="/opt/sglang-0.5.23/bin/python", **kw)


def _flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_the_sglang_arm_runs_sglangs_server_on_the_stock_arms_settings(tmp_path):
    """sglang: SGLang 0.5.21's own server from its runtime's Python, each of the stock arm's settings carried by the
    SGLang setting servers.PEERS names: the same context length, batch limit and KV budget (in tokens: 1.5 GiB of
    the 94-layer 235B shard is the 33,456 tokens vLLM's own log gave in H200 run 9), its default MoE runner."""
    model = _model("qwen3-235b-tp8-tensor")
    assert "sglang" in model.arms and "vllm-latest" in model.arms
    cfg, shard = _peer_config(tmp_path), _shard(tmp_path)
    stock, _ = servers.server_command(cfg, model, "stock", shard, 8001)
    cmd, env = servers.server_command(cfg, model, "sglang", shard, 8003)
    assert cmd[:3] == ["/opt/sglang/bin/python", "-m", "sglang.launch_server"]
    assert _flag(cmd, "--model-path") == _flag(stock, "serve") == str(shard)  # vllm serve: the model follows serve
    assert (_flag(cmd, "--host"), _flag(cmd, "--port")) == ("127.0.0.1", "8003")
    assert _flag(cmd, "--context-length") == _flag(stock, "--max-model-len") == "320"
    assert _flag(cmd, "--max-running-requests") == _flag(stock, "--max-num-seqs") == "128"
    assert _flag(stock, "--kv-cache-memory-bytes") == str(3 << 29)
    assert _flag(cmd, "--max-total-tokens") == "33456"
    assert servers.kv_bytes_per_token(shard) == 2 * 94 * 1 * 128 * 2
    assert float(_flag(cmd, "--mem-fraction-static")) == servers.SGLANG_MEM_FRACTION_STATIC
    assert not any(a.startswith("--moe-runner") or a.startswith("--fp8-gemm") for a in cmd)  # its defaults
    # its own runtime alone: no search path of the bench's, every cache in its own empty home
    assert "PYTHONPATH" not in env and env["HOME"] == str(cfg.home("qwen3-235b-tp8-tensor.sglang"))
    assert env["TRITON_CACHE_DIR"].startswith(env["HOME"])


def test_the_vllm_latest_arm_is_vllm_serve_of_its_runtime_with_the_stock_arms_flags(tmp_path):
    """vllm-latest: `vllm serve` (vLLM 0.34's supported entry point) from its own Python, with every engine flag of
    the stock arm, the block-FP8 model's --linear-backend too; no stock site on its path."""
    for model in (next(m for m in models.MODELS if m.fp8 == "tensor"), next(m for m in models.MODELS
                                                                         if m.fp8 == "block")):
        cfg, shard = _peer_config(tmp_path), _shard(tmp_path)
        stock, stock_env = servers.server_command(cfg, model, "stock", shard, 8001)
        cmd, env = servers.server_command(cfg, model, "vllm-latest", shard, 8004)
        assert cmd[:6] == ["/opt/v034/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", str(shard), "--host"]
        assert stock[:5] == [cfg.image_python, "-m", "vllm.entrypoints.cli.main", "serve", str(shard)]
        assert cmd[cmd.index("--port") + 2:] == stock[stock.index("--port") + 2:]  # the same engine flags
        assert "--jit-monitor-verbose" in cmd
        assert cfg.stock_site in stock_env["PYTHONPATH"] and "PYTHONPATH" not in env


def test_the_sglang_latest_arm_is_the_sglang_arms_server_from_its_own_runtime(tmp_path):
    """sglang-latest: the same SGLang server command and environment as the sglang arm (servers.PEERS, the profile,
    a block-FP8 model's settings), from SGLang 0.5.23's Python, in a home of its own."""
    for model in (next(m for m in models.MODELS if m.fp8 == "tensor"), next(m for m in models.MODELS
                                                                         if m.fp8 == "block")):
        assert "sglang-latest" in model.arms
        cfg, shard = _peer_config(tmp_path, profile=True), _shard(tmp_path)
        cmd, env = servers.server_command(cfg, model, "sglang", shard, 8003)
        latest, latest_env = servers.server_command(cfg, model, "sglang-latest", shard, 8003)
        assert latest == [cfg.sglang_latest_python, *cmd[1:]]
        home, own = cfg.home(f"{model.name}.sglang-latest"), cfg.profile_dir(f"{model.name}.sglang-latest")
        assert latest_env["HOME"] == str(home) and latest_env["SGLANG_TORCH_PROFILER_DIR"] == str(own)
        assert {k: v for k, v in latest_env.items() if str(home) not in v and str(own) != v} == {
            k: v for k, v in env.items() if str(cfg.home(f"{model.name}.sglang")) not in v
            and str(cfg.profile_dir(f"{model.name}.sglang")) != v}


def test_the_peers_commands_carry_the_profile_and_a_model_setting_sglang_has_no_counterpart_for(tmp_path):
    block = next(m for m in models.MODELS if m.fp8 == "block")
    cfg, shard = _peer_config(tmp_path, profile=True), _shard(tmp_path, "deepseek-v3-tp8", 61)
    cmd, env = servers.server_command(cfg, block, "sglang", shard, 8003)
    assert "--linear-backend" not in cmd and servers.SGLANG_ENGINE_ARGS["linear-backend"] is None
    assert env["SGLANG_JIT_DEEPGEMM_PRECOMPILE"] == "false"  # DeepGEMM compiled as used, not for 16K sizes at start
    tensor = next(m for m in models.MODELS if m.fp8 == "tensor")
    assert "SGLANG_JIT_DEEPGEMM_PRECOMPILE" not in servers.server_command(cfg, tensor, "sglang", shard, 8003)[1]
    assert env["SGLANG_TORCH_PROFILER_DIR"] == str(cfg.profile_dir(f"{block.name}.sglang"))
    # the vLLM arms' profile: no Python stacks, no shapes; SGLang records both unless told not to
    assert (env["SGLANG_PROFILE_WITH_STACK"], env["SGLANG_PROFILE_RECORD_SHAPES"]) == ("false", "false")
    stock, _ = servers.server_command(cfg, block, "stock", shard, 8005)
    assert json.loads(_flag(stock, "--profiler-config"))["torch_profiler_with_stack"] is False
    latest, _ = servers.server_command(cfg, block, "vllm-latest", shard, 8004)
    assert json.loads(_flag(latest, "--profiler-config"))["torch_profiler_dir"] == str(
        cfg.profile_dir(f"{block.name}.vllm-latest"))
    from dataclasses import replace
    odd = replace(block, engine_args=(("enforce-eager", "true"),))
    with pytest.raises(ValueError, match="--enforce-eager has no SGLang counterpart"):
        servers.server_command(cfg, odd, "sglang", shard, 8003)


def test_peers_start_in_their_home_and_sglang_is_ready_on_health(tmp_path, monkeypatch):
    started = {}
    monkeypatch.setattr(servers, "spawn", lambda cmd, env, log, port, **kw: started.setdefault(cmd[0], kw))
    monkeypatch.setattr(servers, "free_port", lambda: 8005)
    cfg, shard = _peer_config(tmp_path), _shard(tmp_path)
    model = models.MODELS[0]
    for arm in ("stock", "sglang", "vllm-latest", "sglang-latest"):
        servers.start_server(cfg, model, arm, shard)
    for arm in models.SGLANG_ARMS:
        assert started[cfg.peer_python(arm)]["ready_path"] == "/health"
        assert started[cfg.peer_python(arm)]["cwd"] == cfg.home(f"{model.name}.{arm}")
    assert started[cfg.vllm_latest_python]["ready_path"] == "/ping"
    assert started[cfg.vllm_latest_python]["cwd"] == cfg.home(f"{model.name}.vllm-latest")
    assert started[cfg.image_python]["cwd"] == ROOT


def test_each_server_records_the_nvcc_its_environment_shows_and_e2e_md_names_it(tmp_path, monkeypatch):
    """The image arms run as their container does (--image-no-nvcc: no nvcc for DeepGEMM's or FlashInfer's JIT);
    stock and the peers keep the host's, which their own JITs may use: each server's facts say which, and e2e.md
    has a line per server recorded so (a JSON from before has none)."""
    host = tmp_path / "cuda" / "bin"
    host.mkdir(parents=True)
    (host / "nvcc").write_text("#!/bin/sh\n")
    (host / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{host}:/usr/bin:/bin")
    monkeypatch.delenv("DG_JIT_NVCC_COMPILER", raising=False)
    monkeypatch.setattr(servers, "spawn", lambda cmd, env, log, port, **kw: None)
    cfg, shard = _peer_config(tmp_path, image_no_nvcc=True), _shard(tmp_path)
    model = models.MODELS[0]
    facts = {arm: {} for arm in ("image", "stock", "sglang")}
    for arm, seen in facts.items():
        servers.start_server(cfg, model, arm, shard, seen)
    assert facts == {"image": {"nvcc": None}, "stock": {"nvcc": str(host / "nvcc")},
                     "sglang": {"nvcc": str(host / "nvcc")}}
    res = json.loads(H200_RUN_3.read_text())
    before = report.summarize(res)
    assert "nvcc" not in before
    name = next(iter(res["servers"]))
    res["servers"][name]["nvcc"] = None
    assert report.summarize(res) == before + f"\n- {name}: no nvcc visible\n"


def test_a_peer_arm_without_its_runtime_is_refused_before_anything_starts(tmp_path, capsys):
    base = ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
            "--work", str(tmp_path / "w"), "--models", "qwen3-235b-tp8-tensor"]
    with pytest.raises(SystemExit) as e:
        cli.main(base + ["--arms", "stock", "image", "sglang", "vllm-latest",
                         "--vllm-latest-python", sys.executable])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--arms sglang: its runtime is not given; --sglang-python PY" in err
    with pytest.raises(SystemExit) as e:
        cli.main(base + ["--arms", "sglang", "sglang-latest", "--sglang-python", sys.executable])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--arms sglang-latest: its runtime is not given; --sglang-latest-python PY" in err
    assert "--arms sglang:" not in err
    with pytest.raises(SystemExit) as e:
        cli.main(base + ["--arms", "vllm-latest", "--vllm-latest-python", str(tmp_path / "no-such-python")])
    assert e.value.code == 2 and "is not a program here" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "m").exists()
    # the default arms leave the peers out; given their runtimes, all pass
    assert not set(models.PEER_ARMS) & set(Config.default("arms")) and "image" in Config.default("arms")
    cfg = Config.from_args(cli.parser().parse_args(base + [
        "--arms", "sglang", "vllm-latest", "sglang-latest", "--sglang-python", sys.executable,
        "--vllm-latest-python", sys.executable, "--sglang-latest-python", sys.executable]))
    assert cli.missing_runtimes(cfg) == []
    assert cfg.record()["sglang_python"] == cfg.record()["sglang_latest_python"] == sys.executable


def test_sglangs_compile_count_is_not_counted(tmp_path):
    """A SGLang server's compile count is None (e2e.md: not counted), never 0."""
    log = tmp_path / "s.log"
    log.write_text("INFO KV Cache is allocated. #tokens: 33456, K size: 0.75 GB\nUsing MoE kernel config from x.\n")
    for arm in models.SGLANG_ARMS:
        facts = servers.log_facts(SimpleNamespace(log=log.read_text, name=f"m.{arm}"))
        assert facts["jit_warnings"] is None and len(facts["log_lines"]) == 2
    assert servers.log_facts(SimpleNamespace(log=lambda: "", name="m.vllm-latest"))["jit_warnings"] == 0


def test_a_server_that_ran_a_default_moe_config_is_named_in_the_summary():
    """Run 34's logs on an H100 (bench/data/h100_block_34): the image found no tuned file named for that GPU, SGLang
    neither (its w13 and w2 files); e2e.md names each server and the files."""
    import tarfile

    logs = tarfile.open(ROOT / "bench" / "data" / "h100_block_34" / "e2e-logs.tar.gz")
    found = {}
    for member in logs.getmembers():
        text = logs.extractfile(member).read().decode(errors="replace") if member.isfile() else None
        if text is not None:
            name = Path(member.name).stem
            found[name] = servers.log_facts(SimpleNamespace(log=lambda t=text: t, name=name))["moe_configs_not_found"]
    shape = "E=16,N=1536,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape="
    assert found == {"qwen3-235b-ep8-block@94L.image": [shape + "[128,128].json"],
                     "qwen3-235b-ep8-block@94L.sglang": [shape + "[128, 128].json", shape + "[128, 128]_down.json"]}
    results = json.loads((ROOT / "bench" / "data" / "h100_block_34" / "e2e.json").read_text())
    for name, missing in found.items():
        results["servers"][name]["moe_configs_not_found"] = missing
    summary = report.summarize(results)
    assert (f"- qwen3-235b-ep8-block@94L.image: no tuned fused-MoE file found, the engine's default config ran: "
            f"{shape}[128,128].json") in summary.splitlines()
    assert servers.log_facts(SimpleNamespace(log=lambda: "", name="m.image"))["moe_configs_not_found"] == []


def test_the_summary_puts_the_image_against_each_peer():
    """Run 3's Qwen3-Coder figures with two made-up peers: the arm/stock rows stay as they were, each peer gets its
    rows against stock beside them, and a table of image/peer ratios (paired per repetition) follows, one row per
    figure and peer."""
    res = json.loads(H200_RUN_3.read_text())
    before = report.summarize(res)
    m = res["models"]["qwen3-coder-480b-tp8-tensor"]
    m["reps"]["sglang"] = json.loads(json.dumps(m["reps"]["stock"]))
    m["reps"]["vllm-latest"] = json.loads(json.dumps(m["reps"]["image"]))
    res["servers"]["qwen3-coder-480b-tp8-tensor.sglang"] = {"ready_s": 100.0, "failed": None, "jit_warnings": None}
    md = report.summarize(res)
    assert all(ln in md.splitlines() for ln in before.splitlines() if ln.startswith("| qwen3-coder-480b-tp8-tensor | "))
    rows = [ln.split("|") for ln in md.splitlines() if ln.startswith("| qwen3-coder-480b-tp8-tensor | image/")]
    assert _latency_clients(res) == {"1", "32"}
    figures = len(workload.THROUGHPUT_CONCURRENCY) + 4 * len(_latency_clients(res))
    assert len(rows) == 2 * figures
    ratios = report.paired_ratios([res], "qwen3-coder-480b-tp8-tensor", "throughput", "tok_s", "1", "image", "sglang")
    one = next(r for r in rows if r[2].strip() == "image/sglang" and r[3].strip() == "tok_s" and r[4].strip() == "1")
    assert float(one[7]) == round(statistics.median(ratios), 3)
    assert all(float(r[7]) == 1.0 for r in rows if r[2].strip() == "image/vllm-latest")  # the image against itself
    # each peer against stock too, the baseline of the three-way comparison: SGLang here is stock's own figures
    for peer, ratio in (("sglang", 1.0), ("vllm-latest", None)):
        against_stock = [ln.split("|") for ln in md.splitlines()
                         if ln.startswith(f"| qwen3-coder-480b-tp8-tensor | {peer} |")]
        assert len(against_stock) == figures, peer
        assert ratio is None or all(float(r[7]) == ratio for r in against_stock)
    image_over_stock = next(ln.split("|") for ln in md.splitlines()
                            if ln.startswith("| qwen3-coder-480b-tp8-tensor | image | tok_s | 1 |"))
    latest_over_stock = next(ln.split("|") for ln in md.splitlines()
                             if ln.startswith("| qwen3-coder-480b-tp8-tensor | vllm-latest | tok_s | 1 |"))
    assert latest_over_stock[5:9] == image_over_stock[5:9]  # vllm-latest holds the image's figures
    assert "| qwen3-coder-480b-tp8-tensor.sglang | 100.0 | - | not counted | - |" in md


def test_every_image_arm_is_set_against_the_peer_measured_beside_it():
    """A run of image-candidates against SGLang, with no image or stock arm (run 25's plan): its peer table has
    image-candidates/sglang rows, paired per repetition; with the image arm too, each image arm gets its rows."""
    res = json.loads(H200_RUN_3.read_text())
    m = res["models"]["qwen3-coder-480b-tp8-tensor"]
    reps = m["reps"]
    m["reps"] = {"image-candidates": reps["image"], "sglang": reps["stock"]}
    m.pop("cross_check", None)
    md = report.summarize(res)
    rows = [ln.split("|") for ln in md.splitlines() if ln.startswith("| qwen3-coder-480b-tp8-tensor | image")]
    assert rows and {r[2].strip() for r in rows} == {"image-candidates/sglang"}
    ratios = report.paired_ratios([res], "qwen3-coder-480b-tp8-tensor", "throughput", "tok_s", "1",
                                  "image-candidates", "sglang")
    one = next(r for r in rows if r[3].strip() == "tok_s" and r[4].strip() == "1")
    assert len(ratios) == len(reps["image"]) and float(one[7]) == round(statistics.median(ratios), 3)
    m["reps"]["image"] = reps["stock"]
    labels = {ln.split("|")[2].strip() for ln in report.summarize(res).splitlines()
              if ln.startswith("| qwen3-coder-480b-tp8-tensor | image")}
    assert {"image/sglang", "image-candidates/sglang"} <= labels


def test_models_only_makes_the_models_a_later_run_reuses_and_starts_nothing(tmp_path, capsys):
    """--models-only (bench/e2e/runbook.sh prep, while the peers' parts still arrive): the chosen models are made
    in --models-dir under the names the run gives them, the peers' runtimes are not asked for, nothing else is
    written; the run's own make_model then finds the folder as it is (serving.tiny_model --reuse)."""
    argv = ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
            "--work", str(tmp_path / "w"), "--models", models.CPU_CHECK.name, "--arms", "stock", "sglang"]
    assert cli.main(argv + ["--models-only"]) == 0
    made = tmp_path / "m" / models.CPU_CHECK.name
    assert capsys.readouterr().out.split() == [str(made)]
    assert (made / "tiny_model.json").is_file() and (made / "config.json").is_file()
    assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()
    stamp = {p.name: p.stat().st_mtime_ns for p in made.iterdir()}
    assert models.make_model(models.CPU_CHECK, tmp_path / "m") == made
    assert {p.name: p.stat().st_mtime_ns for p in made.iterdir()} == stamp
    with pytest.raises(SystemExit) as e:  # without --models-only the same command asks for SGLang's runtime
        cli.main(argv)
    assert e.value.code == 2 and "--arms sglang: its runtime is not given" in capsys.readouterr().err


def test_models_only_with_drop_models_makes_the_first_model_alone(tmp_path, capsys):
    """With --drop-models the disk holds one checkpoint at a time, so --models-only (bench/e2e/runbook.sh prep)
    makes the first model only and says the run makes the others in turn: two 94-layer shards do not fit the
    H200 host's 64 GB disk together."""
    later = "qwen3-235b-tp8-tensor"
    argv = ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
            "--work", str(tmp_path / "w"), "--models", models.CPU_CHECK.name, later, "--layers", f"{later}=1",
            "--drop-models", "--models-only"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(tmp_path / "m" / models.CPU_CHECK.name)
    assert f"made {models.CPU_CHECK.name} only; the run makes {later}@1L in turn" in out[1]
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [models.CPU_CHECK.name]


def test_each_models_flags_make_the_spec_the_bench_checks_the_disk_for():
    """make_model passes bench.e2e.shards the flags tiny_model_args gives; its parser turns them into the spec that
    Model.spec names (so the disk check sizes the checkpoint that is made)."""
    from bench.e2e import shards

    for m in (*models.MODELS, models.CPU_CHECK):
        m = models.with_layers(m, 5) if m.preset else m
        _, spec = shards.parse(["--out", "x", "--reuse", *models.tiny_model_args(m)])
        assert spec == m.spec, m.name


def test_a_checkpoint_the_disk_cannot_hold_is_refused_with_the_layers_that_fit(tmp_path, capsys):
    """A model deeper than the free disk under --models-dir holds is refused before it is made (DeepSeek-V3's EP8
    shard at 61 layers is 88 GB, over the H200 host's 64 GB disk): the message gives the checkpoint's size, a layer's
    and the most layers that fit, which do fit and one more does not."""
    import shutil

    from bench.e2e.shards import checkpoint_bytes

    models_dir = tmp_path / "not-yet" / "models"
    name, layers = "deepseek-v3-ep8-block", 100_000  # 144 TB: more than any disk here
    with pytest.raises(SystemExit) as e:
        cli.main(["--stock-site", str(tmp_path), "--models-dir", str(models_dir), "--out", str(tmp_path / "o"),
                  "--models", name, "--layers", str(layers), "--models-only"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{name} at {layers} layers needs" in err, err
    fit = int(re.search(rf"at most (\d+) of its layers fit \(--layers {name}=(\d+)\)", err)[1])
    spec = _model(name, layers).spec
    room, drift = shutil.disk_usage(tmp_path).free - capacity.DISK_MARGIN, 64 << 20  # the disk moves a little meanwhile
    assert fit == 0 or checkpoint_bytes(replace(spec, layers=fit)) <= room + drift
    assert checkpoint_bytes(replace(spec, layers=fit + 1)) > room - drift
    assert f"needs {checkpoint_bytes(spec) / 1e9:.1f} GB" in err and not models_dir.parent.exists()


def test_the_layers_that_fit_count_a_models_dense_first_layers():
    """DeepSeek-V3's own architecture (deepseek-v3-tp8-mla) starts with three dense layers, lighter than the MoE layers
    after them: the room of n layers' checkpoint holds n layers and not one more, and under its first MoE layer no
    depth is offered."""
    from bench.e2e.shards import checkpoint_bytes

    spec = _model("deepseek-v3-tp8-mla-block", 30).spec
    for n in (5, 30):
        room = checkpoint_bytes(replace(spec, layers=n))
        assert capacity.layers_that_fit(spec, room) == n and capacity.layers_that_fit(spec, room - 1) == n - 1, n
    room = checkpoint_bytes(replace(spec, layers=4))
    assert capacity.layers_that_fit(spec, room) == 4 and capacity.layers_that_fit(spec, room - 1) == 0


H200_FREE = int(139.1 * 2**30)  # an H200's free memory when the bench's first server starts (run 20's log)


def _engine_log_gib(run: str, pattern: str) -> dict[str, float]:
    """Each server's figure in GiB matched by `pattern` in a stored H200 run's servers' logs (e2e-live-logs.tar.gz)."""
    import tarfile

    found = {}
    with tarfile.open(ROOT / "bench" / "data" / run / "e2e-live-logs.tar.gz") as tar:
        for member in tar.getmembers():
            if member.name.startswith("logs/") and member.name.endswith(".log"):
                text = tar.extractfile(member).read().decode(errors="replace")
                found[Path(member.name).stem.split(".")[-1]] = float(re.search(pattern, text)[1])
    return found


@pytest.mark.parametrize("run,name,layers,servers", [("h200_block_20", "qwen3-235b-ep8-block", 94, 4),
                                                     ("h200_block_26", "qwen3-coder-480b-ep8-block", 36, 2),
                                                     ("h200_block_27", "deepseek-v3-ep8-block", 30, 2),
                                                     ("h200_block_27_tp8", "deepseek-v3-tp8-block", 30, 2)])
def test_the_gpu_check_counts_the_weights_vllm_loaded_and_passes_the_servers_that_ran(run, name, layers, servers):
    """The GPU check sizes a server's weights as the checkpoint's tensors: every server of runs 20 and 26 logged
    loading exactly that ("Model loading took 27.53 GiB" at 94 layers of the 235B EP8 shard, 37.52 GiB at 36 of the
    Coder's); DeepSeek-V3's shards at 30 layers (run 27) logged 0.01 and 0.02 GiB more than their tensors (40.72 and
    40.82 GiB), well inside the reserve the check adds a server. The servers those runs started together (four 235B
    servers, two of each other shard) pass it in the free memory their first server's log gave."""
    from bench.e2e.shards import checkpoint_bytes

    m = _model(name, layers)
    loaded = _engine_log_gib(run, r"Model loading took ([\d.]+) GiB")
    free = max(_engine_log_gib(run, r"Initial free memory ([\d.]+) GiB").values())
    tensors = checkpoint_bytes(m.spec) / 2**30
    assert len(set(loaded.values())) == 1 and -0.005 <= max(loaded.values()) - tensors < 0.025, (loaded, tensors)
    cfg = Config(stock_site="-", models_dir=Path("-"), out=Path("-"), arms=tuple(loaded))
    assert len(cfg.started_arms(m)) == len(loaded) == servers
    assert capacity.gpu_shortfall(cfg, {name: m}, int(free * 2**30)) == []


def test_servers_the_gpu_cannot_hold_together_are_refused_with_the_layers_that_fit():
    """DeepSeek-V3's EP8 shard at its 61 layers holds 82.3 GiB of weights a server: stock and the image side by side
    need more than an H200 has (139.1 GiB free, run 20's log), whatever the disk. The check names the most layers two
    servers hold, which do fit and one more does not; a third arm lowers it."""
    from bench.e2e.shards import checkpoint_bytes

    free = H200_FREE
    name = "deepseek-v3-ep8-block"
    m = _model(name, 61)
    fits = {}
    for arms in (("stock", "image"), ("stock", "image", "image-candidates")):
        cfg = Config(stock_site="-", models_dir=Path("-"), out=Path("-"), arms=arms)
        [problem] = capacity.gpu_shortfall(cfg, {name: m}, free)
        assert f"{name} at 61 layers: its {len(arms)} servers ({', '.join(arms)}) start together" in problem
        assert "82.3 GiB of weights" in problem and "139.1 GiB free on the GPU" in problem, problem
        fit = fits[len(arms)] = int(re.search(rf"At most (\d+) of its layers fit \d+ servers \(--layers {name}=(\d+)\)",
                                              problem)[1])
        server = cfg.kv_bytes + capacity.SERVER_GPU_RESERVE
        assert len(arms) * (checkpoint_bytes(replace(m.spec, layers=fit)) + server) <= free
        assert len(arms) * (checkpoint_bytes(replace(m.spec, layers=fit + 1)) + server) > free
        assert capacity.gpu_shortfall(cfg, {name: models.with_layers(m, fit)}, free) == []
    assert fits[3] < fits[2] < 61




def _performance_page_commands() -> list[tuple[str, list[str]]]:
    """Each engine-bench command docs/performance.md gives to reproduce a table: (its data folder, its arguments)."""
    page = (ROOT / "docs" / "performance.md").read_text()
    found = re.findall(r"^- `(\w+)` \([^)]*\): `python -m bench\.e2e ([^`]+)`", page, re.M)
    return list({folder: shlex.split(args) for folder, args in found}.items())


def test_the_performance_pages_commands_pass_the_checks_the_bench_makes_before_it_starts(tmp_path, monkeypatch):
    """Every command that reproduces a table of the performance page still runs: its flags parse, its arms exist
    for its models, and its servers, started together, fit the free memory of the GPU it ran on."""
    monkeypatch.chdir(ROOT)  # the commands' paths are relative to the repository's root
    commands = _performance_page_commands()
    assert len(commands) >= 10, commands
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    for folder, args in commands:
        args = [str(python) if a in ("SGLANG_PY", "VLLM_0_34_PY") else a for a in args]
        cfg = Config.from_args(cli.parser().parse_args(args))
        deep = cli.models_at_depth(cfg)
        assert cli.run_problems(cfg, list(deep.values())) == [], folder
        if folder.startswith("h200_"):
            assert capacity.gpu_shortfall(cfg, deep, H200_FREE) == [], folder


def test_the_gpu_check_waits_for_memory_being_freed_and_refuses_at_once_what_an_empty_gpu_cannot_hold():
    """Memory that a process which just ended still holds (in use) is waited for, read again each poll; a run that
    would not fit even the whole GPU (free and used together) is refused at the first reading, not after the wait."""
    gib = 2**30
    cfg = Config(stock_site="-", models_dir=Path("-"), out=Path("-"),
                 arms=("stock", "image", "image-candidates", "vllm-latest"))
    m = _model("qwen3-235b-ep8-block", 94)
    readings, waits = iter([(40 * gib, 99 * gib), (100 * gib, 39 * gib), (139 * gib, 0)]), []
    assert capacity.gpu_problems(cfg, {m.name: m}, poll_s=0, log=waits.append, read=lambda: next(readings)) == []
    assert len(waits) == 2 and "40.0 GiB free on the GPU and 99.0 GiB in use" in waits[0]
    readings = iter([(100 * gib, 39 * gib)] * 3)  # never freed: refused once settle_s has passed
    [problem] = capacity.gpu_problems(cfg, {m.name: m}, settle_s=0, poll_s=0, log=waits.append,
                                      read=lambda: next(readings))
    assert "its 4 servers" in problem and "100.0 GiB free" in problem
    deepseek = _model("deepseek-v3-ep8-block", 61)
    cfg = Config(stock_site="-", models_dir=Path("-"), out=Path("-"), arms=("stock", "image"))
    [problem] = capacity.gpu_problems(cfg, {deepseek.name: deepseek}, log=pytest.fail,
                                      read=lambda: (70 * gib, 69 * gib))
    assert "70.0 GiB free" in problem


def test_the_gpus_memory_is_read_from_nvidia_smi_and_none_without_it(tmp_path, monkeypatch):
    """nvidia-smi's free and used memory (MiB, as --format=csv,noheader,nounits prints them) in bytes; where no
    nvidia-smi is on PATH (the CPU engine's runs) there is no GPU to check, and the bench starts its servers
    unchecked."""
    assert capacity.parse_gpu_memory("142445, 581\n") == (142445 << 20, 581 << 20)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert capacity.gpu_memory() is None
    cfg = Config(stock_site="-", models_dir=tmp_path, out=tmp_path, arms=("stock", "image"))
    deepseek = _model("deepseek-v3-ep8-block", 61)
    t0 = time.monotonic()
    assert capacity.gpu_problems(cfg, {deepseek.name: deepseek}, log=pytest.fail) == []
    assert time.monotonic() - t0 < 5  # no GPU: nothing to wait for


def test_a_streamed_token_without_text_counts_as_vllms_client_counts_it():
    """The first chunk of a stream may carry a token whose text vLLM holds back (an incomplete UTF-8 sequence): the
    bench times the first token from that chunk, as `vllm bench serve` does, and the first text separately
    (`ttft_text`, its time to first token up to run 19). A loopback server sends vLLM's chunk shapes: a token without
    text, 400 ms later one with text, a usage chunk without choices, [DONE]. The gap leaves a client on a loaded
    machine 330 ms to read the first chunk before the two would merge."""
    import http.server
    import threading

    chunks = [{"choices": [{"index": 0, "text": ""}]}, {"choices": [{"index": 0, "text": "a"}]},
              {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]},
              {"choices": [], "usage": {"completion_tokens": 3}}]

    class Stream(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i, c in enumerate(chunks):
                if i == 1:
                    time.sleep(0.4)
                self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stream)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = workload.streamed(f"127.0.0.1:{srv.server_address[1]}", {"prompt": [1, 2], "stream": True})
    finally:
        srv.shutdown()
    assert r["tokens"] == 3 and len(r["gaps"]) == 2  # three chunks with a token; the usage chunk is none
    assert r["ttft_text"] - r["ttft"] >= 0.07 and r["gaps"][0] >= 0.07


@pytest.mark.parametrize("preset,layers,fit",
                         [("qwen3-coder-480b-a35b-ep8", 36, 42), ("qwen3-235b-a22b-ep8", 94, 130)])
def test_the_kv_budget_says_how_many_requests_it_holds_and_the_report_names_the_clients_that_wait(
        tmp_path, preset, layers, fit):
    """The bench's 1.5 GiB KV budget holds 42 requests of 128 + 128 tokens on the Coder EP8 shard at 36 layers (8 KV
    heads) and 130 on the 235B EP8 shard at 94 (one KV head; vLLM's log of run 9: 33,456 tokens): e2e.md names each
    measured concurrency above that (128 clients on the Coder, none on the 235B), whose figures include requests
    waiting for blocks."""
    from bench.e2e.shards import preset_spec
    from serving.tiny_model import _config

    (tmp_path / "config.json").write_text(json.dumps(_config(preset_spec(preset, layers=layers), 1, 2)))
    assert servers.kv_sequences(Config.default("kv_bytes"), tmp_path, 256) == fit
    reps = [{"throughput": {c: {"tok_s": 1.0} for c in ("1", "32", "128")}, "latency": {}}]
    results = {"args": {"out_tokens": "128"}, "servers": {},
               "models": {"m": {"kv_sequences": fit, "reps": {"stock": reps, "image": reps}, "profile": {}}}}
    notes = [ln for ln in report.summarize(results).splitlines() if ln.startswith("- m: the KV budget")]
    assert notes == ([f"- m: the KV budget holds {fit} requests at once; at 128 clients the others waited for their "
                      "blocks (raise --kv-bytes to measure the engine alone)"] if fit < 128 else [])


def test_the_start_checks_two_layouts_put_nvcc_on_path_and_under_the_default_folder_only(tmp_path, monkeypatch):
    """bench.e2e.start_check: one layout finds nvcc on PATH; the other has it only where the default CUDA folder
    would be (PATH without it, CUDA_HOME and CUDA_PATH unset), where FlashInfer's GEMM runtime finds none."""
    from bench.e2e import start_check
    from serving import kernels

    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setattr(start_check, "DEFAULT_CUDA_BIN", cuda / "bin")
    monkeypatch.setattr(kernels, "DEFAULT_CUDA_HOME", str(cuda))
    base = {"PATH": f"/usr/bin{os.pathsep}/bin", "CUDA_HOME": str(cuda), "HOME": str(tmp_path)}
    on_path, hidden = start_check.layouts(base).values()
    assert on_path["PATH"].split(os.pathsep)[0] == str(cuda / "bin") and on_path["CUDA_HOME"] == str(cuda)
    assert str(cuda / "bin") not in hidden["PATH"] and "CUDA_HOME" not in hidden and "CUDA_PATH" not in hidden
    assert kernels.deep_gemm_nvcc(hidden) == cuda / "bin" / "nvcc" and kernels.flashinfer_nvcc(hidden)
    assert kernels.flashinfer_nvcc(hidden, gemm_runtime=True) is None
    assert kernels.flashinfer_nvcc(on_path, gemm_runtime=True) == cuda / "bin" / "nvcc"
