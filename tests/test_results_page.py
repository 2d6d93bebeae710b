"""bench/RESULTS.md, the figures on one page: short, opening with the headline, its engine figures those of the
recorded run, its index naming every run the archive holds and data that exists."""
from __future__ import annotations

import json
import re
import statistics
import tarfile
from pathlib import Path

from bench.e2e.report import paired_ratios, summarize

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "bench" / "RESULTS.md").read_text()
ARCHIVE = (ROOT / "bench" / "RESULTS-archive.md").read_text()
HEADLINE = PAGE.split("## Goals")[0]
GOALS = PAGE.split("## Goals")[1].split("## What ships")[0]


def test_page_is_short_and_opens_with_the_headline():
    assert len(PAGE.splitlines()) <= 150
    sections = re.findall(r"^## (.+)$", PAGE, re.M)
    assert sections == ["Headline", "Goals", "What ships and why", "Method and caveats", "Reproduce", "Index of runs"]


def tok_s(res: dict, model: str, clients: str, arm: str = "image", base: str = "stock") -> tuple[list, list]:
    """arm's output tokens/s over base's in a run's JSON, paired per repetition: (this bench's ratios, sorted; vLLM's
    client's, the cross-check's)."""
    ratios = sorted(paired_ratios([res], model, "throughput", "tok_s", clients, arm=arm, base=base))
    return ratios, paired_ratios([res], model, "throughput", "tok_s", clients, arm=arm, base=base,
                                 section="cross_check")


def index_row_of(run: str) -> str:
    """The results page's index row of one run."""
    return next(ln for ln in PAGE.splitlines() if ln.startswith(f"| run {run} |"))


def start_against(res: dict, model: str, peer: str) -> str:
    """'ready after A against B s, first request C against D ms': the image's start and first request against
    peer's, as the goals rows give them."""
    image, other = (res["servers"][f"{model}.{arm}"] for arm in ("image", peer))
    return (f"ready after {image['ready_s']:.1f} against {other['ready_s']:.1f} s, first request "
            f"{image['first_ttft_ms']:.1f} against {other['first_ttft_ms']:.1f} ms")


def test_headline_figures_are_the_recorded_run_9():
    res = json.loads((ROOT / "bench" / "data" / "h200_engine_9" / "e2e.json").read_text())
    for model in ("qwen3-235b-tp8-tensor@94L", "qwen3-coder-480b-tp8-tensor@40L"):
        for clients in ("1", "8"):
            ratios = paired_ratios([res], model, "throughput", "tok_s", clients)
            assert f"{statistics.median(ratios):.3f}x" in HEADLINE, (model, clients)
        one = paired_ratios([res], model, "throughput", "tok_s", "1")
        assert 1.192 <= round(min(one), 3) and round(max(one), 3) <= 1.208  # "every paired ratio within 1.192-1.208"


def test_the_coder_ep8_figures_are_the_recorded_run_18():
    res = json.loads((ROOT / "bench" / "data" / "h200_block_18" / "e2e.json").read_text())
    for clients in ("1", "8", "32"):
        ratios = paired_ratios([res], "qwen3-coder-480b-ep8-block@36L", "throughput", "tok_s", clients)
        assert len(ratios) == 4 and f"**{statistics.median(ratios):.3f}x**" in HEADLINE, clients


def test_the_235b_ep8_and_sglang_figures_are_the_recorded_run_19():
    """The headline's 235B EP8 figures (image/stock) and its SGLang figures (image/sglang, each repetition's image
    figure over SGLang's of the same repetition), from both clients, are run 19's."""
    res = json.loads((ROOT / "bench" / "data" / "h200_block_19" / "e2e.json").read_text())
    model = "qwen3-235b-ep8-block@94L"
    for base in ("stock", "sglang"):
        for clients in ("1", "8", "32"):
            ratios, cross = tok_s(res, model, clients, base=base)
            assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}x**" in HEADLINE, (base, clients)
            assert len(cross) == 2
            if base == "sglang" or clients == "1":
                assert f"{statistics.median(cross):.3f}x" in HEADLINE, (base, clients)


def test_the_per_tensor_235b_and_sglang_figures_are_the_recorded_run_28():
    """The headline's per-tensor 235B TP8 figures (image/stock) and its SGLang figures (image/sglang), this bench's
    medians in bold with vLLM's client's beside them, and the goals row's medians with their ranges, are run 28's."""
    res = json.loads((ROOT / "bench" / "data" / "h200_tensor_28" / "e2e.json").read_text())
    model = "qwen3-235b-tp8-tensor@94L"
    for base in ("stock", "sglang"):
        for clients in ("1", "8", "32"):
            ratios, cross = tok_s(res, model, clients, base=base)
            assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}x**" in HEADLINE, (base, clients)
            assert len(cross) == 2 and f"{statistics.median(cross):.3f}x" in HEADLINE, (base, clients)
            if base == "sglang":
                figure = f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})"
                assert figure in GOALS, (base, clients)


def test_the_per_tensor_vllm_034_figures_are_the_recorded_run_30():
    """The headline's per-tensor 235B TP8 figures against stock vLLM 0.34 (image/vllm-latest, this bench's in bold and
    vLLM's client's), the goals row's with their ranges and its start and first request, and the index row's, are
    run 30's."""
    res = json.loads((ROOT / "bench" / "data" / "h200_tensor_30" / "e2e.json").read_text())
    index_row = index_row_of("30")
    model = "qwen3-235b-tp8-tensor@94L"
    for base in ("stock", "vllm-latest"):
        for clients in ("1", "8", "32"):
            ratios, cross = tok_s(res, model, clients, base=base)
            assert len(ratios) == 3 and len(cross) == 2 and f"{statistics.median(ratios):.3f}x" in index_row
            if base == "vllm-latest":
                assert f"**{statistics.median(ratios):.3f}x**" in HEADLINE, clients
                assert f"{statistics.median(cross):.3f}x" in HEADLINE, clients
                assert f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})" in GOALS, clients
    assert start_against(res, model, "vllm-latest") in GOALS


def test_the_235b_ep8_sglang_figures_at_32_clients_are_the_recorded_run_31():
    """The headline's and the goals row's 235B EP8 figures against SGLang at 32 clients (the image with the small-M
    entries up to 32 tokens, and without them), the entries' own ratio, and the start and first request, are run
    31's."""
    res = json.loads((ROOT / "bench" / "data" / "h200_block_31" / "e2e.json").read_text())
    model = "qwen3-235b-ep8-block@94L"
    with_entries, _ = tok_s(res, model, "32", arm="image-candidates", base="sglang")
    without, _ = tok_s(res, model, "32", arm="image", base="sglang")
    entries, _ = tok_s(res, model, "32", arm="image-candidates", base="image")
    assert len(with_entries) == len(without) == len(entries) == 3
    assert f"**{statistics.median(with_entries):.3f}x**" in HEADLINE
    assert f"{statistics.median(without):.3f}x" in HEADLINE
    for ratios in (with_entries, without, entries):
        assert f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})" in GOALS
    assert min(with_entries) >= 1.0  # issue 29's goal at 32 clients
    assert start_against(res, model, "sglang") in GOALS


def test_the_aot_compile_figures_are_the_recorded_run_29():
    """The goals row's, the index row's and the aot_compile setting's figures for the image without vLLM's AOT
    compile (image-no-aot-compile/image) are run 29's: how much sooner it was ready, and its tokens/s range."""
    from serving.settings import TABLE

    res = json.loads((ROOT / "bench" / "data" / "h100_tensor_29" / "e2e.json").read_text())
    model = "qwen3-235b-tp8-tensor@94L"
    ready = {arm: res["servers"][f"{model}.{arm}"]["ready_s"] for arm in ("image", "image-no-aot-compile")}
    sooner = f"{ready['image'] - ready['image-no-aot-compile']:.0f} s sooner"
    medians = [statistics.median(paired_ratios([res], model, "throughput", "tok_s", c, arm="image-no-aot-compile",
                                               base="image")) for c in ("1", "8", "32")]
    tok_s = f"{min(medians):.3f}-{max(medians):.3f}x the tokens/s"
    index_row = index_row_of("29")
    assert sooner in GOALS and sooner in index_row and tok_s in index_row
    help_text = TABLE["aot_compile"].why
    assert f"ready after {ready['image-no-aot-compile']:.0f} against {ready['image']:.0f} s" in help_text
    assert tok_s in help_text


def test_the_in_process_start_figures_are_the_recorded_run_32():
    """The engine_in_process setting's, the goals row's and the index row's start figures (each server started alone
    on an H100) are run 32's: the image exec'ing `vllm serve` against vLLM's CLI in the launcher's process (arm
    image-in-process at that tree) with their paired one-client tokens/s, and the in-process image against SGLang."""
    from serving.settings import TABLE

    model = "qwen3-235b-tp8-tensor@94L"
    data = ROOT / "bench" / "data" / "h100_tensor_32"
    res = json.loads((data / "e2e.json").read_text())
    ready = {arm: res["servers"][f"{model}.{arm}"]["ready_s"] for arm in ("image", "image-in-process")}
    ratio = statistics.median(paired_ratios([res], model, "throughput", "tok_s", "1", arm="image-in-process",
                                            base="image"))
    help_text = TABLE["engine_in_process"].why
    assert f"ready after {ready['image-in-process']:.0f} against {ready['image']:.0f} s" in help_text
    assert f"{ratio:.3f}x the one-client tokens/s" in help_text
    index_row = index_row_of("32")
    assert f"ready after {ready['image-in-process']:.0f} against {ready['image']:.0f} s at {ratio:.3f}x" in index_row
    peer = json.loads((data / "e2e-sglang.json").read_text())["servers"]
    image, sglang = peer[f"{model}.image-in-process"]["ready_s"], peer[f"{model}.sglang"]["ready_s"]
    assert f"{image:.1f} against {sglang:.1f} s" in GOALS and f"{ready['image']:.1f} s exec'ing" in GOALS


def test_the_start_defaults_figures_are_the_recorded_run_33():
    """The start goal's figures against SGLang (each server started alone on an H100, the image with its engine core
    forked and no compile cache) and the tokens/s ratios at 1/8/32 clients, in the goals row, the index row, the
    archive's table and the two settings' help, are run 33's."""
    from serving.settings import TABLE

    model = "qwen3-235b-tp8-tensor@94L"
    res = json.loads((ROOT / "bench" / "data" / "h100_tensor_33" / "e2e.json").read_text())
    servers = res["servers"]
    image, sglang = servers[f"{model}.image"], servers[f"{model}.sglang"]
    start = f"ready after {image['ready_s']:.1f} against {sglang['ready_s']:.1f} s"
    first = f"first request {image['first_ttft_ms']:.1f} against {sglang['first_ttft_ms']:.1f} ms"
    assert start in GOALS and first in GOALS
    assert f"ready after {image['ready_s']:.0f} s against SGLang 0.5.21's {sglang['ready_s']:.0f}" in index_row_of("33")
    section = archived("33")
    assert f"| **{image['ready_s']:.1f}** | **{image['first_ttft_ms']:.1f}** |" in section
    assert f"| {sglang['ready_s']:.1f} | {sglang['first_ttft_ms']:.1f} |" in section
    for key in ("worker_multiproc_method", "disable_compile_cache"):
        assert f"{image['ready_s']:.1f} against SGLang 0.5.21's {sglang['ready_s']:.1f} s" in TABLE[key].why, key
    for clients in ("1", "8", "32"):
        ratios = paired_ratios([res], model, "throughput", "tok_s", clients, arm="image", base="sglang")
        assert len(ratios) == 3
        figure = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        assert figure in GOALS and f"**{statistics.median(ratios):.3f}** ({min(ratios):.3f}-{max(ratios):.3f})" \
            in section, clients
        assert f"{statistics.median(ratios):.3f}x" in index_row_of("33")


def test_the_h100_ep8_figures_against_sglang_are_the_recorded_runs_34_and_35():
    """The 235B EP8 shard against SGLang on an H100: run 34 (none of the image's files read there) in its archive
    section, index row, the goals row and README; run 35 (the H200's fused-MoE files read as the H100's) and 35b (the
    small-M files too) in the goals row, the headline (35b: not there, where run 36's side-by-side figures stand) and
    the archive; the H200 entries' kernel ratios on the H100 come from probe 34b's bench."""
    from bench.kernels.moe.report import t_of

    model = "qwen3-235b-ep8-block@94L"
    data = ROOT / "bench" / "data" / "h100_block_34"
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    res = json.loads((data / "e2e.json").read_text())
    for clients in ("1", "8", "32", "128"):
        ratios, cross = tok_s(res, model, clients, base="sglang")
        assert len(ratios) == 3 and len(cross) == 2, clients
        assert f"**{statistics.median(ratios):.3f}** ({ratios[0]:.3f}-{ratios[-1]:.3f})" in archived("34"), clients
        assert f"{statistics.median(ratios):.3f}x" in index_row_of("34") and f"{statistics.median(cross):.3f}" in \
            archived("34"), clients
    for clients in ("8", "32", "128"):  # run 34's in the goals row and README too
        assert f"{statistics.median(tok_s(res, model, clients, base='sglang')[0]):.3f}" in GOALS, clients
        assert f"{statistics.median(tok_s(res, model, clients, base='sglang')[0]):.3f}x" in readme, clients
    new = ROOT / "bench" / "data" / "h100_block_35"
    res = json.loads((new / "e2e.json").read_text())
    assert res["servers"][f"{model}.image"]["moe_configs_not_found"] == []  # the H200's files, read as the H100's
    for clients in ("1", "8", "32", "128"):
        ratios, cross = tok_s(res, model, clients, base="sglang")
        assert len(ratios) == 3 and len(cross) == 2, clients
        mine = f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})"
        theirs = f"{statistics.median(cross):.3f}"
        assert mine in GOALS and f"**{statistics.median(ratios):.3f}** ({ratios[0]:.3f}-{ratios[-1]:.3f})" in \
            archived("35"), clients
        assert f"**{statistics.median(ratios):.3f}x**" in HEADLINE and f"{theirs}x" in HEADLINE, clients
        assert f"{statistics.median(ratios):.3f}x" in index_row_of("35") and theirs in archived("35"), clients
    assert start_against(res, model, "sglang") in GOALS
    small_m = json.loads((new / "e2e-small-m.json").read_text())
    for clients in ("8", "32"):
        ratios, _ = tok_s(small_m, model, clients, arm="image-candidates", base="image")
        assert len(ratios) == 3, clients
        figure = f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})"
        assert figure in GOALS and f"**{statistics.median(ratios):.3f}** ({ratios[0]:.3f}-{ratios[-1]:.3f})" in \
            archived("35"), clients
        assert f"{statistics.median(ratios):.3f}x" in index_row_of("35"), clients
    # probe 34b on the H100: the H200 entries (w13 + w2) over vLLM's default, the archive's rows
    assert json.loads((data / "kernels" / "meta_h100.json").read_text())["device"] == "NVIDIA H100 80GB HBM3"
    rows = json.loads((data / "kernels" / "bench_h100.json").read_text())["rows"]
    times: dict = {}
    for r in rows:
        times.setdefault((r["shape"], r["M"], r["variant"]), 0.0)
        times[(r["shape"], r["M"], r["variant"])] += t_of(r)
    for shape, row in (("qwen3-235b-ep8", "| 235B EP8"), ("qwen3-coder-480b-ep8", "| Coder EP8")):
        ratio = {m: times[(shape, m, "ours")] / times[(shape, m, "stock")] for s_, m, v in times if s_ == shape}
        line = next(ln for ln in archived("34").splitlines() if ln.startswith(row))
        big = sorted(ratio[m] for m in (96, 128, 256, 512))
        assert f"**{ratio[1]:.3f}**" in line and f"**{big[0]:.3f}-{big[-1]:.3f}**" in line, shape
        assert max(ratio.values()) < 1.005, shape


def test_the_h100_ep8_figures_of_the_image_as_it_ships_are_the_recorded_run_36():
    """Run 36, the image reading the H200's fused-MoE and small-M files as the H100's, side by side with SGLang: its
    ratios in the archive, the goals row, the headline and the index row; the start figures in the archive; vLLM's
    own split of the image's first token at 128 clients in the archive and the goals row."""
    model = "qwen3-235b-ep8-block@94L"
    res = json.loads((ROOT / "bench" / "data" / "h100_block_36" / "e2e.json").read_text())
    assert res["servers"][f"{model}.image"]["moe_configs_not_found"] == []
    for clients in ("8", "32", "128"):
        ratios, cross = tok_s(res, model, clients, base="sglang")
        assert len(ratios) == 3 and cross == [], clients
        m, rng = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})"
        assert f"**{m}** {rng}" in archived("36") and f"**{m} {rng}**" in GOALS, clients
        assert f"**{m}x**" in HEADLINE and f"{m}x" in index_row_of("36"), clients
    image, sglang = (res["servers"][f"{model}.{arm}"] for arm in ("image", "sglang"))
    assert (f"Ready after {image['ready_s']:.1f} against {sglang['ready_s']:.1f} s" in archived("36")
            and f"first request {image['first_ttft_ms']:.1f}\n  against {sglang['first_ttft_ms']:.1f} ms" in archived("36"))
    split = [r["throughput"]["128"]["server"] for r in res["models"][model]["reps"]["image"]]
    ttft, queue, prefill = (statistics.median(x[k] for x in split) for k in ("ttft_ms", "queue_ms", "prefill_ms"))
    assert f"{ttft:.1f} ms after its arrival" in archived("36").replace("\n  ", " ")
    assert f"{queue:.1f} ms in the scheduler's queue and {prefill:.1f}" in archived("36").replace("\n  ", " ")
    assert f"{queue:.1f} ms queued, {prefill:.1f} ms prefill" in GOALS and f"{round(ttft)} ms" in GOALS

def test_the_h100_ep8_figures_against_sglang_with_vllms_client_are_the_recorded_run_37():
    """Run 37, the image as it ships against SGLang with vLLM's client beside: both clients' ratios in the archive,
    the goals row and the headline; the start figures; the profile's step spans on the host and the GPU at 128
    clients, and vLLM's split of the first token under vLLM's client, in the archive."""
    model = "qwen3-235b-ep8-block@94L"
    res = json.loads((ROOT / "bench" / "data" / "h100_block_37" / "e2e.json").read_text())
    section, goals = archived("37"), GOALS.replace("\n", " ")
    for clients in ("8", "32", "128"):
        ratios, cross = tok_s(res, model, clients, base="sglang")
        assert len(ratios) == 3 and len(cross) == 2, clients
        m, rng = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})"
        cm = f"{statistics.median(cross):.3f}"
        cross_rng = f"({min(cross):.3f}-{max(cross):.3f})"
        assert f"**{m}** {rng}" in section and f"{cm} {cross_rng}" in section, clients
        assert f"**{m} {rng}**" in goals and f"**{m}x**" in HEADLINE, clients
        assert f"{cm}x" in HEADLINE and f"{m}x" in index_row_of("37"), clients
    assert "**0.956 (0.947-0.964)**: **not met**" in goals
    image, sglang = (res["servers"][f"{model}.{arm}"] for arm in ("image", "sglang"))
    started = f"Ready after {image['ready_s']:.1f} against {sglang['ready_s']:.1f} s, first request " \
              f"{image['first_ttft_ms']:.1f} against {sglang['first_ttft_ms']:.1f} ms"
    assert started in section and started in goals
    steps = res["models"][model]["profile"]["image.c128"]["step_kinds"]
    decode = steps["execute_context_0(0)_generation_128(128)"]
    alone = steps["execute_context_1(128)_generation_0(0)"]
    tail = steps["execute_context_1(64)_generation_127(127)"]
    flat = section.replace("\n  ", " ")
    assert f"spanned {decode['gpu_ms']:.2f} ms on the GPU and {decode['host_ms']:.1f} ms on the host" in flat
    assert f"alone (128 tokens) {alone['host_ms']:.1f} ms on the host and {alone['gpu_ms']:.1f} ms" in flat
    assert f"127 decodes {tail['host_ms']:.1f} ms on the host for {tail['gpu_ms']:.1f} ms on the GPU" in flat
    window = {arm: res["models"][model]["profile"][f"{arm}.c128"] for arm in ("image", "sglang")}
    idle = {arm: f"{w['gpu_span_ms'] - w['gpu_busy_ms']:.0f} of {w['gpu_span_ms']:.0f}" for arm, w in window.items()}
    assert f"idled {idle['image']} ms (SGLang {idle['sglang']})" in goals.replace("the window's ", "")
    prompt_steps = [v["host_ms"] for k, v in steps.items() if not k.startswith("execute_context_0(")]
    assert f"{min(prompt_steps):.0f}-{max(prompt_steps):.0f} ms of host time" in goals
    split = res["models"][model]["cross_check"]["image"]
    ttft, queue, prefill = (statistics.median(r["latency"]["128"]["server"][k] for r in split)
                            for k in ("ttft_ms", "queue_ms", "prefill_ms"))
    client = statistics.median(r["latency"]["128"]["ttft_p50_ms"] for r in split)
    assert (f"{ttft:.1f} ms from arrival" in flat and f"{queue:.1f} ms of it queued and {prefill:.1f} ms of prefill"
            in flat and f"client's p50 of {client:.1f} ms" in flat)


def test_the_every_step_in_one_graph_figures_are_the_recorded_run_38():
    """Run 38, every step in one CUDA graph (the arm image-full-graphs, the image's default since) over the image with
    vLLM's mode: its ratios at 1-128 clients in the archive, the goals row, the shipping row and the index row; both
    servers' start in the archive; the setting's own description quotes their span."""
    from serving.settings import SETTINGS

    model = "qwen3-235b-ep8-block@94L"
    res = json.loads((ROOT / "bench" / "data" / "h100_block_38" / "e2e.json").read_text())
    section, goals = archived("38"), GOALS.replace("\n", " ")
    shipping = next(ln for ln in PAGE.splitlines() if ln.startswith("| `cuda_graph_full_steps` + 0013 |"))
    medians = []
    for clients in ("1", "8", "32", "128"):
        ratios, _ = tok_s(res, model, clients, arm="image-full-graphs", base="image")
        assert len(ratios) == 2 and ratios[0] > 1.0, clients
        m = f"{statistics.median(ratios):.3f}"
        medians.append(m)
        assert f"**{m}** ({ratios[0]:.3f}-{ratios[-1]:.3f})" in section, clients
        assert f"{m}x" in index_row_of("38") and f"{m}x" in shipping, clients
    assert "{}, {}, {} and {} (".format(*medians) in goals
    ready = {arm: res["servers"][f"{model}.{arm}"]["ready_s"] for arm in ("image-full-graphs", "image")}
    assert f"ready after {ready['image-full-graphs']:.1f} against {ready['image']:.1f} s" in section
    setting = next(s for s in SETTINGS if s.key == "cuda_graph_full_steps")
    assert f"{min(medians)[:4]}-{max(medians)[:4]}x the output tokens/s" in setting.why


def sglang_ratios_recorded(res: dict, model: str, run: str, readme: str,
                           readme_clients: tuple[str, ...]) -> list[tuple[list, list]]:
    """The image's tokens/s over SGLang at 8/32/128 clients in a run of three repetitions and one pass of vLLM's
    client, each as the run's archive section, the goals row, the headline and the index row give it, and README
    (flattened) at readme_clients: the median and range in bold, vLLM's client's figure beside. Returns (ratios,
    cross) per concurrency."""
    section, goals = archived(run), GOALS.replace("\n", " ")
    recorded = []
    for clients in ("8", "32", "128"):
        ratios, cross = tok_s(res, model, clients, base="sglang")
        assert len(ratios) == 3 and len(cross) == 1, clients
        m, rng, cm = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})", f"{cross[0]:.3f}"
        assert f"**{m}** {rng}" in section and f"**{m} {rng}**" in goals, clients
        assert f"**{m}x**" in HEADLINE and f"{cm}x" in HEADLINE and f"{m}x" in index_row_of(run), clients
        assert cm in section and cm in goals, clients
        assert clients not in readme_clients or f"{m}x" in readme and f"{cm}x" in readme, clients
        recorded.append((ratios, cross))
    return recorded


def test_the_h100_ep8_figures_of_every_step_in_one_graph_against_sglang_are_the_recorded_run_39():
    """Run 39, the image as it ships (vLLM's cudagraph_mode FULL, as its start log says) against SGLang with vLLM's
    client: both clients' ratios in the archive, the goals row, the headline, the index row and (at 8 and 32 clients)
    README; vLLM's client's TTFT and ITL p50 at 128 clients and the share of a round's gap that is the decode steps;
    the start."""
    model = "qwen3-235b-ep8-block@94L"
    data = ROOT / "bench" / "data" / "h100_block_39"
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    res = json.loads((data / "e2e.json").read_text())
    section, goals = archived("39"), GOALS.replace("\n", " ")
    with tarfile.open(data / "e2e-logs.tar.gz") as logs:
        start = logs.extractfile(f"logs/{model}.image.log").read().decode()
    assert "cudagraph_mode FULL" in start and "Capturing CUDA graphs (FULL)" in start
    sglang_ratios_recorded(res, model, "39", readme, ("8", "32"))
    image, sglang = (res["models"][model]["cross_check"][arm][0]["latency"]["128"] for arm in ("image", "sglang"))
    flat = section.replace("\n  ", " ")
    assert (f"{image['ttft_p50_ms']:.1f} + 127 x {image['itl_p50_ms']:.2f} ms against SGLang's "
            f"{sglang['ttft_p50_ms']:.1f} + 127 x {sglang['itl_p50_ms']:.2f} ms") in flat
    assert f"ITL p50 {image['itl_p50_ms']:.2f} against {sglang['itl_p50_ms']:.2f} ms" in goals
    rounds = {arm: r["ttft_p50_ms"] + 127 * r["itl_p50_ms"] for arm, r in (("image", image), ("sglang", sglang))}
    gap = rounds["image"] - rounds["sglang"]
    assert 0.6 < 127 * (image["itl_p50_ms"] - sglang["itl_p50_ms"]) / gap < 0.7  # "two thirds", the decode steps
    assert f"of the {gap:.0f} ms" in flat and f"a round's {gap:.0f} ms" in goals
    image, sglang = (res["servers"][f"{model}.{arm}"] for arm in ("image", "sglang"))
    assert (f"Ready after {image['ready_s']:.1f} against {sglang['ready_s']:.1f} s, first request "
            f"{image['first_ttft_ms']:.1f} against {sglang['first_ttft_ms']:.1f} ms") in section


def test_the_h100_ep8_figures_of_one_kv_split_are_the_recorded_run_40():
    """Run 40, one KV split (no combine kernel) against the image: both clients' ratios in the archive, the 128-client
    figures in the goals row, the headline and the index row; the decode step of 128 from its profile; and run 40b's
    loss with 3,840-token prompts, from its one repetition (at one client in README too)."""
    model, arm = "qwen3-235b-ep8-block@94L", "image-attn-one-split"
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    res = json.loads((ROOT / "bench" / "data" / "h100_block_40" / "e2e.json").read_text())
    section, goals = archived("40"), GOALS.replace("\n", " ")
    for clients in ("1", "8", "32", "128"):
        ratios, cross = tok_s(res, model, clients, arm=arm, base="image")
        cross = sorted(cross)
        assert len(ratios) == 3 and len(cross) == 2, clients
        m, rng = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})"
        cm = f"{statistics.median(cross):.3f} ({cross[0]:.3f}-{cross[-1]:.3f})"
        assert f"{m}** {rng}" in section or f"{m} {rng}" in section, clients
        assert cm.replace(" (", "** (", 1) in section or cm in section, clients
        assert f"{m}x" in HEADLINE and f"{m}x" in index_row_of("40"), clients
    ratios, cross = tok_s(res, model, "128", arm=arm, base="image")
    m128, c128 = f"{statistics.median(ratios):.3f}", f"{statistics.median(cross):.3f}"
    assert f"{m128} ({ratios[0]:.3f}-{ratios[-1]:.3f})" in goals and f"vLLM's client {c128}" in goals
    steps = {a: res["models"][model]["profile"][f"{a}.c128"]["step_kinds"]["execute_context_0(0)_generation_128(128)"]
             for a in ("image", arm)}
    step = f"{steps[arm]['gpu_ms']:.2f} against {steps['image']['gpu_ms']:.2f} ms"
    assert (f"{steps['image']['gpu_ms']:.2f} ms on the GPU ({steps['image']['n']} steps) against "
            f"{steps[arm]['gpu_ms']:.2f} ms with one split ({steps[arm]['n']} steps)") in section.replace("\n  ", " ")
    assert step in goals and step in index_row_of("40")
    long = json.loads((ROOT / "bench" / "data" / "h100_block_40b" / "e2e.json").read_text())
    assert long["args"]["in_tokens"] == "3840"
    for clients in ("1", "8"):
        ratios, _ = tok_s(long, model, clients, arm=arm, base="image")
        assert len(ratios) == 1, clients
        m = f"{ratios[0]:.3f}"
        assert f"**{m}**" in section and m in goals and f"{m}x" in HEADLINE, clients
        assert clients != "1" or f"{m}x the tokens/s at one client with 3,840-token prompts" in readme


def test_the_h100_per_tensor_figures_against_sglang_at_128_clients_are_the_recorded_run_41():
    """Run 41, the image as it ships against SGLang on the per-tensor TP8 shard at 8/32/128 clients: both clients'
    ratios in the archive, the goals row, the headline, the index row and README; each above 1.00; vLLM's client's
    ITL p50 at 8/32/128 clients; the start; and SGLang's default fused-MoE config, as its start log names it."""
    model = "qwen3-235b-tp8-tensor@94L"
    data = ROOT / "bench" / "data" / "h100_tensor_41"
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    res = json.loads((data / "e2e.json").read_text())
    section, goals = archived("41"), GOALS.replace("\n", " ")
    recorded = sglang_ratios_recorded(res, model, "41", readme, ("8", "32", "128"))
    assert min(min(ratios + cross) for ratios, cross in recorded) > 1.0
    latency = {arm: res["models"][model]["cross_check"][arm][0]["latency"] for arm in ("image", "sglang")}
    itl = {arm: ", ".join(f"{latency[arm][c]['itl_p50_ms']:.2f}" for c in ("8", "32")) + " and "
           + f"{latency[arm]['128']['itl_p50_ms']:.2f}" for arm in latency}
    assert f"ITL p50 {itl['image']} ms against SGLang's {itl['sglang']} ms" in section.replace("\n  ", " ")
    assert start_against(res, model, "sglang") in goals
    with tarfile.open(data / "e2e-logs.tar.gz") as logs:
        log = logs.extractfile(f"logs/{model}.sglang.log").read().decode()
    assert "Using default MoE kernel config" in log and "E=128,N=192,device_name=NVIDIA_H100_80GB_HBM3" in log
    assert "no fused-MoE file for this rank on an H100" in readme


def test_the_h100s_small_m_files_up_to_128_tokens_are_the_recorded_run_42():
    """Run 42 on an H100: the decode GEMM bench's split-K times at 128 tokens over CUTLASS's, the engine's 128-client
    ratios (the candidates over the image, and over SGLang by both clients, with vLLM's client's TTFT and ITL p50 and
    the first token's share of a round's gap), each where the archive, the goals row, the headline and the index row
    give it; the start against SGLang."""
    model, arm = "qwen3-235b-ep8-block@94L", "image-candidates"
    data = ROOT / "bench" / "data" / "h100_block_42"
    section, goals = archived("42").replace("\n  ", " "), GOALS.replace("\n", " ")
    bench = json.loads((data / "decode" / "decode_gemm.json").read_text())
    for layer, (n, k) in (("qkv", (1280, 4096)), ("o_proj", (4096, 1024))):
        case = next(c for c in bench["cases"].values() if c.get("n") == n and c.get("k") == k and c.get("m") == 128)
        ratio = f"{statistics.median(case['ratio']['triton split-K']):.2f}x"
        for where in (goals, index_row_of("42"), section):
            assert ratio in where or ratio.rstrip("x") in where, (layer, ratio)
    own = json.loads((data / "image-vs-candidates" / "e2e.json").read_text())
    ratios, _ = tok_s(own, model, "128", arm=arm, base="image")
    m, rng = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})"
    assert f"**{m}** {rng}" in section and f"{m} {rng}" in goals
    assert f"{m}x" in index_row_of("42")
    res = json.loads((data / "e2e.json").read_text())
    ratios, cross = tok_s(res, model, "128", arm=arm, base="sglang")
    assert len(ratios) == 3 and len(cross) == 1
    m, rng, cm = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})", f"{cross[0]:.3f}"
    assert f"**{m}** {rng}" in section and f"**{m} {rng}**" in goals
    assert f"**{m}x** ({cm}x)" in HEADLINE and f"{m}x" in index_row_of("42")
    assert f"**{cm}**" in section and f"**{cm}**" in goals and f"{cm}x" in index_row_of("42")
    lat = {a: res["models"][model]["cross_check"][a][0]["latency"]["128"] for a in (arm, "sglang")}
    ttft = f"TTFT p50 {lat[arm]['ttft_p50_ms']:.1f} against {lat['sglang']['ttft_p50_ms']:.1f} ms"
    itl = f"ITL p50 {lat[arm]['itl_p50_ms']:.2f} against {lat['sglang']['itl_p50_ms']:.2f} ms"
    for where in (goals, index_row_of("42")):
        assert ttft in where and itl in where
    rounds = {a: lat[a]["ttft_p50_ms"] + 127 * lat[a]["itl_p50_ms"] for a in lat}
    gap = rounds[arm] - rounds["sglang"]
    assert 0.85 < (lat[arm]["ttft_p50_ms"] - lat["sglang"]["ttft_p50_ms"]) / gap < 0.95  # "nine tenths"
    assert f"the {gap:.0f} ms gap" in section and f"a round's {gap:.0f} ms gap" in goals
    ready = {a: res["servers"][f"{model}.{a}"] for a in (arm, "sglang")}
    assert (f"ready after {ready[arm]['ready_s']:.1f} against {ready['sglang']['ready_s']:.1f} s, first request "
            f"{ready[arm]['first_ttft_ms']:.1f} against {ready['sglang']['first_ttft_ms']:.1f} ms") in goals


def test_the_235b_ep8_gemv_and_vllm_034_figures_are_the_recorded_run_20():
    """The headline's 235B EP8 figures with patch 0011's entries (image-candidates/stock) and its stock vLLM 0.34
    figures (image/vllm-latest), from both clients, are run 20's."""
    res = json.loads((ROOT / "bench" / "data" / "h200_block_20" / "e2e.json").read_text())
    model = "qwen3-235b-ep8-block@94L"
    for arm, base in (("image-candidates", "stock"), ("image", "vllm-latest")):
        for clients in ("1", "8", "32"):
            ratios, cross = tok_s(res, model, clients, arm=arm, base=base)
            assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}x**" in HEADLINE, (arm, clients)
            assert len(cross) == 2
            if base == "vllm-latest" or clients == "1":
                assert f"{statistics.median(cross):.3f}x" in HEADLINE, (arm, clients)


def archived(run: str) -> str:
    """The archive's section of one run (up to the next heading of its level)."""
    return re.split(r"^### ", ARCHIVE.split(f"### Run {run} ", 1)[1], flags=re.M)[0]


def test_the_coder_ep8_gemv_figure_is_the_recorded_run_21():
    """The archive's Coder EP8 figure with patch 0011's entries (image-candidates/stock, one client) is run 21's."""
    res = json.loads((ROOT / "bench" / "data" / "h200_block_21" / "e2e.json").read_text())
    ratios = paired_ratios([res], "qwen3-coder-480b-ep8-block@36L", "throughput", "tok_s", "1", arm="image-candidates")
    assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}** (" in archived("21")


def test_the_coder_ep8_figures_with_0012_are_the_recorded_run_22():
    """The archive's Coder EP8 figures with 0011's entries and patch 0012 (image/stock), from both clients, are run
    22's; and 0012 against the image without it (its second bench) is the 0.976x the page gives."""
    data = ROOT / "bench" / "data" / "h200_block_22"
    res = json.loads((data / "e2e.json").read_text())
    section = archived("22")
    model = "qwen3-coder-480b-ep8-block@36L"
    for clients in ("1", "8", "32"):
        ratios = paired_ratios([res], model, "throughput", "tok_s", clients)
        assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}**" in section, clients
        cross = paired_ratios([res], model, "throughput", "tok_s", clients, section="cross_check")
        assert len(cross) == 2 and f"{statistics.median(cross):.3f}" in section, clients
    silu = json.loads((data / "e2e-silu.json").read_text())
    ratios = paired_ratios([silu], model, "throughput", "tok_s", "1", arm="image", base="image-vllm-act")
    assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}x**" in section
    assert f"({statistics.median(ratios):.3f}x, run 22)" in PAGE


def test_the_coder_ep8_small_m_and_norm_quant_figures_are_the_recorded_run_23():
    """The headline's Coder EP8 figures: the image with the Coder's small-M files over stock (image-candidates, from
    both clients), and option.norm_quant compiled over vLLM's fused kernel (image-compiled-norm-quant/image, at one
    client in the first bench and at 8 and 32 in the third), are run 23's."""
    data = ROOT / "bench" / "data" / "h200_block_23"
    model = "qwen3-coder-480b-ep8-block@36L"
    res = json.loads((data / "e2e.json").read_text())
    for clients in ("1", "8", "32"):
        ratios = paired_ratios([res], model, "throughput", "tok_s", clients, arm="image-candidates")
        assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}x**" in HEADLINE, clients
        cross = paired_ratios([res], model, "throughput", "tok_s", clients, arm="image-candidates",
                              section="cross_check")
        assert len(cross) == 2 and f"{statistics.median(cross):.3f}x" in HEADLINE, clients
    for name, counts in (("e2e-norm-quant.json", ("1",)), ("e2e-norm-quant-8-32.json", ("8", "32"))):
        res = json.loads((data / name).read_text())
        for clients in counts:
            ratios = paired_ratios([res], model, "throughput", "tok_s", clients, arm="image-compiled-norm-quant",
                                   base="image")
            assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}x**" in HEADLINE, (name, clients)


def test_the_coder_ep8_no_nvcc_and_compile_sizes_figures_are_the_recorded_run_24():
    """The headline's container figure (image-no-nvcc over the image, one client) and the one-client inter-token
    latencies behind compile_decode_tokens staying off are run 24's."""
    data = ROOT / "bench" / "data" / "h200_block_24"
    model = "qwen3-coder-480b-ep8-block@36L"
    res = json.loads((data / "e2e-no-nvcc.json").read_text())
    ratios = paired_ratios([res], model, "throughput", "tok_s", "1", arm="image-no-nvcc", base="image")
    assert len(ratios) == 3 and f"**{statistics.median(ratios):.3f}x**" in HEADLINE
    compiled = json.loads((data / "e2e-compile-sizes.json").read_text())
    itl = {arm: statistics.median(r["latency"]["1"]["itl_p50_ms"] for r in recorded["reps"][arm])
           for recorded, arm in ((res["models"][model], "image-no-nvcc"),
                                 (compiled["models"][model], "image-compile-decode-sizes"))}
    words = " ".join(PAGE.split())  # the paragraph's wrapping aside
    assert f"ITL {itl['image-compile-decode-sizes']:.2f} against {itl['image-no-nvcc']:.2f} ms" in words


def test_the_committed_gemv_figures_are_the_recorded_kernel_probe_25():
    """The archive's run-25 table (0010's split-K and GEMV kernels as committed) and the index row's ratios are
    kernel probe 25's."""
    probe = json.loads((ROOT / "bench" / "data" / "h200_dense_gemv_probe" / "probe_25.json").read_text())
    section = archived("25")
    names = {"coder-qkv": "Coder qkv", "coder-o-proj": "Coder o_proj", "235b-o-proj": "235B o_proj"}
    for r in probe["rows"]:
        row = next(ln.replace("**", "") for ln in section.splitlines() if ln.startswith(f"| {names[r['shape']]}")
                   and ln.split("|")[1].strip().endswith(f", {r['M']}"))
        assert f"| {r['small_m']['us']:.2f} |" in row and f"{r['gemv']['us']:.2f} (" in row, row
    index_row = index_row_of("25")
    ratio = {(r["shape"], r["M"]): r["gemv"]["us"] / r["small_m"]["us"] for r in probe["rows"]}
    for key in (("coder-qkv", 1), ("coder-o-proj", 1), ("235b-o-proj", 1), ("235b-o-proj", 2)):
        assert f"{ratio[key]:.2f}x" in index_row, key


def test_the_coder_ep8_gemv_file_figures_are_run_26s_two_machines():
    """The Coder EP8 figures with the one-token GEMV files (image-candidates/stock): each repetition's line in the two
    machines' session logs (machine A's files were lost, machine B's e2e.json holds two repetitions), paired within a
    repetition; their medians and one-client range are the headline's, the goals row's and README's, and machine B's
    own report agrees with its lines."""
    data = ROOT / "bench" / "data" / "h200_block_26"
    line = re.compile(r"rep (\d+) (stock|image-candidates): c1 (\d+) tok/s, c8 (\d+) tok/s, c32 (\d+) tok/s")
    pairs = []
    for log in ("machine-a.log", "session.log"):
        reps: dict[str, dict[str, list[int]]] = {}
        for rep, arm, *tok_s in line.findall((data / log).read_text()):
            reps.setdefault(rep, {})[arm] = [int(v) for v in tok_s]
        pairs += [r for r in reps.values() if len(r) == 2]
    assert len(pairs) == 4
    readme_row = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "Qwen3-Coder-480B EP8" in ln)
    medians = []
    for i in range(3):
        ratios = sorted(p["image-candidates"][i] / p["stock"][i] for p in pairs)
        medians.append(f"{statistics.median(ratios):.3f}")
        assert f"{medians[-1]} ({ratios[0]:.3f}-{ratios[-1]:.3f}" in GOALS, i
        if i == 0:
            assert ratios[0] >= 1.20 and f"{ratios[0]:.3f}-{ratios[-1]:.3f} at 1 client" in HEADLINE
    assert "**{}x**, **{}x**, **{}x**".format(*medians) in HEADLINE
    assert "{}x, {}x and {}x stock at 1, 8 and 32 clients".format(*medians) in readme_row
    res = json.loads((data / "e2e.json").read_text())
    model = "qwen3-coder-480b-ep8-block@36L"
    for i, clients in enumerate(("1", "8", "32")):
        recorded = paired_ratios([res], model, "throughput", "tok_s", clients, arm="image-candidates")
        from_lines = [p["image-candidates"][i] / p["stock"][i] for p in pairs[2:]]
        assert len(recorded) == 2 and all(abs(a - b) < 0.01 for a, b in zip(sorted(recorded), sorted(from_lines)))
        assert f"{statistics.median(recorded):.3f} ({min(recorded):.3f}-{max(recorded):.3f})" in archived("26")


def test_index_names_every_run_of_the_archive_and_its_data():
    index = PAGE.split("## Index of runs")[1]
    runs = re.findall(r"^### Run (\d+)\b", ARCHIVE, re.M)
    assert len(runs) >= 9
    for n in runs:  # each run the archive holds has its row
        assert f" run {n} |" in index, f"the index lacks run {n}"
    for folder in re.findall(r"`(h200_engine[_0-9]*)/`", index):
        assert (ROOT / "bench" / "data" / folder).is_dir(), folder
    for name in ("kernel run 1", "kernel run 2", "CPU study"):
        assert f"| {name} |" in index


def test_every_stored_e2e_md_is_todays_report_of_the_json_beside_it():
    """bench/data's e2e*.md files, at any depth, are views: each is bench.e2e.report.summarize of the e2e*.json beside
    it, so a figure quoted from one is the figure the report prints today."""
    pairs = sorted((ROOT / "bench" / "data").glob("**/e2e*.json"))
    assert len(pairs) >= 20
    for path in pairs:
        md = path.with_suffix(".md")
        assert md.read_text() == summarize(json.loads(path.read_text())), f"{md}: rewrite it from {path.name}"


def test_the_archives_peer_over_stock_rows_of_run_20_are_the_reports():
    """The three-way table's baseline row (stock vLLM 0.34.0 over stock 0.32, both clients) in the archive's run 20
    is a row the report prints: each peer is set against stock, in the bench's table and in the cross-check's."""
    md = (ROOT / "bench" / "data" / "h200_block_20" / "e2e.md").read_text()
    section = archived("20")
    bench = {ln.split("|")[4].strip(): ln.split("|")[7].strip() + " (" + ln.split("|")[8].strip() + ")"
             for ln in md.splitlines() if ln.startswith("| qwen3-235b-ep8-block@94L | vllm-latest | tok_s |")}
    cross = {ln.split("|")[4].strip(): ln.split("|")[6].strip()
             for ln in md.splitlines() if ln.startswith("| qwen3-235b-ep8-block@94L | vllm-latest/stock | tok_s |")}
    assert set(bench) == set(cross) == {"1", "8", "32"}
    assert f"| stock vLLM 0.34.0, this bench | {bench['1']} | {bench['8']} | {bench['32']} |" in section
    assert f"| stock vLLM 0.34.0, vLLM's client | {cross['1']} | {cross['8']} | {cross['32']} |" in section


def test_four_api_servers_at_24_layers_are_the_recorded_run_43():
    """Run 43 on an H100: four API server processes over the image at 128 clients, by this bench and by vLLM's client
    (tokens/s and TTFT p50 paired per pass, and the passes' mean TTFT), where the archive, the goals row and the index
    row give them."""
    model, arm = "qwen3-235b-ep8-block@24L", "image-api-servers"
    res = json.loads((ROOT / "bench" / "data" / "h100_block_43" / "e2e.json").read_text())
    section, goals, row = archived("43").replace("\n  ", " "), GOALS.replace("\n", " "), index_row_of("43")
    ratios, cross = tok_s(res, model, "128", arm=arm, base="image")
    assert len(ratios) == 1 and len(cross) == 2
    cross = sorted(cross)
    m, rng = f"{statistics.median(cross):.3f}", f"({cross[0]:.3f}-{cross[-1]:.3f})"
    assert f"| {ratios[0]:.3f} |" in section and f"**{m}** {rng}" in section
    assert f"{ratios[0]:.3f}x" in row
    passes = res["models"][model]["cross_check"]
    ttft = {a: [p["latency"]["128"]["ttft_p50_ms"] for p in passes[a]] for a in ("image", arm)}
    ttft_ratios = sorted(b / a for a, b in zip(ttft["image"], ttft[arm]))
    ttft_ratio = f"{statistics.median(ttft_ratios):.3f}"
    assert f"**{ttft_ratio}** ({ttft_ratios[0]:.3f}-{ttft_ratios[-1]:.3f})" in section
    means = {a: f"{statistics.mean(v):.1f}" for a, v in ttft.items()}
    assert f"TTFT p50 {means['image']} against {means[arm]} ms" in section
    assert f"({means['image']} against {means[arm]} ms)" in row
    for where in (goals, row):
        assert f"{ttft_ratio}x" in where and f"{m}x" in where
    assert f"{m}x {rng}" in goals and rng in row


def test_four_api_servers_at_depth_and_against_sglang_are_the_recorded_run_44():
    """Run 44 on an H100: four API server processes over one on the 94-layer shard at 1-128 clients by both clients
    (and vLLM's client's TTFT p50 at 128), then the image so configured over SGLang at 128 clients (44b), each where
    the archive, the goals row, the index row, the peers table and README give it; the start against SGLang."""
    model, four = "qwen3-235b-ep8-block@94L", "image-api-servers"  # the run's names: "image" ran one API server
    data = ROOT / "bench" / "data"
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    section, goals, row = archived("44").replace("\n  ", " "), GOALS.replace("\n", " "), index_row_of("44")
    res = json.loads((data / "h100_block_44" / "e2e.json").read_text())
    ours, theirs = [], []
    for clients in ("1", "8", "32", "128"):
        ratios, cross = tok_s(res, model, clients, arm=four, base="image")
        assert len(ratios) == 3 and len(cross) == 2, clients
        cross = sorted(cross)
        m, cm = f"{statistics.median(ratios):.3f}", f"{statistics.median(cross):.3f}"
        assert f"**{m}** ({ratios[0]:.3f}-{ratios[-1]:.3f})" in section, clients
        assert f"{cm} ({cross[0]:.3f}-{cross[-1]:.3f})" in section.replace("**", ""), clients
        ours.append(m)
        theirs.append(cm)
    assert ", ".join(ours) in goals and ", ".join(theirs) in goals
    assert ", ".join(f"{r}x" for r in ours) in row and ", ".join(f"{r}x" for r in theirs) in row
    assert f"{', '.join(f'{r}x' for r in ours[:3])} and {ours[3]}x" in readme
    assert ", ".join(f"{r}x" for r in theirs) in readme
    passes = res["models"][model]["cross_check"]
    ttft = sorted(b["latency"]["128"]["ttft_p50_ms"] / a["latency"]["128"]["ttft_p50_ms"]
                  for a, b in zip(passes["image"], passes[four]))
    t = f"{statistics.median(ttft):.3f}"
    assert f"**{t}** ({ttft[0]:.3f}-{ttft[-1]:.3f})" in section
    assert all(f"{t}x" in where for where in (row, readme)) and t in goals
    peer = json.loads((data / "h100_block_44b" / "e2e.json").read_text())
    ratios, cross = tok_s(peer, model, "128", arm=four, base="sglang")
    assert len(ratios) == 3 and len(cross) == 2
    cross = sorted(cross)
    m, rng = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})"
    cm, crng = f"{statistics.median(cross):.3f}", f"({cross[0]:.3f}-{cross[-1]:.3f})"
    assert f"**{m}** {rng}" in section and f"**{cm}** {crng}" in section
    assert f"**{m} {rng}**" in goals and f"**{cm} {crng}**" in goals
    assert f"**{m}x** ({cm}x)" in HEADLINE and f"{m}x" in row and f"{cm}x" in row
    assert f"{m}x {rng} at 128 (run 44b; {cm}x)" in readme
    ready = {a: peer["servers"][f"{model}.{a}"] for a in (four, "sglang")}
    assert (f"ready after {ready[four]['ready_s']:.1f} against {ready['sglang']['ready_s']:.1f} s, first request "
            f"{ready[four]['first_ttft_ms']:.1f} against {ready['sglang']['first_ttft_ms']:.1f} ms") in goals


def test_the_image_against_vllm_034_at_128_clients_is_the_recorded_run_45():
    """Run 45 on an H100: the image over stock vLLM 0.34.0 on the EP8 block shard at 1 and 128 clients (45) and the
    per-tensor shard at 128 (45b), by both clients, vLLM's client's TTFT p50 at 128 and the start, each where the
    archive, the goals rows, the peers table, the index row and README give it."""
    data = ROOT / "bench" / "data"
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    section, goals, row = archived("45").replace("\n  ", " "), GOALS.replace("\n", " "), index_row_of("45")
    for folder, model, clients, passes in (("h100_block_45", "qwen3-235b-ep8-block@94L", ("1", "128"), 2),
                                           ("h100_tensor_45b", "qwen3-235b-tp8-tensor@94L", ("128",), 1)):
        res = json.loads((data / folder / "e2e.json").read_text())
        for c in clients:
            ratios, cross = tok_s(res, model, c, base="vllm-latest")
            assert len(ratios) == 3 and len(cross) == passes, (folder, c)
            cross = sorted(cross)
            m, rng, cm = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})", \
                f"{statistics.median(cross):.3f}"
            assert f"{m}** {rng}" in section and f"{m} {rng}" in goals.replace("**", ""), (folder, c)
            assert f"**{m}x**" in HEADLINE and f"{m}x" in row and f"{cm}x" in row, (folder, c)
            assert f"{cm} (" in section and f"{cm}x" in HEADLINE and cm in goals, (folder, c)
        runs = res["models"][model]["cross_check"]
        ttft = sorted(a["latency"]["128"]["ttft_p50_ms"] / b["latency"]["128"]["ttft_p50_ms"]
                      for a, b in zip(runs["image"], runs["vllm-latest"]))
        t = f"{statistics.median(ttft):.3f}"
        assert f"**{t}**" in section and f"{t}x" in row and f"{t}x" in readme and t in goals
        shard = "per-tensor" if "tensor" in model else "EP8"
        assert f"{m}x on the {shard} shard" in readme  # m: the 128-client median, the last of clients
        assert start_against(res, model, "vllm-latest") in goals


def test_the_image_against_stock_032_at_128_clients_is_the_recorded_run_46():
    """Run 46 on an H100: the image over stock vLLM 0.32.0 on the EP8 block shard at 1 and 128 clients by both clients,
    vLLM's client's TTFT p50 at 128 and the start, each where the archive, the headline, the goals row, the peers
    table, the index row and README give it; and the peers' 128-client baseline, chained through the image arm of
    runs 45 (vLLM 0.34) and 44b (SGLang)."""
    data = ROOT / "bench" / "data"
    model = "qwen3-235b-ep8-block@94L"
    readme = (ROOT / "README.md").read_text().replace("\n", " ")
    section, goals, row = archived("46").replace("\n  ", " "), GOALS.replace("\n", " "), index_row_of("46")
    headline = HEADLINE.replace("\n  ", " ")
    res = json.loads((data / "h100_block_46" / "e2e.json").read_text())
    assert res["args"]["arms"] == "['stock', 'image']" and res["args"]["image_no_nvcc"] == "True"
    image_over_stock = {}
    for c in ("1", "128"):
        ratios, cross = tok_s(res, model, c)
        assert len(ratios) == 3 and len(cross) == 1, c
        m, rng, cm = f"{statistics.median(ratios):.3f}", f"({ratios[0]:.3f}-{ratios[-1]:.3f})", f"{cross[0]:.3f}"
        image_over_stock[c] = statistics.median(ratios)
        assert f"**{m}** {rng}" in section and f"{m} {rng}" in goals, c
        assert f"**{m}x**" in headline and f"{m}x" in row and f"{cm}x" in row and f"{cm}x" in headline, c
        assert f"| {cm} |" in archived("46"), c
    assert f"{image_over_stock['128']:.3f}x stock 0.32's" in readme
    runs = res["models"][model]["cross_check"]
    ttft = runs["image"][0]["latency"]["128"]["ttft_p50_ms"] / runs["stock"][0]["latency"]["128"]["ttft_p50_ms"]
    assert f"**{ttft:.3f}**" in section and f"{ttft:.3f}x" in row
    image, stock = (res["servers"][f"{model}.{arm}"] for arm in ("image", "stock"))
    assert (f"{image['ready_s']:.1f} against {stock['ready_s']:.1f}; {image['first_ttft_ms']:.1f} against "
            f"{stock['first_ttft_ms']:.1f}") in section
    assert f"run 46 (an H100): image {image['ready_s']:.0f}, {image['first_ttft_ms']:.0f}, stock " \
           f"{stock['ready_s']:.0f}, {stock['first_ttft_ms']:.0f}" in HEADLINE
    # the peers over stock 0.32 at 128 clients: image/stock here over image/peer in the peer's run
    peers_row = next(ln for ln in HEADLINE.splitlines() if ln.startswith("| over stock 0.32:"))
    peers = (("h100_block_45", "image", "vllm-latest", "vLLM 0.34", "vLLM 0.34.0"),
             ("h100_block_44b", "image-api-servers", "sglang", "SGLang", "SGLang 0.5.21"))
    for folder, image_arm, peer, name, full in peers:
        other = json.loads((data / folder / "e2e.json").read_text())
        chained = image_over_stock["128"] / statistics.median(
            paired_ratios([other], model, "throughput", "tok_s", "128", arm=image_arm, base=peer))
        assert f"{name} {chained:.3f}" in peers_row, name
        assert f"{full} **{chained:.3f}x**" in section, name
