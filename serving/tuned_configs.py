"""The folder of tuned configs handed to vLLM (VLLM_TUNED_CONFIG_FOLDER), and the GPUs that read another GPU's files.

vLLM looks a fused-MoE config up by the GPU's name, `E=..,N=..,device_name=<GPU>,dtype=...json`, in the tuned folder
first, then in its own configs/; with neither it runs its default config. Patch 0010 finds a block-FP8 linear layer's
small-M file, `N=..,K=..,device_name=<GPU>,...,small_m.json`, the same way in the tuned folder; without one CUTLASS
runs. By name no GPU reads another's files, though an H100 80GB HBM3 is the H200's chip (GH100: 132
multiprocessors, 50 MB of L2, the same shared memory a multiprocessor) with less memory bandwidth, and the H200's
files serve it well (docs/settings.md, configs_device). So a GPU that reads another's files (READS_FILES_OF, or
option.configs_device) gets a folder of its own under the cache directory: a link to each file of the configs folder,
and each of the other GPU's tuned files again under this GPU's name, wherever neither folder holds a file of this GPU
for that shape (its own file, tuned on it, comes first).
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
# A tuned file's name: a fused-MoE config (E=..,N=..) or patch 0010's small-M file of a linear layer (N=..,K=..)
_TUNED_FILE = re.compile(
    r"^(?:E=\d+,N=\d+|N=\d+,K=\d+),device_name=(?P<device>[^,]+),dtype=[^,]+(,block_shape=\[\d+,\d+\])?"
    r"(?P<small_m>,small_m)?\.json$")


def tuned_file_device(name: str) -> str | None:
    """The GPU a tuned file (fused-MoE or small-M) is named for (None: not such a file)."""
    m = _TUNED_FILE.match(name)
    return m["device"] if m else None


def is_small_m(name: str) -> bool:
    """Whether a tuned file is patch 0010's small-M file of a block-FP8 linear layer."""
    m = _TUNED_FILE.match(name)
    return bool(m and m["small_m"])


def devices_in(configs_dir: Path) -> list[str]:
    """The GPUs the tuned files of configs_dir are named for, sorted."""
    return sorted({d for f in configs_dir.glob("*.json") if (d := tuned_file_device(f.name))})


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
        if tuned_file_device(f.name) != source:
            continue
        name = f.name.replace(f",device_name={source},", f",device_name={device},")
        if not (configs_dir / name).exists() and not (vllm_dir is not None and (vllm_dir / name).exists()):
            borrowed[name] = f
    if not borrowed:
        return Layout(configs_dir)
    folder = cache_dir / FOLDER / device
    why = "the same chip" if configs_device is None else "option.configs_device"
    small_m = sum(map(is_small_m, borrowed))
    note = (f"tuned configs: the {device} reads {len(borrowed) - small_m} fused-MoE and {small_m} small-M file(s) of "
            f"the {source} ({why}) that neither {configs_dir} nor vLLM holds for it, from {folder} "
            f"(option.configs_device={OWN_ONLY}: its own files only)")
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
