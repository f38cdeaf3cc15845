"""What the benchmark times: hectorgen variants (data-driven, VARIANTS) and the baselines (hand-written layers in
fp32 and bf16, PyG's RGCNConv, FastRGCNConv, RGATConv, HGTConv).

A System builds, for one model on one dataset, a callable that runs inference or one training step (forward,
cross-entropy loss on random labels, backward to every weight; the input features need no gradient, as for a
first layer). Systems carry a precision class: "fp32" (fp32 and tf32 variants; fp32 baselines run with TF32
allowed) or "bf16" (bf16 and fp16 variants; bf16 baselines). The report compares each hectorgen variant with the
best baseline of its class.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import handwritten as hw  # noqa: E402

MODELS = ("rgcn", "rgat", "hgt")
DIM = 64
STORAGE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------------------------------------------------------
# hectorgen variants

@dataclass(frozen=True)
class Variant:
    """One way to generate a model: the spec's options.dtype, the precision class it is compared in, and further
    edits of the spec text ((regex, replacement), each must match exactly once), e.g. a schedule; traversal:
    options.schedule.traversal's entries, ((key, value), ...), e.g. (("edge_batch", 4),) (none: the spec's own);
    gather_sum: options.schedule.gather_sum's, likewise."""
    key: str
    dtype: str
    klass: str
    edits: tuple = ()
    note: str = ""
    traversal: tuple = ()
    gather_sum: tuple = ()
    # The key of the variant whose generated module this one runs (none: its own), and whether an auto module's
    # program is chosen by timing both on the case's graph (choose_by_timing, before the case) instead of by its
    # cost model.
    module_of: str = ""
    timed_choice: bool = False

    @property
    def label(self) -> str:
        return f"hectorgen_{self.key}"

    def module(self, model: str) -> str:
        """The generated module's name: the bundled model for plain fp32, else <model>_<key> (of module_of's key)."""
        key = self.module_of or self.key
        return model if key == "fp32" and not self.edits else f"{model}_{key}"


# The edits of auto: materialization chosen per graph, reordering where it pays.
_AUTO = (("materialization: vanilla", "materialization: auto"), ("reorder: off", "reorder: auto"))

# Add a variant here (an optimisation: a key and its spec edits) and select it with --variants.
VARIANTS = {
    "fp32": Variant("fp32", "fp32", "fp32"),
    "tf32": Variant("tf32", "tf32", "fp32"),
    "bf16": Variant("bf16", "bf16", "bf16"),
    "fp16": Variant("fp16", "fp16", "bf16"),
    # Compact materialization (issue 9): values of an edge's (source, edge type) pair computed and stored once per
    # unique pair.
    "tf32_compact": Variant("tf32_compact", "tf32", "fp32", (("materialization: vanilla", "materialization: compact"),),
                            "compact materialization"),
    "bf16_compact": Variant("bf16_compact", "bf16", "bf16", (("materialization: vanilla", "materialization: compact"),),
                            "compact materialization"),
    # Linear operator reordering (issue 9), alone and with compact materialization (the thesis's R and C+R).
    "tf32_reorder": Variant("tf32_reorder", "tf32", "fp32", (("reorder: off", "reorder: on"),), "linear operator reordering"),
    "bf16_reorder": Variant("bf16_reorder", "bf16", "bf16", (("reorder: off", "reorder: on"),), "linear operator reordering"),
    "tf32_compact_reorder": Variant("tf32_compact_reorder", "tf32", "fp32",
                                    (("materialization: vanilla", "materialization: compact"), ("reorder: off", "reorder: on")),
                                    "compact materialization and linear operator reordering"),
    "bf16_compact_reorder": Variant("bf16_compact_reorder", "bf16", "bf16",
                                    (("materialization: vanilla", "materialization: compact"), ("reorder: off", "reorder: on")),
                                    "compact materialization and linear operator reordering"),
    # fp16's fixed programs (its backward keeps gradient temporaries in fp32: other bytes than bf16's), to calibrate
    # fp16_auto's choices against
    "fp16_reorder": Variant("fp16_reorder", "fp16", "bf16", (("reorder: off", "reorder: on"),), "linear operator reordering"),
    "fp16_compact_reorder": Variant("fp16_compact_reorder", "fp16", "bf16",
                                    (("materialization: vanilla", "materialization: compact"), ("reorder: off", "reorder: on")),
                                    "compact materialization and linear operator reordering"),
    # The backward recomputing saved edge and pair GEMM results (recompute: auto, the default: where that lowers the
    # step's estimated peak, HGT's and not RGAT's) against saving them (recompute: off): the step time that memory costs.
    "tf32_saved": Variant("tf32_saved", "tf32", "fp32", (("reorder: off", "reorder: off\n  recompute: off"),),
                          "GEMM results saved for the backward, not recomputed"),
    "tf32_compact_saved": Variant("tf32_compact_saved", "tf32", "fp32",
                                  (("materialization: vanilla", "materialization: compact"),
                                   ("reorder: off", "reorder: off\n  recompute: off")),
                                  "compact materialization, GEMM results saved for the backward"),
    # auto (issue 9): one module with the vanilla and the compact program, choosing per graph and mode at
    # prepare_graph from its cost model (the report shows which program it picked per case), and reorder: auto
    # (each linear operator pair rewritten where its FLOP/byte count says it pays).
    # fp32 products (3xTF32 on tensor cores) with auto's choices: the variant for users who need fp32's accuracy.
    "fp32_auto": Variant("fp32_auto", "fp32", "fp32",
                         (("materialization: vanilla", "materialization: auto"), ("reorder: off", "reorder: auto")),
                         "fp32 (3xTF32), materialization chosen per graph, reordering where it pays (auto)"),
    "tf32_auto": Variant("tf32_auto", "tf32", "fp32",
                         (("materialization: vanilla", "materialization: auto"), ("reorder: off", "reorder: auto")),
                         "materialization chosen per graph, reordering where it pays (auto)"),
    "bf16_auto": Variant("bf16_auto", "bf16", "bf16",
                         (("materialization: vanilla", "materialization: auto"), ("reorder: off", "reorder: auto")),
                         "materialization chosen per graph, reordering where it pays (auto)"),
    "fp16_auto": Variant("fp16_auto", "fp16", "bf16",
                         (("materialization: vanilla", "materialization: auto"), ("reorder: off", "reorder: auto")),
                         "materialization chosen per graph, reordering where it pays (auto)"),
    # auto with the program chosen by timing both on the case's graph (the module's choose_by_timing, run before the
    # case like the hand-written layers' autotuning) instead of by the cost model; the same module as tf32_auto /
    # bf16_auto.
    "tf32_auto_timed": Variant("tf32_auto_timed", "tf32", "fp32", _AUTO, "auto, program chosen by timing",
                               module_of="tf32_auto", timed_choice=True),
    "bf16_auto_timed": Variant("bf16_auto_timed", "bf16", "bf16", _AUTO, "auto, program chosen by timing",
                               module_of="bf16_auto", timed_choice=True),
    # auto without the gather sums' rows variant (schedule.gather_sum.group_rows_below: 0; auto runs it below 4
    # entries a row): beside tf32_auto / bf16_auto it measures what a warp's groups taking a row each gain on graphs
    # of few entries a row (a pair's edges: 1.6 on wikikg2), the A/B that set auto's threshold
    # (bench/gather_sum_rows/ab.md, run when auto was still 0 with the rows variant as the B side).
    "tf32_auto_gs_split": Variant("tf32_auto_gs_split", "tf32", "fp32", _AUTO, "auto, gather sums' split kernel only",
                                  gather_sum=(("group_rows_below", 0),)),
    "bf16_auto_gs_split": Variant("bf16_auto_gs_split", "bf16", "bf16", _AUTO, "auto, gather sums' split kernel only",
                                  gather_sum=(("group_rows_below", 0),)),
    # auto with the node kernels' edge loops taking 4 edges a step (schedule.traversal.edge_batch: the loads of 4
    # edges in flight together instead of one edge's after another's; the same sums): beside tf32_auto / bf16_auto
    # it measures what the batch gains before it becomes a tuning-table default.
    "tf32_auto_eb4": Variant("tf32_auto_eb4", "tf32", "fp32", _AUTO, "auto, edge loops 4 edges a step",
                             (("edge_batch", 4),)),
    "bf16_auto_eb4": Variant("bf16_auto_eb4", "bf16", "bf16", _AUTO, "auto, edge loops 4 edges a step",
                             (("edge_batch", 4),)),
    # auto with a node's edges' pairs and relations read through their edge ids (schedule.traversal.position_indices:
    # 0, the kernels before runtime 1.5) instead of by CSR position: beside tf32_auto / bf16_auto it measures what
    # the CSR-ordered indices (in_pair, in_etype) gain in one process.
    "tf32_auto_ids": Variant("tf32_auto_ids", "tf32", "fp32", _AUTO, "auto, edge indices through edge ids",
                             (("position_indices", 0),)),
    "bf16_auto_ids": Variant("bf16_auto_ids", "bf16", "bf16", _AUTO, "auto, edge indices through edge ids",
                             (("position_indices", 0),)),
    # auto with a fixed number of lanes per traversal row (schedule.traversal.row_lanes; auto's default picks 8 or 16
    # per kernel, bench/README.md "Lanes per row"): 32 is a warp a row, as before row_lanes; at 16 or 8 a warp walks
    # 2 or 4 rows' chains of index and row loads at once.
    "tf32_auto_rl32": Variant("tf32_auto_rl32", "tf32", "fp32", _AUTO, "auto, a warp per traversal row",
                              (("row_lanes", 32),)),
    "bf16_auto_rl32": Variant("bf16_auto_rl32", "bf16", "bf16", _AUTO, "auto, a warp per traversal row",
                              (("row_lanes", 32),)),
    "tf32_auto_rl16": Variant("tf32_auto_rl16", "tf32", "fp32", _AUTO, "auto, 16 lanes per traversal row",
                              (("row_lanes", 16),)),
    "bf16_auto_rl16": Variant("bf16_auto_rl16", "bf16", "bf16", _AUTO, "auto, 16 lanes per traversal row",
                              (("row_lanes", 16),)),
    "bf16_auto_rl8": Variant("bf16_auto_rl8", "bf16", "bf16", _AUTO, "auto, 8 lanes per traversal row",
                             (("row_lanes", 8),)),
    # auto with every traversal slot moved on its own (schedule.traversal.vector: 1, the layout before vector runs:
    # element lane + G j, one scalar load each) against auto's runs of up to 8 consecutive elements a lane, each one
    # vector load of up to 16 bytes (bench/README.md, "Vector runs").
    "tf32_auto_v1": Variant("tf32_auto_v1", "tf32", "fp32", _AUTO, "auto, scalar traversal loads", (("vector", 1),)),
    "bf16_auto_v1": Variant("bf16_auto_v1", "bf16", "bf16", _AUTO, "auto, scalar traversal loads", (("vector", 1),)),
    "bf16_auto_rl16_eb4": Variant("bf16_auto_rl16_eb4", "bf16", "bf16", _AUTO,
                                  "auto, 16 lanes per traversal row, edge loops 4 edges a step",
                                  (("row_lanes", 16), ("edge_batch", 4))),
}


def variant_spec_text(model: str, v: Variant) -> str:
    """specs/<model>.yaml with the module renamed and options.dtype (and v.edits) applied: the spec rewriting the
    GPU check's dtype variants use too (tests/gpu/dtypes.py); an edit must match exactly once (ValueError)."""
    if str(REPO / "tests" / "gpu") not in sys.path:
        sys.path.insert(0, str(REPO / "tests" / "gpu"))
    from dtypes import rewrite_spec
    text = rewrite_spec((REPO / "specs" / f"{model}.yaml").read_text(), model=model, rename=v.module(model),
                        dtype=v.dtype, edits=v.edits, where=f"variant {v.key}: specs/{model}.yaml")
    for section, entries in (("traversal", v.traversal), ("gather_sum", v.gather_sum)):
        text = with_schedule(text, section, entries) if entries else text
    return text


def schedule_line(section: str, entries: tuple) -> str:
    """The spec line of options.schedule.<section> with these ((key, value), ...) entries."""
    return f"    {section}: {{" + ", ".join(f"{k}: {v}" for k, v in entries) + "}\n"


def with_schedule(text: str, section: str, entries: tuple) -> str:
    """`text` (a spec whose options block ends where `program:` begins) with options.schedule.<section> (traversal,
    gather_sum) set to these entries: a line under its `schedule:` if it has one (one without that section), else
    a schedule block."""
    line = schedule_line(section, entries)
    if re.search(rf"(?m)^    {section}:", text):
        raise ValueError(f"with_schedule: the spec already has a {section} schedule")
    if re.search(r"(?m)^  schedule:\n", text):
        return re.sub(r"(?m)^  schedule:\n", lambda m: m.group(0) + line, text, count=1)
    text, n = re.subn(r"(?m)^program:", lambda m: "  schedule:\n" + line + m.group(0), text, count=1)
    if n != 1:
        raise ValueError("with_schedule: no 'program:' line")
    return text


def _gpu_check():
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import gpu_check  # noqa: E402  (the one place that knows how generated modules are built and imported)
    return gpu_check


def generate(model: str, v: Variant, gen_dir: Path, hectorgen: str | None) -> str:
    """Writes the variant's module into gen_dir/<module>; returns a status line. An output identical to the one
    already there is kept with its build folder (no rebuild). Without hectorgen only the plain fp32 variant exists
    (the committed generated/<model>)."""
    name = v.module(model)
    out = gen_dir / name
    new = gen_dir / f"{name}.new"
    if new.exists():
        shutil.rmtree(new)
    if not hectorgen:
        if name != model:
            raise RuntimeError(f"{name}: no hectorgen binary to generate it (only generated/{model} is bundled)")
        shutil.copytree(REPO / "generated" / model, new, ignore=shutil.ignore_patterns("build"))
        msg = f"{name}: the committed generated/{model} (no hectorgen)"
    else:
        if os.sep in hectorgen:
            hectorgen = str(Path(hectorgen).resolve())   # it runs in another directory
        if name == model:
            spec, cwd = f"specs/{model}.yaml", REPO
        else:
            (gen_dir / "specs").mkdir(parents=True, exist_ok=True)
            spec = gen_dir / "specs" / f"{name}.yaml"
            spec.write_text(variant_spec_text(model, v))
            cwd = gen_dir
        p = subprocess.run([hectorgen, str(spec), "-o", str(new)], cwd=cwd, capture_output=True, text=True,
                           timeout=300)
        if p.returncode != 0:
            shutil.rmtree(new, ignore_errors=True)
            raise RuntimeError(f"{name}: hectorgen failed (rc {p.returncode}): {p.stderr.strip()[:400]}")
        warn = [ln for ln in p.stderr.splitlines() if "warning" in ln]
        msg = f"{name}: generated from {spec}" + (f" ({'; '.join(warn)[:300]})" if warn else "")
    if out.is_dir() and _same_files(out, new):
        shutil.rmtree(new)
        return msg + ", unchanged"
    if out.exists():
        shutil.rmtree(out)
    new.rename(out)
    return msg


def _same_files(a: Path, b: Path) -> bool:
    files = lambda d: sorted(p.relative_to(d) for p in d.rglob("*") if p.is_file() and "build" not in  # noqa: E731
                             p.relative_to(d).parts)
    fa, fb = files(a), files(b)
    return fa == fb and all((a / f).read_bytes() == (b / f).read_bytes() for f in fa)


def build(model: str, v: Variant, gen_dir: Path, timeout: float, jobs: int = 4) -> str:
    gc = _gpu_check()
    gc.build_extension(gen_dir / v.module(model), jobs=jobs, timeout=timeout)
    return f"{v.module(model)}: built"


def load(model: str, v: Variant, gen_dir: Path):
    """(module, layer class) of a built variant."""
    gc = _gpu_check()
    gv = gc.Variant(v.module(model), f"specs/{model}.yaml")
    mod = gc.load_generated(gv, gen_dir, build=False)
    return mod, gc.layer_class(mod, gv)


# ---------------------------------------------------------------------------------------------------------------
# Systems


@dataclass
class Context:
    """One dataset on the device, shared by every case of it."""
    g: dict
    dg: hw.DeviceGraph
    x: torch.Tensor            # [N, 64] float32 features
    label: torch.Tensor        # [N] random classes in [0, 64)
    cache: dict = field(default_factory=dict)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def loss_of(out, label):
    """The training step's loss, the same for every system: mean cross-entropy of the node outputs (in fp32)
    against the labels. Written as log_softmax and a gather rather than F.cross_entropy, whose nll_loss kernels
    reduce all N rows in one thread block: 3.7 ms of every step on am/mag (H100), more than a whole bf16 RGCN
    step of the layer itself (bench/README.md, "Loss")."""
    z = out.float().reshape(label.numel(), -1)
    return -F.log_softmax(z, 1).gather(1, label[:, None]).mean()


class System:
    name = "?"
    kind = "baseline"
    klass = "fp32"
    tf32 = False          # run with TF32 allowed in cuBLAS/cuDNN (fp32 baselines)
    dtype = "fp32"

    def supports(self, model: str) -> bool:
        return True

    def presetup(self, ctx: Context, model: str, train: bool) -> None:
        """Work done once, before the measured case (autotuning, module import): not timed, not in its peak."""

    def setup(self, ctx: Context, model: str, train: bool):
        """A callable running one inference pass or training step."""
        raise NotImplementedError

    def skip_reason(self, ctx: Context, model: str, train: bool, budget_s: float) -> str | None:
        return None

    def case_note(self, model: str) -> str:
        """A remark for the case's cell (set up by the last setup())."""
        return getattr(self, "note", "")

    def case_info(self, ctx: Context, model: str, train: bool) -> dict:
        """Extra fields of the case's record (after setup())."""
        return {}


def drop_prepared_graphs(ctx: Context) -> None:
    """Forgets the graphs hectorgen modules prepared on the dataset (a system set up on one keeps it alive)."""
    for k in [k for k in ctx.cache if k[0] == "hg_graph"]:
        del ctx.cache[k]


def _arch(device) -> str:
    """sm_XY of a CUDA device (the tuning table's key), else "cpu"."""
    if torch.device(device).type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


class HectorgenSystem(System):
    kind = "hectorgen"

    def __init__(self, model_modules: dict, v: Variant):
        self.v = v
        self.name, self.klass, self.dtype = v.label, v.klass, v.dtype
        self.modules = model_modules   # model -> (module, class) or an exception
        self.notes = {m: self._dtype_note(mc[0]) for m, mc in model_modules.items()
                      if not isinstance(mc, BaseException)}

    def _dtype_note(self, mod) -> str:
        """A warning when the module does not declare the variant's dtype (a compiler that ignores options.dtype
        would label fp32 code as another dtype)."""
        if self.dtype == "fp32":
            return ""
        try:
            man = json.loads((Path(mod.__file__).parent / "manifest.json").read_text())
        except Exception:  # noqa: BLE001
            man = {}
        declared = man.get("dtype") or man.get("options", {}).get("dtype")
        return "" if declared == self.dtype else \
            f"the module does not declare dtype {self.dtype} (manifest: {declared or 'none'}): generated as fp32?"

    def case_note(self, model):
        return self.notes.get(model, "")

    def case_info(self, ctx, model, train):
        """A materialization: auto module: the program it runs on this graph in this mode, and its cost model's
        estimates of both (ms)."""
        mod, _ = self.modules[model]
        if getattr(mod, "MATERIALIZATION", None) != "auto":
            return {}
        hg = self.graph(ctx, model, train)
        # A training step here computes the weights' gradients only (the features need none): the module's
        # forward() passes the same to its cost model.
        grads = getattr(mod, "WEIGHTS", None) if train else None
        kw = {"grads": grads} if grads is not None else {}
        estimates = mod.estimated_seconds(hg, train, **kw)
        timed = {"timed_ms": {k: None if ms is None else round(ms, 4)
                              for k, ms in self.timed_graph(ctx, model, train)[1].items()}} if self.timed(model) else {}
        return {"materialization": mod.materialization(hg, train, **kw), **timed,
                "estimated_ms": {k: None if s is None else round(s * 1e3, 4) for k, s in estimates.items()},
                # (launches, bytes, gather rows, search steps) per program: bench/calibrate_auto.py fits the tuning
                # table to the fixed variants
                "cost_terms": mod.cost_terms(hg, train, **kw), **({"grads": list(grads)} if grads else {}),
                "arch": _arch(ctx.x.device)}

    def supports(self, model):
        return model in self.modules

    def skip_reason(self, ctx, model, train, budget_s):
        m = self.modules[model]
        return f"ERR {m}" if isinstance(m, BaseException) else None

    def presetup(self, ctx, model, train):
        mod, _ = self.modules[model]
        key = ("hg_graph", mod.__name__)
        if key not in ctx.cache:
            drop_prepared_graphs(ctx)   # one prepared graph in the cache at a time
            g, dg = ctx.g, ctx.dg
            _sync(dg.device)
            t = time.perf_counter()
            hg = mod.prepare_graph(dg.src, dg.dst, dg.etype, g["num_nodes"], g["num_etypes"], ntype=dg.ntype,
                                   num_ntypes=g["num_ntypes"])
            _sync(dg.device)
            ctx.cache[key] = (hg, (time.perf_counter() - t) * 1e3)
        if self.timed(model):
            self.timed_graph(ctx, model, train)

    def timed(self, model) -> bool:
        """Whether the case's program is chosen by timing (timed_choice, on an auto module: the CPU dry run's
        stand-ins have one program)."""
        return self.v.timed_choice and getattr(self.modules[model][0], "MATERIALIZATION", None) == "auto"

    def timed_graph(self, ctx, model, train):
        """timed_choice: a copy of the case's prepared graph (the same arrays; its own choices, so that the cost-model
        variant sharing the module keeps its own) on which choose_by_timing picked the mode's program, timing both
        with a layer of this variant's dtype; kept in ctx.cache per mode, with the times."""
        mod, _ = self.modules[model]
        key = ("hg_graph", mod.__name__, "timed", train)
        if key not in ctx.cache:
            hg = ctx.cache[("hg_graph", mod.__name__)][0]
            mod.materialization(hg)   # the cost model's choices exist on hg
            timed = copy.copy(hg)
            timed.materialization_choices = dict(hg.materialization_choices)
            timed.materialization_by_grads = dict(getattr(hg, "materialization_by_grads", {}))
            timed.materialization_fixed = set(getattr(hg, "materialization_fixed", ()))
            layer = self.make_layer(ctx, model)
            times = layer.choose_by_timing(timed, ctx.x.to(STORAGE[self.dtype]), training=train)
            ctx.cache[key] = (timed, times)
            del layer
        return ctx.cache[key]

    def prepare_ms(self, ctx, model):
        return ctx.cache[("hg_graph", self.modules[model][0].__name__)][1]

    def make_layer(self, ctx, model):
        mod, cls = self.modules[model]
        g = ctx.g
        kw = {} if STORAGE[self.dtype] == torch.float32 else {"dtype": STORAGE[self.dtype]}
        return cls(g["num_etypes"], num_ntypes=g["num_ntypes"], device=ctx.x.device, **kw)

    def graph(self, ctx, model, train):
        """The prepared graph the case runs on (timed_choice: the copy whose program was chosen by timing)."""
        if self.timed(model):
            return self.timed_graph(ctx, model, train)[0]
        return ctx.cache[("hg_graph", self.modules[model][0].__name__)][0]

    def setup(self, ctx, model, train):
        hg = self.graph(ctx, model, train)
        layer = self.make_layer(ctx, model)
        x = ctx.x.to(STORAGE[self.dtype])
        self.last_layer = layer
        if not train:
            return lambda: layer(hg, x)
        params = list(layer.parameters())

        def step():
            for p in params:
                p.grad = None
            loss_of(layer(hg, x), ctx.label).backward()
        return step


class HandSystem(System):
    def __init__(self, dtype: str):
        self.dtype = dtype
        self.name = f"hand_{dtype}"
        self.klass = "bf16" if dtype in ("bf16", "fp16") else "fp32"
        self.tf32 = dtype == "fp32"

    def presetup(self, ctx, model, train):
        ctx.dg.choose(STORAGE[self.dtype], DIM)

    def setup(self, ctx, model, train):
        layer = hw.HandLayer(model, ctx.dg, STORAGE[self.dtype], layout="auto", dim=DIM)
        times = ctx.dg.segmm_ms.get(STORAGE[self.dtype], {})
        self.note = f"segment GEMM: {layer.kind}" + (
            " (" + ", ".join(f"{k} {v:.2f} ms" for k, v in times.items()) + ")" if len(times) > 1 else "")
        x = ctx.x.to(STORAGE[self.dtype])
        if not train:
            return lambda: layer(x)
        params = list(layer.parameters())

        def step():
            for p in params:
                p.grad = None
            loss_of(layer(x), ctx.label).backward()
        return step


# PyG's layer per model, and a rough cost model (ms per call on an H100, from ../shared/anchors/pyg.txt) used only
# to skip calls that would take minutes: RGCNConv loops over relations with a mask over all edges.
PYG_LAYERS = {"RGCNConv": "rgcn", "FastRGCNConv": "rgcn", "RGATConv": "rgat", "HGTConv": "hgt"}


def pyg_estimate_ms(layer: str, train: bool, N: int, E: int, R: int) -> float:
    if layer == "RGCNConv":
        ms = R * (0.2 + 3.5e-7 * E)
    elif layer == "HGTConv":
        ms = 0.25 * R + 1.5e-5 * E
        ms *= 18 if train else 1
    else:   # FastRGCNConv, RGATConv: per-edge weight matrices, memory-bound, OOM beyond ~5M edges on 80 GB
        ms = 1.5e-5 * E
        ms *= 10 if train else 1
    return ms


class PygSystem(System):
    def __init__(self, layer: str):
        self.layer = layer
        self.name = f"pyg_{layer}"
        self.tf32 = True

    def supports(self, model):
        return PYG_LAYERS[self.layer] == model

    def skip_reason(self, ctx, model, train, budget_s):
        try:
            import torch_geometric  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"skip: torch_geometric not importable ({type(e).__name__})"
        g = ctx.g
        est = pyg_estimate_ms(self.layer, train, g["num_nodes"], g["src"].numel(), g["num_etypes"])
        if est * 3 > budget_s * 1e3:
            return f"skip: estimated {est / 1e3:.0f} s a call, 3 calls exceed the {budget_s:.0f} s case budget"
        return None

    def setup(self, ctx, model, train):
        from torch_geometric.nn import FastRGCNConv, HGTConv, RGATConv, RGCNConv
        g, dg = ctx.g, ctx.dg
        D = DIM
        if self.layer == "HGTConv":
            nptr = g["nptr"].tolist()
            ntypes = [f"n{i}" for i in range(g["num_ntypes"])]
            xd = {t: ctx.x[nptr[i]:nptr[i + 1]] for i, t in enumerate(ntypes)}
            labd = {t: ctx.label[nptr[i]:nptr[i + 1]] for i, t in enumerate(ntypes)}
            eid, eptr = {}, g["eptr"].tolist()
            for r, (st, dt) in enumerate(g["rel_types"]):
                s = dg.src[eptr[r]:eptr[r + 1]] - nptr[st]
                d = dg.dst[eptr[r]:eptr[r + 1]] - nptr[dt]
                eid[(ntypes[st], f"r{r}", ntypes[dt])] = torch.stack([s, d])
            m = HGTConv(D, D, (ntypes, list(eid)), heads=1).to(ctx.x.device)
            if not train:
                return lambda: m(xd, eid)

            def step():
                m.zero_grad(set_to_none=True)
                out = m(xd, eid)
                sum(loss_of(out[k], labd[k]) for k in out if out[k] is not None).backward()
            return step
        ei = torch.stack([dg.src, dg.dst])
        cls = {"RGCNConv": RGCNConv, "FastRGCNConv": FastRGCNConv, "RGATConv": RGATConv}[self.layer]
        m = cls(D, D, g["num_etypes"], heads=1) if self.layer == "RGATConv" else cls(D, D, g["num_etypes"])
        m = m.to(ctx.x.device)
        if not train:
            return lambda: m(ctx.x, ei, dg.etype)

        def step():
            m.zero_grad(set_to_none=True)
            loss_of(m(ctx.x, ei, dg.etype), ctx.label).backward()
        return step


def baselines(names) -> list:
    out = []
    for n in names:
        if n in ("hand_fp32", "hand_bf16", "hand_fp16"):
            out.append(HandSystem(n.split("_")[1]))
        elif n.startswith("pyg_") and n[4:] in PYG_LAYERS:
            out.append(PygSystem(n[4:]))
        else:
            raise ValueError(f"unknown baseline {n!r} (hand_fp32, hand_bf16, hand_fp16, "
                             f"{', '.join('pyg_' + k for k in PYG_LAYERS)})")
    return out


DEFAULT_BASELINES = ("hand_fp32", "hand_bf16", "pyg_RGCNConv", "pyg_FastRGCNConv", "pyg_RGATConv", "pyg_HGTConv")


class StandInModule:
    """What a generated module offers (prepare_graph, a layer class with the spec's parameters), computed by the
    hand-written float32 layer: lets ``bench.py --device cpu`` run every path of the harness without a GPU."""

    def __init__(self, model: str):
        self.MODEL = model
        self.__name__ = f"standin_{model}"
        outer = self

        class Layer(torch.nn.Module):
            def __init__(self, num_etypes, num_ntypes=1, device=None, dtype=torch.float32):
                super().__init__()
                self.num_etypes, self.num_ntypes = num_etypes, num_ntypes
                for name, shape in hw.spec_shapes(outer.MODEL, num_etypes, num_ntypes, DIM).items():
                    t = torch.ones(shape) if name == "mu" else torch.randn(shape) / 8
                    setattr(self, name, torch.nn.Parameter(t.to(device=device, dtype=dtype)))

            def forward(self, g, x):
                lay = hw.HandLayer(outer.MODEL, g, x.dtype, layout="loop", dim=DIM,
                                   weights=dict(self.named_parameters()))
                return lay(x)
        self.Layer = Layer

    def prepare_graph(self, src, dst, etype, num_nodes, num_etypes, ntype=None, num_ntypes=None):
        ptr = lambda t, n: torch.cat([torch.zeros(1, dtype=torch.int64),  # noqa: E731
                                      torch.cumsum(torch.bincount(t.cpu(), minlength=n), 0)])
        eptr, nptr = ptr(etype, num_etypes), ptr(ntype, num_ntypes)
        g = dict(num_nodes=num_nodes, num_etypes=num_etypes, num_ntypes=num_ntypes, src=src, dst=dst, etype=etype,
                 ntype=ntype, eptr=eptr, nptr=nptr)
        return hw.DeviceGraph(g, src.device)
