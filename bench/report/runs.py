"""The recorded engine runs: each bench/data folder with an e2e.json, read with the first line of its README.md."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# The README line of a run's folder: date, GPU, the command (`python -m bench.e2e ...`), and where the image as it
# shipped ran under another arm than `image` (a candidate file or default measured before it shipped), that arm.
README_LINE = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2}), one (?P<gpu>H100|H200): `(?P<command>python -m [^`]+)`"
                         r"(?: \(the image as it ships: arm `(?P<arm>[\w-]+)`\))?")
README_FORM = "YYYY-MM-DD, one H100|H200: `python -m bench.e2e ...` [(the image as it ships: arm `NAME`)]"

PEERS = (("stock", "vLLM 0.32.0"), ("vllm-latest", "vLLM 0.34.0"), ("sglang", "SGLang 0.5.21"),
         ("sglang-latest", "SGLang 0.5.23"))
# What a model name of the bench says (family-layout-scheme@NL): the checkpoint, its layers, the FP8 scheme, the rank
FAMILIES = {"qwen3-235b": ("Qwen3-235B-A22B", 94), "qwen3-coder-480b": ("Qwen3-Coder-480B-A35B", 62),
            "deepseek-v3": ("DeepSeek-V3", 61)}
SCHEMES = {"block": "block FP8", "tensor": "per-tensor FP8"}
MODEL_NAME = re.compile(r"(?P<family>.+)-(?P<layout>[et]p\d+)-(?P<scheme>block|tensor)@(?P<layers>\d+)L")


class RunError(ValueError):
    """A run folder the report cannot read; the message names the file and what is wrong."""


@dataclass(frozen=True, eq=False)
class Run:
    folder: str  # under bench/data
    date: str
    gpu: str
    command: str
    image_arm: str  # the arm that ran the image as it shipped
    results: dict  # e2e.json

    @property
    def order(self) -> tuple:
        """Runs sort by date, then by folder name, numbers by value (h100_block_9 before h100_block_10)."""
        return self.date, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", self.folder)]


@dataclass(frozen=True)
class Layout:
    """A checkpoint's layout as a model name of the bench says it, at the depth the run measured."""
    model: str  # the bench's name, e.g. qwen3-235b-ep8-block@94L

    @property
    def parts(self) -> re.Match:
        return MODEL_NAME.fullmatch(self.model)

    @property
    def title(self) -> str:
        p = self.parts
        name, total = FAMILIES[p["family"]]
        return (f"{name}, {SCHEMES[p['scheme']]}, one {p['layout'].upper()} rank, {p['layers']} of {total} layers")

    @property
    def short(self) -> str:
        """A headline cell: family, scheme, rank, depth."""
        p = self.parts
        name = FAMILIES[p["family"]][0].split("-A")[0]
        return f"{name} {SCHEMES[p['scheme']]} {p['layout'].upper()}, {p['layers']} L"

    @property
    def anchor(self) -> str:
        return self.model.replace("@", "-").lower()


def is_layout(model: str) -> bool:
    """A model name that records its depth and a known family (runs at the bench's default depth, host-bound, are
    kept apart from deployment depths and never tabled)."""
    p = MODEL_NAME.fullmatch(model)
    return bool(p) and p["family"] in FAMILIES


def read_run(folder: Path) -> Run:
    readme = folder / "README.md"
    if not readme.is_file():
        raise RunError(f"{readme}: missing; a run folder's README.md is one line: {README_FORM}")
    text = (readme.read_text().strip().splitlines() or [""])[0]
    m = README_LINE.fullmatch(text)
    if not m:
        raise RunError(f"{readme}: {text[:80]!r} is not the line {README_FORM}")
    try:
        results = json.loads((folder / "e2e.json").read_text())
    except json.JSONDecodeError as e:
        raise RunError(f"{folder / 'e2e.json'}: not JSON: {e}") from e
    arm = m["arm"] or "image"
    if not any(arm in (mod.get("reps") or {}) for mod in results.get("models", {}).values()):
        raise RunError(f"{readme}: arm {arm!r} has no repetitions in e2e.json")
    return Run(folder.name, m["date"], m["gpu"], m["command"], arm, results)


def read_runs(data: Path) -> list[Run]:
    """Every run folder of `data` (a folder with an e2e.json), oldest first."""
    return sorted((read_run(p.parent) for p in data.glob("*/e2e.json")), key=lambda r: r.order)
