"""Graph preprocessing runtime shared by the modules that hectorgen generates.

`preprocess(...)` builds, from a typed COO graph, the layouts the generated kernels read and returns them as a
dict of named tensors; `Graph` holds the same tensors as attributes. On CUDA tensors the work runs on the GPU
through the compiled extension (runtime/src/graph_preprocess.cu + runtime/torch/); `reference_preprocess(...)` is
the pure-PyTorch implementation of the same contract, used as the test oracle and as the CPU fallback.

Layouts and their result keys (int32 unless noted; p is an edge's position in the etype-sorted edge order):

  etype_sorted_coo        perm [E] (caller edge id at p), sorted_src, sorted_dst, sorted_etype [E],
                          etype_ptr [R+1] (relation r owns positions etype_ptr[r]:etype_ptr[r+1])
  csr_by_dst              in_row_ptr [N+1], in_col_src, in_col_eid (= p), in_col_etype [E];
                          a row lists the node's incoming edges ordered by (etype, p)
  csr_by_src              out_row_ptr [N+1], out_col_dst, out_col_eid, out_col_etype [E]; outgoing edges
  compact_src_etype       unique_src [U] (unique (src, etype) pairs ordered by (etype, src)),
                          unique_src_etype_ptr [R+1], edge_to_unique_src [E] (compact row of edge p)
  compact_dst_etype       unique_dst, unique_dst_etype_ptr, edge_to_unique_dst: the same for (dst, etype)
  inv_relation_in_degree  inv_relation_in_degree [E] float32: 1 / #edges with the same (dst, etype) as edge p
  ntype_ptr               ntype_ptr [T+1] (nodes must be sorted by ntype)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import warnings
from typing import Dict, Iterable, Mapping, Optional, Sequence

import torch

__all__ = [
    "LAYOUTS",
    "LAYOUT_KEYS",
    "Graph",
    "load_extension",
    "preprocess",
    "reference_preprocess",
]

LAYOUT_KEYS: Dict[str, tuple] = {
    "etype_sorted_coo": ("perm", "sorted_src", "sorted_dst", "sorted_etype", "etype_ptr"),
    "csr_by_dst": ("in_row_ptr", "in_col_src", "in_col_eid", "in_col_etype"),
    "csr_by_src": ("out_row_ptr", "out_col_dst", "out_col_eid", "out_col_etype"),
    "compact_src_etype": ("unique_src", "unique_src_etype_ptr", "edge_to_unique_src"),
    "compact_dst_etype": ("unique_dst", "unique_dst_etype_ptr", "edge_to_unique_dst"),
    "inv_relation_in_degree": ("inv_relation_in_degree",),
    "ntype_ptr": ("ntype_ptr",),
}
LAYOUTS = tuple(LAYOUT_KEYS)

_MAX_COUNT = 2**31 - 2  # offsets arrays have count + 1 int32 entries


def _default_layouts(ntype: Optional[torch.Tensor]) -> tuple:
    return tuple(name for name in LAYOUTS if name != "ntype_ptr" or ntype is not None)


def _check_layouts(layouts: Iterable[str]) -> frozenset:
    names = frozenset(layouts)
    unknown = sorted(names - set(LAYOUTS))
    if unknown:
        raise ValueError(f"unknown layout(s) {unknown}; known layouts: {', '.join(LAYOUTS)}")
    return names


# ---------------------------------------------------------------------------------------------------------------
# Reference implementation


def _offsets(sorted_or_any_keys: torch.Tensor, num_segments: int) -> torch.Tensor:
    """CSR offsets [num_segments + 1] of keys in [0, num_segments): a histogram and its cumulative sum."""
    counts = torch.bincount(sorted_or_any_keys, minlength=num_segments)
    offsets = torch.zeros(num_segments + 1, dtype=torch.int64, device=sorted_or_any_keys.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return offsets


def _check_range(name: str, t: torch.Tensor, bound: int) -> None:
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= bound):
        raise ValueError(f"{name} out of range [0, {bound})")


def reference_preprocess(
    src: torch.Tensor,
    dst: torch.Tensor,
    etype: torch.Tensor,
    num_nodes: int,
    num_etypes: int,
    ntype: Optional[torch.Tensor] = None,
    layouts: Optional[Sequence[str]] = None,
    num_ntypes: Optional[int] = None,
) -> Dict[str, torch.Tensor]:
    """Pure-PyTorch implementation of `preprocess` (any device; synchronises freely). Raises ValueError on invalid
    input. Written independently of the CUDA implementation: stable sorts, torch.unique and bincount."""
    layouts = _check_layouts(_default_layouts(ntype) if layouts is None else layouts)
    for name, t in (("src", src), ("dst", dst), ("etype", etype)):
        if t.dim() != 1 or t.numel() != src.numel() or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be a 1-D int32/int64 tensor of length {src.numel()}")
    if not (0 <= num_nodes <= _MAX_COUNT and 1 <= num_etypes <= _MAX_COUNT and src.numel() <= _MAX_COUNT):
        raise ValueError("num_nodes, num_etypes or the number of edges out of the supported int32 range")
    src, dst, etype = src.long(), dst.long(), etype.long()
    _check_range("src", src, num_nodes)
    _check_range("dst", dst, num_nodes)
    _check_range("etype", etype, num_etypes)

    num_edges = src.numel()
    device = src.device
    out: Dict[str, torch.Tensor] = {}

    def emit(key: str, value: torch.Tensor) -> None:
        out[key] = value.to(torch.int32)

    # Etype-sorted COO: a stable sort keeps the caller's order inside a relation.
    sorted_etype, perm = torch.sort(etype, stable=True)
    s_src, s_dst = src[perm], dst[perm]
    if "etype_sorted_coo" in layouts:
        emit("perm", perm)
        emit("sorted_src", s_src)
        emit("sorted_dst", s_dst)
        emit("sorted_etype", sorted_etype)
        emit("etype_ptr", _offsets(sorted_etype, num_etypes))

    positions = torch.arange(num_edges, dtype=torch.int64, device=device)
    for layout, prefix, row, col, col_key in (
        ("csr_by_dst", "in_", s_dst, s_src, "col_src"),
        ("csr_by_src", "out_", s_src, s_dst, "col_dst"),
    ):
        if layout not in layouts:
            continue
        # Lexicographic (row, etype, p) by successive stable sorts, least significant key first.
        order = positions[torch.argsort(sorted_etype[positions], stable=True)]
        order = order[torch.argsort(row[order], stable=True)]
        emit(prefix + "row_ptr", _offsets(row, num_nodes))
        emit(prefix + col_key, col[order])
        emit(prefix + "col_eid", order)
        emit(prefix + "col_etype", sorted_etype[order])

    for layout, name, node in (("compact_src_etype", "src", s_src), ("compact_dst_etype", "dst", s_dst)):
        if layout not in layouts:
            continue
        if num_edges == 0:
            unique_keys = torch.zeros(0, dtype=torch.int64, device=device)
            inverse = unique_keys
        else:
            # torch.unique sorts its keys, so pairs come out ordered by (etype, node).
            unique_keys, inverse = torch.unique(sorted_etype * num_nodes + node, sorted=True, return_inverse=True)
        unique_etype = unique_keys // max(num_nodes, 1)
        emit("unique_" + name, unique_keys - unique_etype * num_nodes)
        emit("unique_" + name + "_etype_ptr", _offsets(unique_etype, num_etypes))
        emit("edge_to_unique_" + name, inverse)

    if "inv_relation_in_degree" in layouts:
        if num_edges == 0:
            out["inv_relation_in_degree"] = torch.zeros(0, dtype=torch.float32, device=device)
        else:
            _, inverse, counts = torch.unique(
                sorted_etype * num_nodes + s_dst, sorted=True, return_inverse=True, return_counts=True
            )
            out["inv_relation_in_degree"] = torch.reciprocal(counts.to(torch.float32))[inverse]

    if "ntype_ptr" in layouts:
        if ntype is None:
            raise ValueError("layout 'ntype_ptr' needs the ntype tensor")
        if ntype.dim() != 1 or ntype.numel() != num_nodes:
            raise ValueError(f"ntype must be a 1-D tensor of length num_nodes={num_nodes}")
        ntype = ntype.long()
        if num_ntypes is None:
            num_ntypes = max(int(ntype.max()) + 1, 1) if num_nodes else 1
        _check_range("ntype", ntype, num_ntypes)
        if num_nodes > 1 and bool((ntype[1:] < ntype[:-1]).any()):
            raise ValueError("nodes are not sorted by ntype (ntype must be non-decreasing)")
        emit("ntype_ptr", _offsets(ntype, num_ntypes))
    return out


# ---------------------------------------------------------------------------------------------------------------
# CUDA extension


_EXTENSION = None
_RUNTIME_ROOT = pathlib.Path(__file__).resolve().parents[2]  # runtime/


def extension_sources() -> list:
    """The C++/CUDA sources of the extension (for torch.utils.cpp_extension)."""
    return [
        str(_RUNTIME_ROOT / "src" / "graph_preprocess.cu"),
        str(_RUNTIME_ROOT / "torch" / "graph_preprocess_torch.cpp"),
        str(_RUNTIME_ROOT / "torch" / "python_module.cpp"),
    ]


def extension_include_dirs() -> list:
    return [str(_RUNTIME_ROOT / "include"), str(_RUNTIME_ROOT / "torch")]


def load_extension(verbose: bool = False):
    """Returns the compiled extension module: `hectorgen_runtime._C` when it was built ahead of time, else a JIT
    build of the sources with torch.utils.cpp_extension.load (needs nvcc; cached in $HECTORGEN_RUNTIME_BUILD_DIR
    or PyTorch's extension directory, rebuilt only when a source changes)."""
    global _EXTENSION
    if _EXTENSION is not None:
        return _EXTENSION
    try:
        from . import _C  # type: ignore[attr-defined]

        _EXTENSION = _C
        return _EXTENSION
    except ImportError:
        pass
    from torch.utils.cpp_extension import load

    build_dir = os.environ.get("HECTORGEN_RUNTIME_BUILD_DIR")
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    _EXTENSION = load(
        name="hectorgen_runtime_C",
        sources=extension_sources(),
        extra_include_paths=extension_include_dirs(),
        extra_cflags=["-O2"],
        extra_cuda_cflags=["-O2"],
        build_directory=build_dir,
        verbose=verbose,
    )
    return _EXTENSION


def preprocess(
    src: torch.Tensor,
    dst: torch.Tensor,
    etype: torch.Tensor,
    num_nodes: int,
    num_etypes: int,
    ntype: Optional[torch.Tensor] = None,
    layouts: Optional[Sequence[str]] = None,
    num_ntypes: Optional[int] = None,
    validate: bool = True,
    backend: str = "auto",
) -> Dict[str, torch.Tensor]:
    """Builds the requested layouts (default: all that apply) and returns them by key; see the module docstring.

    backend: "cuda" (the extension; CUDA tensors), "reference" (pure PyTorch), or "auto": "cuda" for CUDA tensors
    when the extension loads (with a warning and the reference otherwise), "reference" for CPU tensors.
    """
    layouts = list(_default_layouts(ntype) if layouts is None else layouts)
    if backend not in ("auto", "cuda", "reference"):
        raise ValueError(f"backend must be 'auto', 'cuda' or 'reference', got {backend!r}")
    if backend == "auto":
        backend = "reference"
        if src.is_cuda:
            try:
                load_extension()
                backend = "cuda"
            except Exception as error:  # noqa: BLE001 - any build/load failure falls back
                warnings.warn(f"hectorgen_runtime: CUDA extension unavailable ({error}); using the reference")
    if backend == "reference":
        return reference_preprocess(src, dst, etype, num_nodes, num_etypes, ntype, layouts, num_ntypes)
    return load_extension().preprocess(
        src, dst, etype, num_nodes, num_etypes, ntype, layouts, -1 if num_ntypes is None else num_ntypes, validate
    )


# ---------------------------------------------------------------------------------------------------------------
# Graph


@dataclasses.dataclass
class Graph:
    """A preprocessed graph: the counts plus every layout tensor that was built (None for layouts not built)."""

    num_nodes: int
    num_edges: int
    num_etypes: int
    num_ntypes: Optional[int] = None
    # etype_sorted_coo
    perm: Optional[torch.Tensor] = None
    sorted_src: Optional[torch.Tensor] = None
    sorted_dst: Optional[torch.Tensor] = None
    sorted_etype: Optional[torch.Tensor] = None
    etype_ptr: Optional[torch.Tensor] = None
    # csr_by_dst
    in_row_ptr: Optional[torch.Tensor] = None
    in_col_src: Optional[torch.Tensor] = None
    in_col_eid: Optional[torch.Tensor] = None
    in_col_etype: Optional[torch.Tensor] = None
    # csr_by_src
    out_row_ptr: Optional[torch.Tensor] = None
    out_col_dst: Optional[torch.Tensor] = None
    out_col_eid: Optional[torch.Tensor] = None
    out_col_etype: Optional[torch.Tensor] = None
    # compact_src_etype
    unique_src: Optional[torch.Tensor] = None
    unique_src_etype_ptr: Optional[torch.Tensor] = None
    edge_to_unique_src: Optional[torch.Tensor] = None
    # compact_dst_etype
    unique_dst: Optional[torch.Tensor] = None
    unique_dst_etype_ptr: Optional[torch.Tensor] = None
    edge_to_unique_dst: Optional[torch.Tensor] = None
    # inv_relation_in_degree
    inv_relation_in_degree: Optional[torch.Tensor] = None
    # ntype_ptr
    ntype_ptr: Optional[torch.Tensor] = None

    @classmethod
    def from_tensors(
        cls, tensors: Mapping[str, torch.Tensor], num_nodes: int, num_edges: int, num_etypes: int
    ) -> "Graph":
        """Wraps the dict returned by preprocess / reference_preprocess."""
        unknown = set(tensors) - _TENSOR_FIELDS
        if unknown:
            raise ValueError(f"unknown layout tensor(s): {sorted(unknown)}")
        ntype_ptr = tensors.get("ntype_ptr")
        num_ntypes = None if ntype_ptr is None else ntype_ptr.numel() - 1
        return cls(num_nodes=num_nodes, num_edges=num_edges, num_etypes=num_etypes, num_ntypes=num_ntypes, **tensors)

    @classmethod
    def from_coo(
        cls,
        src: torch.Tensor,
        dst: torch.Tensor,
        etype: torch.Tensor,
        num_nodes: int,
        num_etypes: int,
        ntype: Optional[torch.Tensor] = None,
        layouts: Optional[Sequence[str]] = None,
        num_ntypes: Optional[int] = None,
        backend: str = "auto",
    ) -> "Graph":
        """Preprocesses a typed COO graph (see `preprocess`) into a Graph."""
        tensors = preprocess(src, dst, etype, num_nodes, num_etypes, ntype, layouts, num_ntypes, backend=backend)
        return cls.from_tensors(tensors, num_nodes, src.numel(), num_etypes)

    def tensors(self) -> Dict[str, torch.Tensor]:
        """The layout tensors that were built, by key."""
        return {name: getattr(self, name) for name in sorted(_TENSOR_FIELDS) if getattr(self, name) is not None}

    def to(self, device) -> "Graph":
        moved = {name: t.to(device) for name, t in self.tensors().items()}
        return dataclasses.replace(self, **moved)

    @property
    def num_unique_src(self) -> Optional[int]:
        return None if self.unique_src is None else self.unique_src.numel()

    @property
    def num_unique_dst(self) -> Optional[int]:
        return None if self.unique_dst is None else self.unique_dst.numel()


_TENSOR_FIELDS = frozenset(key for keys in LAYOUT_KEYS.values() for key in keys)
