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
    (tree / PAGE).write_text((ROOT / PAGE).read_text().replace("| 1.322 (", "| 1.111 (", 1))
    stale = (tree / PAGE).read_text()
    r = report(tree, "--check")
    assert r.returncode == 1 and str(PAGE) in r.stderr and "python -m bench.report" in r.stderr, r.stderr
    assert (tree / PAGE).read_text() == stale and report(tree, "--check").returncode == 1


def test_a_later_run_replaces_the_cell_it_measured(tree):
    """A run dated after the others, on the 235B EP8 shard against stock at 128 clients with the image's tokens/s
    doubled, is the headline's cell there; the earlier run stays the cell at the concurrencies it alone measured."""
    data = tree / "bench" / "data"
    src, new = data / "h100_block_46", data / "h100_block_later"
    results = json.loads((src / "e2e.json").read_text())
    model = results["models"]["qwen3-235b-ep8-block@94L"]
    for rep in model["reps"]["image"]:
        rep["throughput"].pop("1")
        rep["throughput"]["128"]["tok_s"] *= 2
    new.mkdir()
    (new / "e2e.json").write_text(json.dumps(results))
    (new / "README.md").write_text((src / "README.md").read_text().replace("2026-12-07", "2026-12-08", 1))
    r = report(tree)
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
