"""A reduction kernel that torch.compile generated for a served model, timed at decode sizes under each config its
autotuner may pick: the kernel's own source from a run's compile cache (a .py of `inductor-kernels.tar.gz`), launched
with each config in CUDA graphs (bench/cuda_graph_timing.py), on the GPU.

    python -m bench.inductor_kernel_probe --kernel FILE.py --tokens 1 8 32 --configs 2,128,2 2,64,2 4,64,4 8,64,8 \\
        --out DIR

The file's own example inputs (its `get_args`, at the token count it was compiled for, --compiled-tokens) are rebuilt
at each token count: every tensor dimension and integer argument that is a multiple of the compiled count is scaled
to the new one. A config is XBLOCK,R0_BLOCK,num_warps (num_stages 1, as Inductor's reduction configs). The grid is
Inductor's: one program per XBLOCK rows of each sub-kernel (each `xnumel*` argument). Every config's outputs must
equal the first config's. Prints a table, writes inductor_kernel_probe.json.
"""
from __future__ import annotations

import argparse
import inspect
import json
import re
import statistics
from pathlib import Path

import torch

HARNESS = "\ndef get_args("


def load(path: Path):
    """The file's @triton.jit kernel (its source up to Inductor's harness), as a module of its own in a temporary
    folder (triton.jit reads a kernel's source back from its file), and the file's get_args source."""
    import importlib.util
    import tempfile

    text = path.read_text()
    if text.count("@triton.jit") != 1 or HARNESS not in text:
        raise ValueError(f"{path}: not one generated kernel's file (one @triton.jit and Inductor's get_args)")
    start = text.index("@triton.jit")
    kernel_src = text[start:text.index(HARNESS, start)]
    harness = text[text.index(HARNESS) + 1:]
    get_args_src = harness[:harness.index("\n\n")]
    name = re.search(r"def (\w+)\(", kernel_src).group(1)
    module = Path(tempfile.mkdtemp(prefix="inductor_kernel_probe_")) / f"{name}.py"
    module.write_text("import triton\nimport triton.language as tl\n"
                      "from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math\n\n" + kernel_src)
    spec = importlib.util.spec_from_file_location(f"inductor_kernel_probe_{name}", module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name), get_args_src


def inputs(get_args_src: str, compiled_tokens: int, tokens: int, device: str) -> tuple:
    """get_args() at `tokens`: random floats, zero integers (as Inductor's rand_strided), contiguous tensors only."""
    def scale(n: int) -> int:
        return n // compiled_tokens * tokens if n and n % compiled_tokens == 0 else n

    def rand_strided(size, stride, device, dtype):
        contiguous = [1] * len(size)
        for i in range(len(size) - 2, -1, -1):
            contiguous[i] = contiguous[i + 1] * size[i + 1]
        if len(size) and list(stride) != contiguous and not (len(size) == 1 and stride[0] == 1):
            raise ValueError(f"only contiguous inputs are rebuilt; got size {size} stride {stride}")
        shape = [scale(n) for n in size]
        if dtype.is_floating_point:
            return torch.randn(shape, dtype=torch.float32, device=device).to(dtype)
        return torch.zeros(shape, dtype=dtype, device=device)

    scope = {"rand_strided": rand_strided, "torch": torch}
    exec(get_args_src.replace("device='cuda:0'", "device=DEVICE"), {**scope, "DEVICE": device}, scope)
    args = scope["get_args"]()
    return tuple(scale(a) if isinstance(a, int) else a for a in args)


def launcher(kernel, args: tuple, config: tuple[int, int, int]):
    """A call of the kernel on `args` with one config, on Inductor's grid for it."""
    xblock, r0_block, warps = config
    names = list(inspect.signature(kernel.fn).parameters)
    grid = sum(-(-v // xblock) for name, v in zip(names, args) if name.startswith("xnumel"))

    def call():
        kernel[(grid,)](*args, XBLOCK=xblock, R0_BLOCK=r0_block, num_warps=warps, num_stages=1)
    return call


def check_equal(kernel, args: tuple, configs: list[tuple[int, int, int]]) -> None:
    """Every config's outputs (each tensor argument after the call) equal the first config's."""
    first = None
    for config in configs:
        mine = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        launcher(kernel, mine, config)()
        got = [a.float() for a in mine if isinstance(a, torch.Tensor)]
        if first is None:
            first = got
            continue
        for i, (a, b) in enumerate(zip(first, got)):
            torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2, msg=lambda m: f"config {config}, arg {i}: {m}")


def parse_config(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected XBLOCK,R0_BLOCK,num_warps, e.g. 2,128,2")
    return tuple(int(p) for p in parts)


def main() -> int:
    from bench.cuda_graph_timing import graph_of, in_turn

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", type=Path, required=True, help="a generated kernel's .py from a compile cache")
    p.add_argument("--compiled-tokens", type=int, default=8192, help="the token count its get_args was written for")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--configs", type=parse_config, nargs="+", required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    kernel, get_args_src = load(a.kernel)
    import triton
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "kernel": kernel.fn.__name__, "file": a.kernel.name, "tokens": {}}
    rows = ["| tokens | " + " | ".join(f"XBLOCK {x}, R0_BLOCK {r}, {w} warps µs" for x, r, w in a.configs) + " |",
            "|---|" + "---|" * len(a.configs)]
    for t in a.tokens:
        args = inputs(get_args_src, a.compiled_tokens, t, "cuda")
        check_equal(kernel, args, a.configs)
        graphs = {c: graph_of(launcher(kernel, args, c)) for c in a.configs}
        times = in_turn(graphs)
        result["tokens"][t] = {",".join(map(str, c)): {"us": times[c], "median": statistics.median(times[c])}
                               for c in a.configs}
        med = {c: statistics.median(times[c]) for c in a.configs}
        rows.append(f"| {t} | " + " | ".join(f"{med[c]:.2f} ({med[c] / med[a.configs[0]]:.2f})" for c in a.configs)
                    + " |")
    (a.out / "inductor_kernel_probe.json").write_text(json.dumps(result, indent=1))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
