#!/usr/bin/env python3
"""The name test: no user name can collide with a generated identifier or a keyword of CUDA, C++ or Python.

    tests/names/name_test.py --hectorgen BUILD/hectorgen [--work DIR] [--keep] [--names N1,N2,...] [--roles R1,...]

Each of the NAMES below is tried in each ROLE (model, hyper-parameter, input, weight, output, field, local,
function, loop variable) of an RGAT-like spec whose other names are all q_-prefixed:

 1. One spec per (name, role), through hectorgen. It must either be accepted (exit 0, and still trainable:
    no "no backward pass" warning), or rejected with a positioned diagnostic (exit 1, first line
    `spec.yaml:LINE:COL: error: ... [kind]`). Anything else (exit 2, a crash, an unpositioned error) fails.
    Which names are rejected in which role is asserted (EXPECTED_REJECTIONS): a new rejection fails too.
 2. The accepted names of each role, many per spec, are generated again and everything is compiled:
    every .cu with nvcc for sm_80 and sm_90 with all warnings as errors (#780 shadowing included), every host
    .cpp against torch's headers (-Wall -Wextra -Werror), every .py with py_compile, then each module is
    imported with torch, its nn.Module built, its parameters and forward() signature checked, and the op schemas
    of its host code parsed by torch. To stay fast the files of many specs are compiled as one translation unit,
    each spec in a namespace of its own; one spec per role is also compiled alone, exactly as written. When a
    batch fails, its specs are compiled alone, and a failing spec is split into one spec per name, so the
    report names the name.
Prints the list of names and the outcome per role. Exit status 0 when every expectation holds. Without nvcc
(or torch) those compile steps are reported as skipped; HECTORGEN_NAME_TEST_STRICT=1 makes that a failure.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# ---- the names -----------------------------------------------------------------------------------------
NAMES = [
    # C++ keywords and types
    "class", "float", "int", "double", "auto", "void", "const", "struct", "new", "delete", "this", "template",
    "typename", "namespace", "operator", "union", "static", "register", "volatile", "char", "bool", "true", "false",
    "nullptr", "sizeof", "switch", "case", "default", "goto", "export", "not", "and", "or", "xor", "final",
    # Python keywords (the model language reserves eight of them)
    "def", "lambda", "for", "in", "if", "else", "while", "return", "pass", "None", "True", "False", "import", "from",
    "global", "nonlocal", "yield", "async", "await", "with", "is", "del", "elif", "except", "finally", "raise", "try",
    "assert", "as", "match", "type",
    # CUDA built-ins, device functions and types, macros of the C, CUDA and torch headers
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "atomicAdd", "min", "max", "expf", "fmaxf", "tanhf",
    "dim3", "int32_t", "int64_t", "size_t", "printf", "NULL", "EOF", "errno", "linux", "unix", "major", "minor",
    "std", "at", "c10", "cub", "__syncthreads", "__global__", "__x",
    # identifiers of the templates and emitters
    "lane", "first_row", "row_stride", "num_rows", "partial", "total", "idx", "j", "k", "m", "warp_sum", "a",
    "args", "stream", "err", "grid", "blocks", "options", "device", "guard", "check", "shape_str", "src", "dst",
    "etype", "ntype", "etype_ptr", "in_ptr", "in_eid", "out_dst", "num_nodes", "num_edges", "num_etypes",
    "num_ntypes", "src_l", "dst_l", "row", "col", "acc", "tile", "x", "w", "y", "v0", "v1", "i_e", "e_src",
    "e_etype", "f_q_att", "n", "e", "g", "Tensor", "TORCH_CHECK", "C10_CUDA_CHECK", "cudaStream_t", "cudaSuccess",
    "warp_max", "leaky_relu", "in_src", "v_q_att", "v_q_msg", "q_e0_src", "q_e0_etype", "i_q_e1", "q_hs_2",
    # Python: builtins, modules and the generated module's own names
    "self", "torch", "os", "sys", "importlib", "dataclass", "isinstance", "tuple", "any", "super", "len", "input",
    "sum", "id", "ctx", "res", "outs", "saved", "tensors", "result", "Graph", "prepare_graph", "load_extension",
    "forward", "backward", "TRAINABLE", "HYPER", "MODEL", "GEMM_TILE", "_Function", "_graph_args", "_ext", "dtype",
    "hyper", "reset_parameters", "training", "cuda", "to", "parameters", "state_dict", "perm", "arrays", "value",
    "name", "ext", "got", "hectorgen_runtime", "RUNTIME_VERSION", "GRAPH_LAYOUTS", "GRAPH_ARRAYS", "_refuse_grad",
    "_ARGUMENT_NAMES", "NO_BACKWARD_REASON", "_GRAD_SLOTS", "SAVED_FOR_BACKWARD", "names",
    # look-alikes of derived names (gradients, versions, temporaries, kernels)
    "d_att", "t_hs", "d_feature", "d_W", "att__0", "d_q_att", "d_q_msg", "d_q_feature", "d_q_W", "d_q_h",
    "d_q_hs", "t_q_hs", "t_q_ht", "t_lin_0", "t_lin_3", "t_wg0", "t_sc0", "t_op0", "t_q_h_edges", "q_att__0",
    "q_att__1", "q_att__2", "q_msg__0", "q_att_2", "q_model_fw_gemm_q_hs", "launch_q_model_fw_gemm_q_hs",
    "q_att_ties", "q_max_ties", "d_q_h_reads", "t_scatter", "t_q_hs_2", "q_model_bw_edges_d_q_att",
    "q_model_forward", "q_model_forward_op", "q_model_backward_meta", "QModelForwardArgs", "d", "t",
    # a weight gradient's workspaces (<kernel>_partial, <kernel>_chunk_ptr) and its launcher's locals
    "q_model_bw_wgrad_d_q_W_partial", "q_model_bw_wgrad_d_q_W_chunk_ptr", "wgrad", "chunk_rows",
    # ordinary names
    "feature", "W", "h", "att", "msg", "norm", "hs", "ht", "hidden", "weight2", "Wq",
]

ROLES = ["model", "hyper", "input", "weight", "output", "field", "local", "function", "loop"]

# The rejections the test expects (name -> roles). Everything else must be accepted and compile.
DSL_KEYWORDS = {"for", "in", "def", "if", "else", "while", "return", "lambda"}
PYTHON_KEYWORDS = {"False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
                   "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in",
                   "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield"}
# Where the model language itself must name the thing with a bare identifier: a keyword of the language
# cannot be one (an input is named as n.input and a field or an output as a string: those work), and g is the graph.
BARE_ROLES = {"hyper", "weight", "local", "function", "loop"}
# A model's module <model>.py would shadow a module of that name: the standard library's, torch's and the
# packages torch imports.
MODULES = set(sys.stdlib_module_names) | {"torch", "numpy", "typing_extensions", "sympy", "networkx", "jinja2",
                                          "fsspec", "filelock", "triton", "setuptools", "pybind11",
                                          "hectorgen_runtime"}
# The built-in functions of the model language (a user function cannot take their names).
DSL_FUNCTIONS = {"exp", "relu", "tanh", "sigmoid", "sqrt", "leakyrelu", "dot", "outer", "linear", "concat", "reshape",
                 "sum", "linear_t", "leakyrelu_grad", "max", "max_grad"}
# Attributes of edges and nodes in the model language: a tensor (input, output, field, local) cannot be one.
ATTRIBUTES = {"src", "dst", "etype", "ntype"}


def expected_rejected(name: str, role: str) -> bool:
    if name.startswith("__"):
        return True  # reserved in every role
    if name in DSL_KEYWORDS and role in BARE_ROLES:
        return True
    if role == "model":
        return name in PYTHON_KEYWORDS or name in MODULES
    if role == "hyper" and name in {"self", "num_etypes", "num_ntypes", "device", "dtype"}:
        return True  # parameters of the generated module's constructor
    if name == "g" and role in {"hyper", "weight", "local", "loop"}:
        return True  # the graph
    if name in ATTRIBUTES and role in {"input", "output", "field", "local"}:
        return True
    if role == "function" and name in DSL_FUNCTIONS:
        return True
    return False


# ---- specs ---------------------------------------------------------------------------------------------
def q(name: str) -> str:
    """A name as a YAML string (unquoted, NULL, True, yes ... would not be strings)."""
    return '"' + name + '"'


def spec_text(model: str, role: str, names: list[str]) -> str:
    """An RGAT-like spec with `names` in `role` (all other names q_-prefixed)."""
    if role == "model":
        return SMALL_SPEC.format(model=q(model))
    r = {rl: [] for rl in ROLES}
    r[role] = list(names)

    def take(rl: str, default: str) -> str:
        return r[rl].pop(0) if r[rl] else default

    hyp = [take("hyper", d) for d in ("q_in", "q_out", "q_heads", "q_slope")]
    q_in, q_out, q_heads, q_slope = hyp
    extra_hyper = r["hyper"]
    feature = take("input", "q_feature")
    node_inputs, graph_inputs = r["input"][0::2], r["input"][1::2]
    W, ws = take("weight", "q_W"), take("weight", "q_ws")
    extra_weights = r["weight"]
    h = take("output", "q_h")
    extra_outputs = r["output"]
    msg, qmax, qsum = take("field", "q_msg"), take("field", "q_max"), take("field", "q_sum")
    extra_fields = r["field"]
    hs, ht = take("local", "q_hs"), take("local", "q_ht")
    extra_locals = r["local"]
    softmax = take("function", "q_softmax")
    extra_functions = r["function"]
    loops = [take("loop", d) for d in ("q_n1", "q_e1", "q_e2", "q_n3", "q_e3", "q_e4", "q_e0", "q_n5", "q_e5", "q_n6")]
    n1, e1, e2, n3, e3, e4, e0, n5, e5, n6 = loops
    extra_loops = r["loop"]

    L = []
    L.append(f"model: {q(model)}")
    L.append("hyper:")
    L += [f"  {q(q_in)}: 8", f"  {q(q_out)}: 8", f"  {q(q_heads)}: 1", f"  {q(q_slope)}: 0.2"]
    L += [f"  {q(x)}: 1.0" for x in extra_hyper]
    L.append("inputs:")
    L.append(f"  {q(feature)}: {{per: node, shape: [{q(q_in)}]}}")
    L += [f"  {q(x)}: {{per: node, shape: [{q(q_heads)}, {q(q_out)}]}}" for x in node_inputs]
    L += [f"  {q(x)}: {{per: edge, shape: [], from_graph: inv_relation_in_degree, requires_grad: false}}" for x in graph_inputs]
    L.append("weights:")
    L.append(f"  {q(W)}: {{per: etype, shape: [{q(q_in)}, \"{q_heads} * {q_out}\"]}}")
    L.append(f"  {q(ws)}: {{per: etype, shape: [{q(q_heads)}, {q(q_out)}]}}")
    L.append(f"  q_wt: {{per: etype, shape: [{q(q_heads)}, {q(q_out)}]}}")
    L += [f"  {q(x)}: {{per: etype, shape: [{q(q_heads)}, {q(q_out)}]}}" for x in extra_weights]
    L.append("outputs:")
    L.append(f"  {q(h)}: {{per: node, shape: [{q(q_heads)}, {q(q_out)}]}}")
    L += [f"  {q(x)}: {{per: node, shape: [{q(q_heads)}, {q(q_out)}]}}" for x in extra_outputs]
    L.append("program: |")
    P = []
    P.append(f'def {softmax}(g, q_att_param):')
    P.append(f'    for {n1} in g.dst_nodes():')
    P.append(f'        {n1}["{qmax}"] = -1e30')
    P.append(f'        for {e1} in {n1}.incoming_edges():')
    P.append(f'            {n1}["{qmax}"] = max({n1}["{qmax}"], {e1}[q_att_param])')
    P.append(f'    for {e2} in g.edges():')
    P.append(f'        {e2}[q_att_param] = exp({e2}[q_att_param] - {e2}.dst["{qmax}"])')
    P.append(f'    for {n3} in g.dst_nodes():')
    P.append(f'        {n3}["{qsum}"] = 0.0')
    P.append(f'        for {e3} in {n3}.incoming_edges():')
    P.append(f'            {n3}["{qsum}"] += {e3}[q_att_param]')
    P.append(f'    for {e4} in g.edges():')
    P.append(f'        {e4}[q_att_param] = {e4}[q_att_param] / {e4}.dst["{qsum}"]')
    for f in extra_functions:
        P.append(f'def {f}(g, q_f):')
        P.append('    for q_e in g.edges():')
        P.append('        q_e[q_f] = q_e[q_f] * 0.5')
    P.append(f'for {e0} in g.edges():')
    P.append(f'    {hs} = reshape({e0}.src.{feature} * {W}[{e0}.etype], {q_heads}, {q_out})')
    P.append(f'    {ht} = reshape({e0}.dst.{feature} * {W}[{e0}.etype], {q_heads}, {q_out})')
    P.append(f'    {e0}["{msg}"] = {hs}')
    # Each extra name feeds the attention through a statement of its own (the code grows linearly).
    extra = bool(extra_locals or extra_fields or extra_weights or extra_hyper)
    if extra:
        P.append(f'    {e0}["q_bias"] = 0.0')
    for x in extra_locals:
        P.append(f'    {x} = dot({ht}, q_wt[{e0}.etype]) * 0.5')
        P.append(f'    {e0}["q_bias"] += {x}')
    for x in extra_fields:
        P.append(f'    {e0}["{x}"] = dot({hs}, q_wt[{e0}.etype]) * 0.25')
        P.append(f'    {e0}["q_bias"] += {e0}["{x}"]')
    for x in extra_weights:
        P.append(f'    {e0}["q_bias"] += dot({hs}, {x}[{e0}.etype])')
    for x in extra_hyper:
        P.append(f'    {e0}["q_bias"] += dot({hs}, q_wt[{e0}.etype]) * {x}')
    bias = f' + {e0}["q_bias"]' if extra else ""
    P.append(f'    {e0}["q_att"] = leakyrelu(dot({hs}, {ws}[{e0}.etype]) + dot({ht}, q_wt[{e0}.etype]){bias}, {q_slope})')
    P.append(f'{softmax}(g, "q_att")')
    P += [f'{f}(g, "q_att")' for f in extra_functions]
    P.append(f'for {n5} in g.dst_nodes():')
    P.append(f'    for {e5} in {n5}.incoming_edges():')
    scale = "".join(f" * {e5}.{x}" for x in graph_inputs)
    P.append(f'        {n5}["{h}"] += {e5}["q_att"] * {e5}["{msg}"]{scale}')
    if node_inputs or extra_outputs:
        P.append(f'for {n6} in g.dst_nodes():')
        P += [f'    {n6}["{h}"] += {n6}.{x}' for x in node_inputs]
        P += [f'    {n6}["{x}"] = {n6}["{h}"] * 2.0' for x in extra_outputs]
    for i in range(0, len(extra_loops) - 1, 2):
        n, e = extra_loops[i], extra_loops[i + 1]
        P.append(f'for {n} in g.dst_nodes():')
        P.append(f'    for {e} in {n}.incoming_edges():')
        P.append(f'        {n}["{h}"] += {e}["{msg}"] * 0.5')
    if len(extra_loops) % 2:
        P.append(f'for {extra_loops[-1]} in g.edges():')
        P.append(f'    {extra_loops[-1]}["q_att"] = {extra_loops[-1]}["q_att"] * 0.5')
    L += ["  " + p for p in P]
    return "\n".join(L) + "\n"


# The model role: a small spec with one edge-type weight (a model name only appears as a prefix, in file
# names and in the Python class name), so that compiling one spec per model name stays cheap.
SMALL_SPEC = """\
model: {model}
hyper:
  q_in: 8
  q_out: 8
inputs:
  q_feature: {{per: node, shape: [q_in]}}
weights:
  q_W: {{per: etype, shape: [q_in, q_out]}}
outputs:
  q_h: {{per: node, shape: [q_out]}}
program: |
  for q_n in g.dst_nodes():
      for q_e in q_n.incoming_edges():
          q_n["q_h"] += q_e.src.q_feature * q_W[q_e.etype]
"""


# ---- running hectorgen ---------------------------------------------------------------------------------
POSITIONED = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>.*) \[(?P<kind>[a-z-]+)\]$")
DROPPED_TRAINING = ("no backward pass generated", "no training code generated")


class Outcome:
    def __init__(self, status: str, detail: str = ""):
        self.status = status  # accepted | rejected | broken
        self.detail = detail


def generate(hectorgen: str, spec: Path, out: Path) -> Outcome:
    p = subprocess.run([hectorgen, spec.name, "-o", str(out)], cwd=spec.parent, capture_output=True, text=True,
                       errors="replace", timeout=120)
    if p.returncode == 0:
        if any(d in p.stderr for d in DROPPED_TRAINING):
            return Outcome("broken", "accepted, but the training code was dropped:\n" + p.stderr)
        return Outcome("accepted")
    if p.returncode == 1:
        first = p.stderr.splitlines()[0] if p.stderr else ""
        m = POSITIONED.match(first)
        if m and m.group("file") == spec.name:
            return Outcome("rejected", f"{m.group('kind')}: {m.group('msg')}")
        return Outcome("broken", f"exit 1 without a positioned diagnostic:\n{p.stderr}")
    return Outcome("broken", f"exit {p.returncode}:\n{p.stderr}")


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


# ---- compiling -----------------------------------------------------------------------------------------
class Compiler:
    def __init__(self, work: Path):
        self.work = work
        self.nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not os.access(self.nvcc, os.X_OK):
            self.nvcc = None
        self.cxx = os.environ.get("CXX") or "c++"
        self.torch_flags = None
        # torch's headers as tests/compile/compile_outputs.py finds them (tools/torch_headers.py: this Python's torch
        # when it is the pinned version, else the headers tools/bootstrap.sh fetched); importing the generated
        # modules needs torch itself.
        sys.path.insert(0, str(ROOT / "tools"))
        import torch_headers  # noqa: E402
        found = None if os.environ.get("HECTORGEN_SKIP_HOST_COMPILE", "0") not in ("", "0") else torch_headers.find()
        self.torch = found is not None
        self.can_import = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
        if self.torch:
            torch_dir = Path(found[0])
            cuda_home = os.environ.get("CUDA_HOME") or (str(Path(os.path.realpath(self.nvcc)).parent.parent)
                                                        if self.nvcc else "/usr/local/cuda")
            system = [torch_dir / "include", torch_dir / "include" / "torch" / "csrc" / "api" / "include",
                      Path(sysconfig.get_paths()["include"]), Path(cuda_home) / "include"]
            self.torch_flags = ["-std=c++20", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
                                "-DTORCH_EXTENSION_NAME=name_test_ext", "-DTORCH_API_INCLUDE_EXTENSION_H",
                                f"-D_GLIBCXX_USE_CXX11_ABI={torch_headers.GLIBCXX_USE_CXX11_ABI}",
                                f"-I{ROOT / 'runtime' / 'include'}", f"-I{ROOT / 'runtime' / 'torch'}"]
            self.torch_flags += [a for d in system for a in ("-isystem", str(d))]

    @staticmethod
    def run(cmd: list[str], cwd: Path | None = None) -> tuple[bool, str]:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        ok = p.returncode == 0 and not p.stdout.strip()  # a warning is a failure
        return ok, p.stdout if p.stdout.strip() else f"exit code {p.returncode}"

    def nvcc_cmd(self, cu: Path, arch: str, includes: list[Path], syntax_only: bool = False) -> list[str]:
        """nvcc as the generated CMakeLists.txt and CI run it; `syntax_only` ends the device compilation after the
        front end (the part names can break: declarations, shadowing, macros), the host code is still compiled."""
        obj = self.work / "obj" / f"{cu.stem}.{arch}.o"
        obj.parent.mkdir(exist_ok=True)
        return [self.nvcc, "-std=c++17", f"-arch={arch}", "-c", str(cu), "-o", str(obj),
                f"-I{ROOT / 'runtime' / 'include'}", *[f"-I{d}" for d in includes], "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror",
                *(["-fdevice-syntax-only"] if syntax_only else [])]

    def host_cmd(self, cpp: Path, includes: list[Path]) -> list[str]:
        return [self.cxx, *self.torch_flags, *[f"-I{d}" for d in includes], "-fsyntax-only", str(cpp)]

    # One translation unit holding many generated files, each in a namespace of its own.
    def unity(self, name: str, files: list[Path], prelude: list[str]) -> Path:
        lines = ["// name test: many generated files, each in a namespace of its own"] + prelude
        for i, f in enumerate(files):
            lines += [f"namespace name_test_{i} {{", f'#include "{f}"', "}"]
        path = self.work / "unity" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path


# What the generated files include before their own headers (the unity files include these first, outside the
# namespaces).
CU_PRELUDE = ["#include <algorithm>", "#include <cstdint>", "#include <cuda_runtime.h>", "#include <cuda_bf16.h>",
              "#include <cuda_fp16.h>", '#include "hectorgen/segments.cuh"', '#include "hectorgen/simt_wgrad.cuh"',
              '#include "hectorgen/tc_gemm.cuh"']
HOST_PRELUDE = ["#include <ATen/cuda/CUDAContext.h>", "#include <c10/cuda/CUDAException.h>",
                "#include <c10/cuda/CUDAGuard.h>", "#include <torch/extension.h>", "#include <torch/library.h>",
                "#include <cstdint>", "#include <cuda_runtime.h>", '#include "hectorgen/runtime_version.h"',
                '#include "hectorgen/segments.h"']

PY_CHECK = r'''
import builtins, importlib.util, inspect, json, keyword, sys, torch
sys.path.insert(0, sys.argv[1])  # runtime/python: the generated modules import hectorgen_runtime
results = {}
probe = torch.nn.Module()
for line in sys.stdin:
    job = json.loads(line)
    try:
        spec = importlib.util.spec_from_file_location(job["module"], job["path"])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[job["module"]] = mod
        spec.loader.exec_module(mod)
        classes = [v for v in vars(mod).values()
                   if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == mod.__name__]
        assert len(classes) == 1, f"expected one nn.Module class, found {classes}"
        layer = classes[0](2)
        params = list(dict(layer.named_parameters()))
        assert len(params) == len(job["weights"]), f"parameters {params} for weights {job['weights']}"
        for w in job["weights"]:  # a parameter keeps the weight's name wherever Python allows it
            if not keyword.iskeyword(w) and not hasattr(probe, w) and w not in ("num_etypes", "num_ntypes", "reset_parameters"):
                assert w in params, f"weight {w!r} became a parameter named otherwise: {params}"
        sig = list(inspect.signature(mod.forward).parameters)
        assert len(sig) == 1 + len(job["inputs"]) + len(job["weights"]), f"forward{tuple(sig)}"
        assert len(set(sig)) == len(sig)
        for n, p in zip(job["inputs"] + job["weights"], sig[1:]):  # keyword arguments keep the user's spelling
            if n in job["plain"]:
                assert p == n, f"{n!r} became the parameter {p!r}"
        msig = list(inspect.signature(layer.forward).parameters)
        assert msig == sig[: 1 + len(job["inputs"])], f"{msig} vs {sig}"
        for s in job["schemas"]:
            torch._C.parse_schema(s)
        results[job["path"]] = ""
    except BaseException as e:  # noqa: BLE001 (the report says what)
        results[job["path"]] = f"{type(e).__name__}: {e}"
print(json.dumps(results))
'''

# Names that keep their spelling as Python keyword arguments (checked in the import step).
PLAIN = {"feature", "W", "x", "h", "d_att", "t_hs", "att__0", "lane", "first_row", "row_stride", "partial",
         "warp_sum", "threadIdx", "float", "int32_t", "class_", "norm", "hidden", "stream", "guard", "options"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hectorgen", required=True)
    ap.add_argument("--work", help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--names", help="comma-separated names instead of NAMES")
    ap.add_argument("--roles", help="comma-separated roles instead of all")
    ap.add_argument("--batch", type=int, default=48, help="names per spec in the compile step")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    args.hectorgen = str(Path(args.hectorgen).resolve())
    names = args.names.split(",") if args.names else NAMES
    roles = args.roles.split(",") if args.roles else ROLES
    assert len(set(names)) == len(names), "duplicate test names"
    strict = os.environ.get("HECTORGEN_NAME_TEST_STRICT", "") not in ("", "0")
    started = time.monotonic()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="hectorgen-names-"))
    work.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []

    # ---- step 1: one spec per (name, role) ---------------------------------------------------------------
    def single(name: str, role: str) -> tuple[str, str, Outcome]:
        d = work / "single" / role / safe(name)
        d.mkdir(parents=True, exist_ok=True)
        model = name if role == "model" else "q_model"
        spec = d / "spec.yaml"
        spec.write_text(spec_text(model, role, [name]))
        return name, role, generate(args.hectorgen, spec, d / "out")

    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda nr: single(*nr), [(n, r) for r in roles for n in names]))
    table: dict[tuple[str, str], Outcome] = {(n, r): o for n, r, o in outcomes}
    for (n, r), o in table.items():
        want_rejected = expected_rejected(n, r)
        if o.status == "broken":
            failures.append(f"{r} {n!r}: {o.detail}")
        elif (o.status == "rejected") != want_rejected:
            failures.append(f"{r} {n!r}: {'rejected' if o.status == 'rejected' else 'accepted'}, expected "
                            f"{'a rejection' if want_rejected else 'it to be accepted'} ({o.detail})")
    print(f"step 1: {len(table)} specs ({len(names)} names x {len(roles)} roles) generated "
          f"in {time.monotonic() - started:.0f} s", flush=True)

    # ---- step 2: batches of accepted names, compiled -----------------------------------------------------
    comp = Compiler(work)
    batches: list[tuple[str, str, list[str], Path]] = []  # (role, model, names, out dir)
    for r in roles:
        ok = [n for n in names if table[(n, r)].status == "accepted"]
        size = 1 if r == "model" else args.batch
        for i in range(0, len(ok), size):
            chunk = ok[i:i + size]
            model = chunk[0] if r == "model" else f"q_{r}_{i // size}"
            d = work / "batch" / r / f"{i // size}_{safe(model)}"
            d.mkdir(parents=True, exist_ok=True)
            spec = d / "spec.yaml"
            spec.write_text(spec_text(model, r, chunk))
            o = generate(args.hectorgen, spec, d / "out")
            if o.status != "accepted":
                failures.append(f"{r} batch {chunk}: {o.status}: {o.detail}")
                continue
            batches.append((r, model, chunk, d / "out"))
    print(f"step 2: {len(batches)} specs of accepted names generated", flush=True)

    compile_failures = compile_all(comp, batches, args.hectorgen, args.jobs)
    if compile_failures is None:
        msg = "compile step skipped (no nvcc or no torch)"
        print(msg)
        if strict:
            failures.append(msg)
    else:
        failures += compile_failures

    # ---- the list ---------------------------------------------------------------------------------------------
    print("\nname".ljust(34) + "".join(r[:8].ljust(9) for r in roles))
    for n in names:
        cells = []
        for r in roles:
            o = table[(n, r)]
            cells.append({"accepted": "ok", "rejected": "rejected", "broken": "BROKEN"}[o.status].ljust(9))
        print(n.ljust(33) + "".join(cells))
    kinds: dict[str, int] = {}
    for o in table.values():
        if o.status == "rejected":
            kinds[o.detail.split(":")[0]] = kinds.get(o.detail.split(":")[0], 0) + 1
    accepted = sum(o.status == "accepted" for o in table.values())
    print(f"\n{accepted} accepted (and compiled), {sum(kinds.values())} rejected with a positioned diagnostic "
          f"({', '.join(f'{k}: {v}' for k, v in sorted(kinds.items()))}), "
          f"{sum(o.status == 'broken' for o in table.values())} broken; {time.monotonic() - started:.0f} s")
    if failures:
        print(f"\n{len(failures)} failure(s):")
        for f in failures:
            print("FAIL " + textwrap.indent(f, "     ").lstrip())
    if not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    elif failures:
        print(f"work directory: {work}")
    return 1 if failures else 0


def compile_all(comp: Compiler, batches, hectorgen: str, jobs: int) -> list[str] | None:
    """Compiles every batch; returns the failures (None when the compilers are missing)."""
    if comp.nvcc is None or not comp.torch:
        for _, _, _, out in batches:  # still: the Python files must compile
            for py in out.glob("*.py"):
                ok, msg = comp.run([sys.executable, "-W", "error", "-m", "py_compile", str(py)])
                if not ok:
                    return [f"py_compile {py}: {msg}"]
        return None
    failures: list[str] = []
    work = comp.work
    spec_of = {}
    cus, cpps, pys = [], [], []
    for role, model, chunk, out in batches:
        for cu in sorted(out.glob("*_kernels.cu")):
            cus.append(cu)
            spec_of[cu] = (role, model, chunk, out)
        for cpp in sorted(out.glob("*_host.cpp")):
            cpps.append(cpp)
            spec_of[cpp] = (role, model, chunk, out)
        for py in sorted(out.glob("*.py")):
            pys.append(py)
            spec_of[py] = (role, model, chunk, out)

    # Compile units: one unity file per architecture for the kernels, one for the host code (torch's headers are
    # the expensive part), and the largest spec as written, alone.
    units = []  # (label, command, files it covers, kind)
    for arch in ("sm_80", "sm_90"):
        u = comp.unity(f"kernels_{arch}.cu", cus, CU_PRELUDE)
        units.append((f"nvcc {arch} -fdevice-syntax-only ({len(cus)} kernels files)",
                      comp.nvcc_cmd(u, arch, [], syntax_only=True), cus, ("cu", arch)))
    u = comp.unity("host.cpp", cpps, HOST_PRELUDE)
    units.append((f"c++ with torch's headers ({len(cpps)} host files)", comp.host_cmd(u, []), cpps, ("cpp", None)))
    largest = max(batches, key=lambda b: len(b[2]))[3]
    for cu in largest.glob("*_kernels.cu"):
        for arch in ("sm_80", "sm_90"):
            units.append((f"nvcc {arch} {cu.name} (alone)", comp.nvcc_cmd(cu, arch, [largest]), [cu], ("cu", arch)))
    for cpp in largest.glob("*_host.cpp"):
        units.append((f"c++ {cpp.name} (alone)", comp.host_cmd(cpp, [largest]), [cpp], ("cpp", None)))

    def run_unit(u):
        label, cmd, files, kind = u
        t = time.monotonic()
        ok, msg = comp.run(cmd)
        return u, ok, msg, time.monotonic() - t

    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(run_unit, units))
    bad_files = []
    for (label, cmd, files, kind), ok, msg, secs in results:
        print(f"{'ok  ' if ok else 'FAIL'} {label} ({secs:.0f} s)", flush=True)
        if not ok:
            bad_files.append((files, kind, msg))

    # py_compile and the import check (one Python process for all modules)
    for py in pys:
        ok, msg = comp.run([sys.executable, "-W", "error", "-X", f"pycache_prefix={work / 'pycache'}", "-m", "py_compile", str(py)])
        if not ok:
            failures.append(f"py_compile {py} ({describe(spec_of[py])}): {msg}")
    import json
    jobs_in = []
    for py in pys:
        role, model, chunk, out = spec_of[py]
        spec = (out.parent / "spec.yaml").read_text()
        decl = parse_decl(spec)
        host = next(out.glob("*_host.cpp")).read_text()
        schemas = [f"hectorgen_{model}::{s}" for s in re.findall(r'm\.def\("([^"]+)"\);', host)]
        jobs_in.append(json.dumps({"module": f"name_test_{model}", "path": str(py), "inputs": decl["inputs"],
                                   "weights": decl["weights"], "plain": sorted(PLAIN), "schemas": schemas}))
    if not comp.can_import:
        print("skip import check (no torch in this Python)")
        return failures
    p = subprocess.run([sys.executable, "-c", PY_CHECK, str(ROOT / "runtime" / "python")],
                       input="\n".join(jobs_in) + "\n", capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        failures.append(f"import check: exit {p.returncode}\n{p.stderr}")
    else:
        for path, err in json.loads(p.stdout.splitlines()[-1]).items():
            if err:
                failures.append(f"import {path} ({describe(spec_of[Path(path)])}): {err}")
    print(f"ok   python: {len(pys)} modules compiled and imported" if not any(f.startswith(("py_compile", "import"))
          for f in failures) else "FAIL python", flush=True)

    # Narrow every failed unit down to its specs, and a failed spec down to its names.
    for files, (kind, arch), msg in bad_files:
        if len(files) == 1:
            failures.append(f"{describe(spec_of[files[0]])}: {kind} {arch or ''}\n{msg}")
            continue
        for f in files:
            role, model, chunk, out = spec_of[f]
            cmd = comp.nvcc_cmd(f, arch, [out]) if kind == "cu" else comp.host_cmd(f, [out])
            ok, msg1 = comp.run(cmd)
            if ok:
                continue
            culprits = narrow(comp, hectorgen, role, chunk, kind, arch)
            failures.append(f"{describe(spec_of[f])}: {kind} {arch or ''} fails; alone, the names "
                            f"{culprits or '(none: only together)'} fail\n{msg1}")
    return failures


def narrow(comp: Compiler, hectorgen: str, role: str, chunk: list[str], kind: str, arch: str | None) -> list[str]:
    bad = []
    for n in chunk:
        d = comp.work / "narrow" / role / safe(n)
        d.mkdir(parents=True, exist_ok=True)
        model = n if role == "model" else "q_model"
        spec = d / "spec.yaml"
        spec.write_text(spec_text(model, role, [n]))
        if generate(hectorgen, spec, d / "out").status != "accepted":
            bad.append(n)
            continue
        f = next((d / "out").glob("*_kernels.cu" if kind == "cu" else "*_host.cpp"))
        cmd = comp.nvcc_cmd(f, arch, [d / "out"]) if kind == "cu" else comp.host_cmd(f, [d / "out"])
        if not comp.run(cmd)[0]:
            bad.append(n)
    return bad


def describe(batch) -> str:
    role, model, chunk, out = batch
    return f"{role} names {chunk} (spec {out.parent / 'spec.yaml'})"


def parse_decl(spec: str) -> dict:
    """The user inputs (not from the graph) and weights of a generated spec, in order."""
    section, out = None, {"inputs": [], "weights": []}
    for line in spec.splitlines():
        if not line.startswith(" "):
            section = line.rstrip(":")
            continue
        m = re.match(r'^  "?([^":]+)"?: \{', line)
        if m and section in out and "from_graph" not in line:
            out[section].append(m.group(1))
    return out


if __name__ == "__main__":
    sys.exit(main())
