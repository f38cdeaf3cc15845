"""The benchmark's graphs: synthetic graphs with the statistics of the thesis's 8 datasets, and loaders for the
real datasets' on-disk formats.

    g = datasets.synthetic("am", seed=0)            # deterministic; cached under ~/.cache/hectorgen-bench
    g = datasets.load_ntriples("aifb.nt")            # RDF N-Triples (aifb, mutag, bgs, am)
    g = datasets.load_tsv_triples(["train.txt"])     # head<TAB>relation<TAB>tail (fb15k)
    g = datasets.load_ogb("ogbl_biokg")              # OGB raw CSV(.gz) layout (biokg, wikikg2, mag)

Every graph is a dict (the layout of ../shared/anchors/synth.py): name, num_nodes, num_ntypes, num_etypes,
int64 CPU tensors ntype [N], nptr [T+1], src, dst, etype [E], eptr [R+1], and rel_types [(src type, dst type)]
per relation. Nodes are sorted by node type and edges by relation (the segment layout grouped GEMMs want), and
every relation joins one (source type, destination type) pair, so the same graph feeds RGCN, RGAT and HGT.

The generator follows synth.py: node-type and relation sizes are Zipf-like (exponent ``type_skew``, 1.1), each
relation picks a random (source type, destination type) pair, sources follow a power law inside their type
segment (a Pareto(``skew``) offset times the segment size / 20, wrapped around the segment: the default 1.5 is
synth.py's, a larger ``skew`` puts the sources on fewer nodes) and destinations are uniform. It draws everything
with numpy in a few vectorised calls (mag, 21M edges: a few seconds on one core), so the same seed gives the same
graph on every machine, with or without a GPU; its random-number stream differs from synth.py's per-relation
loop, so graphs are statistically, not bit-for-bit, those of the anchors.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os
import re
from pathlib import Path

import numpy as np
import torch

# name: (nodes, node types, edges, relations), as in the thesis's evaluation (and ../shared/anchors/synth.py)
STATS = {
    "aifb": (7262, 7, 48810, 104),
    "mutag": (27163, 5, 148100, 50),
    "bgs": (94806, 27, 672884, 122),
    "fb15k": (14541, 1, 620232, 474),
    "biokg": (93773, 5, 4762678, 51),
    "am": (1885136, 7, 5668682, 108),
    "wikikg2": (2500604, 1, 16109182, 535),
    "mag": (1939743, 4, 21111007, 4),
}
GENERATOR_VERSION = 1  # bump when the generator's output changes: it is part of the cache key


def _zipf_sizes(total: int, k: int, rng, a: float) -> np.ndarray:
    """``total`` split into ``k`` positive parts with Zipf-like sizes in random order."""
    if total < k:
        raise ValueError(f"cannot split {total} into {k} positive parts")
    w = 1.0 / np.arange(1, k + 1) ** a
    w = rng.permutation(w)
    s = 1 + np.floor(w / w.sum() * (total - k)).astype(np.int64)   # sums to at most total
    s[np.argmax(s)] += total - s.sum()
    return s


def generate(num_nodes: int, num_ntypes: int, num_edges: int, num_etypes: int, *, seed: int = 0,
             skew: float = 1.5, type_skew: float = 1.1, name: str = "synthetic") -> dict:
    """A synthetic typed graph with these sizes (see the module docstring)."""
    if min(num_nodes, num_ntypes, num_edges, num_etypes) < 1 or num_ntypes > num_nodes or num_etypes > num_edges:
        raise ValueError(f"bad sizes: N={num_nodes} T={num_ntypes} E={num_edges} R={num_etypes}")
    if skew <= 0:
        raise ValueError(f"skew (the Pareto shape of the source offsets) must be > 0, got {skew}")
    rng = np.random.default_rng(seed)
    nsizes = _zipf_sizes(num_nodes, num_ntypes, rng, type_skew)
    nptr = np.concatenate([[0], np.cumsum(nsizes)])
    esizes = _zipf_sizes(num_edges, num_etypes, rng, type_skew)
    rel_src = rng.integers(0, num_ntypes, num_etypes)
    rel_dst = rng.integers(0, num_ntypes, num_etypes)
    etype = np.repeat(np.arange(num_etypes), esizes)
    # Per-edge sizes and offsets of the endpoint type segments, expanded from per-relation values.
    ns = np.repeat(nsizes[rel_src].astype(np.float32), esizes)
    nd = np.repeat(nsizes[rel_dst].astype(np.float32), esizes)
    # Power-law sources inside the source type's segment (numpy's pareto(skew) is expm1(exponential / skew)),
    # uniform destinations; float32 is exact for the integers involved (N < 2^24).
    x = rng.standard_exponential(num_edges, dtype=np.float32)
    x /= np.float32(skew)
    np.expm1(x, out=x)
    x *= ns / np.float32(20.0)
    np.floor(x, out=x)
    np.fmod(x, ns, out=x)
    src = np.repeat(nptr[rel_src], esizes) + x.astype(np.int64)
    y = rng.random(num_edges, dtype=np.float32)
    y *= nd
    np.floor(y, out=y)
    np.minimum(y, nd - 1, out=y)
    dst = np.repeat(nptr[rel_dst], esizes) + y.astype(np.int64)
    g = _graph(name, nsizes, src, dst, etype, num_etypes, list(zip(rel_src.tolist(), rel_dst.tolist())))
    g.update(seed=seed, skew=skew, type_skew=type_skew, source="synthetic")
    return g


def _graph(name, nsizes, src, dst, etype, num_etypes, rel_types) -> dict:
    """The graph dict from numpy arrays whose edges are already grouped by relation."""
    nsizes = np.asarray(nsizes, np.int64)
    esizes = np.bincount(etype, minlength=num_etypes) if len(etype) else np.zeros(num_etypes, np.int64)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
    return dict(
        name=name, num_nodes=int(nsizes.sum()), num_ntypes=len(nsizes), num_etypes=num_etypes,
        ntype=t(np.repeat(np.arange(len(nsizes)), nsizes)), nptr=t(np.concatenate([[0], np.cumsum(nsizes)])),
        src=t(src), dst=t(dst), etype=t(etype), eptr=t(np.concatenate([[0], np.cumsum(esizes)])),
        rel_types=[(int(a), int(b)) for a, b in rel_types])


def cache_dir() -> Path:
    return Path(os.environ.get("HG_BENCH_CACHE", Path.home() / ".cache" / "hectorgen-bench"))


def synthetic(name: str, seed: int = 0, skew: float = 1.5, type_skew: float = 1.1, *, scale: float = 1.0,
              cache: bool = True) -> dict:
    """The synthetic stand-in for dataset ``name`` (STATS); ``scale`` shrinks nodes and edges (tests), types
    are kept. Cached as a torch file keyed by every parameter and GENERATOR_VERSION."""
    n, nt, e, et = STATS[name]
    if scale != 1.0:
        n, e = max(nt, int(n * scale)), max(et, int(e * scale))
    key = f"{name}-n{n}-e{e}-seed{seed}-skew{skew}-tskew{type_skew}-v{GENERATOR_VERSION}"
    path = cache_dir() / f"{key}.pt"
    if cache and path.is_file():
        try:
            return torch.load(path, weights_only=False)
        except Exception:  # noqa: BLE001  (a truncated file from an interrupted run: regenerate)
            pass
    g = generate(n, nt, e, et, seed=seed, skew=skew, type_skew=type_skew, name=name)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(g, tmp)
        os.replace(tmp, path)
    return g


def unique_src_etype_pairs(g) -> int:
    """How many distinct (source, relation) pairs the graph has (what compact materialization computes)."""
    return int(torch.unique(g["etype"] * g["num_nodes"] + g["src"]).numel())


def validate(g) -> None:
    """Raises AssertionError unless ``g`` keeps the invariants of the module docstring."""
    N, T, R = g["num_nodes"], g["num_ntypes"], g["num_etypes"]
    src, dst, et, nt = g["src"], g["dst"], g["etype"], g["ntype"]
    E = src.numel()
    assert dst.numel() == E and et.numel() == E and nt.numel() == N
    assert g["nptr"].tolist() == [0] + torch.cumsum(torch.bincount(nt, minlength=T), 0).tolist()
    assert g["eptr"].tolist() == [0] + torch.cumsum(torch.bincount(et, minlength=R), 0).tolist()
    assert bool((nt[1:] >= nt[:-1]).all()) and bool((et[1:] >= et[:-1]).all()), "not sorted by type"
    if E:
        assert 0 <= int(src.min()) and int(src.max()) < N and 0 <= int(dst.min()) and int(dst.max()) < N
        rel = torch.tensor(g["rel_types"], dtype=torch.int64).reshape(R, 2)
        assert torch.equal(nt[src], rel[et, 0]) and torch.equal(nt[dst], rel[et, 1]), "relation type pairs"


# ---------------------------------------------------------------------------------------------------------------
# Real datasets


def _typed_graph(name: str, node_type_of: dict, triples, type_names=None) -> dict:
    """A graph from entity -> type-name and (src entity, relation name, dst entity) triples. Nodes are numbered
    by (type name, entity) order, relations are the sorted distinct (type(src), relation, type(dst)) triples
    (so each joins one type pair, as in DGL's canonical edge types)."""
    tnames = sorted(set(node_type_of.values())) if type_names is None else list(type_names)
    tindex = {t: i for i, t in enumerate(tnames)}
    ents = sorted(node_type_of, key=lambda x: (tindex[node_type_of[x]], x))
    nid = {x: i for i, x in enumerate(ents)}
    nsizes = np.bincount([tindex[node_type_of[x]] for x in ents], minlength=len(tnames))
    canon = sorted({(node_type_of[s], r, node_type_of[d]) for s, r, d in triples})
    rid = {c: i for i, c in enumerate(canon)}
    rows = sorted((rid[(node_type_of[s], r, node_type_of[d])], nid[s], nid[d]) for s, r, d in triples)
    arr = np.array(rows, np.int64).reshape(-1, 3)
    g = _graph(name, nsizes, arr[:, 1], arr[:, 2], arr[:, 0], len(canon),
               [(tindex[a], tindex[b]) for a, _, b in canon])
    g.update(source="file", ntype_names=tnames, relation_names=[f"{a}|{r}|{b}" for a, r, b in canon])
    return g


def _open_text(path):
    path = Path(path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
_NT_TERM = re.compile(r'\s*(<[^>]*>|_:\S+|"(?:[^"\\]|\\.)*"(?:@[\w-]+|\^\^<[^>]*>)?)')


def _nt_terms(line: str, where: str) -> list:
    terms, pos = [], 0
    for _ in range(3):
        m = _NT_TERM.match(line, pos)
        if not m:
            raise ValueError(f"{where}: not an N-Triples statement: {line.strip()[:120]}")
        terms.append(m.group(1))
        pos = m.end()
    if line[pos:].strip() != ".":
        raise ValueError(f"{where}: expected '.' after the object: {line.strip()[:120]}")
    return terms


def load_ntriples(paths, name: str = "rdf") -> dict:
    """RDF N-Triples files (.nt or .nt.gz) as a typed graph, the way the thesis's RDF datasets (aifb, mutag, bgs,
    am) are used: every IRI, blank node and literal that occurs as subject or object is a node; a node's type is
    the object of its first rdf:type statement (in file order), "_Literal" for literals, "_Untyped" otherwise;
    every other statement is an edge subject -> object whose relation is (type(s), predicate, type(o))."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    types, triples, ents = {}, [], {}
    for p in paths:
        with _open_text(p) as f:
            for i, line in enumerate(f, 1):
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                s, pred, o = _nt_terms(line, f"{p}:{i}")
                if pred == f"<{RDF_TYPE}>":
                    types.setdefault(s, o.strip("<>"))
                    ents.setdefault(s, None)
                    continue
                triples.append((s, pred.strip("<>"), o))
                ents.setdefault(s, None)
                ents.setdefault(o, None)
    node_type = {x: types.get(x, "_Literal" if x.startswith('"') else "_Untyped") for x in ents}
    return _typed_graph(name, node_type, triples)


def load_tsv_triples(paths, name: str = "kg") -> dict:
    """Knowledge-graph triples, one ``head<TAB>relation<TAB>tail`` per line (FB15k's train/valid/test.txt): one
    node type, relations in sorted name order."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    triples = []
    for p in paths:
        with _open_text(p) as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 3:
                    raise ValueError(f"{p}:{i}: expected head<TAB>relation<TAB>tail, got {len(parts)} fields")
                triples.append(tuple(parts))
    node_type = {x: "entity" for h, _, t in triples for x in (h, t)}
    return _typed_graph(name, node_type, triples)


def _find(d: Path, stem: str):
    for cand in (d / f"{stem}.csv.gz", d / f"{stem}.csv"):
        if cand.is_file():
            return cand
    return None


def _csv_rows(path) -> list:
    with _open_text(path) as f:
        return [row for row in csv.reader(f) if row]


def _int_array(path, cols: int) -> np.ndarray:
    with _open_text(path) as f:
        a = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    if a.size == 0:
        return np.zeros((0, cols), np.int64)
    if a.shape[1] != cols:
        raise ValueError(f"{path}: expected {cols} column(s), got {a.shape[1]}")
    return a


def load_ogb(root, name: str | None = None) -> dict:
    """An OGB dataset from its raw CSV(.gz) files (DATASET/raw/ or the raw folder itself), either layout:

    * heterogeneous (ogbl-biokg, ogbn-mag): num-node-dict.csv.gz (a header of node types, one row of counts) and
      relations/<src type>___<relation>___<dst type>/edge.csv.gz (rows ``src,dst``, ids local to their type);
    * homogeneous (ogbl-wikikg2): edge.csv.gz (rows ``src,dst``), edge_reltype.csv.gz (one relation id a row;
      without it one relation) and num-node-list.csv.gz (the node count).
    """
    root = Path(root)
    raw = root / "raw" if (root / "raw").is_dir() else root
    name = name or root.name
    if (raw / "relations").is_dir():
        ndict = _find(raw, "num-node-dict")
        if ndict is None:
            raise FileNotFoundError(f"{raw}/num-node-dict.csv(.gz) missing")
        header, counts = _csv_rows(ndict)[:2]
        nsize = {t: int(c) for t, c in zip(header, counts)}
        tnames = sorted(nsize)
        toff = dict(zip(tnames, np.concatenate([[0], np.cumsum([nsize[t] for t in tnames])]).tolist()))
        rels = sorted(p.name for p in (raw / "relations").iterdir() if p.is_dir())
        srcs, dsts, ets, rel_types = [], [], [], []
        for r, rel in enumerate(rels):
            parts = rel.split("___")
            if len(parts) != 3 or parts[0] not in nsize or parts[2] not in nsize:
                raise ValueError(f"{raw}/relations/{rel}: expected <src type>___<relation>___<dst type>")
            f = _find(raw / "relations" / rel, "edge")
            if f is None:
                raise FileNotFoundError(f"{raw}/relations/{rel}/edge.csv(.gz) missing")
            a = _int_array(f, 2)
            if len(a) and (a[:, 0].max() >= nsize[parts[0]] or a[:, 1].max() >= nsize[parts[2]] or a.min() < 0):
                raise ValueError(f"{f}: node id out of range for its type")
            srcs.append(a[:, 0] + toff[parts[0]])
            dsts.append(a[:, 1] + toff[parts[2]])
            ets.append(np.full(len(a), r, np.int64))
            rel_types.append((tnames.index(parts[0]), tnames.index(parts[2])))
        g = _graph(name, [nsize[t] for t in tnames], np.concatenate(srcs), np.concatenate(dsts),
                   np.concatenate(ets), len(rels), rel_types)
        g.update(source="file", ntype_names=tnames, relation_names=rels)
        return g
    f = _find(raw, "edge")
    if f is None:
        raise FileNotFoundError(f"{raw}: neither relations/ nor edge.csv(.gz): not an OGB raw folder")
    a = _int_array(f, 2)
    rt = _find(raw, "edge_reltype")
    et = _int_array(rt, 1)[:, 0] if rt is not None else np.zeros(len(a), np.int64)
    if len(et) != len(a):
        raise ValueError(f"{rt}: {len(et)} relation ids for {len(a)} edges")
    nl = _find(raw, "num-node-list")
    n = int(_int_array(nl, 1)[0, 0]) if nl is not None else int(a.max()) + 1
    order = np.argsort(et, kind="stable")
    R = int(et.max()) + 1 if len(et) else 1
    g = _graph(name, [n], a[order, 0], a[order, 1], et[order], R, [(0, 0)] * R)
    g.update(source="file")
    return g


def load(spec: str, seed: int = 0, skew: float = 1.5, type_skew: float = 1.1, scale: float = 1.0) -> dict:
    """A dataset by name (synthetic), or ``name=path`` for a real one: .nt/.nt.gz files (RDF), .txt/.tsv
    (triples, comma-separated list allowed) or an OGB folder."""
    if "=" not in spec:
        return synthetic(spec, seed, skew, type_skew, scale=scale)
    name, path = spec.split("=", 1)
    paths = path.split(",")
    if all(re.search(r"\.nt(\.gz)?$", p) for p in paths):
        return load_ntriples(paths, name)
    if all(re.search(r"\.(txt|tsv)(\.gz)?$", p) for p in paths):
        return load_tsv_triples(paths, name)
    return load_ogb(path, name)


def fingerprint(g) -> str:
    """A short hash of the graph's arrays (to show two runs used the same graph)."""
    h = hashlib.sha256()
    for k in ("nptr", "src", "dst", "etype"):
        h.update(g[k].numpy().tobytes())
    return h.hexdigest()[:12]
