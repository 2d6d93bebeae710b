"""Whether a later start can read vLLM's compile cache: the launcher's default for option.disable_compile_cache.

A container's own filesystem (its overlay root, a tmpfs) ends with the container, so a compile cache written
there costs the start its writing and no later start reads it: there the launcher turns the cache off. Any other
filesystem outlives the process (a docker volume, a bind mount, EFS or FSx, a host's own disk outside a
container), and a compilation_config that names its own cache_dir asks for a cache: there vLLM's default, the
cache on, stays. The filesystem is read from /proc/self/mountinfo, the mount table of this process's namespace.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, NamedTuple

MOUNTINFO = Path("/proc/self/mountinfo")
# Filesystems that end with the container (a container's root is an overlay) or the machine (tmpfs): a cache on
# them is never read by a later start.
EPHEMERAL = frozenset({"overlay", "tmpfs", "ramfs", "aufs"})
_OCTAL = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040


class Mount(NamedTuple):
    point: str
    fstype: str


def mounts(text: str) -> list[Mount]:
    """The mount points and filesystem types of a mountinfo text (proc(5)): the fifth field, and the first after
    the " - " separator."""
    out = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or not tail.split():
            continue
        out.append(Mount(_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4]), tail.split()[0]))
    return out


def mount_of(path: Path, table: list[Mount]) -> Mount | None:
    """The mount that holds path: the last-mounted one of the longest mount point above it."""
    best = None
    for m in table:
        point = Path(m.point)
        deeper = best is None or len(point.parts) >= len(Path(best.point).parts)
        if deeper and (path == point or point in path.parents):
            best = m
    return best


def default(root: Path, user_compilation_config: Mapping | None,
            mountinfo: str | None = None) -> tuple[str, str] | None:
    """(raw value, why) for option.disable_compile_cache where the user left it unset, or None to keep vLLM's
    default. `mountinfo` is read from MOUNTINFO when not given; where it cannot be read, vLLM's default stays."""
    if user_compilation_config and user_compilation_config.get("cache_dir"):
        return None
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text()
        except OSError:
            return None
    m = mount_of(Path(os.path.abspath(root)), mounts(mountinfo))
    if m is None or m.fstype not in EPHEMERAL:
        return None  # a filesystem that lasts (or none found): vLLM's default
    return "true", f"VLLM_CACHE_ROOT {root} is on the {m.fstype} at {m.point}, which no later start reads"
