"""Unified tensors: tensors in pinned, GPU-mapped host memory that the GPU reads directly over PCIe (zero-copy),
after PyTorch-Direct (Min et al.; docs/unified_tensor.md has the design, the placement table and measurements).

    import hectorgen_runtime as hr
    features = hr.to_unified(features)          # copy into the pinned pool (or hr.unified(t): pin t in place)
    batch = features[neighbour_ids_cuda]        # GPU affinity (the default): a CUDA tensor, gathered over PCIe
    batch = hr.gather(features, ids)            # the same, with the per-call path choice and options spelled out

Representation. A `UnifiedTensor` is a `torch.Tensor` subclass whose data is an ordinary CPU tensor on GPU-mapped
memory: every CPU operator of PyTorch reads and writes it unchanged, `t.cuda_view()` is a zero-copy CUDA alias of
the same bytes (so every CUDA operator can read it too), and `__torch_function__` applies the placement rules of
the table below. The other choices were worse here: a new device type or dispatch key (what PyTorch-Direct added to
PyTorch itself) needs a PyTorch fork, and a wrapper object that is not a tensor breaks every API that expects one.
The memory comes from a process-wide pool (hectorgen/unified_pool.h) of large cudaHostAlloc(Mapped | Portable)
chunks, sub-allocated, so creating and freeing unified tensors costs no CUDA API call once the pool holds a chunk;
`unified(t)` instead maps t's own memory in place (cudaHostRegister), undone when t's storage dies.

Affinity ("host" or "gpu", per tensor, switchable with `set_affinity` without moving data) decides where operators
on unified tensors compute and where their results live (the thesis's Table "Rules of placements"):

  all unified operands GPU-affine
    some operand is a non-scalar CPU tensor        compute on GPU   result: host-affine unified
    else some operand is a CUDA tensor             compute on GPU   result: CUDA
    else (unified tensors and CPU scalars only)    compute on GPU   result: CUDA
  some unified operand host-affine
    some operand is a non-scalar CPU tensor        compute on CPU (GPU if some operand is GPU-affine)
                                                                    result: host-affine unified
    else some operand is a CUDA tensor             compute on GPU   result: host-affine unified
    else (unified tensors and CPU scalars only)    compute on CPU (GPU if some operand is GPU-affine)
                                                                    result: host-affine unified

CPU scalars are Python numbers and 0-dim CPU tensors. The rules apply to indexing by an index tensor
(`t[idx]`, `torch.index_select(t, 0, idx)`) and to the elementwise operators of `ELEMENTWISE`; any other operator
sees unified tensors as the CPU tensors they are, and a result that is a view of a unified tensor (slices,
reshapes, transposes) is unified with the same affinity. Computing on the GPU reads unified operands through their
CUDA alias and copies non-scalar CPU operands to the GPU; a host-affine result computed on the GPU is written back
into new unified memory.

Errors: NotPinnableError (memory that cannot be mapped in place), PinnedMemoryError (the pool cannot get pinned
memory, a MemoryError), IndexError (an index out of range, checked on the GPU with an error word for the zero-copy
path: never silent garbage), TypeError (dtypes), ValueError (devices, shapes, layouts).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

__all__ = [
    "AFFINITIES",
    "ELEMENTWISE",
    "PATHS",
    "Calibration",
    "NotPinnableError",
    "PinnedMemoryError",
    "UnifiedTensor",
    "calibrate",
    "check_gather_errors",
    "empty_unified",
    "gather",
    "is_unified",
    "placement",
    "pool_stats",
    "set_pool_limit",
    "to_unified",
    "trim_pool",
    "unified",
]

AFFINITIES = ("host", "gpu")
# gather's paths: the zero-copy kernel over the index as given or sorted (the result un-permuted), or the CPU
# gathering into pinned staging chunks that the copy engine moves while the next chunk is gathered.
PATHS = ("zero_copy", "zero_copy_sorted", "cpu")


class NotPinnableError(RuntimeError):
    """The memory of a CPU tensor cannot be pinned and mapped in place; `to_unified` (a copy) still works."""


class PinnedMemoryError(MemoryError):
    """The unified pool cannot get the pinned host memory a request needs (or would pass its limit)."""


# ---------------------------------------------------------------------------------------------------------------
# Backend: the compiled extension (tests substitute a fake one on machines without a GPU)


class _NativeBackend:
    """The unified functions of the compiled extension hectorgen_runtime._C."""

    def __init__(self):
        self._module = None

    def module(self):
        if self._module is None:
            if not torch.cuda.is_available():
                raise RuntimeError("hectorgen unified tensors need a CUDA GPU (torch.cuda.is_available() is False)")
            from . import load_extension

            self._module = load_extension()
        return self._module

    def empty(self, sizes, dtype):
        return self.module().unified_empty(list(sizes), dtype)

    def pin(self, t):
        return self.module().unified_pin(t)

    def is_mapped(self, t):
        return self._module is not None and self.module().unified_is_mapped(t)

    def cuda_view(self, t, device):
        return self.module().unified_cuda_view(t, device)

    def gather(self, table, index, positions, out, error):
        self.module().unified_gather(table, index, positions, out, error)

    def gather_cpu(self, table, index, out, chunk_bytes):
        return self.module().unified_gather_cpu(table, index, out, chunk_bytes)

    def plan(self, table, out):
        return self.module().unified_gather_plan(table, out)

    def pool_stats(self):
        return self.module().unified_pool_stats()

    def trim_pool(self):
        return self.module().unified_trim_pool()

    def set_pool_limit(self, nbytes):
        self.module().unified_set_pool_limit(nbytes)


_backend = _NativeBackend()


def _use_backend(backend) -> object:
    """Replaces the backend (tests); returns the previous one."""
    global _backend
    previous, _backend = _backend, backend
    return previous


# ---------------------------------------------------------------------------------------------------------------
# The tensor type


def _check_affinity(affinity: str) -> str:
    if affinity not in AFFINITIES:
        raise ValueError(f"affinity must be one of {AFFINITIES}, got {affinity!r}")
    return affinity


class UnifiedTensor(torch.Tensor):
    """A CPU tensor on pinned, GPU-mapped host memory, with an affinity ("host" or "gpu") that places the operators
    applied to it (see the module's table). Made by `to_unified`, `unified` or `empty_unified`."""

    _affinity: str

    @staticmethod
    def __new__(cls, data: torch.Tensor, affinity: str = "gpu"):
        with torch._C.DisableTorchFunctionSubclass():
            t = torch.Tensor._make_subclass(cls, data, False)
        t._affinity = _check_affinity(affinity)
        return t

    @property
    def affinity(self) -> str:
        return self._affinity

    def set_affinity(self, affinity: str) -> "UnifiedTensor":
        """Switches this tensor's affinity in place (no data moves); returns self."""
        self._affinity = _check_affinity(affinity)
        return self

    def with_affinity(self, affinity: str) -> "UnifiedTensor":
        """Another unified tensor on the same memory with `affinity` (no data moves)."""
        return UnifiedTensor(_plain(self), affinity)

    @property
    def is_unified(self) -> bool:
        return True

    def plain(self) -> torch.Tensor:
        """This tensor as the plain CPU tensor it is (same memory, no placement rules)."""
        return _plain(self)

    def cuda_view(self, device=None) -> torch.Tensor:
        """A CUDA tensor on the same bytes (zero-copy): CUDA operators on it read and write host memory over PCIe.
        It keeps this tensor's memory alive."""
        return _backend.cuda_view(_plain(self), _cuda_index(device))

    def __repr__(self, *, tensor_contents=None):
        return f"unified({_plain(self)!r}, affinity={self._affinity!r})"

    def __reduce_ex__(self, protocol):
        # Pickles (and deep-copies) as a plain CPU tensor: pinned memory is a property of this process.
        return _plain(self).clone().__reduce_ex__(protocol)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INDEX_FUNCTIONS:
            call = _index_call(func, args, kwargs)
            if call is not None:
                return _index(*call)
        if func in _ELEMENTWISE_FUNCTIONS:
            return _elementwise(func, args, kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*_unwrap(args), **_unwrap(kwargs))
            return _rewrap_views(result, _unified_operands(args, kwargs))


def _plain(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor) if isinstance(t, UnifiedTensor) else t


def _unwrap(value):
    if isinstance(value, UnifiedTensor):
        return _plain(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value


def _unified_operands(args, kwargs) -> List[UnifiedTensor]:
    found: List[UnifiedTensor] = []

    def visit(value):
        if isinstance(value, UnifiedTensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    visit(args)
    visit(kwargs)
    return found


def _storage_key(t: torch.Tensor) -> int:
    with torch._C.DisableTorchFunctionSubclass():
        return t.untyped_storage().data_ptr()


def _rewrap_views(result, sources: Sequence[UnifiedTensor]):
    """Tensors in `result` that live in the memory of a unified source become unified with its affinity."""
    if not sources:
        return result
    if isinstance(result, torch.Tensor) and not isinstance(result, UnifiedTensor):
        if result.device.type == "cpu" and result.numel() > 0:
            key = _storage_key(result)
            for source in sources:
                if _storage_key(source) == key:
                    return UnifiedTensor(result, source.affinity)
        return result
    if isinstance(result, (list, tuple)) and not hasattr(result, "_fields"):
        return type(result)(_rewrap_views(r, sources) for r in result)
    return result


def is_unified(t) -> bool:
    """Whether `t` is a unified tensor."""
    return isinstance(t, UnifiedTensor)


def _cuda_index(device) -> int:
    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_available() else 0
    device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


def empty_unified(*size, dtype: torch.dtype = torch.float32, affinity: str = "gpu") -> UnifiedTensor:
    """An uninitialised contiguous unified tensor from the pool."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    _check_affinity(affinity)
    return UnifiedTensor(_backend.empty(tuple(int(s) for s in size), dtype), affinity)


def to_unified(t: torch.Tensor, affinity: str = "gpu") -> UnifiedTensor:
    """A unified copy of `t` (any device), contiguous, in memory from the pool (PyTorch-Direct's t.to("unified"))."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_unified expects a tensor, got {type(t).__name__}")
    out = empty_unified(tuple(t.shape), dtype=t.dtype, affinity=affinity)
    _plain(out).copy_(_plain(t))
    return out


def unified(t: torch.Tensor, affinity: str = "gpu") -> UnifiedTensor:
    """`t` itself made unified: its CPU memory is pinned and mapped for the GPU in place (no copy), and stays so
    until its storage dies. Raises NotPinnableError when the memory cannot be pinned (then use to_unified), and
    ValueError for a tensor that is not on the CPU."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"unified expects a tensor, got {type(t).__name__}")
    if isinstance(t, UnifiedTensor):
        return t.with_affinity(affinity) if t.affinity != affinity else t
    if t.device.type != "cpu":
        raise ValueError(f"unified(t) pins a CPU tensor's memory in place, but t is on {t.device}; to_unified(t) "
                         "copies it into unified memory")
    _check_affinity(affinity)
    _backend.pin(t)
    return UnifiedTensor(t.detach(), affinity)


def pool_stats() -> Dict[str, int]:
    """The unified pool's counters: reserved_bytes, in_use_bytes, chunks, source_allocations (cudaHostAlloc calls
    so far), source_releases, largest_free_block."""
    return dict(_backend.pool_stats())


def trim_pool() -> int:
    """Frees the pool's chunks that hold no tensor; returns the bytes given back."""
    return int(_backend.trim_pool())


def set_pool_limit(nbytes: int) -> None:
    """At most `nbytes` of unified memory in use at once (0: no limit); past it, PinnedMemoryError."""
    _backend.set_pool_limit(int(nbytes))


# ---------------------------------------------------------------------------------------------------------------
# Placement rules


def _operand_kind(value) -> Optional[str]:
    """'host' / 'gpu' (unified, by affinity), 'cpu', 'cpu_scalar', 'cuda', or None (not a tensor operand)."""
    if isinstance(value, UnifiedTensor):
        return value.affinity
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return "cpu_scalar" if value.dim() == 0 else "cpu"
        return "cuda"
    if isinstance(value, (bool, int, float, complex)):
        return "cpu_scalar"
    return None


def placement(kinds: Iterable[str]) -> Tuple[str, str]:
    """The thesis's placement rule for an operator whose operands are of `kinds` (see _operand_kind): returns
    (compute device, result) with compute device 'cpu' or 'gpu' and result 'cuda' or 'unified_host'. At least one
    kind must be 'host' or 'gpu'."""
    kinds = list(kinds)
    unknown = set(kinds) - {"host", "gpu", "cpu", "cpu_scalar", "cuda"}
    if unknown:
        raise ValueError(f"unknown operand kinds {sorted(unknown)}")
    if "host" not in kinds and "gpu" not in kinds:
        raise ValueError("placement applies to operators with at least one unified operand")
    some_cpu_tensor = "cpu" in kinds
    some_cuda = "cuda" in kinds
    if "host" not in kinds:  # every unified operand is GPU-affine
        return ("gpu", "unified_host") if some_cpu_tensor else ("gpu", "cuda")
    some_gpu_affine = "gpu" in kinds
    if some_cpu_tensor:
        return ("gpu" if some_gpu_affine else "cpu"), "unified_host"
    if some_cuda:
        return "gpu", "unified_host"
    return ("gpu" if some_gpu_affine else "cpu"), "unified_host"


def _compute_device(values) -> torch.device:
    for value in values:
        if isinstance(value, torch.Tensor) and not isinstance(value, UnifiedTensor) and value.is_cuda:
            return value.device
    return torch.device("cuda", _cuda_index(None))


def _on_gpu(value, device: torch.device):
    """An operand as a GPU operator takes it: unified through its CUDA alias, CPU tensors copied (0-dim CPU
    tensors stay: PyTorch takes them as scalars)."""
    if isinstance(value, UnifiedTensor):
        return value.cuda_view(device)
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() > 0:
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_on_gpu(v, device) for v in value)
    return value


def _as_result(result, output: str):
    if output == "cuda" or not isinstance(result, torch.Tensor):
        return result
    return to_unified(result, affinity="host")


ELEMENTWISE = (
    "abs", "add", "ceil", "clamp", "cos", "div", "eq", "exp", "floor", "ge", "gt", "le", "log", "lt", "maximum",
    "minimum", "mul", "ne", "neg", "pow", "reciprocal", "relu", "rsqrt", "sigmoid", "sin", "sqrt", "sub", "tanh",
    "true_divide", "where",
)
_DUNDERS = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
            "__neg__", "__pow__", "__rpow__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__abs__")
_IN_PLACE = ("add_", "sub_", "mul_", "div_", "clamp_", "relu_", "neg_", "__iadd__", "__isub__", "__imul__",
             "__itruediv__")


def _functions(names, *owners):
    found = set()
    for name in names:
        for owner in owners:
            fn = getattr(owner, name, None)
            if fn is not None:
                found.add(fn)
    return found


_ELEMENTWISE_FUNCTIONS = (_functions(ELEMENTWISE, torch, torch.Tensor, torch.nn.functional)
                          | _functions(_DUNDERS, torch.Tensor))
_IN_PLACE_FUNCTIONS = _functions(_IN_PLACE, torch.Tensor)
_ELEMENTWISE_FUNCTIONS |= _IN_PLACE_FUNCTIONS
_INDEX_FUNCTIONS = {torch.Tensor.__getitem__, torch.index_select, torch.Tensor.index_select}


def _elementwise(func, args, kwargs):
    values = list(args) + list(kwargs.values())
    kinds = [k for k in (_operand_kind(v) for v in values) if k is not None]
    compute, output = placement(kinds)
    if func in _IN_PLACE_FUNCTIONS:
        target = args[0]
        if not isinstance(target, UnifiedTensor):
            raise ValueError(f"{func.__name__}: only the unified tensor itself can be updated in place")
        if compute == "gpu":
            device = _compute_device(values)
            func(target.cuda_view(device), *_on_gpu(tuple(args[1:]), device),
                 **{k: _on_gpu(v, device) for k, v in kwargs.items()})
        else:
            with torch._C.DisableTorchFunctionSubclass():
                func(*_unwrap(args), **_unwrap(kwargs))
        return target
    if compute == "gpu":
        device = _compute_device(values)
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*_on_gpu(tuple(args), device), **{k: _on_gpu(v, device) for k, v in kwargs.items()})
    else:
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*_unwrap(args), **_unwrap(kwargs))
    return _as_result(result, output)


def _index_call(func, args, kwargs):
    """(table, index) when `func(*args, **kwargs)` indexes the rows of a unified table by an index tensor, else
    None (then the operator runs with CPU semantics)."""
    if func is torch.Tensor.__getitem__:
        table, key = args[0], args[1]
        # t[idx], t[idx,], t[idx, :, ...] and t[idx, ...] index rows; anything else keeps CPU semantics.
        if isinstance(key, tuple) and key and all(k is Ellipsis or k == slice(None) for k in key[1:]):
            key = key[0]
        if isinstance(table, UnifiedTensor) and isinstance(key, torch.Tensor) and not isinstance(key, UnifiedTensor):
            return table, key
        return None
    table = kwargs.get("input", args[0] if args else None)
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    index = kwargs.get("index", args[2] if len(args) > 2 else None)
    if (isinstance(table, UnifiedTensor) and dim in (0, -table.dim()) and isinstance(index, torch.Tensor)
            and not isinstance(index, UnifiedTensor) and index.dim() <= 1 and "out" not in kwargs):
        return table, index
    return None


def _index(table: UnifiedTensor, index: torch.Tensor):
    if index.dtype == torch.bool:
        if tuple(index.shape) != tuple(table.shape[:1]):
            raise IndexError(f"a boolean index of shape {tuple(index.shape)} does not match the table's "
                             f"{table.shape[0]} rows")
        index = index.nonzero().squeeze(1)
    _check_index(index)
    compute, output = placement([table.affinity, _operand_kind(index)])
    shape = tuple(index.shape) + tuple(table.shape[1:])
    flat = index.reshape(-1)
    if compute == "gpu" and output == "cuda":
        return gather(table, flat).reshape(shape)
    out = empty_unified((flat.numel(),) + tuple(table.shape[1:]), dtype=table.dtype, affinity="host")
    if compute == "gpu":
        gather(table, flat, out=out)
    else:
        cpu_index = flat.cpu()
        _check_cpu_range(cpu_index, table.shape[0])
        torch.index_select(_plain(table), 0, cpu_index, out=_plain(out))
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------------------------------
# Gather


def _check_index(index) -> None:
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"the index must be a tensor, got {type(index).__name__}")
    if index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"the index must be an int32 or int64 tensor, got {index.dtype}")


def _check_cpu_range(index: torch.Tensor, num_rows: int) -> None:
    if index.numel() == 0:
        return
    bad = ((index < 0) | (index >= num_rows)).nonzero()
    if bad.numel():
        position = int(bad[0, 0])
        raise IndexError(f"index {int(index[position])} at position {position} is out of range for a table of "
                         f"{num_rows} rows")


_sticky_errors: Dict[int, torch.Tensor] = {}


def _sticky_error_word(device: torch.device) -> torch.Tensor:
    word = _sticky_errors.get(device.index)
    if word is None:
        word = torch.full((1,), -1, dtype=torch.int64, device=device)
        _sticky_errors[device.index] = word
    return word


def check_gather_errors(device=None) -> None:
    """Raises IndexError if a gather with check=False on `device` (default: the current one) met an index out of
    range since the last check (synchronises with that device), and clears the record."""
    index = _cuda_index(device)
    word = _sticky_errors.get(index)
    if word is None:
        return
    position = int(word.item())
    if position != -1:
        word.fill_(-1)
        raise IndexError(f"a gather with check=False met an index out of range (output row {position}); those rows "
                         "were zero-filled")


def _table_row_bytes(table: torch.Tensor) -> int:
    return (table.numel() // table.shape[0] if table.shape[0] else 0) * table.element_size()


def gather(table: torch.Tensor, index: torch.Tensor, *, out: Optional[torch.Tensor] = None, path: str = "auto",
           check: bool = True, chunk_bytes: int = 8 << 20) -> torch.Tensor:
    """table[index] as a CUDA tensor (or into `out`, a CUDA or unified tensor), on the current CUDA stream.

    table: a contiguous unified tensor [N, ...]. index: int32/int64, CPU or CUDA, any shape (the result has shape
    index.shape + table.shape[1:]). path: "auto" chooses per call from the row width, the batch size and the
    machine's calibration (`calibrate`, run once and cached); or one of PATHS. check: raise IndexError for an
    index out of range (one synchronisation: the error word is read back); with check=False nothing waits, bad
    rows are zero-filled and `check_gather_errors()` raises later. The zero-copy paths only queue GPU work, so on a
    side stream (torch.cuda.stream(s)) they overlap with compute on others; the CPU path returns once its copies are
    done.
    """
    if not isinstance(table, torch.Tensor):
        raise TypeError(f"gather's table must be a unified tensor, got {type(table).__name__}")
    if not is_unified(table):
        raise TypeError(f"gather's table must be a unified tensor (hectorgen_runtime.to_unified / unified), got a "
                        f"{table.device.type} tensor")
    _check_index(index)
    plain_table = _plain(table)
    if plain_table.dim() == 0:
        raise ValueError("gather's table must have at least one dimension (rows)")
    if not plain_table.is_contiguous():
        raise ValueError("gather's table must be contiguous (rows of consecutive bytes); to_unified(t.contiguous()) "
                         "makes a contiguous copy")
    if index.device.type not in ("cpu", "cuda"):
        raise ValueError(f"gather's index must be on the CPU or a CUDA device, got {index.device}")
    if path != "auto" and path not in PATHS:
        raise ValueError(f"path must be 'auto' or one of {PATHS}, got {path!r}")
    row_shape = tuple(plain_table.shape[1:])
    shape = tuple(index.shape) + row_shape
    count = index.numel()
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a tensor, got {type(out).__name__}")
        if out.dtype != plain_table.dtype:
            raise TypeError(f"out has dtype {out.dtype} but the table {plain_table.dtype}")
        if tuple(out.shape) not in (shape, (count,) + row_shape):
            raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
        if not (out.is_cuda or is_unified(out)) or not _plain(out).is_contiguous():
            raise ValueError(f"out must be a contiguous CUDA or unified tensor, got a {out.device} tensor")
    device = (index.device if index.is_cuda else out.device if out is not None and out.is_cuda
              else torch.device("cuda", _cuda_index(None)))
    if out is not None and out.is_cuda and out.device != device:
        raise ValueError(f"out is on {out.device} but the index on {device}")
    if index.is_cuda and index.device != device:
        raise ValueError(f"the index is on {index.device} but out on {device}")
    result = out if out is not None else torch.empty(shape, dtype=plain_table.dtype, device=device)
    flat_result = _plain(result).view((count,) + row_shape)
    if count == 0:
        return result
    row_bytes = _table_row_bytes(plain_table)
    num_rows = plain_table.shape[0]
    flat_index = index.reshape(-1)
    if path == "auto":
        forced = os.environ.get("HECTORGEN_UNIFIED_PATH")
        if forced:
            if forced not in PATHS:
                raise ValueError(f"HECTORGEN_UNIFIED_PATH must be one of {PATHS}, got {forced!r}")
            path = forced
        else:
            path = _calibration(device).choose(row_bytes, count)
    if path == "cpu" and not result.is_cuda:
        path = "zero_copy"  # the CPU path copies into GPU memory; a unified out is written by the kernel
    if path == "cpu":
        cpu_index = flat_index.cpu().contiguous()
        bad = _backend.gather_cpu(plain_table, cpu_index, flat_result, int(chunk_bytes))
        if bad != -1:
            raise IndexError(f"index {int(cpu_index[bad])} at position {bad} is out of range for a table of "
                             f"{num_rows} rows")
        return result
    cuda_index = flat_index.to(device, non_blocking=True).contiguous()
    positions = None
    if path == "zero_copy_sorted":
        if cuda_index.dtype == torch.int64 and num_rows < 2**31 - 1:
            # 32-bit keys sort about twice as fast; clamping first keeps every bad index out of range (-1 or N).
            cuda_index = cuda_index.clamp(-1, num_rows).to(torch.int32)
        cuda_index, positions = torch.sort(cuda_index)
    error = torch.full((1,), -1, dtype=torch.int64, device=device) if check else _sticky_error_word(device)
    _backend.gather(plain_table, cuda_index, positions, _plain(flat_result), error)
    if check:
        position = int(error.item())
        if position != -1:
            value = int(flat_index[position])
            raise IndexError(f"index {value} at position {position} is out of range for a table of {num_rows} rows")
    return result


# ---------------------------------------------------------------------------------------------------------------
# Calibration: which path is fastest on this machine, per row width and batch size


@dataclasses.dataclass
class Calibration:
    """Measured costs of each gather path on one machine: for each row width in `widths` and each path, the time
    of a gather of `count` rows is modelled as fixed[path][w] + count * per_row[path][w] (seconds), fitted from two
    batch sizes; between widths the per-byte cost and the fixed cost are interpolated on log(width)."""

    key: str
    widths: List[int]
    fixed: Dict[str, List[float]]
    per_row: Dict[str, List[float]]

    def predict(self, path: str, row_bytes: int, count: int) -> float:
        widths = self.widths
        w = min(max(row_bytes, widths[0]), widths[-1])
        upper = next(i for i, width in enumerate(widths) if width >= w)
        lower = max(upper - 1, 0)
        if widths[upper] == widths[lower]:
            t = 0.0
        else:
            t = (math.log(w) - math.log(widths[lower])) / (math.log(widths[upper]) - math.log(widths[lower]))
        per_byte = [self.per_row[path][i] / widths[i] for i in (lower, upper)]
        fixed = [self.fixed[path][i] for i in (lower, upper)]
        per_byte_here = per_byte[0] + t * (per_byte[1] - per_byte[0])
        fixed_here = fixed[0] + t * (fixed[1] - fixed[0])
        return fixed_here + count * row_bytes * per_byte_here

    def choose(self, row_bytes: int, count: int) -> str:
        """The path with the lowest predicted time (ties: the first of PATHS)."""
        return min((self.predict(path, row_bytes, count), i, path) for i, path in enumerate(PATHS)
                   if path in self.per_row)[2]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Calibration":
        calibration = cls(key=str(data["key"]), widths=[int(w) for w in data["widths"]],
                          fixed={p: [float(x) for x in v] for p, v in data["fixed"].items()},
                          per_row={p: [float(x) for x in v] for p, v in data["per_row"].items()})
        if (not calibration.widths or sorted(calibration.widths) != calibration.widths
                or set(calibration.fixed) != set(calibration.per_row) or not set(calibration.per_row) <= set(PATHS)
                or any(len(v) != len(calibration.widths) for v in (*calibration.fixed.values(),
                                                                     *calibration.per_row.values()))):
            raise ValueError("malformed unified gather calibration")
        return calibration


CALIBRATION_WIDTHS = (128, 512, 2052, 4096, 16384)
_calibrations: Dict[str, Calibration] = {}


def calibration_file() -> pathlib.Path:
    """Where calibrations are cached: $HECTORGEN_UNIFIED_CALIBRATION, else
    ${XDG_CACHE_HOME:-~/.cache}/hectorgen/unified_calibration.json (one entry per machine key)."""
    explicit = os.environ.get("HECTORGEN_UNIFIED_CALIBRATION")
    if explicit:
        return pathlib.Path(explicit)
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return cache / "hectorgen" / "unified_calibration.json"


def machine_key(device: torch.device) -> str:
    """What a calibration is valid for: the GPU, its PCI bus, the host's memory size and the CUDA/torch versions."""
    props = torch.cuda.get_device_properties(device)
    bus = getattr(props, "pci_bus_id", "?")
    try:
        host_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        host_memory = 0
    return f"{props.name}|bus {bus}|host {host_memory >> 30} GiB|cuda {torch.version.cuda}|torch {torch.__version__}"


def _load_calibrations(path: pathlib.Path) -> Dict[str, dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store_calibration(path: pathlib.Path, calibration: Calibration) -> None:
    entries = _load_calibrations(path)
    entries[calibration.key] = calibration.to_json()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".tmp{os.getpid()}")
        temporary.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
        temporary.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a calibration per process


def _calibration(device: torch.device) -> Calibration:
    key = machine_key(device)
    calibration = _calibrations.get(key)
    if calibration is None:
        entry = _load_calibrations(calibration_file()).get(key)
        if entry is not None:
            try:
                calibration = Calibration.from_json(entry)
            except (KeyError, TypeError, ValueError):
                calibration = None
        if calibration is None:
            calibration = calibrate(device)
        _calibrations[key] = calibration
    return calibration


def _time(fn, repeats: int) -> float:
    """Median seconds of fn() after one warm-up, synchronising around each run."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def calibrate(device=None, *, table_bytes: int = 2 << 30, batch_bytes: Tuple[int, int] = (4 << 20, 256 << 20),
              widths: Sequence[int] = CALIBRATION_WIDTHS, repeats: int = 3, store: bool = True,
              verbose: bool = True) -> Calibration:
    """Measures every gather path on this machine (random rows of a `table_bytes` unified table, for each row width
    and two batch sizes) and caches the result in calibration_file() (store=True); `gather(path="auto")` does this
    once per machine. A few seconds. The large batch gathers 1/8 of the table: random reads over PCIe get faster
    with the density of the rows read (sorted rows then share pages), and mini-batch inputs are of that order."""
    device = torch.device("cuda", _cuda_index(device))
    if verbose:
        print(f"hectorgen unified: calibrating the gather paths on {torch.cuda.get_device_name(device)} "
              f"(once; cached in {calibration_file()})", flush=True)
    widths = sorted(int(w) for w in widths)
    fixed: Dict[str, List[float]] = {path: [] for path in PATHS}
    per_row: Dict[str, List[float]] = {path: [] for path in PATHS}
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.cuda.device(device):
        memory = _plain(empty_unified(table_bytes, dtype=torch.uint8))
        for width in widths:
            rows = table_bytes // width
            table = UnifiedTensor(memory[: rows * width].view(rows, width))
            counts = [max(1, b // width) for b in batch_bytes]
            for path in PATHS:
                times = []
                for count in counts:
                    index = torch.randint(0, rows, (count,), device=device, generator=generator)
                    out = torch.empty((count, width), dtype=torch.uint8, device=device)
                    times.append(_time(lambda: gather(table, index, out=out, path=path, check=False), repeats))
                slope = max((times[1] - times[0]) / max(counts[1] - counts[0], 1), 1e-15)
                per_row[path].append(slope)
                fixed[path].append(max(times[0] - slope * counts[0], 0.0))
        check_gather_errors(device)
        del memory, table
    trim_pool()
    calibration = Calibration(key=machine_key(device), widths=widths, fixed=fixed, per_row=per_row)
    if store:
        _store_calibration(calibration_file(), calibration)
    _calibrations[calibration.key] = calibration
    return calibration
