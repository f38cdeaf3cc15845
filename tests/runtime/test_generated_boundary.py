#!/usr/bin/env python3
"""The boundary between generated modules and the hectorgen runtime, checked without a GPU (CTest: runtime_boundary).

    python3 tests/runtime/test_generated_boundary.py [-v]        (unittest; no pytest needed)

* versions: hectorgen/runtime_version.h and the Python package agree on the runtime version, and every generated
  module, host file and CMakeLists.txt asks for one runtime version that it serves (same major, minor not newer);
* `hectorgen_runtime.require_version` accepts exactly the compatible versions, and importing a generated module with
  a missing, pre-1.0 or incompatible runtime fails at import with a message naming both versions;
* every generated module imports with the runtime, hands its ops exactly the graph arrays, sizes and graph inputs
  of its manifest (graph prepared on the CPU by the reference backend, ops replaced by a recorder), and rejects
  graphs prepared for other layouts or another GEMM tile.

Without torch the version tests run against a stub torch module (the runtime and the generated modules only
reference torch attributes at import time); the graph tests are skipped. HECTORGEN_GENERATED_DIR selects the
directory of generated modules (default: the bundled generated/).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pathlib
import py_compile
import re
import sys
import tempfile
import types
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNTIME_PYTHON = ROOT / "runtime" / "python"
GENERATED = pathlib.Path(os.environ.get("HECTORGEN_GENERATED_DIR", ROOT / "generated"))
MODELS = sorted(p.parent.name for p in GENERATED.glob("*/manifest.json"))

try:
    import torch

    HAVE_TORCH = True
except ImportError:  # the version tests still run, against a stub
    torch = None
    HAVE_TORCH = False


def header_version() -> tuple:
    text = (ROOT / "runtime" / "include" / "hectorgen" / "runtime_version.h").read_text()
    numbers = tuple(int(re.search(rf"#define HECTORGEN_RUNTIME_VERSION_{part} (\d+)", text).group(1))
                    for part in ("MAJOR", "MINOR", "PATCH"))
    string = re.search(r'#define HECTORGEN_RUNTIME_VERSION_STRING "([^"]*)"', text).group(1)
    return numbers, string


VERSION, VERSION_STRING = header_version()
MAJOR, MINOR = VERSION[0], VERSION[1]


def required_version(model: str) -> tuple:
    """(MAJOR, MINOR) of the runtime that generated module `model` asks for (its RUNTIME_VERSION): the newest
    runtime interface its code uses, which may be older than the runtime of this checkout (src/emit/host.cpp)."""
    text = (GENERATED / model / f"{model}.py").read_text()
    found = re.search(r'^RUNTIME_VERSION = "(\d+)\.(\d+)"$', text, re.MULTILINE)
    if found is None:
        raise AssertionError(f"{model}.py records no RUNTIME_VERSION")
    return int(found.group(1)), int(found.group(2))


def stub_torch() -> types.ModuleType:
    """The torch attributes that the runtime package and generated modules touch while being imported."""
    stub = types.ModuleType("torch")
    # hectorgen_runtime.unified lists the Tensor methods and functions its placement rules apply to.
    stub.Tensor = type("Tensor", (), {"__getitem__": lambda self, index: None,
                                      "index_select": lambda self, dim, index: None})
    stub.index_select = lambda input, dim, index: None
    stub.float32 = "float32"
    stub.autograd = types.SimpleNamespace(Function=object,
                                          function=types.SimpleNamespace(once_differentiable=lambda f: f))
    stub.nn = types.SimpleNamespace(Module=object, functional=types.SimpleNamespace())
    return stub


def load_file(name: str, path: pathlib.Path) -> types.ModuleType:
    """Imports `path` as module `name` (registered in sys.modules for the duration of the caller's isolation)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def isolated(runtime="real", version=None):
    """Runs the body with a chosen `hectorgen_runtime` in sys.modules and restores sys.modules afterwards.

    runtime: "real" (runtime/python/hectorgen_runtime, its VERSION/__version__ replaced by `version` if given),
    "missing" (importing it fails) or "unversioned" (a package from before 1.0: no require_version)."""
    saved = dict(sys.modules)
    try:
        if not HAVE_TORCH:
            sys.modules["torch"] = stub_torch()
        if runtime == "missing":
            sys.modules["hectorgen_runtime"] = None  # import raises ImportError
        elif runtime == "unversioned":
            old = types.ModuleType("hectorgen_runtime")
            old.preprocess = lambda *args, **kwargs: None
            sys.modules["hectorgen_runtime"] = old
        else:
            module = load_file("hectorgen_runtime", RUNTIME_PYTHON / "hectorgen_runtime" / "__init__.py")
            if version is not None:
                module.VERSION = version
                module.__version__ = ".".join(map(str, version))
        yield sys.modules["hectorgen_runtime"]
    finally:
        for name in set(sys.modules) - set(saved):
            del sys.modules[name]
        sys.modules.update(saved)


def import_generated(model: str) -> types.ModuleType:
    return load_file(f"{model}", GENERATED / model / f"{model}.py")


class VersionsAgree(unittest.TestCase):
    def test_header_string_matches_numbers(self):
        self.assertEqual(VERSION_STRING, ".".join(map(str, VERSION)))

    def test_python_package_matches_header(self):
        text = (RUNTIME_PYTHON / "hectorgen_runtime" / "__init__.py").read_text()
        self.assertIn(f"VERSION = {VERSION}", text)
        self.assertIn(f'__version__ = "{VERSION_STRING}"', text)
        with isolated() as runtime:
            self.assertEqual(runtime.VERSION, VERSION)
            self.assertEqual(runtime.__version__, VERSION_STRING)

    def test_generated_files_record_one_version_this_runtime_serves(self):
        self.assertTrue(MODELS, f"no generated modules under {GENERATED}")
        for model in MODELS:
            with self.subTest(model=model):
                d = GENERATED / model
                major, minor = required_version(model)
                self.assertEqual(major, MAJOR)
                self.assertLessEqual(minor, MINOR)
                self.assertIn(f"find_package(hectorgen_runtime {major}.{minor} CONFIG)",
                              (d / "CMakeLists.txt").read_text())
                self.assertIn(f"HECTORGEN_RUNTIME_VERSION_MAJOR == {major} && "
                              f"HECTORGEN_RUNTIME_VERSION_MINOR >= {minor}", (d / f"{model}_host.cpp").read_text())

    def test_generated_cmake_has_no_relative_runtime_path(self):
        for model in MODELS:
            with self.subTest(model=model):
                text = (GENERATED / model / "CMakeLists.txt").read_text()
                self.assertNotIn("../", text)
                self.assertIn("hectorgen::runtime", text)


class RequireVersion(unittest.TestCase):
    def test_compatible_versions(self):
        with isolated() as runtime:
            for required in (f"{MAJOR}.{MINOR}", f"{MAJOR}.0"):
                runtime.require_version(required, "m")  # no exception

    def test_newer_major_or_minor_is_refused_with_both_versions(self):
        with isolated() as runtime:
            for required in (f"{MAJOR + 1}.0", f"{MAJOR}.{MINOR + 1}"):
                with self.subTest(required=required):
                    with self.assertRaises(RuntimeError) as caught:
                        runtime.require_version(required, "mymodel (generated by hectorgen 9.9)")
                    message = str(caught.exception)
                    self.assertIn("mymodel (generated by hectorgen 9.9) needs hectorgen runtime " + required, message)
                    self.assertIn(f"installed hectorgen_runtime is {VERSION_STRING}", message)
                    self.assertIn("install a hectorgen runtime", message)

    def test_older_major_is_refused_with_advice_to_regenerate(self):
        with isolated(version=(MAJOR + 1, 2, 0)) as runtime:
            with self.assertRaises(RuntimeError) as caught:
                runtime.require_version(f"{MAJOR}.{MINOR}", "m")
            self.assertIn(f"is {MAJOR + 1}.2.0", str(caught.exception))
            self.assertIn("regenerate", str(caught.exception))

    def test_malformed_version(self):
        with isolated() as runtime:
            for bad in ("1", "1.x", "", "1.0.0"):
                with self.subTest(bad=bad), self.assertRaises(ValueError):
                    runtime.require_version(bad, "m")


class GeneratedModuleImport(unittest.TestCase):
    def test_py_compile(self):
        with tempfile.TemporaryDirectory() as tmp:
            for model in MODELS:
                with self.subTest(model=model):
                    py_compile.compile(str(GENERATED / model / f"{model}.py"), cfile=f"{tmp}/{model}.pyc", doraise=True)

    def test_imports_with_the_runtime(self):
        for model in MODELS:
            with self.subTest(model=model), isolated() as runtime:
                module = import_generated(model)
                self.assertEqual(module.RUNTIME_VERSION, "{}.{}".format(*required_version(model)))
                self.assertIs(module.hectorgen_runtime, runtime)

    def test_imports_with_a_newer_compatible_runtime(self):
        for model in MODELS:
            with self.subTest(model=model), isolated(version=(MAJOR, MINOR + 3, 1)):
                import_generated(model)

    def test_missing_runtime(self):
        for model in MODELS:
            with self.subTest(model=model), isolated("missing"):
                with self.assertRaises(ImportError) as caught:
                    import_generated(model)
                message = str(caught.exception)
                self.assertIn(f"{model} (generated by hectorgen", message)
                self.assertIn("needs the hectorgen runtime {}.{}".format(*required_version(model)), message)
                self.assertIn("hectorgen_runtime is missing or too old", message)
                self.assertIn("runtime/README.md", message)

    def test_runtime_from_before_versioning(self):
        for model in MODELS:
            with self.subTest(model=model), isolated("unversioned"):
                with self.assertRaisesRegex(ImportError, "missing or too old .*require_version"):
                    import_generated(model)

    def test_incompatible_runtime(self):
        for model in MODELS:
            major, minor = required_version(model)
            for version in ((major + 1, 0, 0), (major, minor - 1, 0) if minor else (major - 1, 7, 0)):
                with self.subTest(model=model, version=version), isolated(version=version):
                    with self.assertRaises(RuntimeError) as caught:
                        import_generated(model)
                    message = str(caught.exception)
                    spec = json.loads((GENERATED / model / "manifest.json").read_text())["spec"]
                    self.assertIn(f"{model} (generated by hectorgen", message)
                    self.assertIn(f"from {spec}) needs hectorgen runtime {major}.{minor}", message)
                    self.assertIn("installed hectorgen_runtime is " + ".".join(map(str, version)), message)


# The runtime key (hectorgen_runtime.Graph) that each kernel-side graph array name of the manifest must receive,
# written down independently of the emitter.
EXPECTED_KEY = {
    "src": "sorted_src", "dst": "sorted_dst", "etype": "sorted_etype", "etype_ptr": "etype_ptr",
    "etype_tile_ptr": "etype_tile_ptr", "in_ptr": "in_row_ptr", "in_eid": "in_col_eid", "in_src": "in_col_src",
    "in_etype": "in_col_etype", "out_ptr": "out_row_ptr", "out_eid": "out_col_eid", "out_dst": "out_col_dst",
    "out_etype": "out_col_etype", "in_pair": "in_col_unique_src", "ntype": "ntype",
    "ntype_ptr": "ntype_ptr", "ntype_tile_ptr": "ntype_tile_ptr",
}

# A 7-edge graph on 4 nodes, 3 relations (relation 2 empty), 3 node types (type 1 empty); nodes sorted by type.
SRC, DST, ETYPE, NTYPE = [0, 1, 2, 0, 1, 3, 0], [1, 2, 1, 1, 0, 1, 2], [1, 0, 1, 0, 1, 1, 1], [0, 0, 2, 2]
N, E, R, T = 4, 7, 3, 3


def hand_graph(dtype=None):
    return [torch.tensor(v, dtype=dtype or torch.int64) for v in (SRC, DST, ETYPE, NTYPE)]


class _RecordingOps:
    """Stands in for torch.ops: records every op call and returns zero outputs shaped as the manifest says."""

    def __init__(self, model, outputs):
        self.calls = []
        self.model, self.outputs = model, outputs

    def __getattr__(self, namespace):
        if namespace != f"hectorgen_{self.model}":
            raise AttributeError(namespace)

        def op(phase):
            def call(*args):
                self.calls.append((phase, args))
                return [torch.zeros(shape) for shape in self.outputs]

            return call

        return types.SimpleNamespace(forward=op("forward"), forward_train=op("forward_train"), backward=op("backward"))


class _TorchWithOps(types.ModuleType):
    def __init__(self, ops):
        super().__init__("torch")
        self.ops = ops

    def __getattr__(self, name):
        return getattr(torch, name)


def rows(per: str) -> list:
    return {"node": [N], "edge": [E], "etype": [R], "ntype": [T], "none": []}[per]


@unittest.skipUnless(HAVE_TORCH, "needs torch (the graph is prepared by the runtime's PyTorch reference)")
class GraphArguments(unittest.TestCase):
    def test_reference_tile_offsets(self):
        with isolated() as runtime:
            src, dst, etype, ntype = hand_graph()
            for tile, etype_tiles, ntype_tiles in ((2, [0, 1, 4, 4], [0, 1, 1, 2]), (16, [0, 1, 2, 2], [0, 1, 1, 2])):
                out = runtime.reference_preprocess(src, dst, etype, N, R, ntype, ["etype_sorted_coo", "ntype_ptr"],
                                                   T, gemm_tile=tile)
                self.assertEqual(out["etype_tile_ptr"].tolist(), etype_tiles)
                self.assertEqual(out["ntype_tile_ptr"].tolist(), ntype_tiles)
                self.assertEqual(out["ntype"].dtype, torch.int32)
                self.assertEqual(out["ntype"].tolist(), NTYPE)
            self.assertNotIn("etype_tile_ptr", runtime.reference_preprocess(src, dst, etype, N, R))

    def test_ops_receive_the_manifest_arguments(self):
        for model in MODELS:
            with self.subTest(model=model), isolated() as runtime:
                module = import_generated(model)
                manifest = json.loads((GENERATED / model / "manifest.json").read_text())
                self.assertEqual(sorted(module.GRAPH_LAYOUTS), sorted(manifest["graph_layouts"]))
                self.assertEqual(list(module.GRAPH_ARRAYS), [EXPECTED_KEY[a] for a in manifest["graph_arrays"]])

                src, dst, etype, ntype = hand_graph()
                g = runtime.prepare_graph(src, dst, etype, N, R, layouts=module.GRAPH_LAYOUTS, ntype=ntype,
                                          num_ntypes=T, gemm_tile=module.GEMM_TILE, backend="reference")
                self.assertEqual(g.layouts, frozenset(manifest["graph_layouts"]))

                tensors = manifest["tensors"]
                outputs = [rows(t["per"]) + t["shape"] for t in tensors if t["role"] == "output"]
                ops = _RecordingOps(model, outputs)
                module.torch = _TorchWithOps(ops)
                module.load_extension = lambda *args, **kwargs: None
                inputs = [t for t in tensors if t["role"] == "input" and "from_graph" not in t]
                weights = [t for t in tensors if t["role"] == "weight"]
                values = [torch.randn(rows(t["per"]) + t["shape"]) for t in inputs + weights]
                with torch.no_grad():
                    module.forward(g, *values)

                self.assertEqual([phase for phase, _ in ops.calls], ["forward"])
                args = list(ops.calls[0][1])
                arrays = manifest["graph_arrays"]
                for name, arg in zip(arrays, args):
                    self.assertIs(arg, getattr(g, EXPECTED_KEY[name]), name)
                    self.assertEqual(arg.dtype, torch.int32, name)
                sizes = args[len(arrays):len(arrays) + 4]
                self.assertEqual(sizes, [N, E, R, T])
                rest = args[len(arrays) + 4:]
                from_graph = [t for t in tensors if t["role"] == "input" and "from_graph" in t]
                for t, arg in zip(from_graph, rest):
                    self.assertIs(arg, getattr(g, t["from_graph"]), t["name"])
                    self.assertEqual(list(arg.shape), rows(t["per"]) + t["shape"], t["name"])
                rest = rest[len(from_graph):]
                self.assertEqual(len(rest), len(values))
                for t, arg, value in zip(inputs + weights, rest, values):
                    if t["per"] == "edge":  # edge inputs are permuted into the etype-sorted order
                        self.assertTrue(torch.equal(arg, value.index_select(0, g.perm)), t["name"])
                    else:
                        self.assertIs(arg, value, t["name"])

    def test_tile_offsets_match_the_segments(self):
        for model in MODELS:
            with self.subTest(model=model), isolated() as runtime:
                module = import_generated(model)
                g = runtime.prepare_graph(*hand_graph()[:3], N, R, layouts=module.GRAPH_LAYOUTS, ntype=hand_graph()[3],
                                          gemm_tile=module.GEMM_TILE, backend="reference")
                self.assertEqual(g.gemm_tile, module.GEMM_TILE)
                for segments, tiles in (("etype_ptr", "etype_tile_ptr"), ("ntype_ptr", "ntype_tile_ptr")):
                    if tiles not in module.GRAPH_ARRAYS:
                        continue
                    ptr = getattr(g, segments).tolist()
                    expected = [0]
                    for a, b in zip(ptr, ptr[1:]):
                        expected.append(expected[-1] + -(-(b - a) // module.GEMM_TILE))
                    self.assertEqual(getattr(g, tiles).tolist(), expected)

    def test_prepare_graph_wants_cuda_tensors(self):
        for model in MODELS:
            with self.subTest(model=model), isolated():
                module = import_generated(model)
                src, dst, etype, ntype = hand_graph()
                with self.assertRaisesRegex(ValueError, f"{model}.prepare_graph: src, dst and etype must be CUDA"):
                    module.prepare_graph(src, dst, etype, N, R, ntype=ntype, num_ntypes=T)

    def test_node_types_are_required_when_the_layouts_need_them(self):
        with isolated() as runtime:
            with self.assertRaisesRegex(ValueError, "m.prepare_graph: this model needs node types"):
                runtime.prepare_graph(*hand_graph()[:3], N, R, layouts=["ntype_ptr"], backend="reference",
                                      caller="m.prepare_graph")
            g = runtime.prepare_graph(*hand_graph()[:3], N, R, layouts=["csr_by_dst"], backend="reference")
            self.assertEqual(g.num_ntypes, 1)
            src, dst, etype, ntype = hand_graph()
            g = runtime.prepare_graph(src, dst, etype, N, R, layouts=["ntype_ptr"], ntype=ntype, backend="reference")
            self.assertEqual(g.num_ntypes, T)  # derived as max(ntype) + 1

    def test_graphs_prepared_for_something_else_are_rejected(self):
        with isolated() as runtime:
            src, dst, etype, ntype = hand_graph()
            g = runtime.prepare_graph(src, dst, etype, N, R, layouts=["etype_sorted_coo", "csr_by_dst"],
                                      gemm_tile=16, backend="reference")
            with self.assertRaisesRegex(ValueError, "no 'out_row_ptr': .* without the layout 'csr_by_src'"):
                g.arrays(["sorted_src", "out_row_ptr"], gemm_tile=16)
            with self.assertRaisesRegex(ValueError, "row tile 16, not 32"):
                g.arrays(["etype_tile_ptr"], gemm_tile=32)
            with self.assertRaisesRegex(ValueError, "no 'ntype_tile_ptr'.*'ntype_ptr' with a gemm_tile"):
                g.array("ntype_tile_ptr")
            with self.assertRaisesRegex(ValueError, "unknown graph array 'bogus'"):
                g.array("bogus")


if __name__ == "__main__":
    unittest.main()
