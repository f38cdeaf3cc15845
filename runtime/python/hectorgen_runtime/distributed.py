"""What the hectorgen runtime needs to know about torch.distributed: which process of a job this is, and where a
process may keep files of its own.

Under ``torchrun`` every process (rank) imports the runtime by itself; anything the runtime writes to disk or pools
in memory by name (the tensor cache's files and pools, a JIT build folder) must not be shared between ranks unless
it is read-only. ``rank_scoped_path(base)`` is the one place that names a rank's own folder:

    path = rank_scoped_path("/tmp/hg_cache")      # /tmp/hg_cache/rank0-of-2 under torchrun, /tmp/hg_cache alone
    path = rank_scoped_path(base, kind="pool")    # /tmp/hg_cache/pool-rank0-of-2

A single process (no ``RANK`` / ``WORLD_SIZE`` in the environment and no process group) keeps ``base`` itself, so
single-process users see no change. Cleaning up is the owner's job: a rank removes its own folder, never another's.
The rank is read from the initialised default process group when there is one, else from torchrun's environment
variables, so the name is right also before ``init_process_group`` (e.g. a cache opened at import time).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RankInfo", "rank_info", "rank_scoped_path"]


@dataclass(frozen=True)
class RankInfo:
    rank: int          # this process's rank in the job, 0 .. world_size - 1
    world_size: int    # processes in the job; 1 for a plain single process
    local_rank: int    # rank on this host (the GPU index torchrun intends), 0 .. local processes - 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"hectorgen_runtime.distributed: environment variable {name}={value!r} is not an integer")


def rank_info() -> RankInfo:
    """This process's rank, world size and local rank: from the default process group when it is initialised,
    else from torchrun's RANK, WORLD_SIZE and LOCAL_RANK, else a single process (0, 1, 0)."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return RankInfo(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", dist.get_rank()))
    except ImportError:
        pass
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"hectorgen_runtime.distributed: RANK={rank} is not in 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
    return RankInfo(rank, world, _env_int("LOCAL_RANK", rank))


def rank_scoped_path(base, kind: str = "", info: RankInfo | None = None) -> Path:
    """``base`` for a single process; ``base/[kind-]rank<r>-of-<w>`` for rank r of a job of w processes. The folder
    is not created. ``kind`` tells apart several per-rank things under one base (e.g. "files", "pool")."""
    info = info or rank_info()
    base = Path(base)
    if not info.distributed:
        return base / kind if kind else base
    name = f"rank{info.rank}-of-{info.world_size}"
    return base / (f"{kind}-{name}" if kind else name)
