"""Activation offloading for training: a tensor cache over the hectorgen offload engine.

    cache = TensorCache(model.layers, parameters_of=model, host_budget_bytes=24 << 30)   # or tier="file", ...
    for batch in data:
        with cache:                          # saved tensors of this forward go through the cache
            loss = model(batch)
        loss.backward()                      # prefetched back in reverse layer order, released after use

What it does (runtime/include/hectorgen/offload/engine.h does the I/O, on its own threads):

  * pack (torch.autograd.graph.saved_tensors_hooks): a tensor that autograd saves for backward is identified by its
    storage (an id stamped on the storage object, so views of one storage and the same activation saved twice are
    stored once) and, unless it is kept, queued for storing to pinned host memory ("host") or to a file on an SSD
    ("file"). Autograd keeps a small handle instead of the tensor; the cache drops its own reference once the store
    is done, so the memory is freed during the forward pass.
  * kept as they are: parameters (and views of them), tensors smaller than `min_bytes`, CPU tensors (unless
    cpu_tensors=True, the CPU tensor mode that tests use), tensors saved during backward (recomputation), tensors
    saved outside the scopes, and scopes placed "keep" (or "recompute"): these cost one check, no record or handle,
    so a scope placed "keep" runs as fast as without the cache; its bytes and storages are still counted
    (last_scope_bytes, last_scope_tensors), and what the loss saves after the scopes too (last_tail_bytes).
  * the cache's own work on offloaded tensors (pack, unpack, release; not the waits for the link) is timed:
    stats["hook_ns"] over stats["records"], which the adaptive planner charges per offloaded tensor.
  * scopes: the modules given (e.g. the layers of a model) get forward and backward hooks. When the backward pass
    enters a scope, the tensors of that scope and of the next `prefetch_scopes` scopes (in reverse forward order)
    are queued for loading.
  * forwarding: unpacking a tensor whose store is still running returns the tensor in memory and cancels the store.
  * release: a tensor is freed (its GPU copy and its room in the engine) when the last graph node that saved it has
    run, i.e. when the backward of the last scope that used it is over.
  * micro-batches: `micro_batch(k)` (or set_micro_batch) keeps a separate scope order per micro-batch, for
    pipeline schedulers; `prefetch()` starts loading the last scopes of a micro-batch ahead of its backward and
    `wait_io()` waits for the engine.
  * errors: a store that fails (tier full, disk full, I/O error) keeps the tensor in memory, with a warning; a load
    that fails raises OffloadError naming the cause: wrong data is never returned.

Placement per scope: `placement={module: "keep" | "host" | "file" | "recompute"}` (default: `tier` for every
scope), or the Plan that `plan_placement(...)` makes from a profiled step (adaptive offloading, offload_plan.py and
docs/offload.md). With a Plan the cache also takes its prefetch depth, and waits for each store where the plan
predicts it done: the CPU runs ahead of the GPU, and only a store that has ended frees memory, in the allocator's
(CPU) order, for what the forward pass allocates next. A Plan that offloads nothing (keep and recompute only)
installs no hooks at all: the cache is then the recompute wrappers alone and runs exactly as the same placement
written by hand (no per-tensor Python check in a step that, at small batches, the CPU's kernel launches bound); a
later set_placement to "host" or "file" turns the hooks on.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import os
import threading
import time
import warnings
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import torch
import torch.utils.checkpoint

from . import _extensions
from .offload_plan import Plan, ScopeDecision, ScopeProfile, StoreSchedule, plan_placement

__all__ = [
    "OffloadError",
    "TensorCache",
    "load_offload_extension",
    "make_engine",
    "plan_placement",
    "Plan",
    "ScopeDecision",
    "ScopeProfile",
]

PLACEMENTS = ("keep", "host", "file", "recompute")

_EXTENSION = None
_EXTENSION_LOCK = threading.Lock()


class OffloadError(RuntimeError):
    """A saved tensor could not be brought back (I/O error, short read): the step cannot compute its gradients."""


def extension_sources() -> list:
    """The C++ sources of the offload extension (torch.utils.cpp_extension), from a source checkout."""
    return _extensions.sources("_offload")


def load_offload_extension(verbose: bool = False):
    """The compiled engine: `hectorgen_runtime._offload` when it was built ahead of time (pip/CMake install), else a
    JIT build of the C++ sources (plain C++, no nvcc needed; cached in $HECTORGEN_RUNTIME_BUILD_DIR or PyTorch's
    extension directory). Raises ImportError saying why when neither works."""
    global _EXTENSION
    with _EXTENSION_LOCK:
        if _EXTENSION is None:
            _EXTENSION = _extensions.load_compiled("_offload", jit_name="hectorgen_runtime_offload",
                                                   sources=extension_sources(),
                                                   include_dirs=_extensions.include_dirs("_offload"),
                                                   ldflags=["-ldl"], verbose=verbose)
        return _EXTENSION


def make_engine(*, host_budget_bytes: int = 0, host_arena_bytes: int = 1 << 30, directories: Sequence[str] = (),
                file_bytes: int = 0, pinned: Optional[bool] = None, direct_io: bool = True, gds: bool = True,
                store_threads: int = 1, load_threads: int = 1, chunk_bytes: int = 8 << 20, queue_depth: int = 4,
                rank: Optional[int] = None, fault_injection: bool = False):
    """An offload engine (several TensorCaches may share one, e.g. to allocate the pinned budget once). pinned:
    pinned host memory (default: when CUDA is available). rank: names the files (default $RANK, $LOCAL_RANK or 0).
    gds: GPUDirect Storage where libcufile works and a GPU is present ($HECTORGEN_OFFLOAD_GDS=0 turns it off)."""
    if pinned is None:
        pinned = torch.cuda.is_available()
    # GPUDirect Storage moves GPU memory: without a GPU there is nothing to ask libcufile for (and its driver open
    # can block on such a machine).
    gds = gds and torch.cuda.is_available() and os.environ.get("HECTORGEN_OFFLOAD_GDS", "1") != "0"
    return load_offload_extension().Engine(
        host_budget_bytes=int(host_budget_bytes), host_arena_bytes=int(host_arena_bytes),
        directories=[str(d) for d in directories], file_bytes=int(file_bytes), pinned=bool(pinned),
        direct_io=direct_io, gds=gds, store_threads=store_threads, load_threads=load_threads,
        chunk_bytes=int(chunk_bytes), queue_depth=queue_depth, rank=-1 if rank is None else int(rank),
        fault_injection=fault_injection)


# ---------------------------------------------------------------------------------------------------------------
# Records


_STAMP = "_hectorgen_offload_id"
# Storage ids are unique in the process, not per cache: a storage stamped by one cache (an input that lives across
# steps) must never be mistaken for another storage by a second cache.
_STORAGE_IDS = itertools.count(1)
_PARAMETER = "_hectorgen_offload_parameter"
# A storage that a kept scope saved in the current forward pass (the value is the cache's mark for that pass).
_KEPT = "_hectorgen_offload_kept"


@dataclasses.dataclass(eq=False)
class _Scope:
    """One call of a scope module in one micro-batch's forward pass."""

    module: torch.nn.Module
    index: int  # position in the micro-batch's forward order
    micro_batch: int
    placement: str
    records: list = dataclasses.field(default_factory=list)
    new_bytes: int = 0  # bytes of the storages this scope saved first
    tensors: int = 0  # how many storages (of at least min_bytes) this scope saved first
    backward_entered: bool = False


def _tensors_in(value) -> List[torch.Tensor]:
    """The tensors of a module's output: a tensor, or tensors in (nested) tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors_in(item)]
    return []


class _Record:
    """One stored storage. States: kept (in memory, never offloaded), storing (in memory, store in flight), stored
    (only in the engine), loading (load in flight into `tensor`), loaded (in memory again)."""

    __slots__ = ("sid", "tensor", "nbytes", "device", "state", "engine_id", "tier", "scopes", "handles", "last_scope",
                 "wanted")

    def __init__(self, sid: int, tensor: torch.Tensor, nbytes: int):
        self.sid = sid
        self.tensor: Optional[torch.Tensor] = tensor  # uint8 [nbytes] over the whole storage
        self.nbytes = nbytes
        self.device = tensor.device
        self.state = "kept"
        self.engine_id: Optional[int] = None
        self.tier: Optional[str] = None
        self.scopes: List[_Scope] = []
        self.handles = 0
        self.last_scope = -1  # the latest scope (forward order) that saved it: where backward needs it first
        self.wanted = False  # prefetched while its store was running: keep it in memory when the store ends


class _Handle:
    """What autograd keeps instead of an offloaded tensor: the record and the view's metadata. When autograd drops
    the last handle of a record (the nodes that saved it have run), the record is released."""

    __slots__ = ("cache", "record", "dtype", "size", "stride", "offset", "__weakref__")

    def __init__(self, cache: "TensorCache", record: _Record, tensor: torch.Tensor):
        self.cache = cache
        self.record = record
        self.dtype = tensor.dtype
        self.size = tuple(tensor.size())
        self.stride = tuple(tensor.stride())
        self.offset = tensor.storage_offset()
        record.handles += 1

    def __del__(self):
        try:
            self.cache._drop_handle(self.record)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# ---------------------------------------------------------------------------------------------------------------
# The cache


class TensorCache:
    """See the module docstring. Arguments:

    scopes: the modules whose saved tensors are offloaded (e.g. a model's layers), in forward order.
    parameters_of: modules whose parameters are never offloaded (default: the scopes).
    tier: "host" or "file", the placement of scopes without an entry in `placement`.
    placement: {module: "keep" | "host" | "file" | "recompute"} per scope module, or a Plan (plan_placement): its
        placement, its prefetch depth (unless prefetch_scopes is given) and its waits (the module docstring).
    keep_last: the last `keep_last` scopes of `scopes` are kept in memory (backward needs them first).
    host_budget_bytes: pinned host memory of the host tier, allocated once (default: 0 unless a scope uses "host",
        then 8 GiB). host_arena_bytes: the size of one pinned allocation; a tensor must fit in one.
    directories, file_bytes: the file tier: one preallocated file per directory (per process; removed even after a
        crash) of file_bytes each (default 16 GiB); default directory $HECTORGEN_OFFLOAD_DIR or the system's temp
        directory.
    min_bytes: smaller storages are kept (default 1 MiB).
    cpu_tensors: offload CPU tensors too (the CPU tensor mode, for tests without a GPU).
    prefetch_scopes: how many scopes ahead of the one in backward are loaded (default: the plan's, else 2); -1: none,
        each tensor is loaded when backward unpacks it and freed after its use (the lowest peak, loads not hidden:
        with max_inflight_bytes=0, which waits for every store at once, it is save_on_cpu over the engine).
    fallback: when a scope's tier is full, try the other tier before keeping the tensor.
    engine options: store_threads, load_threads, chunk_bytes, queue_depth, direct_io, gds, rank,
        fault_injection (tests).
    engine: an engine from make_engine() to share (the engine options above are then ignored).
    max_inflight_bytes: how many bytes of tensors may wait for their stores; saving more waits for the oldest
        stores (see "The CPU runs ahead" in docs/offload.md), or, with when_busy="keep", keeps the tensor in memory
        instead (offloads only what the link absorbs without slowing the step down; useful for a slow disk).
    """

    def __init__(
        self,
        scopes: Iterable[torch.nn.Module] = (),
        *,
        parameters_of: Optional[Iterable[torch.nn.Module]] = None,
        tier: str = "host",
        placement: Optional[Mapping[torch.nn.Module, str]] = None,
        keep_last: int = 0,
        host_budget_bytes: Optional[int] = None,
        host_arena_bytes: int = 1 << 30,
        directories: Optional[Sequence[str]] = None,
        file_bytes: Optional[int] = None,
        min_bytes: int = 1 << 20,
        cpu_tensors: bool = False,
        prefetch_scopes: Optional[int] = None,
        fallback: bool = True,
        store_threads: int = 1,
        load_threads: int = 1,
        chunk_bytes: int = 8 << 20,
        queue_depth: int = 4,
        direct_io: bool = True,
        gds: bool = True,
        rank: Optional[int] = None,
        fault_injection: bool = False,
        engine=None,
        max_inflight_bytes: int = 2 << 30,
        when_busy: str = "wait",
    ):
        if tier not in ("host", "file"):
            raise ValueError(f"tier must be 'host' or 'file', got {tier!r}")
        self.scopes = list(scopes)
        self.tier = tier
        # Whether the hooks are on: None while constructing, then False for a Plan that offloads nothing.
        self._tracking: Optional[bool] = None
        self.placement: Dict[torch.nn.Module, str] = {}
        for index, module in enumerate(self.scopes):
            self.placement[module] = "keep" if index >= len(self.scopes) - keep_last else tier
        for module, where in (placement or {}).items():
            self.set_placement(module, where)
        self.min_bytes = int(min_bytes)
        self.cpu_tensors = bool(cpu_tensors)
        self._plan: Optional[Plan] = placement if isinstance(placement, Plan) else None
        if prefetch_scopes is None:
            prefetch_scopes = self._plan.prefetch_scopes if self._plan is not None else 2
        self.prefetch_scopes = max(-1, int(prefetch_scopes))
        self.fallback = bool(fallback)
        self.max_inflight_bytes = int(max_inflight_bytes)
        if when_busy not in ("wait", "keep"):
            raise ValueError(f"when_busy must be 'wait' or 'keep', got {when_busy!r}")
        self.when_busy = when_busy
        self._inflight: "collections.deque" = collections.deque()  # (engine id, bytes) of queued async copies
        self._inflight_bytes = 0

        uses = set(self.placement.values()) | {tier}
        if host_budget_bytes is None:
            host_budget_bytes = (8 << 30) if "host" in uses else 0
        if directories is None:
            directories = [os.environ.get("HECTORGEN_OFFLOAD_DIR") or os.environ.get("TMPDIR") or "/tmp"] \
                if "file" in uses else []
        if file_bytes is None:
            file_bytes = (16 << 30) if directories else 0
        self.engine = engine if engine is not None else make_engine(
            host_budget_bytes=host_budget_bytes, host_arena_bytes=host_arena_bytes, directories=directories,
            file_bytes=file_bytes, pinned=torch.cuda.is_available() and not self.cpu_tensors, direct_io=direct_io,
            gds=gds, store_threads=store_threads, load_threads=load_threads, chunk_bytes=chunk_bytes,
            queue_depth=queue_depth, rank=rank, fault_injection=fault_injection)
        if engine is None and ("host" in uses and not self.engine.host_available
                               or "file" in uses and not self.engine.file_available
                               or "could only allocate" in self.engine.status):
            warnings.warn(f"hectorgen offload: {self.engine.status.rstrip('; ')}", stacklevel=2)
        # Per scope module, in the last finished backward: the bytes and the number of storages it saved first.
        self.last_scope_bytes: Dict[torch.nn.Module, int] = {}
        self.last_scope_tensors: Dict[torch.nn.Module, int] = {}
        # Bytes saved outside the scopes once the forward pass has entered one (the loss): resident at its end.
        self.last_tail_bytes = 0
        self._tail_bytes: Dict[int, int] = {}
        self._kept_mark = object()
        self._stalled_ns = 0  # time spent waiting for stores beyond max_inflight_bytes

        self._lock = threading.RLock()
        self._records: Dict[int, _Record] = {}
        self._by_engine_id: Dict[int, _Record] = {}
        self._stack: List[_Scope] = []
        self._micro_batch = 0
        self._order: Dict[int, List[_Scope]] = {}
        # With a plan, per micro-batch: the predicted store ends and the stores waited for there, in order.
        self._schedules: Dict[int, StoreSchedule] = {}
        self._due: Dict[int, "collections.deque"] = {}
        self._warned: set = set()
        self._hooks: list = []
        self._saved_hooks = None
        self._backward_callback_queued = False
        self.stats: Dict[str, int] = {}
        self.reset_stats()

        for module in (self.scopes if parameters_of is None else parameters_of):
            self.exclude_parameters(module)
        self._tracking = False
        for module in self.scopes:
            self._wrap_for_recompute(module)
        if self._plan is None or self._offloads():
            self._track()

    def _offloads(self) -> bool:
        return any(where in ("host", "file") for where in self.placement.values())

    def _track(self) -> None:
        """Turns on the scope hooks (and, from the next forward on, the saved-tensor hooks)."""
        self._tracking = True
        for module in self.scopes:
            self._hooks.append(module.register_forward_pre_hook(self._forward_enter))
            self._hooks.append(module.register_forward_hook(self._forward_exit))

    # ---- configuration ------------------------------------------------------------------------------------------

    def set_placement(self, module: torch.nn.Module, where: str) -> None:
        """Manual override for one scope module: "keep", "host", "file" or "recompute" (its forward runs under
        torch.utils.checkpoint: only its inputs are kept, the rest is recomputed in backward)."""
        if where not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {where!r}")
        if module not in self.placement:
            raise ValueError(f"{type(module).__name__} is not one of this cache's scopes")
        self.placement[module] = where
        if self._tracking is False and where in ("host", "file"):
            self._track()

    def exclude_parameters(self, module: torch.nn.Module) -> None:
        """Never offload the parameters of `module` (nor views of them, e.g. the transposes linear layers save)."""
        for parameter in module.parameters():
            setattr(parameter.untyped_storage(), _PARAMETER, True)

    def remove(self) -> None:
        """Removes the module hooks and forward wrappers (the cache can no longer be used)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for module in self.scopes:
            if getattr(module.forward, "_hectorgen_offload_cache", None) is self:
                del module.forward

    def _wrap_for_recompute(self, module: torch.nn.Module) -> None:
        """Runs the module's forward under activation checkpointing while its placement is "recompute"."""
        original = module.forward
        placement = self.placement

        def forward(*args, **kwargs):
            if placement.get(module) != "recompute" or not torch.is_grad_enabled():
                return original(*args, **kwargs)
            self.stats["recomputed_scopes"] += 1
            return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, **kwargs)

        forward._hectorgen_offload_cache = self
        module.forward = forward

    def reset_stats(self) -> None:
        self.stats = {key: 0 for key in (
            "packed", "kept_small", "kept_outside", "kept_placement", "kept_backward", "kept_full", "kept_busy",
            "kept_wanted", "deduplicated", "stored_host", "stored_file", "store_failed", "forwarded", "prefetched",
            "load_misses", "released", "throttled", "waited_due", "recomputed_scopes", "offered_bytes",
            "offloaded_bytes", "records", "hook_ns")}

    # ---- saved tensor hooks ----------------------------------------------------------------------------------------

    def __enter__(self) -> "TensorCache":
        if self._saved_hooks is not None:
            raise RuntimeError("hectorgen offload: this TensorCache is already active (it does not nest)")
        with self._lock:
            # A forward whose backward never ran (its graph was dropped): forget its scope order.
            order = self._order.get(self._micro_batch)
            if order and all(record.handles == 0 for scope in order for record in scope.records):
                del self._order[self._micro_batch]
            self._kept_mark = object()
        if self._tracking:
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        else:  # a plan that offloads nothing: the recompute wrappers do all there is to do
            self._saved_hooks = contextlib.nullcontext()
        self._saved_hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        hooks, self._saved_hooks = self._saved_hooks, None
        hooks.__exit__(*exc)

    def _offloadable_device(self, tensor: torch.Tensor) -> bool:
        return tensor.is_cuda or (self.cpu_tensors and tensor.device.type == "cpu")

    def _pack(self, tensor: torch.Tensor):
        with self._lock:
            self.stats["packed"] += 1
            if not self._offloadable_device(tensor) or isinstance(tensor, torch.nn.Parameter):
                return tensor
            storage = tensor.untyped_storage()
            if getattr(storage, _PARAMETER, False):
                return tensor
            nbytes = storage.nbytes()
            if nbytes < self.min_bytes:
                self.stats["kept_small"] += 1
                return tensor
            if _in_backward():
                self.stats["kept_backward"] += 1  # recomputation inside backward: used right away
                return tensor
            scope = self._stack[-1] if self._stack else None
            if scope is None:
                self.stats["kept_outside"] += 1
                if self._order.get(self._micro_batch) and getattr(storage, _KEPT, None) is not self._kept_mark:
                    setattr(storage, _KEPT, self._kept_mark)  # after the scopes: what the loss saves
                    self._tail_bytes[self._micro_batch] = self._tail_bytes.get(self._micro_batch, 0) + nbytes
                return tensor
            sid = getattr(storage, _STAMP, None)
            record = self._records.get(sid) if sid is not None else None
            if record is None and (scope.placement in ("keep", "recompute")
                                   or getattr(storage, _KEPT, None) is self._kept_mark):
                return self._keep_in_place(tensor, storage, nbytes, scope)
            started, stalled = time.perf_counter_ns(), self._stalled_ns
            self._reap()
            if record is not None:
                self.stats["deduplicated"] += 1
            else:
                if sid is None:
                    sid = next(_STORAGE_IDS)
                    setattr(storage, _STAMP, sid)
                data = torch.empty(0, dtype=torch.uint8, device=tensor.device)
                with torch.no_grad():
                    data.set_(storage, 0, (nbytes,), (1,))
                record = _Record(sid, data, nbytes)
                self._records[sid] = record
                self.stats["offered_bytes"] += nbytes
                self.stats["records"] += 1
                scope.new_bytes += nbytes
                scope.tensors += 1
                self._start_store(record, scope.placement)
                schedule = self._schedules.get(scope.micro_batch)
                if record.state == "storing" and schedule is not None:
                    due = schedule.store(scope.index, scope.new_bytes - nbytes, nbytes)
                    self._due[scope.micro_batch].append((due, record))
            if scope not in record.scopes:
                record.scopes.append(scope)
                scope.records.append(record)
                record.last_scope = max(record.last_scope, scope.index)
            handle = _Handle(self, record, tensor)
            # The cache's own time: waits for the link (throttling) are not part of it.
            self.stats["hook_ns"] += time.perf_counter_ns() - started - (self._stalled_ns - stalled)
            if self._plan is not None:  # a wait is the plan's, not the cache's own time
                self._wait_due_in(scope)
            return handle

    def _keep_in_place(self, tensor: torch.Tensor, storage, nbytes: int, scope: _Scope) -> torch.Tensor:
        """A tensor of a scope placed "keep" (or "recompute": checkpoint's inputs) stays with autograd as it is: no
        record, no handle, nothing to unpack or release. The storage is marked for this forward pass, so that its
        bytes count once in the scope's size and a later offloaded scope saving it keeps it too (a copy would free
        nothing while this scope holds it)."""
        self.stats["kept_placement"] += 1
        if getattr(storage, _KEPT, None) is self._kept_mark:
            self.stats["deduplicated"] += 1
        else:
            setattr(storage, _KEPT, self._kept_mark)
            self.stats["offered_bytes"] += nbytes
            scope.new_bytes += nbytes
            scope.tensors += 1
        if self._by_engine_id:  # stores of earlier scopes: free what they are done with before more is allocated
            self._reap()
        if self._plan is not None:  # the stores of earlier scopes end while this one computes
            self._wait_due_in(scope)
        return tensor

    def _start_store(self, record: _Record, where: str) -> None:
        if self.when_busy == "keep":
            self._throttle(wait=False)  # takes in the stores that are done
            if self._inflight and self._inflight_bytes + record.nbytes > self.max_inflight_bytes:
                self.stats["kept_busy"] += 1
                return
        tiers = [where] + ([t for t in ("host", "file") if t != where] if self.fallback else [])
        for tier in tiers:
            if tier == "host" and not self.engine.host_available or tier == "file" and not self.engine.file_available:
                continue
            # Host tier on the GPU: the copy is queued on a copy stream now, to start as soon as the GPU has
            # produced the data (an engine thread only waits for it).
            asynchronous = tier == "host" and record.device.type == "cuda"
            engine_id, accepted, placed = self.engine.store(record.tensor, tier, asynchronous)
            if not accepted:
                self._warn_once(f"full:{tier}", f"hectorgen offload: {self.engine.error(engine_id)}; tensors that do "
                                f"not fit stay in memory")
                self.engine.release(engine_id)
                continue
            record.state, record.engine_id, record.tier = "storing", engine_id, tier
            self._by_engine_id[engine_id] = record
            self._inflight.append((engine_id, record.nbytes))
            self._inflight_bytes += record.nbytes
            self._throttle(wait=self.when_busy == "wait")
            return
        self.stats["kept_full"] += 1

    def _wait_due_in(self, scope: _Scope) -> None:
        """_wait_due at the current point of `scope`'s forward (the fraction of its saved bytes saved so far)."""
        size = self._plan.scope_size(scope.index)
        self._wait_due((scope.index, scope.new_bytes / size if size else 1.0))

    def _wait_due(self, position) -> None:
        """Waits for the stores that the plan predicts done by `position` (scope index, fraction of its saved bytes)
        of the current micro-batch's forward pass, and frees their memory."""
        due = self._due.get(self._micro_batch)
        waited = False
        while due and due[0][0] <= position:
            _, record = due.popleft()
            if record.state == "storing":
                self.stats["waited_due"] += 1
                self.engine.wait_store(record.engine_id)
                waited = True
        if waited:
            self._throttle(wait=False)

    def _throttle(self, wait: bool) -> None:
        """Keeps the tensors whose stores are not done under max_inflight_bytes. The CPU runs ahead of the GPU;
        without this it would queue the whole forward pass while the copies lag behind, holding every activation
        (the caching allocator frees memory in CPU time). Beyond the limit it waits for the oldest store, and the
        memory that store frees is free before the CPU allocates more."""
        while self._inflight:
            engine_id, nbytes = self._inflight[0]
            state = self.engine.store_state(engine_id)
            if state in ("queued", "running"):
                if not wait or self._inflight_bytes <= self.max_inflight_bytes:
                    break
                self.stats["throttled"] += 1
                waiting = time.perf_counter_ns()
                self.engine.wait_store(engine_id)
                self._stalled_ns += time.perf_counter_ns() - waiting
            self._inflight.popleft()
            self._inflight_bytes -= nbytes
        self._reap()

    def _reap(self) -> None:
        """Takes in the stores that ended: a done store's tensor is dropped; a failed one stays in memory."""
        for engine_id, state in self.engine.take_finished_stores():
            record = self._by_engine_id.get(engine_id)
            if record is None or record.state != "storing":
                continue
            self._store_ended(record, state)

    def _store_ended(self, record: _Record, state: str) -> None:
        """Takes in the end of `record`'s store ("done" or "failed"; anything else leaves it storing)."""
        if state == "done":
            self.stats["stored_" + record.tier] += 1
            self.stats["offloaded_bytes"] += record.nbytes
            if record.wanted:  # backward has reached it: it stays in memory, no need to read it back
                self.stats["kept_wanted"] += 1
                self._forget_engine_entry(record)
                record.state = "kept"
            else:
                record.state, record.tensor = "stored", None
        elif state == "failed":
            self.stats["store_failed"] += 1
            error = self.engine.error(record.engine_id)
            self._warn_once("store:" + error, f"hectorgen offload: {error}; the tensor stays in memory")
            self._forget_engine_entry(record)
            record.state = "kept"

    def _forget_engine_entry(self, record: _Record) -> None:
        if record.engine_id is not None:
            self._by_engine_id.pop(record.engine_id, None)
            self.engine.release(record.engine_id)
            record.engine_id = None

    def _unpack(self, handle):
        if not isinstance(handle, _Handle):
            return handle
        started = time.perf_counter_ns()
        record = handle.record
        with self._lock:
            self._reap()
            if record.state == "storing" and not self.engine.cancel_store(record.engine_id):
                # The store ended since _reap looked: taken in as _reap would, the tensor being wanted now.
                record.wanted = True
                self._store_ended(record, self.engine.store_state(record.engine_id))
            if record.state == "storing":
                # Forwarding: the tensor is still in memory; the store is no longer needed.
                self._forget_engine_entry(record)
                record.state = "kept"
                self.stats["forwarded"] += 1
            elif record.state == "stored":
                self.stats["load_misses"] += 1
                self._start_load(record)
            engine_id, state = record.engine_id, record.state
        if state == "loading":
            waiting = time.perf_counter_ns()
            result = self.engine.wait_load(engine_id)
            started += time.perf_counter_ns() - waiting  # a stall on the link, not the cache's own time
            with self._lock:
                if record.state == "loading":
                    if result != "done":
                        message = self.engine.error(engine_id)
                        raise OffloadError(
                            f"hectorgen offload: a saved activation ({record.nbytes} bytes, {record.tier} tier) could "
                            f"not be loaded back: {message}. This step's gradients cannot be computed; nothing "
                            f"wrong was returned (offloading with tier='host', or keeping this scope, avoids the "
                            f"{record.tier} tier)")
                    record.state = "loaded"
                    self._forget_engine_entry(record)
        view = _view(record.tensor, handle)
        self.stats["hook_ns"] += time.perf_counter_ns() - started
        return view

    def _start_load(self, record: _Record) -> None:
        record.tensor = torch.empty(record.nbytes, dtype=torch.uint8, device=record.device)
        self.engine.load(record.engine_id, record.tensor)
        record.state = "loading"

    def _drop_handle(self, record: _Record) -> None:
        started = time.perf_counter_ns()
        with self._lock:
            record.handles -= 1
            if record.handles > 0:
                return
            if self._records.get(record.sid) is record:
                del self._records[record.sid]
            if record.state == "storing":
                self.engine.cancel_store(record.engine_id)
            self._forget_engine_entry(record)
            record.tensor = None
            record.state = "released"
            self.stats["released"] += 1
            self.stats["hook_ns"] += time.perf_counter_ns() - started

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    # ---- scopes ------------------------------------------------------------------------------------------------

    def _forward_enter(self, module, args):
        if not torch.is_grad_enabled() or _in_backward():
            return
        with self._lock:
            self._reap()
            order = self._order.setdefault(self._micro_batch, [])
            scope = _Scope(module, len(order), self._micro_batch, self.placement.get(module, self.tier))
            order.append(scope)
            self._stack.append(scope)
            if scope.index == 0:
                self._tail_bytes[self._micro_batch] = 0
            if self._plan is not None:
                if scope.index == 0:  # a new forward pass: its stores start on an idle link
                    self._schedules[self._micro_batch] = self._plan.store_schedule()
                    self._due[self._micro_batch] = collections.deque()
                self._wait_due((scope.index, 0.0))

    def _forward_exit(self, module, args, output):
        with self._lock:
            if not (self._stack and self._stack[-1].module is module):
                return  # not a scope this forward pass entered (no grad, or a recomputation in backward)
            scope = self._stack.pop()
        # The backward reaches the scope when the first gradient of one of its outputs is computed. A hook on those
        # tensors (not a module's full backward hooks, which wrap its inputs and outputs in identity functions and
        # keep gradients for their post-hook) sees that and costs nothing else.
        outputs = [t for t in _tensors_in(output) if t.requires_grad]
        if outputs:
            torch.autograd.graph.register_multi_grad_hook(outputs, lambda grad: self._backward_enter(scope), mode="any")
        else:  # nothing of it is differentiated: its backward never comes
            scope.backward_entered = True

    def _backward_enter(self, scope: _Scope) -> None:
        with self._lock:
            if scope.backward_entered:
                return
            self._reap()
            order = self._order.get(scope.micro_batch, [])
            scope.backward_entered = True
            # The peak is at the start of backward: every store of the forward pass is (predicted) done by then.
            self._wait_due((float("inf"), 0.0))
            if not self._backward_callback_queued:
                self._backward_callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_finished)
            self._prefetch_from(order, scope.index)

    def _prefetch_from(self, order: List[_Scope], index: int) -> None:
        """Queues loads for the tensors first needed by scopes index, index-1, ... index-prefetch_scopes."""
        for position in range(index, max(-1, index - self.prefetch_scopes - 1), -1):
            for record in order[position].records:
                if record.last_scope != position:
                    continue
                if record.state == "stored":
                    self._start_load(record)
                    self.stats["prefetched"] += 1
                elif record.state == "storing":
                    record.wanted = True

    def _backward_finished(self) -> None:
        with self._lock:
            self._backward_callback_queued = False
            order = self._order.get(self._micro_batch, [])
            if order and all(scope.backward_entered for scope in order):
                self.last_scope_bytes, self.last_scope_tensors = {}, {}
                for scope in order:
                    self.last_scope_bytes[scope.module] = self.last_scope_bytes.get(scope.module, 0) + scope.new_bytes
                    self.last_scope_tensors[scope.module] = (self.last_scope_tensors.get(scope.module, 0)
                                                             + scope.tensors)
                self.last_tail_bytes = self._tail_bytes.pop(self._micro_batch, 0)
                del self._order[self._micro_batch]
            self._reap()

    # ---- micro-batches and scheduler hints ----------------------------------------------------------------------

    def set_micro_batch(self, micro_batch: int) -> None:
        """The micro-batch whose forward or backward runs next (pipeline schedulers call this between stages)."""
        with self._lock:
            self._micro_batch = int(micro_batch)

    @contextlib.contextmanager
    def micro_batch(self, micro_batch: int):
        previous = self._micro_batch
        self.set_micro_batch(micro_batch)
        try:
            yield self
        finally:
            self.set_micro_batch(previous)

    def prefetch(self, micro_batch: Optional[int] = None) -> None:
        """Starts loading the last scopes of a micro-batch (default: the current one) before its backward."""
        with self._lock:
            self._reap()
            order = self._order.get(self._micro_batch if micro_batch is None else int(micro_batch), [])
            if order:
                self._prefetch_from(order, len(order) - 1)

    def wait_io(self) -> None:
        """Waits until the engine has no store or load queued or running."""
        self.engine.drain()
        with self._lock:
            self._reap()

    # ---- introspection -------------------------------------------------------------------------------------------

    def live_records(self) -> int:
        """Storages the cache still tracks (0 between steps: nothing leaks)."""
        with self._lock:
            return len(self._records)

    def engine_stats(self) -> dict:
        return self.engine.stats()


def _view(data: torch.Tensor, handle: _Handle) -> torch.Tensor:
    """The saved view (dtype, size, stride, offset) over the storage held by `data`."""
    out = torch.empty(0, dtype=handle.dtype, device=data.device)
    with torch.no_grad():
        out.set_(data.untyped_storage(), handle.offset, handle.size, handle.stride)
    return out


def _in_backward() -> bool:
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1
