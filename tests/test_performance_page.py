"""The performance page, README's headline table and bench/data's index are what `python -m bench.report` writes
from the recorded runs: regenerated into a copy of the tree and compared with the committed files."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report.page import INDEX, PAGE, README

ROOT = Path(__file__).resolve().parents[1]
GENERATED = (PAGE, README, INDEX)


def report(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.report", "--root", str(root), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the report reads and writes: README.md, bench/data, docs/performance.md."""
    shutil.copytree(ROOT / "bench" / "data", tmp_path / "bench" / "data")
    for path in (README, PAGE):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, tmp_path / path)
    return tmp_path


def later_run(tree: Path, src: str, name: str, results: dict, date: str, later: str) -> subprocess.CompletedProcess:
    """bench/data/NAME: run SRC's README line with its date `date` replaced by `later`, over `results`; then the
    report over the tree."""
    data = tree / "bench" / "data"
    (data / name).mkdir()
    (data / name / "e2e.json").write_text(json.dumps(results))
    (data / name / "README.md").write_text((data / src / "README.md").read_text().replace(date, later, 1))
    return report(tree)


def test_committed_pages_are_what_the_report_writes(tree):
    for path in GENERATED:
        (tree / path).unlink()
    (tree / README).write_text((ROOT / README).read_text())  # the report fills README's block, not the file
    r = report(tree)
    assert r.returncode == 0, r.stderr
    stale = [str(p) for p in GENERATED if (tree / p).read_text() != (ROOT / p).read_text()]
    assert not stale, (f"{', '.join(stale)} differ from what the recorded runs give: run `python -m bench.report` "
                       "and commit the result")


def test_check_names_a_stale_page_and_writes_nothing(tree):
    page = (ROOT / PAGE).read_text()
    row = next(ln for ln in page.splitlines() if ln.startswith("| Qwen3-235B block FP8 EP8, 94 L | vLLM 0.32.0 |"))
    (tree / PAGE).write_text(page.replace(row, row.replace(" H100 |", " H200 |", 1), 1))
    stale = (tree / PAGE).read_text()
    r = report(tree, "--check")
    assert r.returncode == 1 and str(PAGE) in r.stderr and "python -m bench.report" in r.stderr, r.stderr
    assert (tree / PAGE).read_text() == stale and report(tree, "--check").returncode == 1


def test_a_later_run_replaces_the_cell_it_measured(tree):
    """A run dated after the others, on the 235B EP8 shard against stock at 128 clients with the image's tokens/s
    doubled, is the headline's cell there; the earlier run stays the cell at the concurrencies it alone measured."""
    src = tree / "bench" / "data" / "h100_block_48"  # the newest run of the shard on an H100
    results = json.loads((src / "e2e.json").read_text())
    model = results["models"]["qwen3-235b-ep8-block@94L"]
    for rep in model["reps"]["image"]:
        rep["throughput"].pop("1")
        rep["throughput"]["128"]["tok_s"] *= 2
    r = later_run(tree, "h100_block_48", "h100_block_later", results, "2026-12-08", "2026-12-09")
    assert r.returncode == 0, r.stderr
    readme = (tree / README).read_text()
    [row] = [ln for ln in readme.splitlines() if ln.startswith("| Qwen3-235B block FP8 EP8, 94 L | vLLM 0.32.0 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    was = [c.strip() for c in next(ln for ln in (ROOT / README).read_text().splitlines()
                                   if ln.startswith(row[:50])).strip("|").split("|")]
    assert cells[2:5] == was[2:5] and cells[5] != was[5] and cells[5].endswith(" H100"), (was, cells)
    assert float(cells[5].split()[0]) == pytest.approx(2 * float(was[5].split()[0]), abs=0.02)
    assert "h100_block_later" in (tree / PAGE).read_text() and "| [h100_block_later](h100_block_later/) |" in \
        (tree / INDEX).read_text()


def test_readme_without_its_markers_is_refused(tree):
    (tree / README).write_text("# A README without the results markers\n")
    r = report(tree)
    assert r.returncode == 2, r.stdout
    assert "<!-- results:begin -->" in r.stderr and "README.md" in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_run_folder_without_its_readme_line_is_refused(tree):
    readme = tree / "bench" / "data" / "h200_block_20" / "README.md"
    readme.write_text("measured on some GPU\n")
    r = report(tree)
    assert r.returncode == 2 and str(readme) in r.stderr and "YYYY-MM-DD, one H100|H200" in r.stderr, r.stderr
    shipped = (ROOT / "bench" / "data" / "h200_block_20" / "README.md").read_text()
    readme.write_text(shipped.replace("arm `image-candidates`", "arm `no-such`"))
    r = report(tree)
    assert r.returncode == 2 and "'no-such' has no repetitions" in r.stderr, r.stderr


def test_the_floor_section_rows_are_each_profiled_window_and_the_newest_runs_layers(tree):
    """Every recorded window of a deployment-depth model is a row of the floor summary, its step and floor those of
    bench.e2e.floor; the per-layer tables are the newest profiled run's image windows, and a later run's replace
    them."""
    from bench.e2e.floor import floor_data

    src = tree / "bench" / "data" / "h200_block_15"
    results = json.loads((src / "e2e.json").read_text())
    d = floor_data(results, "qwen3-235b-ep8-block@94L", "image.c1", "H200")
    page = (ROOT / PAGE).read_text()
    row = (f"| [h200_block_15](../bench/data/h200_block_15/) | H200 | qwen3-235b-ep8-block@94L | image | 1 | "
           f"{d['step_us']:.0f} | {d['floor_us']:.0f} | {d['floor_us'] / d['step_us']:.0%} |")
    assert row in page
    assert "### h200_block_15: qwen3-235b-ep8-block@94L, image, 1 client (H200)" in page
    # a later run whose image window at one client took twice the GPU time
    window = results["models"]["qwen3-235b-ep8-block@94L"]["profile"]["image.c1"]
    window["total_gpu_ms"] *= 2
    window["top_kernels"] = [[n, k, 2 * us] for n, k, us in window["top_kernels"]]
    r = later_run(tree, "h200_block_15", "h200_block_later", results, "2026-12-0", "2026-12-1")
    assert r.returncode == 0, r.stderr
    page = (tree / PAGE).read_text()
    assert row in page  # the earlier run's row stays
    assert (f"| [h200_block_later](../bench/data/h200_block_later/) | H200 | qwen3-235b-ep8-block@94L | image | 1 | "
            f"{2 * d['step_us']:.0f} | {d['floor_us']:.0f} |") in page
    assert "### h200_block_later: qwen3-235b-ep8-block@94L, image, 1 client (H200)" in page
    assert "### h200_block_15:" not in page
