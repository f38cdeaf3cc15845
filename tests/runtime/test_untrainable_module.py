#!/usr/bin/env python3
"""A model hectorgen cannot differentiate: generation warns, and its module refuses to run under autograd when an
argument requires grad (naming the arguments, the reason and what to do) instead of silently returning outputs
with no gradient; under torch.no_grad() it runs. Checked on the CPU with the ops replaced by a recorder
(CTest: untrainable_module).

    python3 tests/runtime/test_untrainable_module.py HECTORGEN_BINARY [-v]
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import test_generated_boundary as boundary  # noqa: E402  (the import helpers and the recording ops)

ROOT = boundary.ROOT
HECTORGEN = None  # set from argv
# rgat_concat_outer with its attention passed through leakyrelu_grad, an operator without a derivative rule:
# the model generates inference code only.
TRAINABLE_SPEC = ROOT / "tests" / "specs" / "rgat_concat_outer.yaml"
MODEL = "rgat_concat_outer"


def untrainable_spec(out: pathlib.Path) -> pathlib.Path:
    text = TRAINABLE_SPEC.read_text()
    assert "leakyrelu(" in text
    spec = out / "untrainable.yaml"
    spec.write_text(text.replace("leakyrelu(", "leakyrelu_grad("))
    return spec


def generate(spec: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([HECTORGEN, str(spec), "-o", str(out)], capture_output=True, text=True, check=False)


@unittest.skipUnless(boundary.HAVE_TORCH, "needs torch")
class UntrainableModule(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = pathlib.Path(cls.tmp.name)
        cls.result = generate(untrainable_spec(cls.out), cls.out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_generation_warns(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        self.assertIn("warning: no backward pass generated", self.result.stderr)

    def run_model(self, requires_grad: set, grad_enabled: bool = True):
        """Runs the generated forward on a hand graph; returns (recorded op calls, the module)."""
        torch = boundary.torch
        with boundary.isolated() as runtime:
            module = boundary.load_file(MODEL, self.out / f"{MODEL}.py")
            src, dst, etype, _ = boundary.hand_graph()
            g = runtime.prepare_graph(src, dst, etype, boundary.N, boundary.R, layouts=module.GRAPH_LAYOUTS,
                                      gemm_tile=module.GEMM_TILE, backend="reference")
            ops = boundary._RecordingOps(MODEL, [[boundary.N, 4, 16]])
            module.torch = boundary._TorchWithOps(ops)
            module.load_extension = lambda *args, **kwargs: None
            layer = module.Rgat_concat_outer(boundary.R)
            for name, p in layer.named_parameters():
                p.requires_grad_(name in requires_grad)
            feature = torch.randn(boundary.N, 64, requires_grad="feature" in requires_grad)
            with torch.set_grad_enabled(grad_enabled):
                layer(g, feature)
            return ops.calls, module

    def test_refuses_a_parameter_that_requires_grad(self):
        with self.assertRaises(RuntimeError) as caught:
            self.run_model({"W", "V"})
        message = str(caught.exception)
        self.assertIn(f"{MODEL}: W, V requires grad", message)
        self.assertNotIn(" a,", message)  # only the arguments that require grad are named
        self.assertIn("no backward pass", message)
        self.assertRegex(message, r"'leakyrelu_grad'.*\(spec line \d+\)")  # why: the autodiff diagnostic, positioned
        self.assertIn("torch.no_grad()", message)  # what to do
        self.assertIn("requires_grad_(False)", message)

    def test_refuses_an_input_that_requires_grad(self):
        with self.assertRaisesRegex(RuntimeError, f"{MODEL}: feature requires grad"):
            self.run_model({"feature"})

    def test_runs_without_grad(self):
        calls, module = self.run_model({"W", "a", "V"}, grad_enabled=False)
        self.assertFalse(module.TRAINABLE)
        self.assertEqual([phase for phase, _ in calls], ["forward"])
        calls, _ = self.run_model(set())
        self.assertEqual([phase for phase, _ in calls], ["forward"])


if __name__ == "__main__":
    HECTORGEN = sys.argv.pop(1)
    unittest.main()
