"""The tables of the performance page: per layout and peer the image's paired ratios, latest run per cell."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.e2e.kv_pool import pool_table, workload_table
from bench.e2e.report import how_started, paired_ratios
from bench.e2e.workload import THROUGHPUT_CONCURRENCY

from .runs import FAMILIES, PEERS, Layout, Run, is_layout

CLIENTS = THROUGHPUT_CONCURRENCY
GPUS = ("H200", "H100")


@dataclass(frozen=True)
class Cell:
    """One figure of the image against one peer: the run, and the paired ratios of its repetitions (the image's
    figure over the peer's in the same repetition), by this bench's client and by vLLM's (the cross-check)."""
    run: Run
    clients: int
    tok_s: list[float]
    cross_tok_s: list[float]
    cross_ttft: list[float]


def measure(run: Run, model: str, peer: str, clients: int) -> Cell | None:
    """The run's cell of the image against `peer` at `clients`, None where it did not measure both."""
    c = str(clients)

    def ratios(kind: str, metric: str, section: str = "reps") -> list[float]:
        return paired_ratios([run.results], model, kind, metric, c, run.image_arm, peer, section)

    tok_s = ratios("throughput", "tok_s")
    if not tok_s:
        return None
    return Cell(run, clients, tok_s, ratios("throughput", "tok_s", "cross_check"),
                ratios("latency", "ttft_p50_ms", "cross_check"))


def layouts(runs: list[Run]) -> list[Layout]:
    """Every layout some run measured the image of against a peer, in FAMILIES' order, block FP8 first."""
    names = {m for r in runs for m in r.results.get("models", {}) if is_layout(m)
             for peer, _ in PEERS if any(measure(r, m, peer, c) for c in CLIENTS)}
    families = list(FAMILIES)
    return [Layout(n) for n in sorted(names, key=lambda n: (families.index(Layout(n).parts["family"]),
                                                             Layout(n).parts["scheme"] != "block", n))]


def latest(runs: list[Run], model: str, peer: str) -> dict[tuple[str, int], Cell]:
    """(GPU, clients) -> the latest run's cell of the image against `peer` on that GPU."""
    cells = {}
    for run in runs:  # oldest first: a later run's cell replaces an earlier one's
        for c in CLIENTS:
            if cell := measure(run, model, peer, c):
                cells[run.gpu, c] = cell
    return cells


def newest(cells: dict[tuple[str, int], Cell], clients: int) -> Cell | None:
    """The latest cell at `clients` on any GPU."""
    found = [cell for (_, c), cell in cells.items() if c == clients]
    return max(found, key=lambda cell: cell.run.order, default=None)


def med(ratios: list[float], digits: int = 3) -> str:
    return f"{statistics.median(ratios):.{digits}f}" if ratios else "-"


def span(ratios: list[float]) -> str:
    return f"{med(ratios)} ({min(ratios):.3f}-{max(ratios):.3f})" if ratios else "-"


def headline(runs: list[Run]) -> list[str]:
    """Per layout and peer, the image's output tokens/s over the peer's at each concurrency: the median paired
    ratio of the latest run that measured it, with its GPU."""
    rows = ["| checkpoint shard | image over | " + " | ".join(f"{c} client{'s' * (c > 1)}" for c in CLIENTS) + " |",
            "|---|---|" + "---|" * len(CLIENTS)]
    for lay in layouts(runs):
        for peer, label in PEERS:
            cells = latest(runs, lay.model, peer)
            if cells:
                row = [(cell := newest(cells, c)) and f"{med(cell.tok_s, 2)} {cell.run.gpu}" or "-" for c in CLIENTS]
                rows.append(f"| {lay.short} | {label} | " + " | ".join(row) + " |")
    return rows


def peer_table(runs: list[Run], lay: Layout, peer: str) -> tuple[list[str], list[Run]]:
    """The layout's table against one peer, a row per concurrency and GPU (the latest run of each), and the runs
    it cites."""
    cells = latest(runs, lay.model, peer)
    rows = ["| clients | GPU | tokens/s, paired ratio: median (range) | repetitions | tokens/s, vLLM's client | "
            "TTFT p50, vLLM's client | data |", "|---|---|---|---|---|---|---|"]
    for (gpu, c), cell in sorted(cells.items(), key=lambda kv: (kv[0][1], GPUS.index(kv[0][0]))):
        rows.append(f"| {c} | {gpu} | {span(cell.tok_s)} | {len(cell.tok_s)} | {med(cell.cross_tok_s)} | "
                    f"{med(cell.cross_ttft)} | [{cell.run.folder}](../bench/data/{cell.run.folder}/) |")
    cited = sorted({cell.run for cell in cells.values()}, key=lambda r: r.order)
    return (rows if cells else []), cited


def start_table(runs: list[Run], lay: Layout) -> list[str]:
    """Cold start and first request of the image and each peer, from the newest run of each peer and GPU that the
    layout's tokens/s tables cite: seconds from start to ready, the first request's time to first token."""
    rows = []
    for peer, label in PEERS:
        newest_on: dict[str, Run] = {}
        for (gpu, _), cell in latest(runs, lay.model, peer).items():
            if gpu not in newest_on or cell.run.order > newest_on[gpu].order:
                newest_on[gpu] = cell.run
        for gpu, run in sorted(newest_on.items(), key=lambda kv: GPUS.index(kv[0])):
            image, other = (run.results["servers"].get(f"{lay.model}.{arm}", {}) for arm in (run.image_arm, peer))
            alone = how_started(run.results.get("args", {}))
            rows.append(f"| {label} | {gpu} | {image.get('ready_s', '-')} / {other.get('ready_s', '-')} | "
                        f"{image.get('first_ttft_ms', '-')} / {other.get('first_ttft_ms', '-')} | {alone} | "
                        f"[{run.folder}](../bench/data/{run.folder}/) |")
    return ["Cold start:", "", "| against | GPU | ready after (s): image / other | first request TTFT (ms): image / "
            "other | servers started | data |", "|---|---|---|---|---|---|", *rows, ""] if rows else []


def layout_sections(runs: list[Run]) -> tuple[list[str], set[str]]:
    """A section per layout: a table per peer, then the command of each run it cites; and the folders cited."""
    out, cited_all = [], set()
    for lay in layouts(runs):
        out += ["", f"### {lay.title}", ""]
        for peer, label in PEERS:
            rows, cited = peer_table(runs, lay, peer)
            if not rows:
                continue
            cited_all |= {r.folder for r in cited}
            out += [f"Against {label}:", "", *rows, "", "Reproduce:", ""]
            out += [f"- `{r.folder}` ({r.date}, one {r.gpu}): `{r.command}`"
                    + (f" (the image as it ships: arm `{r.image_arm}`)" if r.image_arm != "image" else "")
                    for r in cited]
            out.append("")
        out += start_table(runs, lay)
    return out, cited_all


def deployment_sections(runs: list[Run]) -> tuple[list[str], set[str]]:
    """A section per run whose engines sized their own KV pools (--kv-pool sized) or that measured other workload
    shapes than today's: every server's KV pool, each shape's figures, and the run's command; and the folders cited.
    The tables are the engine bench's own (bench.e2e.kv_pool), as its e2e.md shows them."""
    out, cited = [], set()
    for run in reversed(runs):  # newest first
        args = run.results.get("args", {})
        if args.get("kv_pool") != "sized" and args.get("workloads", "['default']") == "['default']":
            continue
        cited.add(run.folder)
        out += ["", f"### [{run.folder}](../bench/data/{run.folder}/) ({run.date}, one {run.gpu})",
                *pool_table(run.results), *workload_table(run.results), "", f"Reproduce: `{run.command}`"]
    return out, cited
