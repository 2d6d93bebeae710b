"""The folder of tuned configs handed to vLLM (VLLM_TUNED_CONFIG_FOLDER), and the GPUs that read another GPU's files.

vLLM looks a fused-MoE config up by the GPU's name, `E=..,N=..,device_name=<GPU>,dtype=...json`, in the tuned folder
first, then in its own configs/; with neither it runs its default config. The image's files were tuned on an H200,
so by name no other GPU reads them. An H100 80GB HBM3 is the same chip (GH100: 132 multiprocessors, 50 MB of L2,
the same shared memory a multiprocessor) with less memory bandwidth; on it the H200's entries took 0.85-1.00x the
time of vLLM's default at 1-512 tokens on the 235B and Coder block-FP8 EP8 ranks, and where an entry holds a
matrix-vector config (patch 0011), that kernel took 0.78-0.95x of vLLM's (bench/RESULTS-archive.md, kernel probes
34b and 34c). So a GPU that reads another's files (READS_FILES_OF, or option.configs_device) gets a folder of its own
under the cache directory: a link to each file of the configs folder, and each of the other GPU's fused-MoE files
again under this GPU's name, wherever neither folder holds a file of this GPU for that shape (its own file, tuned on
it, comes first). The block-FP8 linear layers' small-M files (patch 0010) stay the H200's own: no H100 has run them.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

# A GPU (its name as vLLM's file names spell it) -> the GPU whose files it reads where it has none of its own
READS_FILES_OF = {"NVIDIA_H100_80GB_HBM3": "NVIDIA_H200"}
# option.configs_device's value for "only the GPU's own files"
OWN_ONLY = "none"
# Under the cache directory: one folder per GPU that reads another's files
FOLDER = "tuned-configs"
_FUSED_MOE_FILE = re.compile(
    r"^E=\d+,N=\d+,device_name=(?P<device>[^,]+),dtype=[^,]+(,block_shape=\[\d+,\d+\])?\.json$")


def fused_moe_device(name: str) -> str | None:
    """The GPU a fused-MoE config file is named for (None: not such a file)."""
    m = _FUSED_MOE_FILE.match(name)
    return m["device"] if m else None


def devices_in(configs_dir: Path) -> list[str]:
    """The GPUs the fused-MoE files of configs_dir are named for, sorted."""
    return sorted({d for f in configs_dir.glob("E=*.json") if (d := fused_moe_device(f.name))})


def vllm_configs_dir() -> Path | None:
    """vLLM's own fused-MoE configs/, found without importing vLLM (None where vLLM is not installed)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "model_executor" / "layers" / "fused_moe" / "configs"


def gpu_name() -> str | None:
    """The first visible GPU's name as vLLM's config file names spell it (spaces as underscores), as vLLM's
    platform reads it (NVML: no CUDA context in this process); None without a CUDA GPU."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return None
        return current_platform.get_device_name().replace(" ", "_")
    except Exception:  # no NVML, no driver: the GPU's own files only
        return None


@dataclass(frozen=True)
class Layout:
    """What the engine reads: `folder` (VLLM_TUNED_CONFIG_FOLDER) and, where it is not the configs folder itself,
    the links it holds (a file name -> the file it points at), `borrowed` of them another GPU's files, and the start
    log's line saying so (`note`)."""

    folder: Path
    links: dict[str, Path] = field(default_factory=dict)
    borrowed: tuple[str, ...] = ()
    note: str | None = None


def layout(configs_dir: Path, cache_dir: Path, device: str | None, configs_device: str | None,
           vllm_dir: Path | None) -> Layout:
    """The folder for GPU `device` (None: none found): configs_dir itself, unless the GPU reads another's files
    (configs_device, else READS_FILES_OF; OWN_ONLY: none) that neither configs_dir nor vLLM's own vllm_dir holds
    under its name."""
    source = READS_FILES_OF.get(device or "") if configs_device is None else configs_device
    if device is None or source in (None, OWN_ONLY, device):
        return Layout(configs_dir)
    files = sorted(f for f in configs_dir.iterdir() if f.is_file())
    borrowed = {}
    for f in files:
        if fused_moe_device(f.name) != source:
            continue
        name = f.name.replace(f",device_name={source},", f",device_name={device},")
        if not (configs_dir / name).exists() and not (vllm_dir is not None and (vllm_dir / name).exists()):
            borrowed[name] = f
    if not borrowed:
        return Layout(configs_dir)
    folder = cache_dir / FOLDER / device
    why = "the same chip" if configs_device is None else "option.configs_device"
    note = (f"tuned configs: the {device} reads {len(borrowed)} fused-MoE file(s) of the {source} ({why}) that "
            f"neither {configs_dir} nor vLLM holds for it, from {folder} (option.configs_device={OWN_ONLY}: its own "
            "files only)")
    return Layout(folder, {f.name: f for f in files} | borrowed, tuple(borrowed), note)


def make(lay: Layout) -> None:
    """Lay the folder out as `lay` says: exactly its links, each a symbolic link to its file's absolute path (an
    earlier start's links go). Raises OSError where the folder cannot be written."""
    if not lay.links:
        return
    lay.folder.mkdir(parents=True, exist_ok=True)
    for old in lay.folder.iterdir():
        if old.is_symlink() or old.is_file():
            old.unlink()
    for name, target in lay.links.items():
        (lay.folder / name).symlink_to(target.resolve())
