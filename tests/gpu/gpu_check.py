#!/usr/bin/env python3
"""GPU correctness check (and a timing) of the modules that hectorgen generates.

    python3 tests/gpu/gpu_check.py --hectorgen build/hectorgen --generated DIR --out OUTDIR \
        [--models rgcn,rgat,rgat4,hgt] [--graphs tiny,medium] [--sanitizer-run] [--build-only] [--no-build]

For every model variant (VARIANTS below: variant name = spec ``model:`` = module name, its
spec, its family for the references) the generated module ``DIR/<name>/<name>.py`` is
imported, its extension built first with CMake into ``DIR/<name>/build`` (see
:func:`build_extension`; skipped with --no-build), and for every graph:

* fresh random inputs and weights (compare.fresh_inputs, a new seed per run unless
  --seed; the values are rounded to float32 once, and every reference gets exactly
  those values in float64), the layer's parameters set from them;
* forward on the GPU, compared with
    - tiny graph: hectorgen's float64 CPU reference interpreter (reference_bridge),
      plus the plain-PyTorch reference in float64 against the same interpreter as a
      sanity cross-check of the two oracles, plus the functional form ``mod.forward``;
    - other graphs (medium): the plain-PyTorch reference in float64 on the GPU;
* the CUDA caching allocator's free blocks are then filled with NaN (which is where the
  generated code's outputs and temporaries come from) and the forward is run again and
  compared again, so an output element or temporary that is read before being written
  shows up as NaN/inf; the rows of nodes without incoming edges are compared exactly
  (0 for RGAT/HGT) and the worst single row is reported, so a skipped row cannot hide
  in the global norm;
* on the non-tiny graphs the generated forward and the PyTorch reference (float32, same
  inputs) are timed with CUDA events (median of 20 after 5 warm-up runs).

Results: the table (compare.print_table) is the LAST thing printed; it and the timings
go to OUTDIR/gpu_check.md, every number to OUTDIR/gpu_check.json. Exit status 0 iff
every check passed.

Each variant runs in a child process of its own (unless --no-isolate), so a sticky CUDA
error or a crash in one model's kernels costs only that model's rows.

--sanitizer-run: one forward per variant on the tiny graph (no build, no CPU reference,
no timing), for ``compute-sanitizer --tool memcheck``; exits non-zero on any error.
--build-only: build the selected extensions in parallel and exit (logs in OUTDIR/build.log).

Assumptions about the generated module beyond docs/generated_api.md (all checked, and a
violation is reported as a FAIL row with the reason, not a crash):
  * ``<name>.load_extension(build_dir=...)`` accepts the CMake build directory (a
    TypeError falls back to ``load_extension()``); DIR/<name> and DIR/<name>/build are on
    sys.path, so ``import <name>_ext`` also works;
  * ``prepare_graph(src, dst, etype, N, R, ntype=..., num_ntypes=T)`` accepts int64 CUDA
    tensors and ntype even for models without per-ntype weights;
  * the layer class ``<Name>(num_etypes, num_ntypes=T, device="cuda")`` has one
    nn.Parameter attribute per spec weight with exactly the shape [R|T, *shape]/[*shape],
    and forward reads them at call time (they are set with ``copy_`` after construction);
  * outputs are float32 CUDA tensors of shape [N|E, *shape] (RGAT: [N, heads, out_dim]),
    freshly allocated through the PyTorch caching allocator on every call.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@dataclass(frozen=True)
class Variant:
    name: str     # spec `model:` = module name = DIR/<name>
    spec: str     # relative to the repository root
    family: str   # rgcn | rgat | hgt: which reference / fresh_inputs layout
    heads: int    # expected heads (the spec's value is used; a mismatch is reported)


VARIANTS = {v.name: v for v in (
    Variant("rgcn", "specs/rgcn.yaml", "rgcn", 1),
    Variant("rgat", "specs/rgat.yaml", "rgat", 1),
    Variant("rgat4", "tests/gpu/specs/rgat4.yaml", "rgat", 4),
    Variant("hgt", "specs/hgt.yaml", "hgt", 1),
    Variant("rgat_concat", "tests/gpu/specs/rgat_concat.yaml", "rgat", 1),  # exercises the PyTorch fallback
    Variant("rgcn_t32c4", "tests/gpu/specs/rgcn_t32c4.yaml", "rgcn", 1),  # GEMM tile 32, coarsening 4
    Variant("hgt_c2", "tests/gpu/specs/hgt_c2.yaml", "hgt", 1),  # coarsening 2, 128-thread traversals
)}

TOL = 1e-5          # generated fp32 vs float64 references
TOL_ORACLES = 1e-10  # PyTorch float64 reference vs the float64 interpreter
ROW_TOL = 1e-4       # worst single row (denominator floored at 0.1 x median row norm)
TOL_GRAD = 1e-4      # generated fp32 gradients vs PyTorch autograd on the float64 reference


class SetupError(RuntimeError):
    pass


class BuildError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Building and importing the generated modules
# ---------------------------------------------------------------------------------------------

def _nvcc() -> str | None:
    if os.environ.get("CUDACXX"):
        return os.environ["CUDACXX"]
    found = shutil.which("nvcc")
    if found:
        return found
    for cand in ("/usr/local/cuda/bin/nvcc",):
        if os.access(cand, os.X_OK):
            return cand
    return None


def default_cuda_arch() -> str | None:
    """CMAKE_CUDA_ARCHITECTURES for this machine: $HECTORGEN_CUDA_ARCH, else the first GPU's
    compute capability (e.g. "90"), else None (leave it to the generated CMakeLists)."""
    if os.environ.get("HECTORGEN_CUDA_ARCH"):
        return os.environ["HECTORGEN_CUDA_ARCH"]
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return f"{major}{minor}"
    except Exception:  # noqa: BLE001
        pass
    return None


def _ext_dirs(build: Path, name: str) -> list:
    """Directories under ``build`` holding the compiled ``<name>_ext`` module."""
    if not build.is_dir():
        return []
    dirs = []
    for p in sorted(build.rglob(f"{name}_ext*")):
        if p.suffix in (".so", ".pyd") and p.parent not in dirs and "CMakeFiles" not in p.parts:
            dirs.append(p.parent)
    return dirs


def add_to_sys_path(d: Path) -> None:
    """DIR, DIR/build and wherever the extension landed under it go first on sys.path."""
    d = Path(d).resolve()
    build = d / "build"
    for p in reversed([d, build] + _ext_dirs(build, d.name)):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    rt = REPO / "runtime" / "python"   # in case the module uses the hectorgen_runtime package
    if rt.is_dir() and str(rt) not in sys.path:
        sys.path.append(str(rt))


def build_extension(dir, *, jobs: int | None = None, cuda_arch: str | None = None,
                    reconfigure: bool = False, timeout: float | None = None,
                    log_path=None) -> Path:
    """Configures (once) and builds the extension of a generated module directory:

        cmake -S DIR -B DIR/build -G Ninja -DCMAKE_PREFIX_PATH=<torch.utils.cmake_prefix_path>
              -DCMAKE_BUILD_TYPE=Release && cmake --build DIR/build

    The hectorgen runtime must be findable by find_package(hectorgen_runtime): tools/gpu_check.sh installs it
    and puts its prefix on the CMAKE_PREFIX_PATH environment variable (runtime/README.md).

    plus Python/pybind11 hints and CMAKE_CUDA_ARCHITECTURES (``cuda_arch``, default: this
    GPU's). The configure step is skipped when DIR/build/CMakeCache.txt exists (unless
    ``reconfigure``); the build is incremental. Output goes to ``log_path`` (default
    DIR/build/build.log); a failure raises BuildError with the log's tail. Puts DIR and
    DIR/build on sys.path. Returns DIR/build.
    """
    import torch

    d = Path(dir).resolve()
    build = d / "build"
    build.mkdir(parents=True, exist_ok=True)
    log_path = Path(log_path) if log_path else build / "build.log"
    if not (d / "CMakeLists.txt").is_file():
        raise BuildError(f"{d}/CMakeLists.txt missing (module not generated?)")
    env = os.environ.copy()
    nvcc = _nvcc()
    if nvcc and "CUDACXX" not in env:
        env["CUDACXX"] = nvcc
    arch = cuda_arch if cuda_arch is not None else default_cuda_arch()
    if arch and "TORCH_CUDA_ARCH_LIST" not in env and arch.isdigit() and len(arch) >= 2:
        env["TORCH_CUDA_ARCH_LIST"] = f"{arch[:-1]}.{arch[-1]}"
    cfg = ["cmake", "-S", str(d), "-B", str(build), "--no-warn-unused-cli",
           f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
           "-DCMAKE_BUILD_TYPE=Release",
           f"-DPython_EXECUTABLE={sys.executable}", f"-DPython3_EXECUTABLE={sys.executable}",
           f"-DPYTHON_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja"):
        cfg += ["-G", "Ninja"]
    if arch:
        cfg.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    try:
        import pybind11  # type: ignore
        cfg.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
    except ImportError:
        pass
    steps = []
    if reconfigure or not (build / "CMakeCache.txt").is_file():
        steps.append(cfg)
    steps.append(["cmake", "--build", str(build)] + (["-j", str(jobs)] if jobs else []))
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        for cmd in steps:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            left = None if timeout is None else max(1.0, timeout - (time.monotonic() - t0))
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=left).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                log.flush()
                tail = "".join(Path(log_path).read_text(errors="replace").splitlines(True)[-40:])
                if cmd is cfg and (build / "CMakeCache.txt").exists():
                    # a half-written cache would make the next run skip the configure step
                    (build / "CMakeCache.txt").unlink()
                raise BuildError(f"{d.name}: `{' '.join(cmd[:3])} ...` failed ({rc}); log {log_path}:\n{tail}")
        log.write(f"# built in {time.monotonic() - t0:.1f} s\n")
    add_to_sys_path(d)
    return build


def load_generated(variant: Variant, gen_dir: Path, build: bool):
    """Builds (optionally) and imports DIR/<name>/<name>.py, loads its extension; returns the module."""
    d = (gen_dir / variant.name).resolve()
    if not (d / f"{variant.name}.py").is_file():
        raise SetupError(f"{d}/{variant.name}.py missing (was the module generated?)")
    if build:
        build_extension(d)
    elif not _ext_dirs(d / "build", variant.name):
        print(f"[{variant.name}] warning: no {variant.name}_ext*.so under {d}/build (not built?)", flush=True)
    add_to_sys_path(d)
    os.environ.setdefault("HECTORGEN_RUNTIME_BUILD_DIR", str(gen_dir.resolve() / "_runtime_jit"))
    mod = importlib.import_module(variant.name)
    if hasattr(mod, "load_extension"):
        try:
            mod.load_extension(build_dir=str(d / "build"))
        except TypeError:
            mod.load_extension()
    return mod


def layer_class(mod, variant: Variant, model_name: str):
    for cand in (variant.name.capitalize(), model_name.capitalize()):
        if hasattr(mod, cand):
            return getattr(mod, cand)
    raise SetupError(f"module {mod.__name__} has no class {variant.name.capitalize()!r}")


def build_all(names, gen_dir: Path, out_dir: Path | None, jobs: int | None, timeout: float | None) -> bool:
    """Builds the selected extensions in parallel; concatenates their logs into OUT/build.log."""
    ncpu = os.cpu_count() or 4
    per_job = jobs or max(2, ncpu // max(1, len(names)))
    arch = default_cuda_arch()
    results = {}

    def one(name):
        t0 = time.monotonic()
        try:
            build_extension(gen_dir / name, jobs=per_job, cuda_arch=arch, timeout=timeout)
            return name, True, f"built in {time.monotonic() - t0:.0f} s"
        except Exception as e:  # noqa: BLE001
            return name, False, str(e)

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as ex:
        for name, ok, msg in ex.map(one, names):
            results[name] = ok
            print(f"[build] {name}: {'OK' if ok else 'FAILED'} {msg.splitlines()[0] if msg else ''}", flush=True)
            if not ok:
                print(msg, flush=True)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "build.log", "w") as f:
            for name in names:
                lp = gen_dir / name / "build" / "build.log"
                f.write(f"===== {name} ({'OK' if results.get(name) else 'FAILED'}) =====\n")
                f.write(lp.read_text(errors="replace") if lp.is_file() else "(no log)\n")
    return all(results.values())


# ---------------------------------------------------------------------------------------------
# Helpers for the checks
# ---------------------------------------------------------------------------------------------

def spec_dims(spec) -> tuple:
    h = spec.hyper
    return int(h["in_dim"]), int(h["out_dim"]), int(h.get("heads", 1))


def call_inputs(spec, inp) -> list:
    return [inp[d.name] for d in spec.inputs if not d.from_graph]


def as_output_dict(out, spec) -> dict:
    names = [d.name for d in spec.outputs]
    if isinstance(out, dict):
        return dict(out)
    if isinstance(out, (tuple, list)):
        if len(out) != len(names):
            raise SetupError(f"forward returned {len(out)} values, the spec has outputs {names}")
        return dict(zip(names, out))
    if len(names) != 1:
        raise SetupError(f"forward returned one tensor, the spec has outputs {names}")
    return {names[0]: out}


def torch_reference(family: str, graph, inp64: dict, spec) -> dict:
    """The plain-PyTorch reference (reference_models) on ``inp64`` (float64), by output name."""
    from reference_models import hgt_ref, rgat_ref, rgcn_ref

    _, _, H = spec_dims(spec)
    if family == "rgcn":
        h = rgcn_ref(graph, inp64["feature"], inp64["W0"], inp64["W"], None)
    elif family == "rgat":
        h = rgat_ref(graph, inp64["feature"], inp64["W"], inp64["w_s"], inp64["w_t"], H,
                     float(spec.hyper.get("negative_slope", 0.2)))
    elif family == "hgt":
        h = hgt_ref(graph, *[inp64[k] for k in ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")],
                    heads=H)
    else:
        raise ValueError(family)
    return {spec.outputs[0].name: h}


def _nonfinite_note(t) -> str:
    import torch
    bad = ~torch.isfinite(t.detach())
    if not bool(bad.any()):
        return ""
    rows = bad.reshape(t.shape[0], -1).any(1).nonzero().flatten().tolist() if t.dim() else []
    return f"{int(bad.sum())} non-finite value(s) in rows {rows[:8]}{'...' if len(rows) > 8 else ''}"


def compare_outputs(got: dict, ref: dict, expect_fp32: bool = True) -> tuple:
    """(max rel err over outputs, note). Shape mismatches and missing outputs raise SetupError."""
    from compare import rel_err
    import torch

    worst, notes = -1.0, []
    for name, r in ref.items():
        if name not in got:
            raise SetupError(f"output {name!r} missing (forward returned {sorted(got)})")
        g = got[name]
        if not isinstance(g, torch.Tensor):
            raise SetupError(f"output {name!r} is a {type(g).__name__}, not a tensor")
        if tuple(g.shape) != tuple(r.shape):
            raise SetupError(f"output {name!r} has shape {tuple(g.shape)}, reference {tuple(r.shape)}")
        if expect_fp32 and g.dtype != torch.float32:
            notes.append(f"{name}: dtype {g.dtype}")
        e = rel_err(g, r)
        nf = _nonfinite_note(g)
        if nf:
            notes.append(f"{name}: {nf}")
        worst = max(worst, e) if not math.isnan(e) else math.nan
    return worst, "; ".join(notes)


def zero_in_degree_check(got: dict, ref: dict, spec, dst, num_nodes: int, tol: float) -> tuple:
    """Rows of nodes without incoming edges: exact when the reference rows are exactly 0
    (RGAT, HGT: returns (max |got|, ..., tol 0)), else rel err. -> (err, tol, note)."""
    import torch
    from compare import rel_err

    indeg = torch.bincount(dst.to(torch.int64), minlength=num_nodes)
    iso = (indeg == 0).nonzero().flatten()
    node_outs = [d.name for d in spec.outputs if d.per == "node"]
    if iso.numel() == 0 or not node_outs:
        return 0.0, tol, "graph has no node without incoming edges"
    err, exact, notes = 0.0, True, []
    for name in node_outs:
        r = ref[name].index_select(0, iso.to(ref[name].device))
        g = got[name].index_select(0, iso.to(got[name].device))
        if bool((r == 0).all()):
            gv = g.detach().double()
            e = math.inf if not bool(torch.isfinite(gv).all()) else float(gv.abs().max()) if gv.numel() else 0.0
            if e != 0.0:
                notes.append(f"{name}: rows must be exactly 0, max |value| {e:.3e}")
        else:
            exact = False
            e = rel_err(g, r)
        err = max(err, e)
    notes.insert(0, f"{iso.numel()} node(s)" + (", exact 0" if exact else ""))
    return err, (0.0 if exact else tol), "; ".join(notes)


def worst_row_check(got: dict, ref: dict, spec) -> tuple:
    """Max over rows of ||got_v - ref_v|| / max(||ref_v||, 0.1 * median nonzero row norm)."""
    import torch

    worst, where = 0.0, ""
    for name, r in ref.items():
        g = got[name].detach().to(device=r.device, dtype=torch.float64)
        n = r.shape[0]
        g2, r2 = g.reshape(n, -1), r.reshape(n, -1)
        if n == 0:
            continue
        if not bool(torch.isfinite(g2).all()):
            return math.inf, f"{name}: {_nonfinite_note(g2)}"
        den = torch.linalg.vector_norm(r2, dim=1)
        nz = den[den > 0]
        floor = 0.1 * float(nz.median()) if nz.numel() else torch.finfo(torch.float64).tiny
        e = torch.linalg.vector_norm(g2 - r2, dim=1) / den.clamp(min=floor)
        i = int(e.argmax())
        if float(e[i]) > worst or not where:
            worst, where = float(e[i]), f"{name}: row {i}"
    return worst, where


def poison_cached_free_memory(max_bytes: int = 8 << 30) -> int:
    """Fills the CUDA caching allocator's free (cached, inactive) blocks with NaN by
    allocating tensors of their sizes, filling them and freeing them again, so the next
    allocations (the generated code's outputs and temporaries) start out as NaN.
    Returns the number of bytes poisoned (0 with PYTORCH_NO_CUDA_MEMORY_CACHING=1)."""
    import torch

    torch.cuda.synchronize()
    try:
        snap = torch.cuda.memory_snapshot()
    except Exception:  # noqa: BLE001
        return 0
    sizes = sorted((int(b["size"]) for seg in snap for b in seg.get("blocks", [])
                    if b.get("state") == "inactive"), reverse=True)
    held, total = [], 0
    for s in sizes:
        if s < 4 or total + s > max_bytes:
            continue
        try:
            t = torch.empty(s // 4, dtype=torch.float32, device="cuda")
        except RuntimeError:
            break
        t.fill_(float("nan"))
        held.append(t)
        total += s
    torch.cuda.synchronize()
    del held
    return total


def cuda_time(fn, warmup: int, iters: int) -> tuple:
    """Median (and all samples) in ms of ``fn()`` timed with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e))
    return statistics.median(samples), samples


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


# ---------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------

class Checker:
    def __init__(self, args):
        self.args = args
        self.rows: list = []
        self.errors: list = []
        self.timings: list = []
        self.cases: list = []
        self.dump_path = None  # child mode: results rewritten here after every row, in case the process dies

    def dump(self):
        if self.dump_path:
            data = {"rows": self.rows, "errors": self.errors, "timings": self.timings, "cases": self.cases}
            tmp = Path(str(self.dump_path) + ".tmp")
            tmp.write_text(json.dumps(_jsonable(data)) + "\n")
            os.replace(tmp, self.dump_path)

    # -- bookkeeping ------------------------------------------------------------------------
    def row(self, model, graph, check, err, tol, note=""):
        from compare import make_row
        r = make_row(model, graph, check, err, tol)
        r["note"] = note
        self.rows.append(r)
        flag = "PASS" if r["ok"] else "FAIL"
        print(f"[{model}/{graph}] {check}: {err:.3e} (tol {tol:.0e}) {flag}" + (f"  -- {note}" if note else ""),
              flush=True)
        self.dump()
        return r

    def fail(self, model, graph, check, exc, tol=None):
        tol = TOL if tol is None else tol
        msg = f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc()
        self.errors.append({"model": model, "graph": graph, "check": check, "error": msg, "traceback": tb})
        print(f"[{model}/{graph}] {check}: ERROR {msg}\n{tb}", flush=True)
        self.row(model, graph, check, math.inf, tol, msg.splitlines()[0][:200])

    def guarded(self, model, graph, check, fn, tol=None):
        """Runs fn() -> (err, tol, note) or (err, note); records a row (an exception is a FAIL)."""
        tol = TOL if tol is None else tol
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001
            self.fail(model, graph, check, e, tol)
            return None
        if len(res) == 3:
            err, tol, note = res
        else:
            err, note = res
        return self.row(model, graph, check, err, tol, note)

    # -- one variant on one graph -----------------------------------------------------------
    def run_case(self, variant, spec, mod, cls, gname, ghost, seed):
        import torch
        from compare import fresh_inputs, rel_err
        from reference_bridge import cpu_reference

        a = self.args
        model = variant.name
        in_dim, out_dim, H = spec_dims(spec)
        gdev = ghost.to("cuda")
        N, R, T, E = ghost.num_nodes, ghost.num_etypes, ghost.num_ntypes, ghost.num_edges
        case = {"model": model, "graph": gname, "seed": seed, "N": N, "E": E, "R": R, "T": T}
        self.cases.append(case)
        tiny = gname == "tiny"
        ref_label = "cpu-ref64" if tiny else "torch-ref64"

        # Inputs and weights (fp32 on the GPU) and their exact float64 copies.
        inp = fresh_inputs(variant.family, ghost, (in_dim, out_dim), heads=H, seed=seed,
                           dtype=torch.float32, device="cuda")
        wanted = [d.name for d in spec.inputs + spec.weights if not d.from_graph]
        missing = [n for n in wanted if n not in inp]
        if missing:
            raise SetupError(f"fresh_inputs({variant.family!r}) has no {missing} (spec names differ)")

        t0 = time.perf_counter()
        hg = mod.prepare_graph(gdev.src, gdev.dst, gdev.etype, N, R, ntype=gdev.ntype, num_ntypes=T)
        torch.cuda.synchronize()
        case["prepare_graph_first_s"] = time.perf_counter() - t0
        layer = cls(R, num_ntypes=T, device="cuda")
        with torch.no_grad():
            for d in spec.weights:
                p = getattr(layer, d.name, None)
                if p is None:
                    raise SetupError(f"layer has no parameter {d.name!r}")
                want = tuple(inp[d.name].shape)
                if tuple(p.shape) != want:
                    raise SetupError(f"parameter {d.name!r} has shape {tuple(p.shape)}, expected {want}")
                p.copy_(inp[d.name])
        args = call_inputs(spec, inp)

        def fwd():
            with torch.no_grad():
                out = as_output_dict(layer(hg, *args), spec)
            torch.cuda.synchronize()
            return out

        # References.
        if tiny:
            ref = None
            if a.hectorgen:
                tens = {n: inp[n] for n in wanted}
                try:
                    ref = cpu_reference(a.hectorgen, REPO / variant.spec, ghost, tens)
                except Exception as e:  # noqa: BLE001
                    self.fail(model, gname, "cpu-ref64 (interpreter)", e)
            else:
                self.row(model, gname, "cpu-ref64 (interpreter)", math.nan, TOL, "no hectorgen binary given")
            inp64 = {k: v.detach().to("cpu", torch.float64) for k, v in inp.items()}
            tref = torch_reference(variant.family, ghost, inp64, spec)
            if ref is not None:
                self.guarded(model, gname, "torch-ref64 vs cpu-ref64",
                             lambda: compare_outputs(tref, ref, expect_fp32=False), tol=TOL_ORACLES)
            else:
                ref = tref
                ref_label = "torch-ref64"
        else:
            inp64 = {k: v.detach().to(torch.float64) for k, v in inp.items()}
            ref = torch_reference(variant.family, gdev, inp64, spec)

        # 1) first call.
        def first():
            out = fwd()
            case["first_call_ok"] = True
            return compare_outputs(out, ref)
        self.guarded(model, gname, f"forward vs {ref_label}", first)

        # 2) functional form (tiny only).
        if tiny:
            def functional():
                if not hasattr(mod, "forward"):
                    raise SetupError("module has no functional forward()")
                weights = [inp[d.name] for d in spec.weights]
                with torch.no_grad():
                    out = as_output_dict(mod.forward(hg, *args, *weights), spec)
                torch.cuda.synchronize()
                return compare_outputs(out, ref)
            self.guarded(model, gname, f"functional vs {ref_label}", functional)

        # 2b) bad inputs raise clear errors (never crash): wrong shape, dtype, device (tiny only).
        if tiny:
            def bad_inputs():
                x = args[0]
                cases = {"shape": x[:, :-1].contiguous(), "dtype": x.double(), "device": x.cpu()}
                wrong = []
                for what, bad in cases.items():
                    try:
                        with torch.no_grad():
                            layer(hg, bad, *args[1:])
                        wrong.append(f"{what}: no error")
                    except RuntimeError as e:
                        if what not in str(e) and "CUDA device" not in str(e) and "Float" not in str(e):
                            wrong.append(f"{what}: unclear message {str(e).splitlines()[0][:60]!r}")
                return (0.0 if not wrong else math.inf), 0.0, "; ".join(wrong) or "wrong shape/dtype/device raise RuntimeError"
            self.guarded(model, gname, "bad inputs raise", bad_inputs)

        # 3) re-run on NaN-poisoned allocator blocks, then the row checks on that output.
        out2 = None

        def poisoned():
            nonlocal out2
            poisoned_bytes = poison_cached_free_memory()
            case["poisoned_bytes"] = poisoned_bytes
            out2 = fwd()
            err, note = compare_outputs(out2, ref)
            return err, f"{poisoned_bytes / 2**20:.1f} MiB poisoned" + (f"; {note}" if note else "")
        self.guarded(model, gname, f"poisoned re-run vs {ref_label}", poisoned)
        if out2 is not None:
            dst = ghost.dst if tiny else gdev.dst
            self.guarded(model, gname, "rows w/o in-edges",
                         lambda: zero_in_degree_check(out2, ref, spec, dst, N, TOL))

            def worst():
                err, where = worst_row_check(out2, ref, spec)
                return err, ROW_TOL, where
            self.guarded(model, gname, "worst row", worst)
        del out2

        # 5) gradients through the generated backward pass (autograd.Function), determinism.
        if getattr(mod, "TRAINABLE", False):
            self.gradient_checks(variant, spec, layer, hg, args, inp, ghost if tiny else gdev, model, gname, case)

        # 4) timing (non-tiny graphs).
        if not tiny and a.timing_iters > 0:
            try:
                from reference_models import hgt_ref, rgat_ref, rgcn_ref
                if variant.family == "rgcn":
                    ref_fn = lambda: rgcn_ref(gdev, inp["feature"], inp["W0"], inp["W"], inp["norm"])  # noqa: E731
                elif variant.family == "rgat":
                    ref_fn = lambda: rgat_ref(gdev, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], H,  # noqa: E731
                                              float(spec.hyper.get("negative_slope", 0.2)))
                else:
                    names = ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")
                    ref_fn = lambda: hgt_ref(gdev, *[inp[k] for k in names], heads=H)  # noqa: E731
                with torch.no_grad():
                    gen_ms, gen_s = cuda_time(lambda: layer(hg, *args), a.timing_warmup, a.timing_iters)
                    ref_ms, ref_s = cuda_time(ref_fn, a.timing_warmup, a.timing_iters)
                    prep_ms, prep_s = cuda_time(
                        lambda: mod.prepare_graph(gdev.src, gdev.dst, gdev.etype, N, R, ntype=gdev.ntype,
                                                  num_ntypes=T), 2, max(5, a.timing_iters // 4))
                t = {"model": model, "graph": gname, "generated_ms": gen_ms, "reference_fp32_ms": ref_ms,
                     "speedup_vs_reference": ref_ms / gen_ms if gen_ms > 0 else math.inf,
                     "prepare_graph_ms": prep_ms, "warmup": a.timing_warmup, "iters": a.timing_iters,
                     "generated_samples_ms": gen_s, "reference_samples_ms": ref_s,
                     "prepare_graph_samples_ms": prep_s}
                self.timings.append(t)
                print(f"[{model}/{gname}] timing: generated {gen_ms:.3f} ms, PyTorch reference (fp32) "
                      f"{ref_ms:.3f} ms, speedup {t['speedup_vs_reference']:.2f}x, prepare_graph {prep_ms:.3f} ms",
                      flush=True)
            except Exception as e:  # noqa: BLE001
                self.errors.append({"model": model, "graph": gname, "check": "timing",
                                    "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
                print(f"[{model}/{gname}] timing: ERROR {e}", flush=True)
        del layer, hg, inp, inp64, ref
        torch.cuda.synchronize()

    def gradient_checks(self, variant, spec, layer, hg, args, inp, graph, model, gname, case):
        """Gradients of every weight and of the inputs, generated (fp32) vs PyTorch autograd on the float64
        reference model; then a second identical backward must give bit-identical weight gradients."""
        import torch
        from compare import rel_err

        names = [d.name for d in spec.inputs if not d.from_graph]
        gen = torch.Generator(device="cuda").manual_seed(int(case["seed"]) + 1)

        def generated_grads():
            xs = [a.detach().clone().requires_grad_(True) for a in args]
            layer.zero_grad(set_to_none=True)
            outs = as_output_dict(layer(hg, *xs), spec)
            if not douts:
                for k, v in outs.items():
                    douts[k] = torch.randn(v.shape, device="cuda", generator=gen)
            torch.autograd.backward([outs[k] for k in douts], [douts[k] for k in douts])
            torch.cuda.synchronize()
            got = {f"d_{n}": x.grad for n, x in zip(names, xs)}
            for d in spec.weights:
                got[f"d_{d.name}"] = getattr(layer, d.name).grad
            return got

        douts = {}
        try:
            got = generated_grads()
        except Exception as e:  # noqa: BLE001
            self.fail(model, gname, "backward (generated)", e)
            return
        dev = graph.src.device
        inp64 = {k: v.detach().to(dev, torch.float64).requires_grad_(True) for k, v in inp.items()}
        ref = torch_reference(variant.family, graph, inp64, spec)
        loss = sum((ref[k] * douts[k].to(dev, torch.float64)).sum() for k in douts)
        loss.backward()
        worst = 0.0
        for name, g in got.items():
            base = name[2:]
            if g is None or base not in inp64 or inp64[base].grad is None:
                continue
            err = rel_err(g.detach().to(dev, torch.float64), inp64[base].grad)
            worst = max(worst, err)
            self.row(model, gname, f"grad {name}", err, TOL_GRAD)
        case["max_grad_rel_err"] = worst
        # Determinism: the same backward again gives bit-identical weight gradients.
        first = {k: v.detach().clone() for k, v in got.items() if v is not None and k[2:] in {d.name for d in spec.weights}}
        again = generated_grads()
        same = all(torch.equal(first[k], again[k]) for k in first)
        self.row(model, gname, "weight grads bit-identical (2 runs)", 0.0 if same else math.inf, 0.0,
                 f"{len(first)} weight gradients")

    # -- everything -------------------------------------------------------------------------
    def run(self, variants, graph_names, base_seed):
        import torch
        from graphs import graph_by_name
        from reference_bridge import load_spec

        a = self.args
        hosts = {}
        for gname in graph_names:
            t0 = time.perf_counter()
            hosts[gname] = graph_by_name(gname, seed=a.graph_seed)
            print(f"graph {hosts[gname].summary()} built in {time.perf_counter() - t0:.1f} s", flush=True)
        for vi, v in enumerate(variants):
            try:
                spec = load_spec(REPO / v.spec)
                if spec.model != v.name:
                    raise SetupError(f"{v.spec} has model {spec.model!r}, expected {v.name!r}")
                H = int(spec.hyper.get("heads", 1))
                if H != v.heads:
                    print(f"[{v.name}] note: spec has heads={H}, table says {v.heads}; using the spec", flush=True)
                mod = load_generated(v, Path(a.generated), build=not a.no_build)
                cls = layer_class(mod, v, spec.model)
            except Exception as e:  # noqa: BLE001
                for gname in graph_names:
                    self.fail(v.name, gname, "build/import", e)
                continue
            for gi, gname in enumerate(graph_names):
                seed = base_seed + 1000 * vi + gi
                try:
                    self.run_case(v, spec, mod, cls, gname, hosts[gname], seed)
                except Exception as e:  # noqa: BLE001
                    self.fail(v.name, gname, "setup", e)
                torch.cuda.empty_cache()


def run_isolated(checker: Checker, args, variants, base_seed: int) -> None:
    """Runs each variant in a child process (same arguments, --models NAME, --child-json FILE) and
    merges the results; a child that crashes or times out gives a FAIL row."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for vi, v in enumerate(variants):
            part = Path(tmp) / f"{v.name}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--hectorgen", args.hectorgen or "",
                   "--generated", str(args.generated), "--out", str(args.out), "--models", v.name,
                   "--graphs", args.graphs, "--graph-seed", str(args.graph_seed), "--seed", str(base_seed + 1000 * vi),
                   "--tol", repr(args.tol), "--timing-iters", str(args.timing_iters),
                   "--timing-warmup", str(args.timing_warmup), "--child-json", str(part)]
            if args.no_build:
                cmd.append("--no-build")
            t0 = time.perf_counter()
            try:
                rc = subprocess.run(cmd, timeout=args.child_timeout).returncode
                why = f"child process exited with {rc}"
            except subprocess.TimeoutExpired:
                rc, why = "timeout", f"child process timed out after {args.child_timeout:.0f} s"
            print(f"[{v.name}] child done in {time.perf_counter() - t0:.1f} s (rc={rc})", flush=True)
            data = None
            if part.is_file():
                try:
                    data = json.loads(part.read_text())
                except ValueError:
                    data = None
            if data is not None:
                for r in data["rows"]:
                    r["err"], r["tol"] = float(r["err"]), float(r["tol"])
                    checker.rows.append(r)
                checker.errors += data["errors"]
                checker.timings += data["timings"]
                checker.cases += data["cases"]
            if rc != 0:  # crashed or timed out: say so (after whatever rows it had recorded)
                done = len(data["rows"]) if data else 0
                checker.errors.append({"model": v.name, "graph": "-", "check": "child process", "error": why,
                                       "traceback": "(see the child's output above)\n"})
                checker.row(v.name, "-", "child process", math.inf, TOL, f"{why} after {done} row(s)")


def _env_info() -> dict:
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
    try:
        info["nvcc"] = subprocess.run([_nvcc() or "nvcc", "--version"], capture_output=True, text=True,
                                      timeout=30).stdout.strip().splitlines()[-1]
    except Exception:  # noqa: BLE001
        pass
    return info


def write_reports(checker: Checker, out_dir: Path, meta: dict) -> None:
    from compare import format_table

    out_dir.mkdir(parents=True, exist_ok=True)
    table = format_table(checker.rows)
    md = ["# hectorgen GPU check", ""]
    md += [f"- {k}: {v}" for k, v in meta.items() if k not in ("args",)]
    md += ["", "```text", table, "```", ""]
    if checker.timings:
        md += ["## Timing (CUDA events, median of "
               f"{checker.timings[0]['iters']} after {checker.timings[0]['warmup']} warm-up runs)", "",
               "| model | graph | generated ms | PyTorch ref (fp32) ms | speedup | prepare_graph ms |",
               "| --- | --- | ---: | ---: | ---: | ---: |"]
        md += [f"| {t['model']} | {t['graph']} | {t['generated_ms']:.3f} | {t['reference_fp32_ms']:.3f} | "
               f"{t['speedup_vs_reference']:.2f}x | {t['prepare_graph_ms']:.3f} |" for t in checker.timings]
        md.append("")
    notes = [r for r in checker.rows if r.get("note")]
    if notes:
        md += ["## Notes", ""] + [f"- {r['model']}/{r['graph']} {r['check']}: {r['note']}" for r in notes] + [""]
    if checker.errors:
        md += ["## Errors", ""]
        for e in checker.errors:
            md += [f"### {e['model']}/{e['graph']} {e['check']}", "", "```text", e["traceback"].strip()[-4000:],
                   "```", ""]
    (out_dir / "gpu_check.md").write_text("\n".join(md) + "\n")
    data = {"meta": meta, "tolerances": {"fp32_vs_f64": TOL, "oracles": TOL_ORACLES, "worst_row": ROW_TOL},
            "rows": checker.rows, "timings": checker.timings, "cases": checker.cases, "errors": checker.errors}
    (out_dir / "gpu_check.json").write_text(json.dumps(_jsonable(data), indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# Sanitizer mode
# ---------------------------------------------------------------------------------------------

def sanitizer_run(args, variants) -> int:
    import torch
    from compare import fresh_inputs, rel_err
    from graphs import tiny_graph
    from reference_bridge import load_spec

    g = tiny_graph()
    gdev = g.to("cuda")
    failures = 0
    for v in variants:
        try:
            spec = load_spec(REPO / v.spec)
            in_dim, out_dim, H = spec_dims(spec)
            mod = load_generated(v, Path(args.generated), build=False)
            cls = layer_class(mod, v, spec.model)
            inp = fresh_inputs(v.family, g, (in_dim, out_dim), heads=H, seed=args.seed or 0, device="cuda")
            hg = mod.prepare_graph(gdev.src, gdev.dst, gdev.etype, g.num_nodes, g.num_etypes,
                                   ntype=gdev.ntype, num_ntypes=g.num_ntypes)
            layer = cls(g.num_etypes, num_ntypes=g.num_ntypes, device="cuda")
            with torch.no_grad():
                for d in spec.weights:
                    getattr(layer, d.name).copy_(inp[d.name])
                out = as_output_dict(layer(hg, *call_inputs(spec, inp)), spec)
            torch.cuda.synchronize()
            if getattr(mod, "TRAINABLE", False):  # one backward through the generated kernels too
                xs = [t.detach().clone().requires_grad_(True) for t in call_inputs(spec, inp)]
                outs = as_output_dict(layer(hg, *xs), spec)
                torch.autograd.backward(list(outs.values()), [torch.ones_like(o) for o in outs.values()])
                torch.cuda.synchronize()
                print(f"sanitizer-run {v.name} tiny: backward ran", flush=True)
            inp64 = {k: t.detach().to("cpu", torch.float64) for k, t in inp.items()}
            ref = torch_reference(v.family, g, inp64, spec)
            out_cpu = {k: t.detach().cpu() for k, t in out.items()}
            err, note = compare_outputs(out_cpu, ref)
            ok = err <= args.tol
            failures += not ok
            print(f"sanitizer-run {v.name} tiny: rel err {err:.3e} {'OK' if ok else 'FAIL'} {note}", flush=True)
            del layer, hg, out
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"sanitizer-run {v.name} tiny: ERROR {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
    print(f"sanitizer-run: {len(variants) - failures}/{len(variants)} variants OK", flush=True)
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    global TOL
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hectorgen", default=str(REPO / "build" / "hectorgen"),
                   help="hectorgen binary for the float64 CPU reference ('' to skip it: the tiny graph is then "
                        "compared with the PyTorch reference only, and a FAIL row says so)")
    p.add_argument("--generated", default=str(REPO / "generated"), help="directory holding <model>/ (default: generated)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "out" / "gpu_check"),
                   help="report directory (default: $OUT or out/gpu_check)")
    p.add_argument("--models", default="rgcn,rgat,rgat4,hgt,rgat_concat,rgcn_t32c4,hgt_c2", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--graphs", default="tiny,medium", help="comma list: tiny and/or graphs.PRESETS names")
    p.add_argument("--graph-seed", type=int, default=0, help="seed of the synthetic (preset) graphs")
    p.add_argument("--seed", type=int, default=None, help="input/weight seed (default: a fresh one per run)")
    p.add_argument("--tol", type=float, default=TOL, help="max rel err, fp32 vs float64 (default 1e-5)")
    p.add_argument("--timing-iters", type=int, default=20, help="timed runs (0: no timing)")
    p.add_argument("--timing-warmup", type=int, default=5)
    p.add_argument("--sanitizer-run", action="store_true", help="one forward per variant on the tiny graph only")
    p.add_argument("--build-only", action="store_true", help="build the extensions (in parallel) and exit")
    p.add_argument("--no-build", action="store_true", help="do not run CMake (use what DIR/<model>/build holds)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compile jobs per extension build")
    p.add_argument("--build-timeout", type=float, default=None, help="seconds per extension build")
    p.add_argument("--no-isolate", action="store_true",
                   help="check all models in this process (default: one child process per model, so a sticky "
                        "CUDA error or a crash in one model's kernels does not take the others down)")
    p.add_argument("--child-timeout", type=float, default=180, help="seconds per model child process")
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)  # internal: child writes its results here
    args = p.parse_args(argv)

    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in VARIANTS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {', '.join(VARIANTS)}")
    variants = [VARIANTS[m] for m in names]
    graph_names = [gname.strip() for gname in args.graphs.split(",") if gname.strip()]
    gen_dir = Path(args.generated)
    out_dir = Path(args.out)
    TOL = args.tol
    if args.hectorgen and not os.access(args.hectorgen, os.X_OK):
        print(f"warning: hectorgen binary {args.hectorgen!r} not executable: no CPU reference", flush=True)
        args.hectorgen = ""

    if args.sanitizer_run:
        # Before torch initialises CUDA: without the caching allocator, memcheck sees every
        # tensor's true bounds.
        os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
        return sanitizer_run(args, variants)

    if args.build_only:
        return 0 if build_all(names, gen_dir, out_dir, args.jobs, args.build_timeout) else 1

    import torch

    if not torch.cuda.is_available():
        print("error: CUDA is not available", flush=True)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    base_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "little")
    meta = {**_env_info(), "seed": base_seed, "graph_seed": args.graph_seed, "models": names,
            "graphs": graph_names, "generated": str(gen_dir.resolve()), "hectorgen": args.hectorgen or None,
            "args": vars(args)}
    print(f"gpu_check: seed {base_seed} (rerun with --seed {base_seed}); {meta.get('device')}, "
          f"torch {meta['torch']}", flush=True)
    t0 = time.perf_counter()
    checker = Checker(args)
    if args.child_json:
        checker.dump_path = Path(args.child_json)
        checker.run(variants, graph_names, base_seed)
        checker.dump()
        return 0
    if args.no_isolate or len(variants) == 1:
        checker.run(variants, graph_names, base_seed)
    else:
        run_isolated(checker, args, variants, base_seed)
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    write_reports(checker, out_dir, meta)

    from compare import print_table
    if checker.errors:
        print(f"\n{len(checker.errors)} error(s) (tracebacks above and in {out_dir / 'gpu_check.md'}):")
        for e in checker.errors:
            print(f"  {e['model']}/{e['graph']} {e['check']}: {e['error'].splitlines()[0][:300]}")
    if checker.timings:
        print("\ntiming (median ms): " + "; ".join(
            f"{t['model']}/{t['graph']} gen {t['generated_ms']:.3f} ref {t['reference_fp32_ms']:.3f} "
            f"({t['speedup_vs_reference']:.2f}x)" for t in checker.timings))
    print(f"\nreports: {out_dir / 'gpu_check.md'}, {out_dir / 'gpu_check.json'}\n", flush=True)
    ok = print_table(checker.rows)
    sys.stdout.flush()
    return 0 if ok and checker.rows else 1


if __name__ == "__main__":
    sys.exit(main())
