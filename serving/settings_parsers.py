"""How a setting's raw text becomes its value: the parsers the settings table names, and the machine facts
(`Context`) that a value such as `tensor_parallel_size=max` depends on.

A parser takes the raw string of any source (serving.properties, the environment) and returns the typed value,
or raises SettingValueError with a message that says what is allowed. Its return annotation is the type of the
setting's field in `Settings`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .tuned_configs import OWN_ONLY


class SettingValueError(ValueError):
    """A value that does not parse; the message says what is allowed."""


def parse_bool(raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise SettingValueError(f"{raw!r} is not a boolean (allowed: true/false, 1/0, yes/no, on/off)")


def flag_set(raw: str) -> bool:
    """A boolean vLLM flag's raw value as the launcher reads it before vLLM does: a value parse_bool refuses counts
    as set (vLLM's parser refuses it later, naming the key)."""
    try:
        return parse_bool(raw)
    except SettingValueError:
        return True


def parse_int(raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise SettingValueError(f"{raw!r} is not an integer") from None


def parse_positive_int(raw: str) -> int:
    n = parse_int(raw)
    if n < 1:
        raise SettingValueError(f"{raw!r} must be a positive integer")
    return n


def parse_non_negative_int(raw: str) -> int:
    n = parse_int(raw)
    if n < 0:
        raise SettingValueError(f"{raw!r} must be 0 or a positive integer")
    return n


def parse_str(raw: str) -> str:
    return raw.strip()


def parse_device_name(raw: str) -> str:
    """A GPU's name as vLLM's config file names spell it (spaces as underscores), or OWN_ONLY ("none")."""
    v = raw.strip().replace(" ", "_")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", v):
        raise SettingValueError(f"{raw!r} is not a GPU's name as config file names spell it (e.g. NVIDIA_H200) "
                                f"or {OWN_ONLY}")
    return OWN_ONLY if v.lower() == OWN_ONLY else v


def parse_path(raw: str) -> Path:
    return Path(raw.strip()).expanduser()


# LMI's and TGI's dtype names -> vLLM's.
DTYPE_ALIASES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def parse_dtype(raw: str) -> str:
    v = raw.strip().lower()
    if v == "int8":
        raise SettingValueError("'int8' is lmi-dist's weight quantization; use option.quantize (e.g. fp8) with "
                                "dtype auto, bf16 or fp16")
    return DTYPE_ALIASES.get(v, raw.strip())


def parse_tp(raw: str) -> int | str:
    """Tensor parallel degree: a positive integer, or `max` for every visible GPU."""
    v = raw.strip().lower()
    if v == "max":
        return "max"
    n = parse_int(v)
    if n < 1:
        raise SettingValueError(f"{raw!r} must be a positive integer or 'max'")
    return n


@dataclass(frozen=True)
class Context:
    """Facts about the machine that some values depend on; `gpus` is counted only when asked."""
    gpus: Callable[[], int] = lambda: 0
    gpu_build: bool = False  # each tensor parallel rank needs a GPU (the CPU build runs ranks on cores)


def expand_tp(value: object, ctx: Context) -> object:
    """`max` -> the visible GPUs; a number above them on the GPU build is refused."""
    if value != "max":
        if ctx.gpu_build and isinstance(value, int) and value > 1 and value > (n := ctx.gpus()):
            raise SettingValueError(f"{value} is more than the {n} visible GPU(s); allowed: 1 to {max(n, 1)}, or max")
        return value
    n = ctx.gpus()
    if n < 1:
        raise SettingValueError("'max' needs at least one visible GPU; none found (set a number instead)")
    return n
