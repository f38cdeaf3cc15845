"""Test graphs for the GPU correctness checks of the generated RGNN code.

Two kinds of heterogeneous graphs, both in the typed-COO form of docs/semantics.md:

* ``tiny_graph()``: a fixed 5-node, 7-edge graph small enough to check by hand.
* ``synthetic_graph(...)``: random graphs in the spirit of the Hector evaluation
  datasets: Zipf-like node-type and relation sizes, power-law (hub-heavy) source
  endpoints, uniform destination endpoints, every relation joining one
  (source node type, destination node type) pair.

In every graph the nodes are sorted by node type (``ntype`` is non-decreasing, and
``nptr`` holds the type segment offsets), while the edges are deliberately *not*
sorted by relation, destination or source: the code under test must do its own
preprocessing (sorting, CSR/CSC construction, segment offsets).

Generation uses only Python's ``random.Random`` (whose output for an integer seed
is stable across platforms and Python versions), so a graph is a pure function of
its arguments, independent of the torch version, device or global RNG state. The
cost is O(E) Python work, roughly 3 s per million edges: "medium" (0.3 M edges) takes
under a second, the largest preset ("bgs", 0.7 M edges) about two.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

__all__ = [
    "HeteroGraph",
    "tiny_graph",
    "synthetic_graph",
    "PRESETS",
    "preset_graph",
    "graph_by_name",
]


@dataclass
class HeteroGraph:
    """A heterogeneous graph in typed-COO form (see docs/semantics.md, "Graph").

    Tensors are int64. Edge ``e`` goes from ``src[e]`` to ``dst[e]`` and has relation
    ``etype[e]``; node ``n`` has node type ``ntype[n]``. Nodes are sorted by type:
    the nodes of type ``t`` are ``nptr[t] .. nptr[t+1]-1``. ``rel_types[r]`` is the
    (source node type, destination node type) pair that relation ``r`` joins.

    Fields can also be read dict-style (``g["src"]``) for code written against the
    dict returned by the shared anchor generator.
    """

    name: str
    num_nodes: int
    num_ntypes: int
    num_etypes: int
    src: torch.Tensor
    dst: torch.Tensor
    etype: torch.Tensor
    ntype: torch.Tensor
    nptr: torch.Tensor
    rel_types: list = field(default_factory=list)
    seed: int | None = None

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())

    def __getitem__(self, key: str):
        if key == "num_edges":
            return self.num_edges
        return getattr(self, key)

    def keys(self):
        return ["name", "num_nodes", "num_ntypes", "num_etypes", "num_edges",
                "src", "dst", "etype", "ntype", "nptr", "rel_types", "seed"]

    def to(self, device) -> "HeteroGraph":
        """A copy with all index tensors on ``device``."""
        return HeteroGraph(
            name=self.name, num_nodes=self.num_nodes, num_ntypes=self.num_ntypes,
            num_etypes=self.num_etypes, src=self.src.to(device), dst=self.dst.to(device),
            etype=self.etype.to(device), ntype=self.ntype.to(device),
            nptr=self.nptr.to(device), rel_types=list(self.rel_types), seed=self.seed)

    def edge_index(self) -> torch.Tensor:
        """``[2, E]`` tensor (row 0: src, row 1: dst), as PyG expects."""
        return torch.stack([self.src, self.dst])

    def summary(self) -> str:
        return (f"{self.name}: N={self.num_nodes} T={self.num_ntypes} "
                f"E={self.num_edges} R={self.num_etypes}")

    def validate(self) -> None:
        """Raise ``AssertionError`` if the graph breaks its own invariants."""
        N, T, R, E = self.num_nodes, self.num_ntypes, self.num_etypes, self.num_edges
        for nm in ("src", "dst", "etype", "ntype", "nptr"):
            t = getattr(self, nm)
            assert t.dtype == torch.int64 and t.dim() == 1, nm
        assert self.dst.numel() == E and self.etype.numel() == E
        assert self.ntype.numel() == N and self.nptr.numel() == T + 1
        if E:
            assert 0 <= int(self.src.min()) and int(self.src.max()) < N
            assert 0 <= int(self.dst.min()) and int(self.dst.max()) < N
            assert 0 <= int(self.etype.min()) and int(self.etype.max()) < R
        assert N == 0 or bool((self.ntype[1:] >= self.ntype[:-1]).all()), "nodes not sorted by ntype"
        counts = torch.bincount(self.ntype, minlength=T)
        assert torch.equal(torch.cumsum(counts, 0), self.nptr[1:]) and int(self.nptr[0]) == 0
        assert len(self.rel_types) == R
        if E:
            st = torch.tensor([p[0] for p in self.rel_types], dtype=torch.int64, device=self.etype.device)
            dt = torch.tensor([p[1] for p in self.rel_types], dtype=torch.int64, device=self.etype.device)
            assert torch.equal(self.ntype[self.src], st[self.etype]), "relation source type mismatch"
            assert torch.equal(self.ntype[self.dst], dt[self.etype]), "relation destination type mismatch"


def _make(name, ntype_list, edges, num_ntypes, num_etypes, rel_types, seed=None) -> HeteroGraph:
    """Build a HeteroGraph from Python lists; ``edges`` is a list of (src, dst, etype)."""
    ntype = torch.tensor(ntype_list, dtype=torch.int64)
    counts = torch.bincount(ntype, minlength=num_ntypes)
    nptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    if edges:
        src, dst, et = (torch.tensor(c, dtype=torch.int64) for c in zip(*edges))
    else:
        src = dst = et = torch.zeros(0, dtype=torch.int64)
    g = HeteroGraph(name=name, num_nodes=len(ntype_list), num_ntypes=num_ntypes,
                    num_etypes=num_etypes, src=src, dst=dst, etype=et, ntype=ntype,
                    nptr=nptr, rel_types=list(rel_types), seed=seed)
    g.validate()
    return g


# The tiny graph, edges listed in a deliberately unsorted order: (src, dst, etype).
#   node types: node 0 is type 0 ("A"); nodes 1..4 are type 1 ("B").
#   relation 0: A -> B, relation 1: B -> B.
#   node 0 has no incoming edges; node 2 receives two parallel edges 4->2 of relation 1
#   and one edge of relation 0, node 1 receives one edge of each relation, so the RGCN
#   norm takes the values 1/2 and 1 and a node mixes two relations.
_TINY_EDGES = [
    (4, 2, 1),
    (0, 1, 0),
    (2, 3, 1),
    (4, 2, 1),
    (3, 1, 1),
    (0, 2, 0),
    (1, 4, 1),
]


def tiny_graph() -> HeteroGraph:
    """Fixed 5-node, 7-edge, 2-relation, 2-node-type graph.

    ===  ===  =====  ==================================
    src  dst  etype  note
    ===  ===  =====  ==================================
    4    2    1      parallel with the edge below
    0    1    0
    2    3    1
    4    2    1      parallel with the first edge
    3    1    1
    0    2    0
    1    4    1
    ===  ===  =====  ==================================

    ``ntype = [0, 1, 1, 1, 1]``; relation 0 joins (0 -> 1), relation 1 joins (1 -> 1).
    Node 0 has no incoming edges (its RGAT/HGT output is 0, its RGCN output is
    ``x[0] @ W0``). Per-(dst, relation) in-degrees: (1,r0)=1, (1,r1)=1, (2,r0)=1,
    (2,r1)=2, (3,r1)=1, (4,r1)=1.
    """
    return _make("tiny", [0, 1, 1, 1, 1], _TINY_EDGES, num_ntypes=2, num_etypes=2,
                 rel_types=[(0, 1), (1, 1)])


def _zipf_sizes(total: int, k: int, rng: random.Random, a: float = 1.1) -> list[int]:
    """Split ``total`` into ``k`` positive integer parts with Zipf-like sizes.

    Part sizes are proportional to 1/rank**a with the ranks randomly permuted, every
    part gets at least 1, and the parts add up to ``total`` exactly.
    """
    if k <= 0:
        raise ValueError("need at least one part")
    if total < k:
        raise ValueError(f"cannot split {total} into {k} positive parts")
    w = [1.0 / (i + 1) ** a for i in range(k)]
    rng.shuffle(w)
    sw = sum(w)
    sizes = [max(1, int(x / sw * total)) for x in w]
    diff = total - sum(sizes)
    # Give the remainder to (or take the excess from) the largest parts.
    order = sorted(range(k), key=lambda i: -sizes[i])
    i = 0
    while diff != 0:
        j = order[i % k]
        if diff > 0:
            sizes[j] += diff
            diff = 0
        elif sizes[j] > 1:
            take = min(sizes[j] - 1, -diff)
            sizes[j] -= take
            diff += take
        i += 1
    return sizes


def synthetic_graph(num_nodes: int, num_ntypes: int, num_edges: int, num_etypes: int,
                    seed: int = 0, name: str | None = None, pareto_shape: float = 1.5,
                    hub_scale: float = 20.0) -> HeteroGraph:
    """Random heterogeneous graph with Hector-dataset-like structure.

    * Node types get Zipf-like sizes (every type has at least one node); nodes are
      numbered type by type, so ``ntype`` is sorted and ``nptr`` gives the segments.
    * Relations get Zipf-like edge counts (every relation has at least one edge) and
      each joins one random (source type, destination type) pair.
    * Source endpoints are power-law distributed inside the source-type segment
      (Lomax(``pareto_shape``) scaled by segment size / ``hub_scale``, a few hubs
      send most edges); hub positions are randomly permuted within each type.
      Destination endpoints are uniform inside the destination-type segment, so
      some nodes receive no edges.
    * Parallel edges and self-loops may occur (as in the real multigraphs).
    * Finally all edges are shuffled: nothing is sorted by relation, source or
      destination.

    Deterministic for a given argument tuple.
    """
    if num_nodes < num_ntypes or num_edges < num_etypes:
        raise ValueError("need num_nodes >= num_ntypes and num_edges >= num_etypes")
    rng = random.Random(seed)
    nsizes = _zipf_sizes(num_nodes, num_ntypes, rng)
    nptr = [0]
    for s in nsizes:
        nptr.append(nptr[-1] + s)
    ntype_list = [t for t in range(num_ntypes) for _ in range(nsizes[t])]
    # A random relabelling inside each type segment, so hubs are not all at the front.
    perm = []
    for t in range(num_ntypes):
        p = list(range(nsizes[t]))
        rng.shuffle(p)
        perm.append(p)

    esizes = _zipf_sizes(num_edges, num_etypes, rng)
    rel_types = []
    edges = []
    for r in range(num_etypes):
        st, dt = rng.randrange(num_ntypes), rng.randrange(num_ntypes)
        rel_types.append((st, dt))
        ns, nd = nsizes[st], nsizes[dt]
        ps, base_s, base_d = perm[st], nptr[st], nptr[dt]
        scale = ns / hub_scale
        for _ in range(esizes[r]):
            # paretovariate(a) - 1 is the Lomax variate that numpy's pareto() draws.
            u = int((rng.paretovariate(pareto_shape) - 1.0) * scale) % ns
            edges.append((base_s + ps[u], base_d + rng.randrange(nd), r))
    rng.shuffle(edges)
    return _make(name or f"synthetic(N={num_nodes},T={num_ntypes},E={num_edges},R={num_etypes},seed={seed})",
                 ntype_list, edges, num_ntypes, num_etypes, rel_types, seed=seed)


# name: (num_nodes, num_ntypes, num_edges, num_etypes)
PRESETS = {
    "mini": (200, 3, 1_500, 5),        # CPU dry runs of the GPU check (tests/gpu/test_gpu_check_dry.py)
    "small": (2_000, 3, 20_000, 8),
    "medium": (20_000, 4, 300_000, 30),
    # Published sizes of Hector evaluation datasets small enough to generate quickly.
    "aifb": (7_262, 7, 48_810, 104),
    "mutag": (27_163, 5, 148_100, 50),
    "fb15k": (14_541, 1, 620_232, 474),
    "bgs": (94_806, 27, 672_884, 122),
}


def preset_graph(name: str, seed: int = 0) -> HeteroGraph:
    """A synthetic graph with the sizes of ``PRESETS[name]``."""
    n, nt, e, et = PRESETS[name]
    return synthetic_graph(n, nt, e, et, seed=seed, name=name)


def graph_by_name(name: str, seed: int = 0) -> HeteroGraph:
    """``"tiny"`` or a preset name."""
    if name == "tiny":
        return tiny_graph()
    return preset_graph(name, seed)
