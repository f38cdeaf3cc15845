#!/usr/bin/env python3
"""GPU check of the code hectorgen generates, for any spec: forward and gradients against two float64 oracles.

    python3 tests/gpu/gpu_check.py [SPEC|MODEL ...] --hectorgen build/hectorgen --generated DIR --out OUTDIR \
        [--graphs tiny,medium] [--seed N] [--device cuda|cpu]
        [--prepare] [--sanitizer-run] [--summary] [--no-build]

Specs: the arguments (spec paths, or model names of the default list), default every bundled and test spec
(specs/*, tests/gpu/specs/*.yaml, tests/specs/*.yaml; a second spec of an already listed model, such as
specs/rgcn.json next to specs/rgcn.yaml, is left out with a note).

Phases (tools/gpu_check.sh runs them in this order, each under its own time limit):

--prepare      generates every spec with hectorgen into DIR/<model>/ (DIR mirrors the repository layout, so
               relative paths in the output match), records whether it warned "no backward pass" (checked
               forward-only) or failed (DIR/generation.json, DIR/gen.log), then builds the extensions in
               parallel (OUTDIR/build.log). Without hectorgen the bundled generated/<model> is copied instead.
(default)      the checks. Per spec, in a child process of its own (a crash or a sticky CUDA error costs only
               that spec's rows), per graph, with FRESH random inputs, weights and output gradients every run
               (ir_torch.random_inputs: values rounded to float32 once, so every reference sees exactly what
               the kernels see; the seed is printed, --seed repeats a run):
                 * references: the generic plain-PyTorch model of the spec (ir_torch.py, float64, autograd
                   for the gradients) and, on the tiny graph, hectorgen's float64 interpreter (forward, and
                   the backward program of its autodiff); the two oracles are compared with each other
                   (1e-12), and with the hand-written family reference where one exists (rgcn/rgat/hgt);
                 * forward of the generated layer vs the interpreter (tiny) / the PyTorch model on the device
                   (medium), the functional form, bad inputs raising, then a re-run on NaN-poisoned
                   allocator blocks (so outputs and temporaries read before written show up), rows of nodes
                   without in-edges (exact 0 where the reference is), the worst single row;
                 * gradients (trainable modules): every input and weight gradient through the generated
                   backward vs the interpreter's / autograd's, then a second backward on poisoned memory:
                   bit-identical weight gradients, and still correct;
                 * modules generated without a backward pass: checked forward-only, plus a row requiring
                   that calling the layer with parameters that require grad raises (item 8);
                 * timings on the non-tiny graphs: the generated forward (and forward+backward) vs the
                   PyTorch model in float32 (and the hand-written reference where one exists);
                 * models of --capture (default rgcn,rgat,hgt), on the last graph: a forward and a training
                   step under torch.cuda.set_sync_debug_mode("error") (no host sync), then each captured in
                   a CUDA graph and replayed on new values vs an eager run (Checker.capture_checks).
--dtypes LIST  the dtype run: the specs (default dtypes.DEFAULT_DTYPE_SPECS) times the dtypes, each generated
               as <model>_<dtype> from the spec with options.dtype replaced (dtype_variants); per module,
               inputs rounded to the storage dtype, forward / forward_train / backward vs the float64
               interpreter at the dtype's tolerance (Checker.run_dtype_case), the table of summarize_dtypes.
               With --prepare: generates and builds those modules.
               Every row goes to OUTDIR/gpu_check.md and OUTDIR/gpu_check.json.
--sanitizer-run  one forward (and backward when trainable) per spec on the tiny graph, with markers that
               attribute compute-sanitizer reports to specs; for memcheck and racecheck.
--summary      the short per-spec table (status PASS / FWD-ONLY / FAIL, worst errors, memcheck, racecheck,
               timings) from OUTDIR/gpu_check.json and the sanitizer logs; printed and written to
               OUTDIR/summary.txt.

--device cpu   a dry run without a GPU: the "generated module" is a stand-in built from the PyTorch model
               itself in float32 (FakeModule), so every path of the harness -- generation status, references,
               poisoning, gradients, determinism, tables -- runs on the CPU. HG_FAKE_BUG=forward|grad|nondet|
               no-raise makes the stand-in wrong in one way, to see the check fail (tests/gpu/test_gpu_check_dry.py).

HG_COMPACT_RELATIONS=THETA|alternate  prepares the graphs of modules with compact layouts with only some relations
               compacted (hectorgen_runtime.prepare_graph(..., compact_relations=), runtime >= 1.3): THETA a
               threshold on unique pairs / edges (0: no relation with edges compacted), alternate: the even
               relations. Every check then runs on the mixed layout, against the same float64 references.

Tolerances: float32 results vs float64 references: relative error 1e-5 (forward) and 1e-4 (gradients), the
denominator floored at 16 times the float32 rounding noise of the same computation in plain PyTorch
(compare.floored_rel_err), so a gradient that cancels to almost zero is judged by the precision it can have.
The dtype run: tests/gpu/dtypes.py (fp32 1e-5, tf32 2e-3, bf16/fp16 2e-2, outputs and gradients alike; the
noise floor scaled to the dtype's precision).

Assumptions about a generated module (docs/generated_api.md), all in Adapter and load_generated below:
``load_extension(build_dir=...)``; ``prepare_graph(src, dst, etype, N, R, ntype=, num_ntypes=)``; the layer
class (the module's torch.nn.Module subclass) ``Cls(num_etypes, num_ntypes=T, device=)`` with one parameter
per weight, shape [R|T, *shape] or [*shape]; ``layer(g, *inputs)`` (inputs in spec order, from_graph ones
left out) returning a tensor or a dict by output name; ``forward(g, *inputs, *weights)``; ``TRAINABLE``.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from dtypes import DEFAULT_DTYPE_SPECS, DTYPES, parse_dtypes, rewrite_spec, variant_name  # noqa: E402

DEFAULT_SPEC_GLOBS = ("specs/*.yaml", "specs/*.yml", "specs/*.json", "tests/gpu/specs/*.yaml", "tests/specs/*.yaml")
# Models with a hand-written reference in reference_models.py (an extra cross-check; no spec needs one).
FAMILIES = {"rgcn": "rgcn", "rgcn_t32c4": "rgcn", "rgat": "rgat", "rgat4": "rgat", "rgat_concat": "rgat",
            "hgt": "hgt", "hgt_c2": "hgt"}

TOL = 1e-5           # generated float32 forward vs float64 references
TOL_GRAD = 1e-4      # generated float32 gradients vs float64 references
TOL_ORACLES = 1e-12  # the float64 references among themselves
ROW_TOL = 1e-4       # worst single row (denominator floored at 0.1 x median row norm)
NOISE_FACTOR = 16.0  # results within this many times plain PyTorch's float32 noise pass (compare.floored_rel_err)


class SetupError(RuntimeError):
    pass


class BuildError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    name: str          # the spec's model name = module name = DIR/<name>
    spec: str          # path relative to the repository root when inside it, else absolute
    family: str | None = None  # hand-written reference family, if any
    graphs: tuple | None = None  # only these graphs (a spec's "# gpu_check: graphs=tiny" line), else all
    dtype: str | None = None   # a dtype variant (--dtypes): options.dtype of the generated spec, else None
    base: str | None = None    # a dtype variant: the model name of the spec it was made from
    source: str | None = None  # a dtype variant: that spec (the references run on it; same program, float64)

    @property
    def ref_spec(self) -> str:
        """The spec the float64 references (interpreter, PyTorch model) are computed from."""
        return self.source or self.spec

    @property
    def base_name(self) -> str:
        return self.base or self.name


def spec_graphs(path: Path):
    """The graphs a spec asks to be checked on, from a comment line "# gpu_check: graphs=tiny[,medium]"
    (a spec too large for the medium graph, e.g. tests/gpu/specs/many_heads.yaml); None: every graph."""
    import re
    m = re.search(r"^#\s*gpu_check:\s*graphs\s*=\s*([\w,]+)", Path(path).read_text(), re.M)
    return tuple(g for g in m.group(1).split(",") if g) if m else None


def _rel(p: Path) -> str:
    p = p.resolve()
    try:
        return str(p.relative_to(REPO))
    except ValueError:
        return str(p)


def model_name(spec_path) -> str:
    from reference_bridge import load_spec
    return load_spec(spec_path).model


def spec_dtype(spec_path) -> str:
    """The spec's own options.dtype (fp32 when it names none)."""
    from reference_bridge import load_spec
    return str((load_spec(spec_path).doc.get("options") or {}).get("dtype", "fp32"))


def discover(entries=None) -> tuple:
    """(variants, notes). ``entries``: spec paths or model names of the default list; default: all."""
    notes = []
    default = []
    for pat in DEFAULT_SPEC_GLOBS:
        default += sorted(REPO.glob(pat))
    by_name: dict = {}

    def add(path: Path, explicit: bool):
        name = model_name(path)
        if name in by_name:
            if explicit or by_name[name].spec != _rel(path):
                notes.append(f"{_rel(path)}: model {name!r} is already checked from {by_name[name].spec}; left out")
            return
        by_name[name] = Variant(name, _rel(path), FAMILIES.get(name), spec_graphs(path))

    if not entries:
        for p in default:
            add(p, False)
        return list(by_name.values()), notes
    known = {}
    for p in default:
        known.setdefault(model_name(p), p)
    for e in entries:
        p = Path(e)
        if not p.is_absolute() and (REPO / p).is_file():
            p = REPO / p
        if p.is_file():
            add(p, True)
        elif e in known:
            add(known[e], True)
        else:
            raise SetupError(f"{e!r} is neither a spec file nor a model of the default specs ({', '.join(known)})")
    return list(by_name.values()), notes


def dtype_variants(entries, dtypes, gen_root: Path) -> tuple:
    """(variants, notes) of a dtype run: every spec of ``entries`` (default dtypes.DEFAULT_DTYPE_SPECS) times every
    dtype of ``dtypes``. Each variant's spec is the original with ``model: <model>_<dtype>`` and ``options.dtype``
    replaced (dtypes.rewrite_spec), written to gen_root/dtype_specs/<model>_<dtype>.yaml (rewritten only when its
    text changes, so a second call keeps the file)."""
    base, notes = discover(list(entries) if entries else list(DEFAULT_DTYPE_SPECS))
    out_dir = Path(gen_root) / "dtype_specs"
    out = []
    for v in base:
        text = (REPO / v.spec).read_text()
        for d in dtypes:
            name = variant_name(v.name, d)
            try:
                new = rewrite_spec(text, model=v.name, rename=name, dtype=d, where=v.spec)
            except ValueError as e:
                raise SetupError(f"{v.spec}: cannot make its {d} variant: {e}") from e
            path = out_dir / f"{name}.yaml"
            if not path.is_file() or path.read_text() != new:
                out_dir.mkdir(parents=True, exist_ok=True)
                path.write_text(new)
            out.append(Variant(name, str(path.resolve()), v.family, v.graphs, dtype=d, base=v.name, source=v.spec))
    return out, notes


def selected_variants(entries, dtypes, gen_root) -> tuple:
    """(variants, notes) a run checks: with ``dtypes`` (a dtype run) the dtype variants of ``entries``
    (dtype_variants, written under gen_root), else the specs themselves (discover), where a spec whose own
    options.dtype is not fp32 is refused: the plain run feeds float32 values."""
    if dtypes:
        return dtype_variants(entries, dtypes, gen_root)
    variants, notes = discover(entries)
    for v in variants:
        if (d := spec_dtype(REPO / v.spec)) != "fp32":
            raise SetupError(f"{v.spec}: options.dtype is {d}, and the plain check runs float32 values; "
                             f"check it with --dtypes {d} {v.spec}")
    return variants, notes


def _default_variants() -> dict:
    try:
        return {v.name: v for v in discover()[0]}
    except Exception:  # noqa: BLE001  (tools/train_example.py imports this table; never fail at import)
        return {}


VARIANTS = _default_variants()


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

@dataclass
class GenResult:
    name: str
    spec: str
    ok: bool
    status: str               # one line for the logs and the summary
    no_backward: str | None   # why there is no training code (forward-only check), None if trainable
    stderr: str = ""


_NO_BACKWARD = re.compile(r"warning: (no backward pass generated: .*|no training code generated.*|backward: .*)$")


def generate(v: Variant, hectorgen: str | None, gen_root: Path) -> GenResult:
    """hectorgen SPEC -o generated/<model>, run in gen_root (a mirror of the repository layout)."""
    out_dir = gen_root / "generated" / v.name
    if not hectorgen:
        bundled = REPO / "generated" / v.name
        if not bundled.is_dir():
            return GenResult(v.name, v.spec, False, "MISSING (no hectorgen, not in generated/)", None)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(bundled, out_dir, ignore=shutil.ignore_patterns("build"))
        return GenResult(v.name, v.spec, True, "bundled generated/ copy (no hectorgen)", None)
    if out_dir.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        # gen_root mirrors specs/, tests/ and runtime/; a spec elsewhere in the repository is named absolutely
        spec = v.spec if (gen_root / v.spec).is_file() else str(REPO / v.spec)
        p = subprocess.run([hectorgen, spec, "-o", f"generated/{v.name}"], cwd=gen_root, capture_output=True,
                           text=True, timeout=120)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        rc, err = "timeout", "hectorgen timed out after 120 s"
    reasons = [m.group(1) for ln in err.splitlines() if (m := _NO_BACKWARD.search(ln))]
    no_bw = "; ".join(dict.fromkeys(reasons)) or None
    if rc != 0:
        lines = err.strip().splitlines()
        first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "")
        return GenResult(v.name, v.spec, False, f"GENERATION FAILED (rc={rc}): {first.strip()[:300]}", no_bw, err)
    n = sum(1 for f in out_dir.iterdir() if f.is_file())
    status = f"generated ({n} files)"
    bundled = REPO / "generated" / v.name
    if bundled.is_dir():
        d = subprocess.run(["diff", "-r", "-q", "-x", "build", "-x", ".*", str(bundled), str(out_dir)],
                           capture_output=True, text=True)
        status += ", same as generated/" if d.returncode == 0 else \
            f", DIFFERS from generated/ ({len(d.stdout.splitlines())} file(s))"
    if no_bw:
        status += ", forward-only (no backward)"
    return GenResult(v.name, v.spec, True, status, no_bw, err)


def generate_all(variants, hectorgen, gen_root: Path) -> dict:
    if gen_root.resolve() == REPO.resolve():
        raise SetupError("--prepare would regenerate the committed generated/; pass --generated SCRATCH/generated")
    gen_root.mkdir(parents=True, exist_ok=True)
    for link in ("specs", "tests", "runtime"):
        lp = gen_root / link
        if lp.is_symlink() or not lp.exists():
            if lp.is_symlink():
                lp.unlink()
            lp.symlink_to(REPO / link)
    (gen_root / "generated").mkdir(exist_ok=True)
    results = {}
    with open(gen_root / "gen.log", "a") as log:
        for v in variants:
            r = generate(v, hectorgen, gen_root)
            results[v.name] = r
            log.write(f"===== {v.name}: hectorgen {v.spec} -o generated/{v.name}: {r.status}\n{r.stderr}\n")
            print(f"[generate] {v.name} ({v.spec}): {r.status}" + (f"\n    no backward: {r.no_backward}"
                                                                     if r.no_backward else ""), flush=True)
    (gen_root / "generation.json").write_text(json.dumps({k: asdict(r) for k, r in results.items()}, indent=1))
    return results


def read_generation(gen_dir: Path) -> dict:
    """DIR/../generation.json or DIR/generation.json -> {name: GenResult}; {} when absent."""
    for p in (gen_dir.parent / "generation.json", gen_dir / "generation.json"):
        if p.is_file():
            return {k: GenResult(**r) for k, r in json.loads(p.read_text()).items()}
    return {}


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
    rt = REPO / "runtime" / "python"   # the hectorgen_runtime package, for modules that import it
    if rt.is_dir() and str(rt) not in sys.path:
        sys.path.append(str(rt))


def build_extension(dir, *, jobs: int | None = None, cuda_arch: str | None = None,
                    reconfigure: bool = False, timeout: float | None = None,
                    log_path=None) -> Path:
    """Configures (once) and builds the extension of a generated module directory -- the one place that
    knows how a generated module is built:

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


def build_all(names, gen_dir: Path, out_dir: Path | None, jobs: int | None, timeout: float | None) -> bool:
    """Builds the selected extensions in parallel; concatenates their logs into OUT/build.log."""
    ncpu = os.cpu_count() or 4
    names = list(names)
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


def load_generated(variant: Variant, gen_dir: Path, build: bool):
    """Builds (optionally) and imports DIR/<name>/<name>.py, loads its extension; returns the module."""
    d = (Path(gen_dir) / variant.name).resolve()
    if not (d / f"{variant.name}.py").is_file():
        raise SetupError(f"{d}/{variant.name}.py missing (was the module generated?)")
    if build:
        build_extension(d)
    elif not _ext_dirs(d / "build", variant.name):
        print(f"[{variant.name}] warning: no {variant.name}_ext*.so under {d}/build (not built?)", flush=True)
    add_to_sys_path(d)
    os.environ.setdefault("HECTORGEN_RUNTIME_BUILD_DIR", str(Path(gen_dir).resolve() / "_runtime_jit"))
    mod = importlib.import_module(variant.name)
    if hasattr(mod, "load_extension"):
        try:
            mod.load_extension(build_dir=str(d / "build"))
        except TypeError:
            mod.load_extension()
    return mod


def layer_class(mod, variant: Variant = None, model_name_: str | None = None):
    """The module's layer: its torch.nn.Module subclass (docs: the model name capitalised)."""
    import torch

    for cand in [n.capitalize() for n in (getattr(variant, "name", None), model_name_) if n]:
        if isinstance(getattr(mod, cand, None), type):
            return getattr(mod, cand)
    found = [c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, torch.nn.Module)
             and c.__module__ == mod.__name__]
    if len(found) == 1:
        return found[0]
    raise SetupError(f"module {mod.__name__} has no unique layer class (nn.Module subclasses: "
                     f"{[c.__name__ for c in found]})")


# ---------------------------------------------------------------------------------------------
# The CPU stand-in for a generated module (--device cpu)
# ---------------------------------------------------------------------------------------------

class FakeModule:
    """What a generated module offers, computed by the PyTorch model of the spec in float32 on the CPU.
    Used by --device cpu to run the harness without a GPU. ``dtype``: the storage dtype of a module generated
    for options.dtype (it then exports DTYPE, takes and returns tensors of that dtype and computes in float32, as
    the generated kernels accumulate); None: a module without DTYPE (float32 only, like those generated before
    dtype support). ``bug`` (HG_FAKE_BUG) injects one defect: 'forward' leaves output row 0 unwritten (NaN) after
    memory was poisoned; 'grad' (or 'grad=SCALE') scales the first weight gradient by 1.001 (SCALE);
    'nondet' perturbs weight gradients differently on every backward; 'no-raise' (for modules without a
    backward) runs while parameters require grad instead of raising; 'sync' synchronises with the host
    (fails under the sync debug mode and in a CUDA-graph capture); 'stale' (a CUDA-graph stand-in) replays
    without recomputing."""

    def __init__(self, model, trainable: bool, bug: str | None = None, dtype=None):
        import torch
        import ir_torch

        self.__name__ = model.name
        self.MODEL = model.name
        self.TRAINABLE = trainable
        if dtype is not None:
            self.DTYPE = dtype
        self._storage = dtype or torch.float32
        self._model = model
        self._bug = bug
        self._poisoned = False
        self._calls = 0
        self._strict = None   # "sync" (sync debug mode) or "capture" (inside a CUDA-graph capture), set by Capture
        fake = self

        class Layer(torch.nn.Module):
            def __init__(self, num_etypes, num_ntypes=1, device=None, dtype=fake._storage):
                super().__init__()
                if dtype != fake._storage:
                    raise ValueError(f"{model.name} kernels are generated for {fake._storage}, not {dtype}")
                lead = {"etype": (num_etypes,), "ntype": (num_ntypes,), "none": ()}
                for d in model.weights:
                    setattr(self, d.name, torch.nn.Parameter(
                        torch.zeros(lead[d.per] + tuple(d.shape), device=device, dtype=dtype)))

            def forward(self, g, *inputs):
                return fake.forward(g, *inputs, *[getattr(self, d.name) for d in model.weights])

        Layer.__name__ = Layer.__qualname__ = model.name.capitalize()
        Layer.__module__ = model.name
        setattr(self, Layer.__name__, Layer)
        self._ir = ir_torch

    def poison(self):
        self._poisoned = True

    def load_extension(self, build_dir=None):
        return None

    def prepare_graph(self, src, dst, etype, num_nodes, num_etypes, ntype=None, num_ntypes=1):
        return {"src": src, "dst": dst, "etype": etype, "num_nodes": int(num_nodes), "num_etypes": int(num_etypes),
                "ntype": ntype, "num_ntypes": int(num_ntypes)}

    def forward(self, g, *tensors):
        import torch

        m = self._model
        user_inputs = [d for d in m.inputs if not d.from_graph]
        if len(tensors) != len(user_inputs) + len(m.weights):
            raise TypeError(f"{m.name}.forward takes {len(user_inputs)} inputs and {len(m.weights)} weights")
        N, E = g["num_nodes"], int(g["src"].numel())
        named = {}
        for d, t in zip(user_inputs + m.weights, tensors):
            want = d.full_shape(N, E, g["num_etypes"], g["num_ntypes"])
            if tuple(t.shape) != want:
                raise RuntimeError(f"{m.name}: {d.name} has shape {tuple(t.shape)}, expected {want}")
            if t.dtype != self._storage:
                raise RuntimeError(f"{m.name}: {d.name} must be {self._storage}, got {t.dtype}")
            if t.device != g["src"].device:
                raise RuntimeError(f"{m.name}: {d.name} is on {t.device}, the graph on {g['src'].device}")
            named[d.name] = t
        grad_wanted = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        if self._bug == "sync" and self._strict:
            raise RuntimeError("called a synchronizing CUDA operation" if self._strict == "sync" else
                               "operation not permitted when stream is capturing")
        if grad_wanted and not self.TRAINABLE and self._bug != "no-raise":
            raise RuntimeError(f"{m.name} has no backward pass (generated forward-only); "
                               "call it under torch.no_grad() or with tensors that do not require grad")
        if grad_wanted and self.TRAINABLE and (self._bug or "").split("=")[0] in ("grad", "nondet"):
            self._calls += 1
            if self._bug == "nondet":
                scale = 1.0 + 1e-7 * self._calls
            else:
                scale = float(self._bug.split("=")[1]) if "=" in self._bug else 1.001
            w = m.weights[0].name
            named[w] = _grad_scale(named[w], scale)
        with torch.set_grad_enabled(grad_wanted and self.TRAINABLE or self._bug == "no-raise" and grad_wanted):
            # float32 arithmetic whatever the storage dtype (the casts carry the gradients back to it)
            out = self._ir.evaluate(m, g, {k: t.float() for k, t in named.items()}, dtype=torch.float32)
            out = {k: t.to(self._storage) for k, t in out.items()}
        if self._bug == "forward" and self._poisoned:
            first = next(iter(out))
            out[first] = out[first].clone()
            with torch.no_grad():
                out[first][0] = float("nan")
        outs = {k: out[k] for k in (o.name for o in m.outputs)}
        return next(iter(outs.values())) if len(outs) == 1 else outs


_GRAD_SCALE = None


def _grad_scale(x, scale: float):
    """x in the forward; its gradient times ``scale`` in the backward (FakeModule's injected defects)."""
    global _GRAD_SCALE
    if _GRAD_SCALE is None:
        import torch

        class GradScale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t, k):
                ctx.k = k
                return t.view_as(t)

            @staticmethod
            def backward(ctx, g):
                return g * ctx.k, None
        _GRAD_SCALE = GradScale
    return _GRAD_SCALE.apply(x, scale)


# ---------------------------------------------------------------------------------------------
# Adapter: the one place that calls a generated module
# ---------------------------------------------------------------------------------------------

def compact_relations_from_env(num_etypes: int):
    """compact_relations for hectorgen_runtime.prepare_graph from HG_COMPACT_RELATIONS (module docstring): None when
    unset, a float threshold, or for 'alternate' the mask of the even relations."""
    value = os.environ.get("HG_COMPACT_RELATIONS", "").strip()
    if not value:
        return None
    if value == "alternate":
        return [r % 2 == 0 for r in range(num_etypes)]
    try:
        return float(value)
    except ValueError:
        raise SetupError(f"HG_COMPACT_RELATIONS must be a threshold (a number >= 0) or 'alternate', got {value!r}") \
            from None


class Adapter:
    def __init__(self, mod, model, device, trainable: bool, variant: Variant | None = None,
                 materialization: str | None = None):
        self.mod = mod
        self.model = model
        self.device = device
        self.cls = layer_class(mod, variant, model.name)  # a dtype variant's class: <Model>_<dtype>
        self.trainable = trainable
        self.input_names = [d.name for d in model.inputs if not d.from_graph]
        self.weight_names = [d.name for d in model.weights]
        # materialization: auto modules: the program every graph is prepared for ("vanilla" or "compact"), so that
        # each is checked; None: the module's own choice.
        self.materialization = materialization

    def prepare(self, g):
        layouts = tuple(getattr(self.mod, "GRAPH_LAYOUTS", ()))
        compact = compact_relations_from_env(g.num_etypes)
        kw = {}
        if self.materialization is not None:  # an auto module: its prepare_graph takes both
            kw = {"materialization": self.materialization}
            if compact is not None:
                kw["compact_relations"] = compact
        elif compact is not None and any(layout.startswith("compact_") for layout in layouts):
            import hectorgen_runtime  # what the module's prepare_graph calls, with the per-relation choice
            return hectorgen_runtime.prepare_graph(g.src, g.dst, g.etype, g.num_nodes, g.num_etypes, layouts=layouts,
                                                   ntype=g.ntype, num_ntypes=g.num_ntypes,
                                                   gemm_tile=self.mod.GEMM_TILE, compact_relations=compact)
        return self.mod.prepare_graph(g.src, g.dst, g.etype, g.num_nodes, g.num_etypes, ntype=g.ntype,
                                      num_ntypes=g.num_ntypes, **kw)

    def layer(self, g, weights: dict, dtype=None):
        """The layer for graph ``g`` with ``weights`` copied into its parameters; ``dtype``: the parameters' dtype
        (the constructor's ``dtype=``; default: the module's own default)."""
        import torch
        kw = {} if dtype is None else {"dtype": dtype}
        layer = self.cls(g.num_etypes, num_ntypes=g.num_ntypes, device=self.device, **kw)
        with torch.no_grad():
            for name in self.weight_names:
                p = getattr(layer, name, None)
                if p is None:
                    raise SetupError(f"layer has no parameter {name!r}")
                if tuple(p.shape) != tuple(weights[name].shape):
                    raise SetupError(f"parameter {name!r} has shape {tuple(p.shape)}, expected "
                                     f"{tuple(weights[name].shape)}")
                p.copy_(weights[name])
        return layer

    def outputs(self, out) -> dict:
        names = [o.name for o in self.model.outputs]
        if isinstance(out, dict):
            return dict(out)
        if isinstance(out, (tuple, list)):
            if len(out) != len(names):
                raise SetupError(f"forward returned {len(out)} values, the spec has outputs {names}")
            return dict(zip(names, out))
        if len(names) != 1:
            raise SetupError(f"forward returned one tensor, the spec has outputs {names}")
        return {names[0]: out}

    def call(self, layer, hg, inputs: list) -> dict:
        return self.outputs(layer(hg, *inputs))

    def functional(self, hg, inputs: list, weights: list) -> dict:
        if not hasattr(self.mod, "forward"):
            raise SetupError("module has no functional forward()")
        return self.outputs(self.mod.forward(hg, *inputs, *weights))


# ---------------------------------------------------------------------------------------------
# Helpers for the checks
# ---------------------------------------------------------------------------------------------

def auto_programs(mod) -> list:
    """The programs to check of a generated module: both ("vanilla", "compact") of a materialization: auto module
    (MATERIALIZATION = "auto"), else [None] (the module's only program)."""
    if getattr(mod, "MATERIALIZATION", None) == "auto":
        return list(mod.PROGRAMS)
    return [None]


def sync(device):
    import torch
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _nonfinite_note(t) -> str:
    import torch
    bad = ~torch.isfinite(t.detach())
    if not bool(bad.any()):
        return ""
    rows = bad.reshape(t.shape[0], -1).any(1).nonzero().flatten().tolist() if t.dim() else []
    return f"{int(bad.sum())} non-finite value(s) in rows {rows[:8]}{'...' if len(rows) > 8 else ''}"


def compare_maps(got: dict, ref: dict, tol: float, noise: dict | None = None, expect_fp32=True,
                 factor: float | None = None) -> tuple:
    """(worst floored rel err over the tensors of ``ref``, tol, note). Missing tensors / shape mismatches
    raise SetupError. ``noise``: per tensor, the rounding noise of the computation at the tested precision
    (compare.floored_rel_err), ``factor`` times which a result may be off (default NOISE_FACTOR).
    ``expect_fp32``: note tensors that are not float32 (a torch.dtype: note those not of that dtype)."""
    import torch
    from compare import floored_rel_err

    want = torch.float32 if expect_fp32 is True else expect_fp32 or None
    factor = NOISE_FACTOR if factor is None else factor

    worst, notes, floored = -1.0, [], []
    for name, r in ref.items():
        if name not in got or got[name] is None:
            raise SetupError(f"{name!r} missing (got {sorted(k for k, v in got.items() if v is not None)})")
        g = got[name]
        if not isinstance(g, torch.Tensor):
            raise SetupError(f"{name!r} is a {type(g).__name__}, not a tensor")
        if tuple(g.shape) != tuple(r.shape):
            raise SetupError(f"{name!r} has shape {tuple(g.shape)}, reference {tuple(r.shape)}")
        if want is not None and g.dtype != want:
            notes.append(f"{name}: dtype {g.dtype}")
        e, fl = floored_rel_err(g, r, tol, (noise or {}).get(name, 0.0), factor)
        if fl:
            floored.append(name)
        nf = _nonfinite_note(g)
        if nf:
            notes.append(f"{name}: {nf}")
        worst = e if math.isnan(e) or e > worst else worst
    if floored:
        notes.append(f"denominator floored at the rounding noise for {', '.join(floored)}")
    return max(worst, 0.0), tol, "; ".join(notes)


def zero_in_degree_check(got: dict, ref: dict, model, dst, num_nodes: int, tol: float) -> tuple:
    """Rows of nodes without incoming edges: exact when the reference rows are exactly 0
    (returns (max |got|, tol 0, note)), else rel err. -> (err, tol, note)."""
    import torch
    from compare import rel_err

    indeg = torch.bincount(dst.to(torch.int64), minlength=num_nodes)
    iso = (indeg == 0).nonzero().flatten()
    node_outs = [o.name for o in model.outputs if o.per == "node"]
    if iso.numel() == 0 or not node_outs:
        return 0.0, tol, "no node without incoming edges" if node_outs else "no node output"
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


def worst_row_check(got: dict, ref: dict) -> tuple:
    """Max over rows of ||got_v - ref_v|| / max(||ref_v||, 0.1 * median nonzero row norm)."""
    import torch

    worst, where = 0.0, ""
    for name, r in ref.items():
        g = got[name].detach().to(device=r.device, dtype=torch.float64)
        n = r.shape[0]
        if n == 0:
            continue
        g2, r2 = g.reshape(n, -1), r.reshape(n, -1)
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
    allocations (the generated code's outputs and temporaries) start out as NaN. Every byte
    becomes 0xFF: a NaN in float32, bfloat16 and float16 alike.
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
            t = torch.empty(s // 4, dtype=torch.int32, device="cuda")
        except RuntimeError:
            break
        t.fill_(-1)
        held.append(t)
        total += s
    torch.cuda.synchronize()
    del held
    return total


def poison(device, mod) -> int:
    """NaN into the memory the next outputs/temporaries come from (CUDA), or the stand-in's flag (CPU)."""
    if str(device).startswith("cuda"):
        return poison_cached_free_memory()
    if hasattr(mod, "poison"):
        mod.poison()
    return 0


def dtype_check(tensors: dict, want) -> tuple:
    """(0, 0, note) when every tensor has dtype ``want``, else (inf, 0, the ones that do not)."""
    wrong = [f"{k}: {t.dtype}" for k, t in tensors.items() if t is not None and t.dtype != want]
    return (math.inf if wrong else 0.0), 0.0, (", ".join(wrong) if wrong else f"{len(tensors)} tensor(s)")


def module_storage(mod, v: Variant):
    """The storage torch.dtype a dtype variant's module must use (its parameters, inputs and outputs): the
    module's DTYPE, which must be that of ``v.dtype``. A module without DTYPE is float32-only (generated by a
    hectorgen that ignores options.dtype): fine for fp32, a SetupError naming the problem for any other dtype."""
    import torch

    info = DTYPES[v.dtype]
    want = info.torch_dtype
    got = getattr(mod, "DTYPE", None)
    if got is None:
        if want == torch.float32 and v.dtype == "fp32":
            return want
        raise SetupError(f"module {v.name} exports no DTYPE: this hectorgen does not implement options.dtype "
                         f"{v.dtype} (expected DTYPE = torch.{info.storage}; the module is float32-only)")
    if isinstance(got, str):
        got = getattr(torch, got.replace("torch.", ""), got)
    if got != want:
        raise SetupError(f"module {v.name}: DTYPE is {got}, expected torch.{info.storage} for dtype {v.dtype}")
    return want


class _FakeGraph:
    """The CPU stand-in of a captured CUDA graph (--device cpu): replay() runs the captured function again and
    copies its results into the tensors the capture returned, as a replay rewrites the graph's memory."""

    def __init__(self, fn, static: dict, mod):
        self.fn, self.static, self.mod = fn, static, mod

    def replay(self):
        import torch
        if getattr(self.mod, "_bug", None) == "stale":
            return
        new = self.fn()
        with torch.no_grad():
            for k, t in self.static.items():
                t.copy_(new[k])


class Capture:
    """CUDA graphs and the host-sync debug mode, or their stand-ins on the CPU (FakeModule's ``_strict`` flag):
    what the capture checks use, so that the dry run exercises them too."""

    def __init__(self, device, mod):
        self.cuda = str(device).startswith("cuda")
        self.mod = mod

    @contextmanager
    def no_sync(self):
        """Any host synchronisation inside raises (torch.cuda.set_sync_debug_mode("error"))."""
        import torch
        if not self.cuda:
            self.mod._strict = "sync"
            try:
                yield
            finally:
                self.mod._strict = None
            return
        torch.cuda.synchronize()
        prev = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(prev)

    def capture(self, fn):
        """(graph, results): fn() run twice on a side stream (warm-up, as torch.cuda.graphs recommends), then
        captured into a torch.cuda.CUDAGraph; ``results`` (a dict of tensors) is what the capture returned,
        rewritten by every replay. Raises if the capture fails (a host sync, a raw allocation, ...)."""
        import torch
        if not self.cuda:
            fn()
            self.mod._strict = "capture"
            try:
                res = fn()
            finally:
                self.mod._strict = None
            return _FakeGraph(fn, res, self.mod), res
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            res = fn()
        torch.cuda.synchronize()
        return graph, res

    def replay(self, graph):
        graph.replay()
        if self.cuda:
            import torch
            torch.cuda.synchronize()


def time_ms(fn, device, warmup: int, iters: int) -> tuple:
    """Median (and all samples) in ms of ``fn()``: CUDA events on a GPU, perf_counter on the CPU."""
    import torch

    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(iters):
        if str(device).startswith("cuda"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), samples


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def hand_reference(family, graph, t: dict, model):
    """The hand-written reference (reference_models) of a family, by output name."""
    from reference_models import hgt_ref, rgat_ref, rgcn_ref

    H = int(model.hyper.get("heads", 1))
    if family == "rgcn":
        h = rgcn_ref(graph, t["feature"], t["W0"], t["W"], t.get("norm"))
    elif family == "rgat":
        h = rgat_ref(graph, t["feature"], t["W"], t["w_s"], t["w_t"], H, float(model.hyper.get("negative_slope", 0.2)))
    elif family == "hgt":
        h = hgt_ref(graph, *[t[k] for k in ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")], heads=H)
    else:
        raise ValueError(family)
    return {model.outputs[0].name: h}


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
        self.specs: dict = {}   # name -> {"spec", "trainable", "no_backward", "generation"}
        self.dump_path = None   # child mode: results rewritten here after every row, in case the process dies
        self.tag: dict = {}     # added to every row (a dtype variant: its base spec and dtype)
        self.graph_names: list = []

    def dump(self):
        if self.dump_path:
            data = {"rows": self.rows, "errors": self.errors, "timings": self.timings, "cases": self.cases,
                    "specs": self.specs}
            tmp = Path(str(self.dump_path) + ".tmp")
            tmp.write_text(json.dumps(_jsonable(data)) + "\n")
            os.replace(tmp, self.dump_path)

    # -- bookkeeping ------------------------------------------------------------------------
    def row(self, model, graph, check, err, tol, note="", kind="check", phase=None):
        from compare import make_row
        r = make_row(model, graph, check, err, tol)
        r["note"] = note
        r["kind"] = kind   # forward | grad | oracle | check | setup | capture
        r.update(self.tag)
        if phase:
            r["phase"] = phase  # dtype runs: setup | oracle | forward | forward_train | backward | sync | capture
        self.rows.append(r)
        flag = "PASS" if r["ok"] else "FAIL"
        print(f"[{model}/{graph}] {check}: {err:.3e} (tol {tol:.0e}) {flag}" + (f"  -- {note}" if note else ""),
              flush=True)
        self.dump()
        return r

    def fail(self, model, graph, check, exc, tol=None, kind="setup", phase=None):
        tol = TOL if tol is None else tol
        msg = f"{type(exc).__name__}: {exc}"
        tb = traceback.format_exc()
        self.errors.append({"model": model, "graph": graph, "check": check, "error": msg, "traceback": tb})
        print(f"[{model}/{graph}] {check}: ERROR {msg}\n{tb}", flush=True)
        self.row(model, graph, check, math.inf, tol, msg.splitlines()[0][:400], kind, phase)

    def guarded(self, model, graph, check, fn, tol=None, kind="check", phase=None):
        """Runs fn() -> (err, tol, note) or (err, note); records a row (an exception is a FAIL)."""
        tol = TOL if tol is None else tol
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001
            self.fail(model, graph, check, e, tol, kind, phase)
            return None
        if len(res) == 3:
            err, tol, note = res
        else:
            err, note = res
        return self.row(model, graph, check, err, tol, note, kind, phase)

    # -- references -------------------------------------------------------------------------
    def references(self, v, model, g, inputs64, d_out64, want_grads, on_device, name, gname, tiny):
        """Float64 references (and float32 noise) for one case. Returns (ref_out, ref_grads, noise_out,
        noise_grads, label). Tiny graph: the interpreter is the reference, the PyTorch model checked against
        it; otherwise the PyTorch model on the device."""
        import torch
        import ir_torch
        from compare import EPS_RATIO

        dev = on_device
        gg = g if tiny else g.to(dev)
        x64 = {k: t.to(dev) for k, t in inputs64.items()}
        dout = {k: t.to(dev) for k, t in d_out64.items()}
        if want_grads:
            t_out, t_grads = ir_torch.forward_backward(model, gg, x64, dout)
            o32, g32 = ir_torch.forward_backward(model, gg, x64, dout, dtype=torch.float32)
            noise_g = {k: float(torch.linalg.vector_norm(g32[k].double() - t_grads[k])) for k in t_grads}
        else:
            with torch.no_grad():
                t_out = ir_torch.evaluate(model, gg, x64)
                o32 = ir_torch.evaluate(model, gg, x64, dtype=torch.float32)
            t_grads, noise_g = None, {}
        noise_o = {k: float(torch.linalg.vector_norm(o32[k].double() - t_out[k])) for k in t_out}
        if not tiny:
            return t_out, t_grads, noise_o, noise_g, "torch-ref64"
        a = self.args
        label = "torch-ref64"
        ref_out, ref_grads = t_out, t_grads
        if a.hectorgen:
            from reference_bridge import cpu_reference, cpu_reference_grads, ReferenceError
            try:
                if want_grads:
                    i_out, i_grads = cpu_reference_grads(a.hectorgen, REPO / v.ref_spec, g, inputs64, d_out64)
                else:
                    i_out, i_grads = cpu_reference(a.hectorgen, REPO / v.ref_spec, g, inputs64), None
                label = "interp64"
                self.guarded(name, gname, "oracles: torch-ref64 vs interp64 (forward)",
                             lambda: compare_maps(t_out, i_out, TOL_ORACLES,
                                                  {k: n * EPS_RATIO for k, n in noise_o.items()}, False),
                             tol=TOL_ORACLES, kind="oracle")
                if want_grads:
                    self.guarded(name, gname, "oracles: torch-ref64 vs interp64 (gradients)",
                                 lambda: compare_maps(t_grads, i_grads, TOL_ORACLES,
                                                      {k: n * EPS_RATIO for k, n in noise_g.items()}, False),
                                 tol=TOL_ORACLES, kind="oracle")
                ref_out, ref_grads = i_out, i_grads
            except ReferenceError as e:
                self.fail(name, gname, "interp64 (float64 interpreter)", e, TOL_ORACLES, "oracle")
        else:
            self.row(name, gname, "interp64 (float64 interpreter)", math.nan, TOL_ORACLES,
                     "no hectorgen binary given", "oracle")
        if v.family:
            def hand():
                with torch.no_grad():
                    h = hand_reference(v.family, g, inputs64, model)
                return compare_maps(h, t_out, TOL_ORACLES, {k: n * EPS_RATIO for k, n in noise_o.items()}, False)
            self.guarded(name, gname, f"oracles: hand-written {v.family} ref vs torch-ref64", hand,
                         tol=TOL_ORACLES, kind="oracle")
        return ref_out, ref_grads, noise_o, noise_g, label

    # -- one spec on one graph --------------------------------------------------------------
    def run_case(self, v, model, ad: Adapter, gname, host_graph, seed):
        import torch
        import ir_torch

        a = self.args
        dev = a.device
        name = v.name
        tiny = gname == "tiny"
        gdev = host_graph.to(dev)
        N, R, T, E = host_graph.num_nodes, host_graph.num_etypes, host_graph.num_ntypes, host_graph.num_edges
        case = {"model": name, "graph": gname, "seed": seed, "N": N, "E": E, "R": R, "T": T}
        self.cases.append(case)

        inputs64 = ir_torch.random_inputs(model, host_graph, seed)
        d_out64 = ir_torch.random_output_grads(model, host_graph, seed)
        inp = {k: t.to(dev, torch.float32) for k, t in inputs64.items()}
        d_out = {k: t.to(dev, torch.float32) for k, t in d_out64.items()}
        trainable = ad.trainable
        grad_names = ir_torch.grad_names(model)

        # References first (the interpreter and the PyTorch model), on the CPU for the tiny graph.
        ref, ref_grads, noise_o, noise_g, label = self.references(
            v, model, host_graph, inputs64, d_out64, trainable and bool(grad_names), "cpu" if tiny else dev,
            name, gname, tiny)

        t0 = time.perf_counter()
        hg = ad.prepare(gdev)
        sync(dev)
        case["prepare_graph_first_s"] = time.perf_counter() - t0
        layer = ad.layer(host_graph, {k: inp[k] for k in ad.weight_names})
        args = [inp[k] for k in ad.input_names]

        def fwd():
            with torch.no_grad():
                out = ad.call(layer, hg, args)
            sync(dev)
            return out

        self.guarded(name, gname, f"forward vs {label}", lambda: compare_maps(fwd(), ref, TOL, noise_o),
                     kind="forward")
        if tiny:
            def functional():
                with torch.no_grad():
                    out = ad.functional(hg, args, [inp[k] for k in ad.weight_names])
                sync(dev)
                return compare_maps(out, ref, TOL, noise_o)
            self.guarded(name, gname, f"functional vs {label}", functional, kind="forward")

            def bad_inputs():
                if not args:
                    return 0.0, 0.0, "no inputs"
                x = args[0]
                cases = {"shape": x[..., :-1].contiguous() if x.dim() > 1 else x[:-1].contiguous(),
                         "dtype": x.double()}
                if str(dev).startswith("cuda"):
                    cases["device"] = x.cpu()
                wrong = []
                for what, bad in cases.items():
                    try:
                        with torch.no_grad():
                            layer(hg, bad, *args[1:])
                        wrong.append(f"{what}: no error")
                    except (RuntimeError, ValueError, TypeError) as e:
                        if not str(e).strip():
                            wrong.append(f"{what}: empty message")
                return (0.0 if not wrong else math.inf), 0.0, "; ".join(wrong) or \
                    f"wrong {'/'.join(cases)} raise with a message"
            self.guarded(name, gname, "bad inputs raise", bad_inputs)

        out2 = None

        def poisoned():
            nonlocal out2
            nbytes = poison(dev, ad.mod)
            case["poisoned_bytes"] = nbytes
            out2 = fwd()
            err, tol, note = compare_maps(out2, ref, TOL, noise_o)
            return err, tol, f"{nbytes / 2**20:.1f} MiB poisoned" + (f"; {note}" if note else "")
        self.guarded(name, gname, f"poisoned re-run vs {label}", poisoned, kind="forward")
        if out2 is not None:
            self.guarded(name, gname, "rows w/o in-edges",
                         lambda: zero_in_degree_check(out2, ref, model, host_graph.dst if tiny else gdev.dst, N, TOL))

            def worst():
                err, where = worst_row_check(out2, ref)
                return err, ROW_TOL, where
            self.guarded(name, gname, "worst row", worst)
        del out2

        if trainable and grad_names:
            self.gradient_checks(ad, layer, hg, args, d_out, ref_grads, noise_g, grad_names, name, gname, label, dev)
        elif not trainable:
            self.guarded(name, gname, "no backward: requires_grad raises", lambda: self.no_backward_raises(
                ad, layer, hg, args))

        if not tiny and a.timing_iters > 0:
            try:
                self.timing(v, model, ad, layer, hg, args, inp, d_out, gdev, name, gname,
                            trainable and bool(grad_names))
            except Exception as e:  # noqa: BLE001
                self.errors.append({"model": name, "graph": gname, "check": "timing",
                                    "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
                print(f"[{name}/{gname}] timing: ERROR {e}", flush=True)
        sync(dev)
        if self.capture_wanted(v) and gname == self.graph_names[-1]:
            self.capture_checks(v, model, ad, layer, hg, host_graph, seed, torch.float32, TOL, name, gname,
                                trainable and bool(grad_names))

    # -- dtype variants (--dtypes) ----------------------------------------------------------
    def run_dtype_case(self, v, model, ad: Adapter, gname, host_graph, seed, storage):
        """One dtype variant on one graph: the generated forward (inference), forward_train and backward vs the
        float64 interpreter, at the dtype's tolerance (dtypes.DTYPES). Inputs, weights and output gradients are
        drawn in float64 and rounded to the storage dtype once; the references run on exactly those values (in
        float64), so only the generated arithmetic is measured. Every phase runs on NaN-poisoned memory."""
        import torch
        import ir_torch

        a = self.args
        dev = a.device
        name = v.name
        info = DTYPES[v.dtype]
        tol = info.tol
        gdev = host_graph.to(dev)
        self.cases.append({"model": name, "graph": gname, "seed": seed, "dtype": v.dtype, "N": host_graph.num_nodes,
                           "E": host_graph.num_edges, "R": host_graph.num_etypes, "T": host_graph.num_ntypes})
        rounded = {k: t.to(storage) for k, t in
                   ir_torch.random_inputs(model, host_graph, seed, round_to_fp32=False).items()}
        d_rounded = {k: t.to(storage) for k, t in
                     ir_torch.random_output_grads(model, host_graph, seed, round_to_fp32=False).items()}
        x64 = {k: t.double() for k, t in rounded.items()}
        d64 = {k: t.double() for k, t in d_rounded.items()}
        trainable = ad.trainable
        grad_names = ir_torch.grad_names(model)
        want_grads = trainable and bool(grad_names)

        # float64 references on the CPU: the interpreter (and the PyTorch model, checked against it), and the
        # float32 rounding noise of the PyTorch model, scaled to this dtype's precision.
        ref, ref_grads, noise_o, noise_g, label = self.references(v, model, host_graph, x64, d64, want_grads, "cpu",
                                                                  name, gname, True)
        noise_o = {k: n * info.noise_scale for k, n in noise_o.items()}
        noise_g = {k: n * info.noise_scale for k, n in noise_g.items()}

        def cmp(got, refs, noise):
            return compare_maps(got, refs, tol, noise, storage, info.noise_factor)

        hg = ad.prepare(gdev)
        layer = ad.layer(host_graph, {k: rounded[k].to(dev) for k in ad.weight_names}, dtype=storage)
        args = [rounded[k].to(dev) for k in ad.input_names]
        d_out = {k: t.to(dev) for k, t in d_rounded.items()}
        self.guarded(name, gname, f"parameters stored as {storage}", lambda: dtype_check(
            {w: getattr(layer, w) for w in ad.weight_names}, storage), tol=0.0, phase="setup")

        def forward():
            nbytes = poison(dev, ad.mod)
            with torch.no_grad():
                out = ad.call(layer, hg, args)
            sync(dev)
            self.row(name, gname, f"outputs stored as {storage}", *dtype_check(out, storage), "forward", "forward")
            err, t, note = cmp(out, ref, noise_o)
            return err, t, f"{nbytes / 2**20:.1f} MiB poisoned" + (f"; {note}" if note else "")
        self.guarded(name, gname, f"forward vs {label}", forward, tol, "forward", "forward")

        if want_grads:
            in_grad = [n for n in ad.input_names if n in grad_names]

            def train_step(state, inputs_grad=True):
                nbytes = poison(dev, ad.mod)
                xs = [x.detach().clone().requires_grad_(inputs_grad and n in in_grad) for n, x in zip(ad.input_names, args)]
                layer.zero_grad(set_to_none=True)
                with torch.enable_grad():
                    outs = ad.call(layer, hg, xs)
                sync(dev)
                state.update(xs=xs, outs=outs, poisoned=nbytes)
                return outs

            def grads_of(state):
                outs, xs = state["outs"], state["xs"]
                keys = [k for k in d_out if k in outs]
                torch.autograd.backward([outs[k] for k in keys], [d_out[k] for k in keys])
                sync(dev)
                got = {n: x.grad for n, x in zip(ad.input_names, xs) if n in in_grad}
                got.update({w: getattr(layer, w).grad for w in ad.weight_names if w in grad_names})
                return got

            first = {}

            def forward_train():
                outs = train_step(first)
                err, t, note = cmp({k: o.detach() for k, o in outs.items()}, ref, noise_o)
                return err, t, f"{first['poisoned'] / 2**20:.1f} MiB poisoned" + (f"; {note}" if note else "")
            self.guarded(name, gname, f"forward_train vs {label}", forward_train, tol, "forward", "forward_train")
            if "outs" in first:
                try:
                    got = grads_of(first)
                except Exception as e:  # noqa: BLE001
                    self.fail(name, gname, "backward (generated)", e, tol, "grad", "backward")
                    got = None
                if got is not None:
                    self.row(name, gname, f"gradients stored as {storage}",
                             *dtype_check({k: t for k, t in got.items() if t is not None}, storage), "grad", "backward")
                    for n in grad_names:
                        self.guarded(name, gname, f"grad {n} vs {label}",
                                     lambda n=n: cmp({n: got.get(n)}, {n: ref_grads[n]}, noise_g), tol, "grad",
                                     "backward")
                    kept = {k: t.detach().clone() for k, t in got.items() if k in ad.weight_names and t is not None}

                    def again():
                        # The second step asks for the weights' gradients alone (the backward's grad_mask skips the
                        # kernels that feed only the inputs' gradients): they must not change by a bit.
                        second = {}
                        train_step(second, inputs_grad=not kept)
                        g2 = grads_of(second)
                        differ = [k for k in kept if g2.get(k) is None or not torch.equal(kept[k], g2[k])]
                        return (math.inf if differ else 0.0), 0.0, (f"differ: {', '.join(differ)}" if differ else
                                                                    f"{len(kept)} weight gradient(s)")
                    self.guarded(name, gname, "weight grads bit-identical (2nd step, weights only, poisoned)",
                                 again, 0.0, "grad", "backward")
        elif not trainable:
            self.guarded(name, gname, "no backward: requires_grad raises",
                         lambda: self.no_backward_raises(ad, layer, hg, args), phase="forward_train")
        sync(dev)
        if self.capture_wanted(v) and gname == self.graph_names[-1]:
            self.capture_checks(v, model, ad, layer, hg, host_graph, seed, storage, tol, name, gname, want_grads)

    # -- CUDA graphs and host syncs (issue 8, item 5) ---------------------------------------
    def capture_wanted(self, v) -> bool:
        """--capture: the models (base names) whose layers are captured in CUDA graphs; 'all' or 'none'."""
        want = [m.strip() for m in (getattr(self.args, "capture", "") or "").split(",") if m.strip()]
        return "all" in want or v.base_name in want

    def capture_checks(self, v, model, ad: Adapter, layer, hg, host_graph, seed, storage, tol, name, gname,
                       train: bool):
        """A generated call synchronises nothing with the host (run under torch.cuda.set_sync_debug_mode("error")),
        and the layer's forward (inference) and, when trainable, a training step (forward_train + backward through
        autograd, into fresh gradients) can be captured in a torch.cuda.CUDAGraph: replayed twice on new values
        copied into the captured inputs, parameters and output gradients, every result (outputs, input and weight
        gradients) matches an eager run on the same values. On the CPU (dry run) the stand-ins of Capture."""
        import torch
        import ir_torch
        from compare import rel_err

        dev = self.args.device
        api = Capture(dev, ad.mod)
        grad_names = ir_torch.grad_names(model)
        in_grad = [n for n in ad.input_names if n in grad_names] if train else []

        def values(sd):
            x = ir_torch.random_inputs(model, host_graph, sd, round_to_fp32=False)
            d = ir_torch.random_output_grads(model, host_graph, sd, round_to_fp32=False)
            return ({k: t.to(storage).to(dev) for k, t in x.items()}, {k: t.to(storage).to(dev) for k, t in d.items()})

        x0, d0 = values(seed + 101)
        xs = [x0[n].clone().requires_grad_(n in in_grad) for n in ad.input_names]
        dout = {k: t.clone() for k, t in d0.items()}
        params = {w: getattr(layer, w) for w in ad.weight_names}

        def load(sd):  # new values into the tensors a graph captured
            x, d = values(sd)
            with torch.no_grad():
                for n, t in zip(ad.input_names, xs):
                    t.copy_(x[n])
                for w, p in params.items():
                    p.copy_(x[w])
                for k, t in dout.items():
                    t.copy_(d[k])
        load(seed + 101)

        def infer():
            with torch.no_grad():
                return dict(ad.call(layer, hg, xs))

        def step():
            layer.zero_grad(set_to_none=True)
            for t in xs:
                t.grad = None
            with torch.enable_grad():
                outs = ad.call(layer, hg, xs)
                keys = [k for k in dout if k in outs]
                torch.autograd.backward([outs[k] for k in keys], [dout[k] for k in keys])
            res = {k: o.detach() for k, o in outs.items()}
            res.update({f"d_{n}": t.grad for n, t in zip(ad.input_names, xs) if n in in_grad and t.grad is not None})
            res.update({f"d_{w}": p.grad for w, p in params.items() if p.grad is not None})
            return res

        def no_sync(fn):
            def run():
                fn()
                sync(dev)
                with api.no_sync():
                    fn()
                sync(dev)
                return 0.0, 0.0, "no host synchronisation (sync debug mode 'error')" if api.cuda else \
                    "no host synchronisation (CPU stand-in)"
            return run

        def captured(fn):
            def run():
                graph, static = api.capture(fn)
                errs, same = [], True
                for k in (1, 2):
                    load(seed + 101 + k)
                    api.replay(graph)
                    got = {kk: t.detach().clone() for kk, t in static.items()}
                    eager = fn()
                    sync(dev)
                    for kk, t in eager.items():
                        if kk not in got:
                            raise SetupError(f"{kk} was not produced by the captured graph")
                        errs.append(rel_err(got[kk], t))
                        same = same and torch.equal(got[kk], t.detach())
                return max(errs, default=0.0), tol, (f"{len(static)} tensor(s), 2 replays on new values, " +
                                                     ("bit-identical to eager" if same else "NOT bit-identical"))
            return run

        self.guarded(name, gname, "no host sync: forward", no_sync(infer), 0.0, "capture", "sync")
        if train:
            self.guarded(name, gname, "no host sync: training step", no_sync(step), 0.0, "capture", "sync")
        self.guarded(name, gname, "CUDA graph: forward captured, replayed vs eager", captured(infer), tol, "capture",
                     "capture")
        if train:
            # The leaves' gradient accumulators were made by the eager calls above, on the default stream; a
            # capture on a side stream must not depend on it (PyTorch: "AccumulateGrad node's stream does not
            # match"). Fresh leaves with the same values get theirs during the capture's side-stream warm-up.
            with torch.no_grad():
                for i, t in enumerate(xs):
                    xs[i] = t.detach().clone().requires_grad_(t.requires_grad)
                for w, p in list(params.items()):
                    fresh = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                    setattr(layer, w, fresh)
                    params[w] = fresh
            self.guarded(name, gname, "CUDA graph: training step captured, replayed vs eager", captured(step), tol,
                         "capture", "capture")
        layer.zero_grad(set_to_none=True)

    def no_backward_raises(self, ad, layer, hg, args):
        import torch
        xs = [x.detach().clone().requires_grad_(True) for x in args]
        try:
            with torch.enable_grad():
                ad.call(layer, hg, xs)
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
            return 0.0, 0.0, f"raises {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        return math.inf, 0.0, ("module has no backward, yet the layer runs while its parameters require grad "
                               "(silently non-differentiable; item 8: it must raise a clear error)")

    def gradient_checks(self, ad, layer, hg, args, d_out, ref_grads, noise_g, grad_names, name, gname, label, dev):
        """Every gradient through the generated backward vs the reference; then a second backward on poisoned
        memory: bit-identical weight gradients, and still correct."""
        import torch

        in_grad = [n for n in ad.input_names if n in grad_names]

        def generated_grads(inputs_grad=True):
            xs = [x.detach().clone().requires_grad_(inputs_grad and x_name in in_grad)
                  for x_name, x in zip(ad.input_names, args)]
            layer.zero_grad(set_to_none=True)
            outs = ad.call(layer, hg, xs)
            keys = [k for k in d_out if k in outs]
            torch.autograd.backward([outs[k] for k in keys], [d_out[k] for k in keys])
            sync(dev)
            got = {n: x.grad for n, x in zip(ad.input_names, xs) if n in in_grad}
            for w in ad.weight_names:
                if w in grad_names:
                    got[w] = getattr(layer, w).grad
            return got

        try:
            got = generated_grads()
        except Exception as e:  # noqa: BLE001
            self.fail(name, gname, "backward (generated)", e, TOL_GRAD, "grad")
            return
        for n in grad_names:
            self.guarded(name, gname, f"grad {n} vs {label}",
                         lambda n=n: compare_maps({n: got.get(n)}, {n: ref_grads[n]}, TOL_GRAD, noise_g),
                         tol=TOL_GRAD, kind="grad")
        first = {k: t.detach().clone() for k, t in got.items() if t is not None}

        def again():
            nbytes = poison(dev, ad.mod)
            second = generated_grads()
            err, tol, note = compare_maps(second, {k: ref_grads[k] for k in first}, TOL_GRAD, noise_g)
            same = [k for k in first if k in ad.weight_names and second.get(k) is not None
                    and torch.equal(first[k], second[k])]
            differ = [k for k in first if k in ad.weight_names and k not in same]
            self.row(name, gname, "weight grads bit-identical (2nd backward, poisoned)",
                     0.0 if not differ else math.inf, 0.0,
                     f"differ: {', '.join(differ)}" if differ else f"{len(same)} weight gradient(s)", "grad")
            return err, tol, f"{nbytes / 2**20:.1f} MiB poisoned" + (f"; {note}" if note else "")
        self.guarded(name, gname, f"poisoned backward vs {label}", again, tol=TOL_GRAD, kind="grad")

        def weights_only():
            # The inputs need no gradient: the backward's grad_mask skips the kernels that feed only theirs.
            poison(dev, ad.mod)
            third = generated_grads(inputs_grad=False)
            weights = [k for k in first if k in ad.weight_names]
            differ = [k for k in weights if third.get(k) is None or not torch.equal(first[k], third[k])]
            return (math.inf if differ else 0.0), 0.0, (f"differ: {', '.join(differ)}" if differ else
                                                         f"{len(weights)} weight gradient(s)")
        if in_grad and any(k in ad.weight_names for k in first):
            self.guarded(name, gname, "weight grads bit-identical, inputs need no grad (poisoned)", weights_only,
                         tol=0.0, kind="grad")

    def timing(self, v, model, ad, layer, hg, args, inp, d_out, gdev, name, gname, with_backward):
        import torch
        import ir_torch

        a = self.args
        dev = a.device
        t = {"model": name, "graph": gname, "warmup": a.timing_warmup, "iters": a.timing_iters}
        inp = {**inp, **ir_torch.graph_inputs(model, gdev, dtype=torch.float32)}  # computed by prepare_graph too
        with torch.no_grad():
            t["generated_ms"], t["generated_samples_ms"] = time_ms(lambda: layer(hg, *args), dev, a.timing_warmup,
                                                                   a.timing_iters)
            t["reference_fp32_ms"], _ = time_ms(lambda: ir_torch.evaluate(model, gdev, inp, dtype=torch.float32),
                                                dev, a.timing_warmup, a.timing_iters)
            if v.family:
                t["hand_reference_fp32_ms"], _ = time_ms(lambda: hand_reference(v.family, gdev, inp, model), dev,
                                                         a.timing_warmup, a.timing_iters)
            t["prepare_graph_ms"], _ = time_ms(lambda: ad.prepare(gdev), dev, 2, max(5, a.timing_iters // 4))
        if with_backward:
            grads_in = [n for n in ad.input_names if n in ir_torch.grad_names(model)]
            keys = list(d_out)

            def gen_step():
                xs = [x.detach().requires_grad_(n in grads_in) for n, x in zip(ad.input_names, args)]
                outs = ad.call(layer, hg, xs)
                torch.autograd.backward([outs[k] for k in keys], [d_out[k] for k in keys])

            def ref_step():
                ir_torch.forward_backward(model, gdev, inp, d_out, dtype=torch.float32)
            it = max(3, a.timing_iters // 2)
            t["generated_fwd_bwd_ms"], _ = time_ms(gen_step, dev, 2, it)
            t["reference_fwd_bwd_fp32_ms"], _ = time_ms(ref_step, dev, 2, it)
        t["speedup_vs_reference"] = t["reference_fp32_ms"] / t["generated_ms"] if t["generated_ms"] > 0 else math.inf
        self.timings.append(t)
        print(f"[{name}/{gname}] timing: generated {t['generated_ms']:.3f} ms, PyTorch model (fp32) "
              f"{t['reference_fp32_ms']:.3f} ms" +
              (f", hand-written {t['hand_reference_fp32_ms']:.3f} ms" if "hand_reference_fp32_ms" in t else "") +
              (f"; forward+backward {t['generated_fwd_bwd_ms']:.3f} vs {t['reference_fwd_bwd_fp32_ms']:.3f} ms"
               if with_backward else ""), flush=True)

    # -- everything -------------------------------------------------------------------------
    def run(self, variants, graph_names, base_seed):
        import torch
        import ir_torch
        from graphs import graph_by_name

        a = self.args
        hosts = {}
        # Built once, loaded by every spec's process; keyed by graphs.py's content, so a change rebuilds them.
        cache = Path(a.generated).resolve().parent / "graphs"
        version = hashlib.sha256((HERE / "graphs.py").read_bytes()).hexdigest()[:12]
        for gname in graph_names:
            t0 = time.perf_counter()
            path = cache / f"{gname}_{a.graph_seed}_{version}.pt"
            try:
                hosts[gname] = torch.load(path, weights_only=False)
                how = "loaded"
            except Exception:  # noqa: BLE001
                hosts[gname] = graph_by_name(gname, seed=a.graph_seed)
                how = "built"
                try:
                    cache.mkdir(parents=True, exist_ok=True)
                    tmp = f"{path}.{os.getpid()}.tmp"  # children of a parallel run may write it at once
                    torch.save(hosts[gname], tmp)
                    os.replace(tmp, path)
                except OSError:
                    pass
            print(f"graph {hosts[gname].summary()} {how} in {time.perf_counter() - t0:.1f} s", flush=True)
        gens = read_generation(Path(a.generated))
        self.graph_names = list(graph_names)
        for vi, v in enumerate(variants):
            gen = gens.get(v.name)
            info = {"spec": v.spec, "family": v.family, "generation": gen.status if gen else "not recorded",
                    "no_backward": gen.no_backward if gen else None, "trainable": None}
            if v.dtype:
                info.update(base=v.base_name, dtype=v.dtype)
                self.tag = {"spec": v.base_name, "dtype": v.dtype}
            self.specs[v.name] = info
            storage = None
            try:
                if gen is not None and not gen.ok:
                    raise SetupError(gen.status)
                model = ir_torch.load_model(REPO / v.ref_spec)
                if a.device == "cpu":
                    bug = os.environ.get("HG_FAKE_BUG")
                    fake_dtype = DTYPES[v.dtype].torch_dtype if v.dtype and bug != "no-dtype" else None
                    mod = FakeModule(model, trainable=not (gen and gen.no_backward), bug=bug, dtype=fake_dtype)
                else:
                    mod = load_generated(v, Path(a.generated), build=not a.no_build)
                if v.dtype:
                    storage = module_storage(mod, v)
                trainable = bool(getattr(mod, "TRAINABLE", False))
                if gen and gen.no_backward and trainable:
                    print(f"[{v.name}] note: generation warned '{gen.no_backward}' but TRAINABLE is True", flush=True)
                if not trainable and not info["no_backward"]:
                    info["no_backward"] = "TRAINABLE is False"
                info["trainable"] = trainable
                # A materialization: auto module holds two programs: each is checked, forced at prepare_graph, as
                # its own rows (<model>[vanilla], <model>[compact]).
                programs = auto_programs(mod)
                cases = [(v if prog is None else replace(v, name=f"{v.name}[{prog}]"),
                          Adapter(mod, model, a.device, trainable, v, materialization=prog)) for prog in programs]
                if programs != [None]:
                    del self.specs[v.name]
                    for prog, (cv, _) in zip(programs, cases):
                        self.specs[cv.name] = dict(info, materialization=prog)
            except Exception as e:  # noqa: BLE001
                if v.dtype:  # one row per variant: the table has one line per spec, dtype and phase
                    self.fail(v.name, "-", "generate/build/import", e, DTYPES[v.dtype].tol, phase="setup")
                    continue
                for gname in graph_names:
                    self.fail(v.name, gname, "generate/build/import", e)
                continue
            for cv, ad in cases:
                for gi, gname in enumerate(graph_names):
                    seed = base_seed + 1000 * vi + gi  # both programs of an auto module see the same data
                    try:
                        if v.dtype:
                            self.run_dtype_case(cv, model, ad, gname, hosts[gname], seed, storage)
                        else:
                            self.run_case(cv, model, ad, gname, hosts[gname], seed)
                    except Exception as e:  # noqa: BLE001
                        self.fail(cv.name, gname, "setup", e, DTYPES[v.dtype].tol if v.dtype else None,
                                  phase="setup" if v.dtype else None)
                    if a.device.startswith("cuda"):
                        torch.cuda.empty_cache()


def run_isolated(checker: Checker, args, variants, base_seed: int, progress=None) -> None:
    """Runs each spec in a child process (same arguments, one spec, --child-json FILE) and merges the
    results in spec order; a child that crashes or times out gives a FAIL row. With --check-jobs N > 1, N
    children run at once (each with 1/N of the CPU threads), and each child's output is printed when it ends.
    ``progress()`` is called after each child's results are merged (main: rewrites the reports, so a run
    stopped by its time limit still leaves the results so far)."""
    import tempfile

    jobs = max(1, int(getattr(args, "check_jobs", 1) or 1))
    env = os.environ.copy()
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 4) // jobs)))
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        def one(vi, v):
            part = Path(tmp) / f"{v.name}.json"
            graphs = args.graphs
            if v.graphs:
                graphs = ",".join(g for g in args.graphs.split(",") if g.strip() in v.graphs) or v.graphs[0]
            cmd = [sys.executable, str(Path(__file__).resolve()), v.source if v.dtype else v.spec,
                   "--hectorgen", args.hectorgen or "", "--generated", str(args.generated), "--out", str(args.out),
                   "--device", args.device, "--graphs", graphs, "--graph-seed", str(args.graph_seed),
                   "--seed", str(base_seed + 1000 * vi), "--timing-iters", str(args.timing_iters),
                   "--timing-warmup", str(args.timing_warmup), "--capture", args.capture or "none",
                   "--child-json", str(part)]
            if v.dtype:
                cmd += ["--dtypes", v.dtype]
            if args.no_build:
                cmd.append("--no-build")
            t0 = time.perf_counter()
            out = None
            try:
                if jobs > 1:
                    p = subprocess.run(cmd, timeout=args.child_timeout, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, errors="replace")
                    rc, out = p.returncode, p.stdout
                else:
                    rc = subprocess.run(cmd, timeout=args.child_timeout, env=env).returncode
                why = f"child process exited with {rc}"
            except subprocess.TimeoutExpired as e:
                rc, why = "timeout", f"child process timed out after {args.child_timeout:.0f} s"
                if e.stdout:
                    out = e.stdout if isinstance(e.stdout, str) else e.stdout.decode(errors="replace")
            data = None
            if part.is_file():
                try:
                    data = json.loads(part.read_text())
                except ValueError:
                    data = None
            return vi, v, rc, why, out, data, time.perf_counter() - t0

        def merge(vi, v, rc, why, out, data, elapsed):
            if out is not None:
                print(out, end="" if out.endswith("\n") else "\n", flush=True)
            rows = data["rows"] if data else []
            bad = sum(1 for r in rows if not r["ok"])
            print(f"[{v.name}] child done in {elapsed:.1f} s (rc={rc}): {len(rows) - bad}/{len(rows)} checks pass",
                  flush=True)
            if data is not None:
                for r in rows:
                    r["err"], r["tol"] = float(r["err"]), float(r["tol"])
                    checker.rows.append(r)
                checker.errors += data["errors"]
                checker.timings += data["timings"]
                checker.cases += data["cases"]
                checker.specs.update(data.get("specs", {}))
            if rc != 0:  # crashed or timed out: say so (after whatever rows it had recorded)
                done = len(rows)
                checker.errors.append({"model": v.name, "graph": "-", "check": "child process", "error": why,
                                       "traceback": "(see the child's output above)\n"})
                checker.tag = {"spec": v.base_name, "dtype": v.dtype} if v.dtype else {}
                checker.row(v.name, "-", "child process", math.inf, DTYPES[v.dtype].tol if v.dtype else TOL,
                            f"{why} after {done} row(s)", "setup", "setup" if v.dtype else None)
                checker.tag = {}
                info = {"spec": v.spec, "trainable": None, "no_backward": None}
                if v.dtype:
                    info.update(base=v.base_name, dtype=v.dtype)
                checker.specs.setdefault(v.name, info)
            if progress is not None:
                progress()

        if jobs == 1:
            for vi, v in enumerate(variants):
                merge(*one(vi, v))
            return
        print(f"checking {len(variants)} module(s), {jobs} at a time (each one's output follows when it ends)",
              flush=True)
        with ThreadPoolExecutor(max_workers=jobs) as ex:
            futures = [ex.submit(one, vi, v) for vi, v in enumerate(variants)]
            from concurrent.futures import as_completed
            for n, f in enumerate(as_completed(futures), 1):
                res = f.result()
                print(f"---- [{n}/{len(variants)}] {res[1].name} ----", flush=True)
                merge(*res)
        # rows in spec order, whatever order the children ended in
        order = {v.name: i for i, v in enumerate(variants)}

        def rank(model):  # an auto module's rows (<model>[program]) sort with their module
            return order.get(model.split("[")[0], len(order))
        checker.rows.sort(key=lambda r: rank(r["model"]))
        checker.specs = dict(sorted(checker.specs.items(), key=lambda kv: rank(kv[0])))


def _env_info(device) -> dict:
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "device": "cpu (dry run: stand-in modules built from the PyTorch reference)"}
    if str(device).startswith("cuda") and torch.cuda.is_available():
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
    md += ["", "## Specs", "", "| model | spec | generation | trainable |", "| --- | --- | --- | --- |"]
    for n, s in checker.specs.items():
        tr = "yes" if s.get("trainable") else f"no: {s.get('no_backward')}" if s.get("trainable") is False else "?"
        md.append(f"| {n} | {s.get('spec')} | {s.get('generation', '')} | {tr} |")
    md += ["", "## Every check", "", "```text", table, "```", ""]
    if checker.timings:
        md += ["## Timing (median ms; CUDA events)", "",
               "| model | graph | generated fwd | PyTorch model fp32 fwd | hand-written fp32 fwd | generated fwd+bwd | "
               "PyTorch model fp32 fwd+bwd | prepare_graph |",
               "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]

        def f(t, k):
            return f"{t[k]:.3f}" if k in t else ""
        md += [f"| {t['model']} | {t['graph']} | {f(t, 'generated_ms')} | {f(t, 'reference_fp32_ms')} | "
               f"{f(t, 'hand_reference_fp32_ms')} | {f(t, 'generated_fwd_bwd_ms')} | "
               f"{f(t, 'reference_fwd_bwd_fp32_ms')} | {f(t, 'prepare_graph_ms')} |" for t in checker.timings]
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
    data = {"meta": meta, "tolerances": {"forward": TOL, "grad": TOL_GRAD, "oracles": TOL_ORACLES,
                                         "worst_row": ROW_TOL, "noise_factor": NOISE_FACTOR,
                                         "dtypes": {d: {"tol": i.tol, "noise_factor": i.noise_factor,
                                                        "noise_scale": i.noise_scale, "storage": i.storage}
                                                    for d, i in DTYPES.items()}},
            "specs": checker.specs, "rows": checker.rows, "timings": checker.timings, "cases": checker.cases,
            "errors": checker.errors}
    (out_dir / "gpu_check.json").write_text(json.dumps(_jsonable(data), indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# Sanitizer mode
# ---------------------------------------------------------------------------------------------

SAN_BEGIN = "sanitizer-run BEGIN "
SAN_END = "sanitizer-run END "


def sanitizer_run(args, variants) -> int:
    """One forward (+ backward when trainable) per spec on the tiny graph, bracketed by markers so that
    compute-sanitizer's reports can be attributed (summary_main). A dtype variant (--dtypes) runs on inputs,
    weights and output gradients stored in its dtype, its outputs compared at the dtype's tolerance."""
    import torch
    import ir_torch
    from graphs import tiny_graph

    dev = args.device
    g = tiny_graph()
    gdev = g.to(dev)
    gens = read_generation(Path(args.generated))
    failures = 0
    for vi, v in enumerate(variants):
        gen = gens.get(v.name)
        print(f"{SAN_BEGIN}{v.name}", flush=True)
        if gen is not None and not gen.ok:
            print(f"{SAN_END}{v.name} SKIP (not generated)", flush=True)
            continue
        ok = False
        try:
            model = ir_torch.load_model(REPO / v.ref_spec)
            storage = DTYPES[v.dtype].torch_dtype if v.dtype else torch.float32
            tol = DTYPES[v.dtype].tol if v.dtype else args.tol
            mod = FakeModule(model, not (gen and gen.no_backward), dtype=storage if v.dtype else None) \
                if dev == "cpu" else load_generated(v, Path(args.generated), build=False)
            if v.dtype:
                module_storage(mod, v)  # a module of another dtype (or none) is refused, as in the checks
            ok = True
            for prog in auto_programs(mod):  # both programs of an auto module
                ad = Adapter(mod, model, dev, bool(getattr(mod, "TRAINABLE", False)), v, materialization=prog)
                seed = (args.seed or 0) + vi
                # the reference runs on the values the module gets: drawn in float64, rounded to the storage dtype
                rounded = {k: t.to(storage) for k, t in
                           ir_torch.random_inputs(model, g, seed, round_to_fp32=False).items()}
                inputs64 = {k: t.double() for k, t in rounded.items()}
                inp = {k: t.to(dev) for k, t in rounded.items()}
                hg = ad.prepare(gdev)
                layer = ad.layer(g, {k: inp[k] for k in ad.weight_names}, dtype=storage if v.dtype else None)
                with torch.no_grad():
                    out = ad.call(layer, hg, [inp[k] for k in ad.input_names])
                sync(dev)
                note = "forward"
                if ad.trainable and ir_torch.grad_names(model):
                    d_out = {k: t.to(dev, storage) for k, t in
                             ir_torch.random_output_grads(model, g, seed, round_to_fp32=False).items()}
                    xs = [inp[k].detach().clone().requires_grad_(True) for k in ad.input_names]
                    outs = ad.call(layer, hg, xs)
                    torch.autograd.backward([outs[k] for k in d_out], [d_out[k] for k in d_out])
                    sync(dev)
                    note = "forward + backward"
                with torch.no_grad():
                    ref = ir_torch.evaluate(model, g, inputs64)
                err, _, why = compare_maps({k: t.detach().cpu() for k, t in out.items()}, ref, tol, None, storage)
                ok = ok and err <= tol
                name = v.name if prog is None else f"{v.name}[{prog}]"
                print(f"sanitizer-run {name} tiny: {note}, rel err {err:.3e} (tol {tol:.0e}) "
                      f"{'OK' if err <= tol else 'FAIL'} {why}", flush=True)
                del layer, hg, out
        except Exception as e:  # noqa: BLE001
            ok = False
            print(f"sanitizer-run {v.name} tiny: ERROR {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
            sys.stdout.flush()
        failures += not ok
        print(f"{SAN_END}{v.name} {'OK' if ok else 'FAIL'}", flush=True)
    print(f"sanitizer-run: {len(variants) - failures}/{len(variants)} specs OK", flush=True)
    return 1 if failures else 0


def parse_sanitizer_log(path) -> dict:
    """{model: (ok, note)} from a compute-sanitizer log of --sanitizer-run: a spec is OK when its run
    finished OK and no sanitizer report (a headline '========= Invalid ...', '========= Error: ...', other
    than the banner and the summary) fell between its BEGIN and END markers; {} when the log is missing.
    Key '__summary__': the last SUMMARY line."""
    p = Path(path) if path else None
    if not p or not p.is_file():
        return {}
    res, cur, reports, ended = {}, None, [], set()
    summary = []
    for line in p.read_text(errors="replace").splitlines():
        if line.startswith(SAN_BEGIN):
            cur, reports = line[len(SAN_BEGIN):].strip(), []
            continue
        if line.startswith(SAN_END) and cur:
            if " SKIP" in line:
                res[cur] = (None, "skipped (not generated)")
                ended.add(cur)
                cur = None
                continue
            ok_run = line.rstrip().endswith(" OK")
            kinds = sorted({r[:70] for r in reports})
            note = "clean" if not reports else f"{len(reports)} report(s): {'; '.join(kinds[:3])}"
            res[cur] = (ok_run and not reports, note if ok_run else f"run failed; {note}")
            ended.add(cur)
            cur = None
            continue
        m = re.match(r"^=+ (\S.*)$", line)  # a report's headline; its details are indented further
        if m:
            text = m.group(1).strip()
            if "SUMMARY" in text:
                summary.append(text)
            elif cur and not text.startswith("COMPUTE-SANITIZER"):
                reports.append(text)
    if cur and cur not in ended:
        res[cur] = (False, "did not finish (crash or timeout)")
    res["__summary__"] = (True, " | ".join(summary))
    return res


# ---------------------------------------------------------------------------------------------
# Summary: the short table printed last
# ---------------------------------------------------------------------------------------------

def summarize(data: dict, memcheck: dict, racecheck: dict, san_state: str = "") -> tuple:
    """(text, all_pass). One line per spec: status (PASS: everything including gradients; FWD-ONLY: every
    check passed, but the module has no backward pass; FAIL), worst forward / gradient / oracle errors,
    memcheck, racecheck, timings on the largest graph, and the failed checks."""
    rows = [r for r in data.get("rows", [])]
    specs = data.get("specs", {})
    names = list(dict.fromkeys(list(specs) + [r["model"] for r in rows]))
    tim = {}
    for t in data.get("timings", []):
        tim[t["model"]] = t  # the last (largest) graph wins

    def fmt(x):
        return "-" if x is None else ("inf" if math.isinf(x) else "nan" if math.isnan(x) else f"{x:.1e}")

    table = [("spec", "status", "fwd err", "grad err", "oracles", "memcheck", "racecheck", "gen fwd ms", "ref fwd ms",
              "gen f+b ms", "ref f+b ms", "failed checks / notes")]
    all_pass = bool(names)
    for n in names:
        rs = [r for r in rows if r["model"] == n]
        failed = []
        for r in rs:
            if r["ok"]:
                continue
            note = r.get("note") or ""
            m = re.search(r"GENERATION FAILED.*?error: (.*)", note)
            note = f"generation failed: {m.group(1)}" if m else note
            why = f" ({note[:200]})" if r.get("kind") == "setup" and note else ""
            item = f"{r['check']}{why}" if r.get("kind") == "setup" else f"{r['graph']}:{r['check']}"
            if item not in failed:
                failed.append(item)

        def worst(kind):
            es = [float(r["err"]) for r in rs if r.get("kind") == kind]
            return max(es, default=None) if not any(math.isnan(e) for e in es) else math.nan
        s = specs.get(n, {})
        mc = memcheck.get(n)
        rc = racecheck.get(n)
        mc_s = "-" if mc is None or mc[0] is None else ("clean" if mc[0] else "FAIL")
        rc_s = "-" if rc is None or rc[0] is None else ("clean" if rc[0] else "FAIL")
        if mc is not None and mc[0] is False:
            failed.append(f"memcheck: {mc[1]}")
        if rc is not None and rc[0] is False:
            failed.append(f"racecheck: {rc[1]}")
        if san_state and (mc is None or rc is None):
            failed.append(f"sanitizer: {san_state}")
        status = "FAIL" if failed or not rs else ("FWD-ONLY" if s.get("trainable") is False else "PASS")
        if status != "PASS":
            all_pass = False
        notes = ", ".join(failed)
        if s.get("no_backward"):
            notes = (notes + "; " if notes else "") + f"no backward: {s.get('no_backward')}"
        t = tim.get(n, {})

        def ms(k):
            return f"{t[k]:.3f}" if k in t else "-"
        table.append((n, status, fmt(worst("forward")), fmt(worst("grad")), fmt(worst("oracle")), mc_s, rc_s,
                      ms("generated_ms"), ms("reference_fp32_ms"), ms("generated_fwd_bwd_ms"),
                      ms("reference_fwd_bwd_fp32_ms"), notes[:400]))
    w = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join([c.ljust(w[i]) for i, c in enumerate(r[:-1])] + [r[-1]]).rstrip() for r in table]
    meta = data.get("meta", {})
    n_pass = sum(1 for ln in table[1:] if ln[1] == "PASS")
    n_fwd = sum(1 for ln in table[1:] if ln[1] == "FWD-ONLY")
    lines.append(f"{n_pass}/{len(names)} PASS, {n_fwd} FWD-ONLY, {len(names) - n_pass - n_fwd} FAIL; "
                 f"{sum(1 for r in rows if r['ok'])}/{len(rows)} checks pass; device {meta.get('device')}, "
                 f"torch {meta.get('torch')}, seed {meta.get('seed')} (rerun: SEED={meta.get('seed')})")
    return "\n".join(lines), all_pass


DTYPE_PHASES = ("setup", "oracle", "forward", "forward_train", "backward", "sync", "capture")


def summarize_dtypes(data: dict, mem: dict | None = None, race: dict | None = None, san_state: str = "") -> tuple:
    """(text, all_pass) of a dtype run: one line per spec, dtype and phase (setup, oracle: the float64 references
    among themselves, forward: inference, forward_train, backward: every gradient, sync: no host synchronisation,
    capture: CUDA graphs) with the worst relative error (relative to its tolerance) of that phase's checks over
    every graph, its tolerance, PASS/FAIL and the failed checks. A variant passes when every phase passes and it
    has a backward pass (forward-only: FWD-ONLY, not a pass) and, where sanitizer logs are given (``mem``, ``race``:
    parse_sanitizer_log; ``san_state``: why they are incomplete), memcheck and racecheck are clean for it."""
    rows = data.get("rows", [])
    specs = data.get("specs", {})
    groups: dict = {}
    for name, s in specs.items():
        if s.get("dtype"):
            groups.setdefault((s.get("base") or name, s["dtype"]), [])
    for r in rows:
        if r.get("dtype"):
            groups.setdefault((r.get("spec") or r["model"], r["dtype"]), []).append(r)
    by_variant = {(s.get("base"), s.get("dtype")): s for s in specs.values() if s.get("dtype")}

    def phase_of(r):
        return r.get("phase") or ("oracle" if r.get("kind") == "oracle" else "setup")

    def badness(r):
        err, tol = float(r["err"]), float(r["tol"])
        ratio = (0.0 if err == 0 else math.inf) if tol <= 0 else err / tol
        return (not r["ok"], math.inf if math.isnan(ratio) else ratio)

    def fmt(x):
        return "inf" if math.isinf(x) else "nan" if math.isnan(x) else f"{x:.2e}"

    table = [("spec", "dtype", "phase", "max rel err", "tolerance", "result", "failed checks / notes")]
    n_ok = 0
    for (spec, dtype), rs in groups.items():
        info = by_variant.get((spec, dtype), {})
        phases = [ph for ph in DTYPE_PHASES if any(phase_of(r) == ph for r in rs)]
        variant_ok = bool(rs)
        for ph in phases:
            prs = [r for r in rs if phase_of(r) == ph]
            worst = max(prs, key=badness)
            ok = all(r["ok"] for r in prs)
            variant_ok &= ok
            failed = list(dict.fromkeys(
                f"{r['graph']}:{r['check']}" + (f" ({r['note'][:220]})" if r.get("note") and ph == "setup" else "")
                for r in prs if not r["ok"]))
            graphs = sorted({r["graph"] for r in prs if r["graph"] != "-"})
            note = "; ".join(failed)[:300] if failed else f"{len(prs)} check(s)" + (
                f" on {','.join(graphs)}" if graphs else "")
            table.append((spec, dtype, ph, fmt(float(worst["err"])), f"{float(worst['tol']):.0e}",
                          "PASS" if ok else "FAIL", note))
        if not rs:
            table.append((spec, dtype, "setup", "-", "-", "FAIL", "no result (child did not report)"))
        elif info.get("trainable") is False:
            variant_ok = False
            table.append((spec, dtype, "backward", "-", "-", "FWD-ONLY",
                          f"no backward pass: {info.get('no_backward')}"))
        for tool, log in (("memcheck", mem), ("racecheck", race)):
            if log is None:
                continue
            san_ok, note = log.get(variant_name(spec, dtype), (False, san_state or "not in the sanitizer log"))
            variant_ok &= bool(san_ok)
            table.append((spec, dtype, tool, "-", "-", "PASS" if san_ok else "FAIL", note))
        n_ok += variant_ok
    w = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join([c.rjust(w[i]) if i in (3, 4) else c.ljust(w[i]) for i, c in enumerate(r[:-1])] + [r[-1]])
             .rstrip() for r in table]
    meta = data.get("meta", {})
    tols = ", ".join(f"{d} {DTYPES[d].tol:.0e}" for d in meta.get("dtypes", []) if d in DTYPES)
    lines.append(f"{n_ok}/{len(groups)} (spec, dtype) variants PASS; {sum(1 for r in rows if r['ok'])}/{len(rows)} "
                 f"checks pass; tolerances {tols}; graphs {','.join(meta.get('graphs', []))}; device "
                 f"{meta.get('device')}, torch {meta.get('torch')}, seed {meta.get('seed')} (rerun: SEED="
                 f"{meta.get('seed')})")
    return "\n".join(lines), bool(groups) and n_ok == len(groups)


def summary_main(args) -> int:
    out_dir = Path(args.out)
    try:
        data = json.loads((out_dir / "gpu_check.json").read_text())
    except Exception as e:  # noqa: BLE001
        data = {"rows": [], "specs": {}, "meta": {}}
        print(f"no check results ({out_dir / 'gpu_check.json'}: {e})")
    mem = parse_sanitizer_log(args.memcheck_log)
    race = parse_sanitizer_log(args.racecheck_log)
    state = ""
    if args.memcheck_log is None and args.racecheck_log is None:
        state = ""
    elif not mem or not race:
        state = "no complete sanitizer log"
    if data.get("meta", {}).get("dtypes"):
        logged = args.memcheck_log is not None or args.racecheck_log is not None
        text, ok = summarize_dtypes(data, mem if logged else None, race if logged else None, state)
    else:
        text, ok = summarize(data, mem, race, state)
    extra = [ln for ln in (args.extra or []) if ln]
    if mem.get("__summary__") or race.get("__summary__"):
        extra.insert(0, f"compute-sanitizer: memcheck {mem.get('__summary__', (0, '-'))[1] or '-'}; "
                        f"racecheck {race.get('__summary__', (0, '-'))[1] or '-'}")
    text = "\n".join([text] + extra)
    (out_dir / "summary.txt").write_text(text + "\n")
    print("\n===== summary =====\n" + text, flush=True)
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    global TOL
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("specs", nargs="*", help="spec paths or model names (default: every bundled and test spec)")
    p.add_argument("--hectorgen", default=str(REPO / "build" / "hectorgen"),
                   help="hectorgen binary: generation (--prepare) and the float64 interpreter ('' for neither)")
    p.add_argument("--generated", default=str(REPO / "generated"),
                   help="directory holding <model>/ (--prepare writes it; default: generated)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "out" / "gpu_check"),
                   help="report directory (default: $OUT or out/gpu_check)")
    p.add_argument("--models", default=None, help="comma list, same as the positional specs")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run with stand-in modules")
    p.add_argument("--graphs", default=None, help="comma list: tiny and/or graphs.PRESETS names (default "
                   "tiny,medium; with --dtypes tiny,mini)")
    p.add_argument("--graph-seed", type=int, default=0, help="seed of the synthetic (preset) graphs")
    p.add_argument("--seed", type=int, default=None, help="input/weight seed (default: a fresh one per run)")
    p.add_argument("--tol", type=float, default=TOL, help="forward tolerance, float32 vs float64 (default 1e-5)")
    p.add_argument("--timing-iters", type=int, default=20, help="timed runs (0: no timing)")
    p.add_argument("--timing-warmup", type=int, default=5)
    p.add_argument("--prepare", action="store_true", help="generate every spec, then build the extensions")
    p.add_argument("--sanitizer-run", action="store_true", help="one forward+backward per spec on the tiny graph")
    p.add_argument("--summary", action="store_true", help="print the short table from OUT/gpu_check.json")
    p.add_argument("--memcheck-log", default=None)
    p.add_argument("--racecheck-log", default=None)
    p.add_argument("--extra", action="append", help="(--summary) a line to add below the table")
    p.add_argument("--build-only", action="store_true", help="build the extensions (in parallel) and exit")
    p.add_argument("--no-build", action="store_true", help="do not run CMake (use what DIR/<model>/build holds)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compile jobs per extension build")
    p.add_argument("--build-timeout", type=float, default=None, help="seconds per extension build")
    p.add_argument("--no-isolate", action="store_true",
                   help="check all specs in this process (default: one child process per spec)")
    p.add_argument("--child-timeout", type=float, default=180, help="seconds per spec child process")
    p.add_argument("--check-jobs", type=int, default=1, help="spec child processes at a time (default 1)")
    p.add_argument("--dtypes", default=None,
                   help="comma list of fp32, tf32, bf16, fp16 (or all): check dtype variants of the specs (default "
                        "those of dtypes.DEFAULT_DTYPE_SPECS), each generated with options.dtype replaced, forward, "
                        "forward_train and backward vs the float64 interpreter at the dtype's tolerance")
    p.add_argument("--capture", default="rgcn,rgat,hgt",
                   help="models (base names) whose layer is captured in CUDA graphs and run under the sync debug "
                        "mode; 'all' or 'none' (default rgcn,rgat,hgt)")
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)  # internal: child writes its results here
    args = p.parse_args(argv)

    out_dir = Path(args.out)
    if args.summary:
        return summary_main(args)
    entries = list(args.specs) + ([m.strip() for m in args.models.split(",") if m.strip()] if args.models else [])
    gen_dir = Path(args.generated)
    dtypes = None
    try:
        if args.dtypes is not None:
            dtypes = parse_dtypes(args.dtypes)
        variants, notes = selected_variants(entries, dtypes, gen_dir.parent)
    except (SetupError, ValueError) as e:
        p.error(str(e))
    if not args.child_json:
        for n in notes:
            print(f"note: {n}", flush=True)
    if args.graphs is None:
        args.graphs = "tiny,mini" if dtypes else "tiny,medium"
    graph_names = [gname.strip() for gname in args.graphs.split(",") if gname.strip()]
    TOL = args.tol
    if args.hectorgen and not os.access(args.hectorgen, os.X_OK):
        print(f"warning: hectorgen binary {args.hectorgen!r} not executable: no generation, no interpreter",
              flush=True)
        args.hectorgen = ""

    if args.prepare:
        gens = generate_all(variants, args.hectorgen or None, gen_dir.parent)
        ok = all(r.ok for r in gens.values())
        if args.device == "cpu":
            return 0 if ok else 1
        built = build_all([v.name for v in variants if gens[v.name].ok], gen_dir, out_dir, args.jobs,
                          args.build_timeout)
        return 0 if ok and built else 1
    if args.build_only:
        return 0 if build_all([v.name for v in variants], gen_dir, out_dir, args.jobs, args.build_timeout) else 1
    if args.sanitizer_run:
        # Before torch initialises CUDA: without the caching allocator, memcheck sees every tensor's bounds.
        os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
        return sanitizer_run(args, variants)

    import torch

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("error: CUDA is not available (--device cpu runs the dry mode)", flush=True)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    base_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "little")
    meta = {**_env_info(args.device), "seed": base_seed, "graph_seed": args.graph_seed,
            "specs": [v.spec for v in variants], "graphs": graph_names, "generated": str(gen_dir.resolve()),
            "hectorgen": args.hectorgen or None, "args": vars(args)}
    if dtypes:
        meta["dtypes"] = dtypes
    if not args.child_json:
        print(f"gpu_check: seed {base_seed} (rerun with --seed {base_seed}); {meta.get('device')}, "
              f"torch {meta['torch']}; {len(variants)} {'module' if dtypes else 'spec'}(s): "
              f"{', '.join(v.name for v in variants)}; graphs {', '.join(graph_names)}" +
              (f"; dtypes {', '.join(dtypes)} (tolerance " +
               ", ".join(f"{d} {DTYPES[d].tol:.0e}" for d in dtypes) + ")" if dtypes else ""), flush=True)
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
        def progress():
            meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
            write_reports(checker, out_dir, meta)
        run_isolated(checker, args, variants, base_seed, progress)
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    write_reports(checker, out_dir, meta)

    from compare import print_table
    if checker.errors:
        print(f"\n{len(checker.errors)} error(s) (tracebacks above and in {out_dir / 'gpu_check.md'}):")
        for e in checker.errors:
            print(f"  {e['model']}/{e['graph']} {e['check']}: {e['error'].splitlines()[0][:300]}")
    print(f"\nreports: {out_dir / 'gpu_check.md'}, {out_dir / 'gpu_check.json'}\n", flush=True)
    ok = print_table(checker.rows)
    data = json.loads((out_dir / "gpu_check.json").read_text())
    text, all_pass = summarize_dtypes(data) if dtypes else summarize(data, {}, {})
    print("\n" + text, flush=True)
    return 0 if ok and all_pass and checker.rows else 1


if __name__ == "__main__":
    sys.exit(main())
