"""One run of the harness: its options, deadline, device, kernels and compile pool."""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from .precompile import Precompiler
from .problem import ShapeCtx


def default_stock_configs_dir(fused_moe_py):
    return os.path.join(os.path.dirname(os.path.abspath(fused_moe_py)), "configs")


@dataclass(frozen=True)
class RunContext:
    """What every mode reads. `opts` is the parsed command line, never written;
    what the run adds to it (deadline, kernels, measured copy bandwidth) is here."""

    opts: argparse.Namespace
    t_end: float  # soft deadline (time.time()): --budget-s after the options were parsed
    dev: torch.device
    bw: float  # measured copy bandwidth, bytes read + written per second
    kstock: ModuleType  # the kernel cut from --fused-moe-py
    kpatched: ModuleType | None  # the kernel cut from --patched-fused-moe-py
    pc: Precompiler

    @property
    def out(self) -> str:
        return self.opts.out

    @property
    def stock_configs_dir(self) -> str:
        """vLLM's own configs/: --stock-configs-dir, else beside --fused-moe-py."""
        return self.opts.stock_configs_dir or default_stock_configs_dir(self.opts.fused_moe_py)

    def dump(self, name, obj):
        dump(self.out, name, obj)

    def shape_done(self, name, obj):
        """After one shape's records: give its memory back to the device, write the records so far."""
        torch.cuda.empty_cache()
        self.dump(name, obj)

    def plan_steps(self, plan, tag):
        """(shape name, its ShapeCtx, M) for each step of a tune plan, one context
        per shape, until the deadline; each M's inputs are dropped after its step."""
        for name, ms in plan:
            if time.time() > self.t_end:
                print(f"[{tag}] deadline: skip {name} {ms}", flush=True)
                continue
            ctx = ShapeCtx(name, self.dev)
            for M in ms:
                if time.time() > self.t_end:
                    print(f"[{tag}] deadline: stop {name} at M={M}", flush=True)
                    break
                yield name, ctx, M
                ctx.drop_m(M)
            del ctx
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def dump(out_dir, name, obj):
    p = Path(out_dir) / name
    p.write_text(json.dumps(obj, indent=1, default=str))
