"""Graph preprocessing runtime shared by the modules that hectorgen generates.

Generated modules call `prepare_graph(...)`, which builds, once per graph and on the GPU, exactly the layouts their
kernels read and returns them as a `Graph`; they pass `Graph.arrays(...)` to their ops. They check at import that
this runtime is compatible with the one they were generated for (`require_version`, semantic versioning: same major
version, at least the minor version they record; the version lives in hectorgen/runtime_version.h).

`preprocess(...)` is the lower level: the layouts as a dict of named tensors. On CUDA tensors the work runs on the
GPU through the compiled extension `hectorgen_runtime._C` (runtime/src/graph_preprocess.cu + runtime/torch/);
`reference_preprocess(...)` is the pure-PyTorch implementation of the same contract, used as the test oracle and as
the CPU fallback.

Layouts and their result keys (int32 unless noted; p is an edge's position in the etype-sorted edge order):

  etype_sorted_coo        perm [E] (caller edge id at p), sorted_src, sorted_dst, sorted_etype [E],
                          etype_ptr [R+1] (relation r owns positions etype_ptr[r]:etype_ptr[r+1]); edges are
                          ordered by (etype, dst, caller's order)
  csr_by_dst              in_row_ptr [N+1], in_col_src, in_col_eid (= p), in_col_etype [E];
                          a row lists the node's incoming edges ordered by (etype, p)
  csr_by_src              out_row_ptr [N+1], out_col_dst, out_col_eid, out_col_etype [E]; outgoing edges
  compact_src_etype       unique_src [U] (unique (src, etype) pairs ordered by (etype, src)),
                          unique_src_etype_ptr [R+1] (relation r owns pair rows ptr[r]:ptr[r+1]),
                          edge_to_unique_src [E] (pair row k of edge p);
                          and the inverses, for gather-only (deterministic) sums in the backward:
                          unique_src_edge_ptr [U+1], unique_src_edge_eid [E]: pair -> edges CSR, the edges p with
                            edge_to_unique_src[p] == k are unique_src_edge_eid[ptr[k]:ptr[k+1]], ascending;
                          unique_src_node_ptr [N+1], unique_src_node_pair [U]: node -> pairs CSR, the pair rows k
                            with unique_src[k] == v are unique_src_node_pair[ptr[v]:ptr[v+1]], ascending (by etype);
                          and per relation (see compact_relations below):
                          unique_src_relation_pairs [R]: the unique (src, r) pairs of relation r, whether or not it
                            is compacted (the rows it has when compacted);
                          src_relation_compacted [R] bool: which relations are compacted
  compact_dst_etype       unique_dst, unique_dst_etype_ptr, edge_to_unique_dst, unique_dst_edge_ptr,
                          unique_dst_edge_eid, unique_dst_node_ptr, unique_dst_node_pair, unique_dst_relation_pairs,
                          dst_relation_compacted: the same for (dst, etype)
                          (unique_dst_edge_eid is the identity: edges are ordered by (etype, dst))
  csr_by_dst_pairs        in_col_unique_src [E]: the pair row of CSR position i, edge_to_unique_src[in_col_eid[i]]
                          (runtime 1.5; needs csr_by_dst and compact_src_etype: a node's incoming edges have
                          scattered positions p, and node kernels read their pairs in CSR order instead)
  inv_relation_in_degree  inv_relation_in_degree [E] float32: 1 / #edges with the same (dst, etype) as edge p
  in_col_inv_relation_in_degree
                          in_col_inv_relation_in_degree [E] float32: inv_relation_in_degree of CSR position i,
                          inv_relation_in_degree[in_col_eid[i]] (runtime 1.6; needs csr_by_dst and
                          inv_relation_in_degree: node kernels read a node's in-edges' norms in CSR order)
  ntype_ptr               ntype_ptr [T+1] (nodes must be sorted by ntype), ntype [N] (the node types as int32)

With gemm_tile (the row tile of the generated GEMM kernels), the row-tile offsets of the segments: segment s owns
tiles tile_ptr[s]:tile_ptr[s+1], ceil(rows of s / gemm_tile) of them:

  etype_sorted_coo        etype_tile_ptr [R+1]
  compact_src_etype       unique_src_tile_ptr [R+1] (the segments of unique_src_etype_ptr: pair rows per relation)
  compact_dst_etype       unique_dst_tile_ptr [R+1]
  ntype_ptr               ntype_tile_ptr [T+1]

`Graph.num_unique_src` / `num_unique_dst` (U) are host ints (the length of unique_src / unique_dst, read back once
when the graph is prepared), so launchers size pair buffers without a synchronisation per call.

Per-relation compaction (runtime 1.3). Compaction pays where a relation repeats its (node, relation) pairs; where
unique pairs / edges is close to 1 the indirection buys nothing. `compact_relations` (of preprocess, prepare_graph,
reference_preprocess and Graph.from_coo) says which relations the compact layouts compact:

  None            every relation (the layouts of runtime 1.2, bit for bit)
  theta (float)   relation r iff it has no edges or unique_pairs_r / edges_r <= theta (an IEEE double division);
                  theta >= 0; 0 compacts only the relations without edges, >= 1 every relation
  mask            a bool sequence or tensor [R]: exactly the relations marked True

An uncompacted relation keeps one pair row per edge, its rows ordered by (node, p): edge_to_unique_* is then a
bijection between its edges and its rows, and every array keeps its meaning, so kernels written for the compact
layout run unchanged on any mix. The choice applies to both endpoints' layouts; the decision is made per layout from
that endpoint's pairs. `Graph.relation_edges`, `relation_unique_src` / `relation_unique_dst` and
`compacted_relations` / `compacted_dst_relations` give the statistics and the decision as host tuples [R].
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import pathlib
import warnings
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _extensions

__all__ = [
    "LAYOUTS",
    "LAYOUT_KEYS",
    "TILE_KEYS",
    "VERSION",
    "Graph",
    "load_extension",
    "prepare_graph",
    "preprocess",
    "reference_preprocess",
    "require_version",
]

# This runtime's version, (MAJOR, MINOR, PATCH); it must equal hectorgen/runtime_version.h (a test checks).
VERSION = (1, 7, 0)
__version__ = "1.7.0"

LAYOUT_KEYS: Dict[str, tuple] = {
    "etype_sorted_coo": ("perm", "sorted_src", "sorted_dst", "sorted_etype", "etype_ptr"),
    "csr_by_dst": ("in_row_ptr", "in_col_src", "in_col_eid", "in_col_etype"),
    "csr_by_src": ("out_row_ptr", "out_col_dst", "out_col_eid", "out_col_etype"),
    "compact_src_etype": ("unique_src", "unique_src_etype_ptr", "edge_to_unique_src", "unique_src_edge_ptr",
                          "unique_src_edge_eid", "unique_src_node_ptr", "unique_src_node_pair",
                          "unique_src_relation_pairs", "src_relation_compacted"),
    "compact_dst_etype": ("unique_dst", "unique_dst_etype_ptr", "edge_to_unique_dst", "unique_dst_edge_ptr",
                          "unique_dst_edge_eid", "unique_dst_node_ptr", "unique_dst_node_pair",
                          "unique_dst_relation_pairs", "dst_relation_compacted"),
    "inv_relation_in_degree": ("inv_relation_in_degree",),
    "ntype_ptr": ("ntype_ptr", "ntype"),
    "csr_by_dst_pairs": ("in_col_unique_src",),
    "in_col_inv_relation_in_degree": ("in_col_inv_relation_in_degree",),
}
LAYOUTS = tuple(LAYOUT_KEYS)
# The extra key of a layout when a gemm_tile is given: the row-tile offsets of its segments.
TILE_KEYS: Dict[str, str] = {
    "etype_sorted_coo": "etype_tile_ptr",
    "compact_src_etype": "unique_src_tile_ptr",
    "compact_dst_etype": "unique_dst_tile_ptr",
    "ntype_ptr": "ntype_tile_ptr",
}
# Which layout provides each key.
_KEY_LAYOUT: Dict[str, str] = {
    **{key: layout for layout, keys in LAYOUT_KEYS.items() for key in keys},
    **{key: layout for layout, key in TILE_KEYS.items()},
}


# ---------------------------------------------------------------------------------------------------------------
# Versions


def require_version(required: str, requester: str = "this module") -> None:
    """Checks that this runtime can serve code generated for runtime version `required` ("MAJOR.MINOR"): it must
    have the same major version and at least that minor version. Raises RuntimeError naming both versions (and
    `requester`, e.g. "rgat (generated by hectorgen 0.1.0 from specs/rgat.yaml)") otherwise."""
    try:
        major, minor = (int(part) for part in str(required).split("."))
    except ValueError:
        raise ValueError(f"{requester}: malformed hectorgen runtime version {required!r}, expected 'MAJOR.MINOR'") \
            from None
    if major == VERSION[0] and minor <= VERSION[1]:
        return
    if (major, minor) > VERSION[:2]:
        advice = f"install a hectorgen runtime {major}.x with x >= {minor} (runtime/README.md)"
    else:
        advice = (f"regenerate it with a hectorgen that targets runtime {VERSION[0]}.x, or install a hectorgen "
                  f"runtime {major}.x with x >= {minor} (runtime/README.md)")
    raise RuntimeError(
        f"{requester} needs hectorgen runtime {major}.{minor} (any {major}.x with x >= {minor}), but the installed "
        f"hectorgen_runtime is {__version__} ({pathlib.Path(__file__).resolve().parent}): {advice}"
    )

_MAX_COUNT = 2**31 - 2  # offsets arrays have count + 1 int32 entries


def _default_layouts(ntype: Optional[torch.Tensor]) -> tuple:
    return tuple(name for name in LAYOUTS if name != "ntype_ptr" or ntype is not None)


def _check_layouts(layouts: Iterable[str]) -> frozenset:
    names = frozenset(layouts)
    unknown = sorted(names - set(LAYOUTS))
    if unknown:
        raise ValueError(f"unknown layout(s) {unknown}; known layouts: {', '.join(LAYOUTS)}")
    if "csr_by_dst_pairs" in names and not {"csr_by_dst", "compact_src_etype"} <= names:
        raise ValueError("layout 'csr_by_dst_pairs' joins 'csr_by_dst' and 'compact_src_etype': ask for both with it")
    if "in_col_inv_relation_in_degree" in names and not {"csr_by_dst", "inv_relation_in_degree"} <= names:
        raise ValueError("layout 'in_col_inv_relation_in_degree' joins 'csr_by_dst' and 'inv_relation_in_degree': "
                         "ask for both with it")
    return names


# ---------------------------------------------------------------------------------------------------------------
# Reference implementation


def _offsets(sorted_or_any_keys: torch.Tensor, num_segments: int) -> torch.Tensor:
    """CSR offsets [num_segments + 1] of keys in [0, num_segments): a histogram and its cumulative sum."""
    counts = torch.bincount(sorted_or_any_keys, minlength=num_segments)
    offsets = torch.zeros(num_segments + 1, dtype=torch.int64, device=sorted_or_any_keys.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return offsets


def _tile_offsets(segment_ptr: torch.Tensor, tile: int) -> torch.Tensor:
    """Row-tile offsets [S+1] of segment offsets [S+1]: segment s is cut into ceil(rows / tile) tiles."""
    tiles = torch.div(segment_ptr[1:] - segment_ptr[:-1] + (tile - 1), tile, rounding_mode="floor")
    offsets = torch.zeros(segment_ptr.numel(), dtype=torch.int64, device=segment_ptr.device)
    offsets[1:] = torch.cumsum(tiles, 0)
    return offsets


def _check_gemm_tile(gemm_tile: Optional[int]) -> int:
    """0 for "no tile offsets", else the tile as a positive int."""
    if gemm_tile is None:
        return 0
    if isinstance(gemm_tile, bool) or not isinstance(gemm_tile, int) or not 0 <= gemm_tile <= _MAX_COUNT:
        raise ValueError(f"gemm_tile must be None (no tile offsets) or an int in [0, {_MAX_COUNT}], got {gemm_tile!r}")
    return gemm_tile


CompactRelations = Union[None, float, Sequence[bool], torch.Tensor]


def _compact_policy(compact_relations: CompactRelations, num_etypes: int) -> Tuple[Optional[float],
                                                                                  Optional[torch.Tensor]]:
    """(threshold, mask) of a compact_relations argument, at most one of them not None: (None, None) for None (every
    relation compacted), (theta, None) for a number theta >= 0, (None, bool tensor [R]) for a mask. ValueError
    otherwise."""
    if compact_relations is None:
        return None, None
    if isinstance(compact_relations, numbers.Real) and not isinstance(compact_relations, bool):
        threshold = float(compact_relations)
        if math.isnan(threshold) or threshold < 0:
            raise ValueError("compact_relations: a threshold on unique pairs / edges must be a number >= 0 (0 "
                             f"compacts only relations without edges, >= 1 every relation), got {compact_relations!r}")
        return threshold, None
    mask = compact_relations
    if not isinstance(mask, torch.Tensor):
        try:
            mask = torch.tensor(list(mask))
        except (TypeError, ValueError, RuntimeError):
            mask = None
    if mask is None or mask.dtype != torch.bool or mask.dim() != 1 or mask.numel() != num_etypes:
        got = (f"a {mask.dtype} tensor of shape {list(mask.shape)}" if isinstance(mask, torch.Tensor)
               else repr(compact_relations))
        raise ValueError("compact_relations must be None (every relation compacted), a threshold >= 0 on unique "
                         f"pairs / edges, or {num_etypes} bools (one per relation); got {got}")
    return None, mask


def _chosen_relations(threshold: Optional[float], mask: Optional[torch.Tensor], relation_pairs: torch.Tensor,
                      relation_edges: torch.Tensor) -> torch.Tensor:
    """The relations [R] (bool) that a policy compacts, given each relation's unique pairs and edges."""
    if mask is not None:
        return mask.to(relation_pairs.device).clone()
    if threshold is None:
        return torch.ones(relation_pairs.numel(), dtype=torch.bool, device=relation_pairs.device)
    # An IEEE double division, like compacts_relation in hectorgen/compact_policy.h; 0 / 0 (no edges) is NaN, so the
    # empty relations are taken by the first term.
    return (relation_edges == 0) | (relation_pairs.double() / relation_edges.double() <= threshold)


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
    gemm_tile: Optional[int] = None,
    compact_relations: CompactRelations = None,
) -> Dict[str, torch.Tensor]:
    """Pure-PyTorch implementation of `preprocess` (any device; synchronises freely). Raises ValueError on invalid
    input. Written independently of the CUDA implementation: stable sorts, torch.unique and bincount."""
    layouts = _check_layouts(_default_layouts(ntype) if layouts is None else layouts)
    gemm_tile = _check_gemm_tile(gemm_tile)
    threshold, mask = _compact_policy(compact_relations, num_etypes)
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

    # Etype-sorted COO, ordered by (etype, dst): a node's incoming edges of one relation are adjacent (the native
    # path sorts the same way); a stable sort keeps the caller's order among equal keys.
    perm = torch.sort(etype * max(num_nodes, 1) + dst, stable=True).indices
    sorted_etype = etype[perm]
    s_src, s_dst = src[perm], dst[perm]
    if "etype_sorted_coo" in layouts:
        emit("perm", perm)
        emit("sorted_src", s_src)
        emit("sorted_dst", s_dst)
        emit("sorted_etype", sorted_etype)
        etype_ptr = _offsets(sorted_etype, num_etypes)
        emit("etype_ptr", etype_ptr)
        if gemm_tile:
            emit("etype_tile_ptr", _tile_offsets(etype_ptr, gemm_tile))

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
        keys = sorted_etype * num_nodes + node
        # Per relation: its edges, its unique (node, etype) pairs, and whether the policy compacts it.
        relation_edges = torch.bincount(sorted_etype, minlength=num_etypes)
        relation_pairs = torch.bincount(torch.unique(keys) // max(num_nodes, 1), minlength=num_etypes)
        compacted = _chosen_relations(threshold, mask, relation_pairs, relation_edges)
        emit("unique_" + name + "_relation_pairs", relation_pairs)
        out[name + "_relation_compacted"] = compacted
        if num_edges == 0:
            unique_keys = torch.zeros(0, dtype=torch.int64, device=device)
            inverse = unique_keys
        elif bool(compacted.all()):
            # torch.unique sorts its keys, so pairs come out ordered by (etype, node).
            unique_keys, inverse = torch.unique(keys, sorted=True, return_inverse=True)
        else:
            # A second key column keeps an uncompacted relation's edges apart: -1 on the edges of compacted relations,
            # the position p on the others, whose pairs are then one per edge, ordered by (etype, node, p).
            positions = torch.arange(num_edges, device=device)
            apart = torch.where(compacted[sorted_etype], torch.full_like(positions, -1), positions)
            rows, inverse = torch.unique(torch.stack([keys, apart], 1), dim=0, sorted=True, return_inverse=True)
            unique_keys = rows[:, 0]
        unique_etype = unique_keys // max(num_nodes, 1)
        unique_node = unique_keys - unique_etype * num_nodes
        unique_etype_ptr = _offsets(unique_etype, num_etypes)
        emit("unique_" + name, unique_node)
        emit("unique_" + name + "_etype_ptr", unique_etype_ptr)
        emit("edge_to_unique_" + name, inverse)
        # The inverses as CSRs: a stable argsort by pair (by node) keeps positions (pair rows) ascending inside a
        # group, and the group offsets are a histogram's cumulative sum.
        emit("unique_" + name + "_edge_ptr", _offsets(inverse, unique_keys.numel()))
        emit("unique_" + name + "_edge_eid", torch.argsort(inverse, stable=True))
        emit("unique_" + name + "_node_ptr", _offsets(unique_node, num_nodes))
        emit("unique_" + name + "_node_pair", torch.argsort(unique_node, stable=True))
        if gemm_tile:
            emit("unique_" + name + "_tile_ptr", _tile_offsets(unique_etype_ptr, gemm_tile))

    if "csr_by_dst_pairs" in layouts:
        emit("in_col_unique_src", out["edge_to_unique_src"].long()[out["in_col_eid"].long()])

    if "inv_relation_in_degree" in layouts:
        if num_edges == 0:
            out["inv_relation_in_degree"] = torch.zeros(0, dtype=torch.float32, device=device)
        else:
            _, inverse, counts = torch.unique(
                sorted_etype * num_nodes + s_dst, sorted=True, return_inverse=True, return_counts=True
            )
            out["inv_relation_in_degree"] = torch.reciprocal(counts.to(torch.float32))[inverse]

    if "in_col_inv_relation_in_degree" in layouts:
        out["in_col_inv_relation_in_degree"] = out["inv_relation_in_degree"][out["in_col_eid"].long()]

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
        ntype_ptr = _offsets(ntype, num_ntypes)
        emit("ntype_ptr", ntype_ptr)
        emit("ntype", ntype)
        if gemm_tile:
            emit("ntype_tile_ptr", _tile_offsets(ntype_ptr, gemm_tile))
    return out


# ---------------------------------------------------------------------------------------------------------------
# CUDA extension


_EXTENSION = None
def extension_sources() -> list:
    """The C++/CUDA sources of the extension (for torch.utils.cpp_extension), from a source checkout."""
    return _extensions.sources("_C")


def extension_include_dirs() -> list:
    return _extensions.include_dirs("_C")


def load_extension(verbose: bool = False):
    """Returns the compiled extension module: `hectorgen_runtime._C` when it was built ahead of time (pip install,
    CMake install, or setup.py build_ext --inplace), else, in a source checkout, a JIT build of the sources with
    torch.utils.cpp_extension.load (needs nvcc and ninja; cached in $HECTORGEN_RUNTIME_BUILD_DIR or PyTorch's
    extension directory, rebuilt only when a source changes). Raises ImportError if neither works."""
    global _EXTENSION
    if _EXTENSION is None:
        _EXTENSION = _extensions.load_compiled("_C", jit_name="hectorgen_runtime_C", sources=extension_sources(),
                                               include_dirs=extension_include_dirs(), cuda_cflags=["-O2"],
                                               verbose=verbose)
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
    gemm_tile: Optional[int] = None,
    compact_relations: CompactRelations = None,
) -> Dict[str, torch.Tensor]:
    """Builds the requested layouts (default: all that apply) and returns them by key; see the module docstring.

    backend: "cuda" (the extension; CUDA tensors), "reference" (pure PyTorch), or "auto": "cuda" for CUDA tensors
    when the extension loads (with a warning and the reference otherwise), "reference" for CPU tensors.
    gemm_tile: also build the row-tile offsets of the segments for GEMM kernels with this row tile.
    compact_relations: which relations the compact layouts compact (module docstring): None (all), a threshold on
    unique pairs / edges, or a bool mask [R]. The CUDA path decides on the device, without a synchronisation.
    """
    layouts = list(_default_layouts(ntype) if layouts is None else layouts)
    gemm_tile = _check_gemm_tile(gemm_tile)
    threshold, mask = _compact_policy(compact_relations, int(num_etypes))
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
        return reference_preprocess(src, dst, etype, num_nodes, num_etypes, ntype, layouts, num_ntypes, gemm_tile,
                                    compact_relations=compact_relations)
    return load_extension().preprocess(
        src, dst, etype, num_nodes, num_etypes, ntype, layouts, -1 if num_ntypes is None else num_ntypes, validate,
        gemm_tile, compact_threshold=-1.0 if threshold is None else threshold, compact_mask=mask,
    )


def prepare_graph(
    src: torch.Tensor,
    dst: torch.Tensor,
    etype: torch.Tensor,
    num_nodes: int,
    num_etypes: int,
    *,
    layouts: Sequence[str],
    ntype: Optional[torch.Tensor] = None,
    num_ntypes: Optional[int] = None,
    gemm_tile: Optional[int] = None,
    backend: str = "cuda",
    caller: str = "prepare_graph",
    compact_relations: CompactRelations = None,
) -> "Graph":
    """Builds exactly `layouts` (and, with gemm_tile, their tile offsets) for a generated module's kernels, once per
    graph, and returns them as a Graph (what generated `<model>.prepare_graph` does).

    src, dst, etype: integer tensors [E], a typed COO graph in any edge order, on the GPU (CPU tensors only with
    backend="reference"). ntype: [num_nodes] node types with the nodes sorted by type; needed (and only read) when
    layouts has "ntype_ptr". num_ntypes: the number of node types; derived as max(ntype) + 1 when needed and not
    given (one host synchronisation), else 1. backend: as for `preprocess`, but "cuda" by default: the compiled
    extension, or an ImportError saying why it is unavailable (not a silent fallback). The work is queued on the
    current CUDA stream; validation reads back one error word (one host synchronisation per graph, none per forward
    call). `caller` prefixes error messages. compact_relations: which relations the compact layouts compact (None:
    all; a threshold on unique pairs / edges; a bool mask [R]; see the module docstring); the statistics and the
    decision are on the Graph as host tuples (relation_edges, relation_unique_src, compacted_relations, ...), read
    back once here with the pair counts, never per forward call.
    """
    _check_layouts(layouts)
    if backend != "reference" and not (src.is_cuda and dst.is_cuda and etype.is_cuda):
        raise ValueError(f"{caller}: src, dst and etype must be CUDA tensors (the generated kernels run on the GPU), "
                         f"got {src.device}, {dst.device}, {etype.device}")
    needs_ntype = "ntype_ptr" in layouts
    if needs_ntype and ntype is None:
        raise ValueError(f"{caller}: this model needs node types (layout 'ntype_ptr'): pass ntype, a [num_nodes] "
                         "tensor with the nodes sorted by type, and num_ntypes")
    num_nodes, num_etypes = int(num_nodes), int(num_etypes)
    try:
        _compact_policy(compact_relations, num_etypes)
    except ValueError as error:
        raise ValueError(f"{caller}: {error}") from None
    tensors = preprocess(src, dst, etype, num_nodes, num_etypes, ntype if needs_ntype else None, list(layouts),
                         None if num_ntypes is None else int(num_ntypes), backend=backend, gemm_tile=gemm_tile,
                         compact_relations=compact_relations)
    graph = Graph.from_tensors(tensors, num_nodes, src.numel(), num_etypes, layouts=layouts, gemm_tile=gemm_tile)
    if graph.num_ntypes is None:
        graph.num_ntypes = 1 if num_ntypes is None else int(num_ntypes)
    return graph


# ---------------------------------------------------------------------------------------------------------------
# Graph


@dataclasses.dataclass
class Graph:
    """A preprocessed graph: the counts, which layouts were built (and for which GEMM row tile), and every layout
    tensor that was built (None for the others). Generated modules read it through `arrays`."""

    num_nodes: int
    num_edges: int
    num_etypes: int
    num_ntypes: Optional[int] = None
    layouts: frozenset = frozenset()
    gemm_tile: Optional[int] = None  # the row tile of the *_tile_ptr arrays, None if not built
    # Per relation r, host tuples [R] read back once when the graph is prepared (None without compact_src_etype /
    # compact_dst_etype): its edges; its unique (src, r) / (dst, r) pairs; whether that compact layout compacts it.
    relation_edges: Optional[tuple] = None
    relation_unique_src: Optional[tuple] = None
    compacted_relations: Optional[tuple] = None
    relation_unique_dst: Optional[tuple] = None
    compacted_dst_relations: Optional[tuple] = None
    # etype_sorted_coo
    perm: Optional[torch.Tensor] = None
    sorted_src: Optional[torch.Tensor] = None
    sorted_dst: Optional[torch.Tensor] = None
    sorted_etype: Optional[torch.Tensor] = None
    etype_ptr: Optional[torch.Tensor] = None
    etype_tile_ptr: Optional[torch.Tensor] = None
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
    unique_src_edge_ptr: Optional[torch.Tensor] = None
    unique_src_edge_eid: Optional[torch.Tensor] = None
    unique_src_node_ptr: Optional[torch.Tensor] = None
    unique_src_node_pair: Optional[torch.Tensor] = None
    unique_src_relation_pairs: Optional[torch.Tensor] = None
    src_relation_compacted: Optional[torch.Tensor] = None
    unique_src_tile_ptr: Optional[torch.Tensor] = None
    # compact_dst_etype
    unique_dst: Optional[torch.Tensor] = None
    unique_dst_etype_ptr: Optional[torch.Tensor] = None
    edge_to_unique_dst: Optional[torch.Tensor] = None
    unique_dst_edge_ptr: Optional[torch.Tensor] = None
    unique_dst_edge_eid: Optional[torch.Tensor] = None
    unique_dst_node_ptr: Optional[torch.Tensor] = None
    unique_dst_node_pair: Optional[torch.Tensor] = None
    unique_dst_relation_pairs: Optional[torch.Tensor] = None
    dst_relation_compacted: Optional[torch.Tensor] = None
    unique_dst_tile_ptr: Optional[torch.Tensor] = None
    # csr_by_dst_pairs
    in_col_unique_src: Optional[torch.Tensor] = None
    # inv_relation_in_degree
    inv_relation_in_degree: Optional[torch.Tensor] = None
    # in_col_inv_relation_in_degree
    in_col_inv_relation_in_degree: Optional[torch.Tensor] = None
    # ntype_ptr
    ntype_ptr: Optional[torch.Tensor] = None
    ntype: Optional[torch.Tensor] = None
    ntype_tile_ptr: Optional[torch.Tensor] = None

    @classmethod
    def from_tensors(
        cls,
        tensors: Mapping[str, torch.Tensor],
        num_nodes: int,
        num_edges: int,
        num_etypes: int,
        layouts: Optional[Iterable[str]] = None,
        gemm_tile: Optional[int] = None,
    ) -> "Graph":
        """Wraps the dict returned by preprocess / reference_preprocess. layouts: the layouts it was asked for
        (default: those whose tensors are all present); gemm_tile: the one it was asked for, if any. Reads the
        per-relation statistics back to the host (one synchronisation, see _relation_statistics)."""
        unknown = set(tensors) - _TENSOR_FIELDS
        if unknown:
            raise ValueError(f"unknown layout tensor(s): {sorted(unknown)}")
        if layouts is None:
            layouts = [name for name, keys in LAYOUT_KEYS.items() if all(key in tensors for key in keys)]
        ntype_ptr = tensors.get("ntype_ptr")
        num_ntypes = None if ntype_ptr is None else ntype_ptr.numel() - 1
        return cls(num_nodes=num_nodes, num_edges=num_edges, num_etypes=num_etypes, num_ntypes=num_ntypes,
                   layouts=_check_layouts(layouts), gemm_tile=_check_gemm_tile(gemm_tile) or None,
                   **_relation_statistics(tensors), **tensors)

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
        gemm_tile: Optional[int] = None,
        compact_relations: CompactRelations = None,
    ) -> "Graph":
        """Preprocesses a typed COO graph (see `preprocess`) into a Graph."""
        layouts = list(_default_layouts(ntype) if layouts is None else layouts)
        tensors = preprocess(src, dst, etype, num_nodes, num_etypes, ntype, layouts, num_ntypes, backend=backend,
                             gemm_tile=gemm_tile, compact_relations=compact_relations)
        return cls.from_tensors(tensors, num_nodes, src.numel(), num_etypes, layouts, gemm_tile)

    def tensors(self) -> Dict[str, torch.Tensor]:
        """The layout tensors that were built, by key."""
        return {name: getattr(self, name) for name in sorted(_TENSOR_FIELDS) if getattr(self, name) is not None}

    def array(self, key: str) -> torch.Tensor:
        """The tensor `key`; ValueError naming the layout that provides it when it was not built."""
        value = getattr(self, key) if key in _TENSOR_FIELDS else None
        if value is None:
            layout = _KEY_LAYOUT.get(key)
            if layout is None:
                raise ValueError(f"unknown graph array {key!r}; known: {', '.join(sorted(_TENSOR_FIELDS))}")
            tiled = " with a gemm_tile" if key in TILE_KEYS.values() else ""
            raise ValueError(f"this graph has no {key!r}: it was prepared without the layout {layout!r}{tiled} "
                             f"(built: {', '.join(sorted(self.layouts)) or 'none'}); prepare it with the module "
                             "that reads it")
        return value

    def arrays(self, keys: Iterable[str], gemm_tile: Optional[int] = None) -> list:
        """The tensors `keys`, in order (a generated op's graph arguments). gemm_tile: the row tile the caller's
        kernels use; required to match the graph's when tile offsets are among the keys."""
        keys = tuple(keys)
        if gemm_tile is not None and gemm_tile != self.gemm_tile and any(key in TILE_KEYS.values() for key in keys):
            raise ValueError(f"this graph's tile offsets are for GEMM row tile {self.gemm_tile}, not {gemm_tile}: "
                             "prepare it with the module that reads it")
        return [self.array(key) for key in keys]

    def to(self, device) -> "Graph":
        moved = {name: t.to(device) for name, t in self.tensors().items()}
        return dataclasses.replace(self, **moved)

    @property
    def num_unique_src(self) -> Optional[int]:
        """U, the number of unique (src, etype) pairs (rows of the pair domain), as a host int: the length of
        unique_src, which preprocessing trimmed once (no synchronisation here). None without compact_src_etype."""
        return None if self.unique_src is None else self.unique_src.numel()

    @property
    def num_unique_dst(self) -> Optional[int]:
        """The number of unique (dst, etype) pairs, like num_unique_src; None without compact_dst_etype."""
        return None if self.unique_dst is None else self.unique_dst.numel()


_TENSOR_FIELDS = frozenset(_KEY_LAYOUT)


def _relation_statistics(tensors: Mapping[str, torch.Tensor]) -> Dict[str, tuple]:
    """The per-relation host tuples of a Graph from its layout tensors, with ONE host synchronisation (a single
    read-back of the stacked counts; none without a compact layout). relation_edges comes from etype_ptr, or, without
    it, from a compact layout (the edges of relation r are those of its pair rows)."""
    columns: Dict[str, torch.Tensor] = {}
    if "etype_ptr" in tensors:
        columns["relation_edges"] = torch.diff(tensors["etype_ptr"].long())
    for name in ("src", "dst"):
        if f"unique_{name}_relation_pairs" not in tensors or f"{name}_relation_compacted" not in tensors:
            continue  # no compact layout of this endpoint (or tensors of a runtime before 1.3)
        if "relation_edges" not in columns:
            pair_ptr = tensors[f"unique_{name}_etype_ptr"].long()
            columns["relation_edges"] = torch.diff(tensors[f"unique_{name}_edge_ptr"].long()[pair_ptr])
        columns[f"relation_unique_{name}"] = tensors[f"unique_{name}_relation_pairs"].long()
        compacted = "compacted_relations" if name == "src" else "compacted_dst_relations"
        columns[compacted] = tensors[f"{name}_relation_compacted"].long()
    if set(columns) <= {"relation_edges"}:
        return {}  # only layouts that do not need them: no read-back
    values = torch.stack(list(columns.values())).tolist()  # the one host synchronisation
    return {
        field: tuple(bool(v) for v in row) if field.startswith("compacted") else tuple(row)
        for field, row in zip(columns, values)
    }


# Unified tensors (pinned, GPU-mapped host memory gathered over PCIe): hectorgen_runtime/unified.py. The function
# `unified` takes the package attribute of the same name (`from hectorgen_runtime.unified import X` still reads the
# module, which is sys.modules["hectorgen_runtime.unified"]).
from .unified import (  # noqa: E402
    NotPinnableError,
    PinnedMemoryError,
    UnifiedTensor,
    calibrate,
    check_gather_errors,
    empty_unified,
    gather,
    is_unified,
    pool_stats,
    set_pool_limit,
    to_unified,
    trim_pool,
    unified,
)
