"""vLLM's model-info cache, made when the environment is built and laid into vLLM's cache folder at each start.

Before it loads a model, vLLM's API server inspects the model's class (does it generate text, take LoRA, run
pipeline parallel, ...). With an empty cache folder it does so in a child Python that imports vLLM, torch and the
model's module, which costs seconds at every cold start of a container. The answer it keeps under
VLLM_CACHE_ROOT/modelinfos is one JSON file per class, valid while the hash of the model's source file matches,
which vLLM checks before it uses the file.

    python -m serving.modelinfo_cache build     # after the series is applied (make venv, make gpu-venv, the image)

writes those files for ARCHITECTURES into SHIPPED, beside the Python that serves, with vLLM's own inspection and
file format, in this process (a build has no CUDA to keep uninitialized). The launcher copies them into the
engine's cache folder before it starts vLLM (`seed`), leaving any file already there; a stale or unusable file costs
nothing but the child process vLLM would have run anyway.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from .tiny_model import ARCHS

# The FP8 MoE architectures this container is built for (the checkpoints the README names), and the embedded
# tiny models' (serving.tiny_model)
ARCHITECTURES = tuple(dict.fromkeys(("Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
                                     "Qwen2MoeForCausalLM", "MixtralForCausalLM", *ARCHS.values())))
SHIPPED = Path(sys.prefix) / "lmi-modelinfos"
FOLDER = "modelinfos"  # vLLM's folder under VLLM_CACHE_ROOT (registry._LazyRegisteredModel._get_cache_dir)


def build(dest: Path, architectures: tuple[str, ...] = ARCHITECTURES) -> dict[str, str]:
    """vLLM's model-info files for `architectures` in dest/modelinfos; per architecture "ok" or why not."""
    os.environ["VLLM_CACHE_ROOT"] = str(dest)  # where vLLM's own _save_modelinfo_to_cache writes (read per call)
    from vllm.model_executor.models.registry import ModelRegistry, _LazyRegisteredModel, _ModelInfo

    outcome = {}
    for arch in architectures:
        model = ModelRegistry.models.get(arch)
        if not isinstance(model, _LazyRegisteredModel):
            outcome[arch] = "not a lazily registered vLLM model"
            continue
        try:
            info = _ModelInfo.from_model_cls(model.load_model_cls())
            source = Path(sys.modules[model.module_name].__file__)  # the file whose hash vLLM checks
            model._save_modelinfo_to_cache(info, model._get_modelinfo_module_hash(source))
            # vLLM writes its files 0600 (a temporary file renamed): the image's non-root user must read them
            (dest / FOLDER / model._get_cache_filename()).chmod(0o644)
            outcome[arch] = "ok"
        except Exception as e:  # one architecture's import failing leaves the others' files
            outcome[arch] = f"{type(e).__name__}: {e}"[:300]
    return outcome


def seed(cache_root: Path, shipped: Path = SHIPPED) -> tuple[list[str], str | None]:
    """Copy the shipped model-info files that cache_root/modelinfos lacks: the names copied, and why the rest could
    not be (None when nothing failed). The start goes on either way: vLLM inspects in its child process what it
    finds no file for."""
    source = shipped / FOLDER
    if not source.is_dir():
        return [], None
    target = cache_root / FOLDER
    copied = []
    try:
        target.mkdir(parents=True, exist_ok=True)
        for f in sorted(source.glob("*.json")):
            if not (target / f.name).exists():
                shutil.copyfile(f, target / f.name)
                copied.append(f.name)
    except OSError as e:
        return copied, f"{type(e).__name__}: {e}"
    return copied, None


def engine_cache_root(env: dict[str, str]) -> Path:
    """The VLLM_CACHE_ROOT the engine started with `env` uses, by vLLM's own rule (vllm.envs)."""
    from vllm import envs

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return Path(envs.environment_variables["VLLM_CACHE_ROOT"]())
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.modelinfo_cache", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write vLLM's model-info files for the architectures into DEST")
    b.add_argument("dest", nargs="?", type=Path, default=SHIPPED, help=f"default: {SHIPPED}")
    args = ap.parse_args(argv)
    try:
        outcome = build(args.dest)
    except Exception as e:  # vLLM's registry itself: no file at all, and still no failed build (below)
        outcome = {arch: f"{type(e).__name__}: {e}"[:300] for arch in ARCHITECTURES}
    for arch, result in outcome.items():
        print(f"{arch}: {result}")
    # a missing file only costs a start the child process vLLM runs without it: never a failed build
    print(f"{sum(r == 'ok' for r in outcome.values())} of {len(outcome)} model-info files in {args.dest / FOLDER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
