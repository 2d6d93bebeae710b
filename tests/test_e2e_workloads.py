"""The engine bench's workloads as deployments run them (bench/e2e): the workload shapes and the client that sends
them, KV pools sized by each engine from --gpu-mem and a deployment's context, the checks that refuse a run before
it starts, every server's KV pool read from its log, and the summary's tables of both. No engine starts here: the
client talks to an OpenAI-completions server on loopback that answers as vLLM's does (the tokens asked for, streamed
one a chunk), and the logs read are the recorded ones of GPU runs (bench/data)."""
from __future__ import annotations

import json
import statistics
import tarfile
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.e2e import capacity, cli, kv_pool, models, servers, workload
from bench.e2e.config import DEPLOYMENT_MODEL_LEN, PEER_RUNTIMES, Config
from bench.e2e.run import Run, summary
from tools.launcher_process import Server

ROOT = Path(__file__).resolve().parent.parent
SHAPES = workload.shapes(128, 128)


class Completions:
    """A loopback server of /v1/models and /v1/completions: each request's prompt length, max_tokens and stream
    flag recorded; max_tokens tokens answered (streamed: one chunk each, then the usage); with hold=N each request
    waits until N are in flight at once (or 30 s)."""

    def __init__(self, hold: int = 0):
        self.bodies: list[dict] = []
        self.in_flight = self.peak = 0
        cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                if self.path != "/v1/models":
                    self.send_error(404)
                    return
                self._send(json.dumps({"data": [{"id": "m"}]}).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with cond:
                    outer.bodies.append(body)
                    outer.in_flight += 1
                    outer.peak = max(outer.peak, outer.in_flight)
                    cond.notify_all()
                    if hold:
                        cond.wait_for(lambda: outer.peak >= hold, timeout=30)
                n = body["max_tokens"]
                if body.get("stream"):
                    self.send_response(200)
                    self.end_headers()
                    for _ in range(n):
                        self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
                    self.wfile.write(b'data: {"choices": [], "usage": {"completion_tokens": %d}}\n\n' % n)
                    self.wfile.write(b"data: [DONE]\n\n")
                else:
                    self._send(json.dumps({"usage": {"completion_tokens": n}}).encode())
                with cond:
                    outer.in_flight -= 1

            def _send(self, data: bytes):
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class Httpd(ThreadingHTTPServer):
            request_queue_size = 256  # a burst's connections arrive together
            daemon_threads = True

        self.httpd = Httpd(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def engine():
    s = Completions()
    yield s
    s.close()


def test_each_shape_draws_its_lengths_from_its_range_the_same_for_every_arm():
    for shape in SHAPES.values():
        drawn = [shape.lengths(k) for k in range(400)]
        assert drawn == [replace(shape).lengths(k) for k in range(400)], shape.name  # seeded by name and number
        assert all(shape.prompt[0] <= p <= shape.prompt[1] and shape.out[0] <= o <= shape.out[1] for p, o in drawn)
        assert max(p + o for p, o in drawn) <= shape.longest
    long, mixed, decode = SHAPES["long"], SHAPES["mixed"], SHAPES["decode-heavy"]
    assert 2048 == long.prompt[0] and long.longest + 64 <= 4096  # 2-4k, within the shards' positions
    prompts = [mixed.lengths(k)[0] for k in range(400)]
    outs = [mixed.lengths(k)[1] for k in range(400)]
    assert 900 < statistics.mean(prompts) < 1150 and 220 < statistics.mean(outs) < 290  # around their means
    assert len(set(prompts)) > 200  # a range, not a few values
    assert decode.prompt == (128, 128) and decode.out[0] >= 8 * decode.prompt[0]
    assert SHAPES["burst"].burst and not any(s.burst for n, s in SHAPES.items() if n != "burst")


def test_todays_shape_keeps_its_prompts_and_every_other_shape_draws_its_own():
    today = workload.Workload("m", 128, 128, 16384)
    default = workload.Workload.of("m", SHAPES["default"], 16384)
    assert [today.prompt(k) for k in range(5)] == [default.prompt(k) for k in range(5)]
    assert today.bodies(0, 3, True) == default.bodies(0, 3, True)
    firsts = {name: workload.Workload.of("m", s, 16384).prompt(7)[:16] for name, s in SHAPES.items()}
    # no shape's prompt shares its first cache block with another's (burst is today's lengths with its own tokens)
    assert len({tuple(p) for p in firsts.values()}) == len(SHAPES)


def test_a_mixed_sweep_sends_every_request_at_its_drawn_lengths(engine):
    shape = SHAPES["mixed"]
    wl = workload.Workload.of("m", shape, 16384)
    first = workload.repetition_start(0)
    r = workload.sweep(wl, engine.host, 1, clients=(1, 8), first=first)
    assert r["workload"] == "mixed" and set(r["throughput"]) == {"1", "8"} and set(r["latency"]) == {"1", "8"}
    sent = [(len(b["prompt"]), b["max_tokens"]) for b in engine.bodies]
    expected = [shape.lengths(k) for k in range(first, first + len(sent))]
    assert sorted(sent) == sorted(expected)
    n = workload.requests_for(1, 1)
    assert r["throughput"]["1"]["tokens"] == sum(o for _, o in expected[:n])
    assert len({p for p, _ in sent}) > 1 and all(b["ignore_eos"] for b in engine.bodies)


def test_a_burst_sends_its_128_prompts_at_once_and_is_one_run():
    server = Completions(hold=workload.BURST_PROMPTS)  # each request answered once all 128 are in flight
    try:
        wl = workload.Workload.of("m", SHAPES["burst"], 16384)
        r = workload.sweep(wl, server.host, 6, clients=(1, 8), first=workload.repetition_start(0))
    finally:
        server.close()
    assert server.peak == workload.BURST_PROMPTS == len(server.bodies)
    assert set(r) == {"burst", "workload"} and r["workload"] == "burst"
    b = r["burst"][str(workload.BURST_PROMPTS)]
    assert b["requests"] == workload.BURST_PROMPTS and b["stream_tok_s"] > 0
    assert 0 < b["ttft_p50_ms"] <= b["ttft_p99_ms"] and b["last_done_s"] >= b["ttft_p99_ms"] / 1e3


def _sized(tmp_path: Path, *extra: str) -> Config:
    argv = ["--stock-site", str(tmp_path / "stock"), "--models-dir", str(tmp_path / "m"), "--out",
            str(tmp_path / "o"), "--work", str(tmp_path / "w"), "--kv-pool", "sized", "--gpu-mem", "0.45", *extra]
    return Config.from_args(cli.parser().parse_args(argv))


def test_sized_pools_start_the_arms_alone_at_a_deployments_context_on_shards_with_its_positions(tmp_path):
    from bench.e2e import shards

    cfg = _sized(tmp_path, "--models", "qwen3-235b-ep8-block", "--layers", "94", "--workload", "default", "long")
    assert cfg.start_alone and cfg.max_model_len == DEPLOYMENT_MODEL_LEN == 16384
    assert cfg.record()["max_model_len"] == "16384" and cfg.record()["kv_pool"] == "sized"
    m = cli.models_at_depth(cfg)["qwen3-235b-ep8-block"]
    assert m.spec.max_position == 16384 and m.name == "qwen3-235b-ep8-block@94L"  # the figures' name unchanged
    assert shards.parse(["--out", "x", *models.tiny_model_args(m)])[1] == m.spec  # the shard made is the one checked
    assert cli.run_problems(cfg, [m]) == []
    # a fixed pool keeps today's context and the presets' positions, the long shape within them
    fixed = Config.from_args(cli.parser().parse_args(
        ["--stock-site", "s", "--models-dir", "m", "--out", "o", "--models", "qwen3-235b-ep8-block",
         "--workload", "default", "long"]))
    fm = cli.models_at_depth(fixed)["qwen3-235b-ep8-block"]
    assert not fixed.start_alone and fixed.max_model_len == 3904 + 128 + 64 and fm.spec.max_position == 4096
    assert cli.run_problems(fixed, [fm]) == []


def test_the_sized_vllm_arms_get_the_same_share_and_context_and_no_kv_bytes_the_image_its_defaults(tmp_path):
    from serving.settings import TABLE

    cfg = _sized(tmp_path, "--models", "qwen3-235b-ep8-block")
    m = models.chosen_models(["qwen3-235b-ep8-block"])[0]
    stock, _ = servers.server_command(cfg, m, "stock", tmp_path, 8001)
    assert "--kv-cache-memory-bytes" not in stock
    assert stock[stock.index("--max-model-len") + 1] == "16384"
    assert stock[stock.index("--gpu-memory-utilization") + 1] == "0.45"
    _, env = servers.server_command(cfg, m, "image", tmp_path, 8002)
    options = {k: v for k, v in env.items() if k.startswith("OPTION_")}
    assert options["OPTION_MAX_MODEL_LEN"] == "16384" and options["OPTION_GPU_MEMORY_UTILIZATION"] == "0.45"
    assert "OPTION_KV_CACHE_MEMORY_BYTES" not in options
    # the image as it ships: its container's settings, the model and address, the workload's and the instruments'
    own = {n for key in (*models.CONTAINER_SETTINGS, "model_id", "host", "port") if key in TABLE
           for n in (f"OPTION_{key.upper()}", *TABLE[key].env_names)}
    workload_flags = {f"OPTION_{k.replace('-', '_').upper()}"
                      for k in (*models.WORKLOAD_ENGINE_ARGS, *models.INSTRUMENT_ENGINE_ARGS)}
    assert set(options) <= own | workload_flags, set(options) - own - workload_flags


@pytest.mark.parametrize("arm", models.SGLANG_ARMS)
def test_the_sized_sglang_arm_fills_the_same_share_of_the_gpu_from_the_memory_free_at_its_start(tmp_path,
                                                                                                   monkeypatch, arm):
    cfg = replace(_sized(tmp_path, "--models", "qwen3-235b-ep8-block"),
                  **{PEER_RUNTIMES[arm][0]: f"/opt/{arm}/bin/python"})
    m = models.chosen_models(["qwen3-235b-ep8-block"])[0]
    gib = 1 << 30
    monkeypatch.setattr(capacity, "gpu_memory", lambda: (100 * gib, 40 * gib))  # what nvidia-smi reads: free, used
    cmd, _ = servers.server_command(cfg, m, arm, tmp_path, 8003)
    assert cmd[0] == f"/opt/{arm}/bin/python"
    assert "--max-total-tokens" not in cmd and cmd[cmd.index("--context-length") + 1] == "16384"
    fraction = float(cmd[cmd.index("--mem-fraction-static") + 1])
    assert fraction * 100 * gib == pytest.approx(0.45 * 140 * gib, rel=1e-3)  # 0.45 of the GPU, of 100 GiB free
    monkeypatch.setattr(capacity, "gpu_memory", lambda: None)  # no GPU: --gpu-mem itself
    assert capacity.sglang_sized_args(cfg) == ["--mem-fraction-static", "0.4500"]
    with pytest.raises(ValueError, match="the arms started before it hold the rest"):
        capacity.sglang_sized_args(cfg, read=lambda: (40 * gib, 100 * gib))


def test_sized_pools_the_gpu_cannot_hold_are_refused_with_the_share_or_layers_that_fit(tmp_path):
    gib = 1 << 30
    total = 140 * gib
    three = _sized(tmp_path, "--models", "qwen3-235b-ep8-block", "--layers", "94",
                   "--arms", "stock", "image", "image-vllm-topk")
    ms = cli.models_at_depth(three)
    [problem] = capacity.gpu_shortfall(three, ms, total, total)
    assert "its 3 servers" in problem and "Give --gpu-mem 0.33 or less" in problem
    assert capacity.gpu_shortfall(replace(three, gpu_mem=0.33), ms, total, total) == []
    # a share too small for the weights, the reserve and one request of the context: the layers that fit
    small = replace(_sized(tmp_path, "--models", "qwen3-235b-ep8-block", "--layers", "94", "--arms", "stock"),
                    gpu_mem=0.2)
    m = cli.models_at_depth(small)["qwen3-235b-ep8-block"]
    [problem] = capacity.gpu_shortfall(small, {"x": m}, total, total)
    fit = int(problem.split("At most ")[1].split(" ")[0])
    at = lambda n: {"x": models.with_layers(replace(m, name="qwen3-235b-ep8-block", layers=16), n)}  # noqa: E731
    assert 0 < fit < 94
    assert capacity.gpu_shortfall(small, at(fit), total, total) == []
    assert capacity.gpu_shortfall(small, at(fit + 1), total, total) != []


def test_a_context_shorter_than_the_workloads_or_longer_than_the_models_positions_is_refused(tmp_path, capsys):
    base = ["--stock-site", str(tmp_path), "--models-dir", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
            "--work", str(tmp_path / "w")]
    with pytest.raises(SystemExit) as e:
        cli.main(base + ["--models", "qwen3-235b-ep8-block", "--workload", "long", "--max-model-len", "2048"])
    assert e.value.code == 2 and "the workloads (long) send requests of up to 4032 tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(base + ["--models", "tiny-cpu", "--kv-pool", "sized"])
    assert e.value.code == 2 and "longer than tiny-cpu's 2048 positions" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "m").exists()


def _recorded_log(archive: str, member: str) -> str:
    with tarfile.open(ROOT / "bench" / "data" / archive) as t:
        return t.extractfile(member).read().decode(errors="replace")


def test_each_servers_kv_pool_is_read_from_its_engines_log():
    """vLLM's and SGLang's own lines, as the GPU runs logged them (H200 run 20; H100 run 34's SGLang 0.5.21)."""
    logs = "h200_block_20/e2e-live-logs.tar.gz"
    stock = kv_pool.pool_facts(_recorded_log(logs, "logs/qwen3-235b-ep8-block@94L.stock.log"))
    image = kv_pool.pool_facts(_recorded_log(logs, "logs/qwen3-235b-ep8-block@94L.image.log"))
    assert stock == {"kv_tokens": 33456, "graphs_gib": 1.17, "weights_gib": 27.53}
    assert image == {"kv_tokens": 33456, "graphs_gib": 0.34, "weights_gib": image["weights_gib"]}
    assert image["weights_gib"] > 27
    sglang = _recorded_log("h100_block_34/e2e-logs.tar.gz", "logs/qwen3-235b-ep8-block@94L.sglang.log")
    assert kv_pool.pool_facts(sglang) == {"kv_tokens": 145008, "kv_gib": 6.5, "graphs_gib": 9.73}
    sized = ("INFO [gpu_worker.py:760] Available KV cache memory: 16.46 GiB\n"
             "INFO [kv_cache_utils.py:2327] GPU KV cache size: 719,248 tokens, Maximum concurrency for 16,384 tokens "
             "per request: 43.90x\n"
             "INFO [gpu_model_runner.py:5150] Model loading took 14.1 GiB memory and 20.5 seconds\n"
             "INFO [gpu_worker.py:774] CUDA graph memory profiling is enabled (default since v0.21.0). The current "
             "--gpu-memory-utilization=0.4500 is equivalent to --gpu-memory-utilization=0.3977 without CUDA graph "
             "memory profiling. To maintain the same effective KV cache size as before, increase ...\n"
             "INFO [gpu_worker.py:1059] Free memory on device (42.87/79.18 GiB) on startup. Desired GPU memory "
             "utilization is (0.45, 35.63 GiB). Actual usage is 14.63 GiB for consumed memory\n")
    facts = servers.log_facts(type("S", (), {"log": lambda self: sized, "name": "m.image"})())
    assert facts["kv_tokens"] == 719248 and facts["kv_gib"] == 16.46
    assert facts["weights_gib"] == 14.1 and facts["graphs_estimate_gib"] == 4.14  # 0.0523 of 79.18 GiB
    assert kv_pool.pool_facts("no pool yet") == {"kv_tokens": None}
    assert kv_pool.held_at_once(719248, 4032) == 719248 // 4032 and kv_pool.held_at_once(33456, 257) == 33456 // 272


def test_a_run_measures_each_shape_in_turn_records_each_and_the_summary_shows_the_pools_beside_them(tmp_path,
                                                                                                    engine):
    """Run.measure over two arms of the loopback server: every shape's warm-up and repetitions, today's where the
    report reads them, the others under workloads; each server's KV pool from its log; e2e.md's tables."""
    cfg = _sized(tmp_path, "--models", "tiny-cpu", "--reps", "2", "--waves", "1", "--clients", "1", "--in-tokens",
                 "8", "--out-tokens", "4", "--workload", "default", "mixed", "burst")
    cfg.out.mkdir(parents=True)
    arms = {}
    for arm, tokens in (("stock", 885056), ("image", 719248)):
        log = tmp_path / f"{arm}.log"
        log.write_text(f"INFO GPU KV cache size: {tokens:,} tokens, Maximum concurrency for 16,384 tokens per "
                       "request: 1.00x\nINFO Graph capturing finished in 9 secs, took 0.45 GiB\n")
        arms[arm] = Server(url=f"http://{engine.host}", proc=None, log_path=log, name=f"tiny-cpu.{arm}")
    r = Run(cfg, 512)
    r.measure(models.CPU_CHECK, arms, tmp_path)
    res = json.loads((cfg.out / "e2e.json").read_text())
    mres = res["models"]["tiny-cpu"]
    assert "kv_sequences" not in mres  # a sized pool's requests held are each server's own
    assert [len(mres["reps"][a]) for a in ("stock", "image")] == [2, 2]
    assert all(x["workload"] == "default" for a in ("stock", "image") for x in mres["reps"][a])
    assert list(mres["workloads"]) == ["default", "mixed", "burst"]
    assert mres["workloads"]["mixed"]["shape"]["prompt_tokens"] == [256, 1792]
    for name in ("mixed", "burst"):
        reps = mres["workloads"][name]["reps"]
        assert [len(reps[a]) for a in ("stock", "image")] == [2, 2] and set(mres["workloads"][name]["first_pass"])
        assert all(x["workload"] == name for a in reps for x in reps[a])
    assert res["servers"]["tiny-cpu.image"]["kv_tokens"] == 719248
    md = (cfg.out / "e2e.md").read_text()
    assert md == summary(res)
    pool_row = next(ln for ln in md.splitlines() if ln.startswith("| tiny-cpu.image | sized"))
    assert "| 719,248 |" in pool_row and f"| {719248 / 885056:.3f} |" in pool_row and "| 0.45 |" in pool_row
    assert "(sized, context 16384)" in md
    assert any(ln.startswith("| tiny-cpu | mixed (prompts 256-1792, outputs 64-448) | 1 | image |")
               for ln in md.splitlines())
    burst = next(ln for ln in md.splitlines() if ln.startswith("| tiny-cpu | burst (prompts 8, outputs 4) | 128 | "
                                                               "image |"))
    assert burst.endswith("(stock) |") and not burst.endswith("| - (stock) |")  # its paired ratio over stock's


def test_one_at_a_time_serves_each_arm_alone_so_each_may_take_a_deployments_share(tmp_path):
    """--one-at-a-time: a group per arm, so three arms at a deployment's --gpu-mem 0.9 fit one H200 at 94 layers,
    where together they are refused naming the share; the cross-check, which measures arms side by side, is
    refused with it."""
    argv = ("--models", "qwen3-235b-ep8-block", "--layers", "94", "--arms", "stock", "image",
            "image-graph-estimate")
    together = _sized(tmp_path, *argv, "--gpu-mem", "0.9")
    alone = _sized(tmp_path, *argv, "--gpu-mem", "0.9", "--one-at-a-time")
    m = cli.models_at_depth(alone)["qwen3-235b-ep8-block"]
    assert together.serving_groups(m) == [["stock", "image", "image-graph-estimate"]]
    assert alone.serving_groups(m) == [["stock"], ["image"], ["image-graph-estimate"]]
    gib, total = 1 << 30, 143771 << 20
    models_ = {m.name: m}
    [problem] = capacity.sized_shortfall(together, models_, 140 * gib, total)
    assert "its 3 servers (stock, image, image-graph-estimate)" in problem
    assert capacity.sized_shortfall(alone, models_, 140 * gib, total) == []
    assert cli.run_problems(alone, [m]) == [] and alone.record()["one_at_a_time"] == "True"
    crossed = _sized(tmp_path, *argv, "--one-at-a-time", "--cross-check", "1")
    assert cli.run_problems(crossed, [m]) == [
        "--one-at-a-time serves one arm at a time; --cross-check measures the arms side by side: give one"]


def test_arms_measured_one_after_the_other_are_paired_by_repetition(tmp_path, engine):
    """Run.measure once per arm, as --one-at-a-time calls it: each arm's repetitions are kept beside the others',
    and the summary pairs repetition r of the image with repetition r of stock."""
    cfg = _sized(tmp_path, "--models", "tiny-cpu", "--reps", "2", "--waves", "1", "--clients", "1", "--in-tokens",
                 "8", "--out-tokens", "4", "--one-at-a-time")
    cfg.out.mkdir(parents=True)
    r = Run(cfg, 512)
    for arm in ("stock", "image"):
        log = tmp_path / f"{arm}.log"
        log.write_text("INFO GPU KV cache size: 1,000 tokens, Maximum concurrency for 16,384 tokens per request: "
                       "1.00x\n")
        r.measure(models.CPU_CHECK, {arm: Server(url=f"http://{engine.host}", proc=None, log_path=log,
                                                 name=f"tiny-cpu.{arm}")}, tmp_path)
    res = json.loads((cfg.out / "e2e.json").read_text())
    reps = res["models"]["tiny-cpu"]["reps"]
    assert [len(reps[a]) for a in ("stock", "image")] == [2, 2] and set(res["models"]["tiny-cpu"]["first_pass"]) == {
        "stock", "image"}
    md = (cfg.out / "e2e.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| tiny-cpu | image | tok_s | 1 |"))
    ratios = [a["throughput"]["1"]["tok_s"] / b["throughput"]["1"]["tok_s"] for a, b in zip(reps["image"],
                                                                                          reps["stock"])]
    assert f"| {statistics.median(ratios):.3f} |" in row
