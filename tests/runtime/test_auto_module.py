#!/usr/bin/env python3
"""materialization: auto modules without a GPU: prepare_graph asks the runtime for the right layouts and
compact_relations, the cost model's choice per graph and mode (and its cache on the Graph), estimated_seconds against
the module's own tables, and forward() running the chosen program's ops. The graph is prepared by the runtime's
PyTorch reference and the ops are replaced by a recorder (CTest: auto_module; skipped without torch).

    python3 tests/runtime/test_auto_module.py HECTORGEN_BINARY [-v]
"""

from __future__ import annotations

import inspect
import pathlib
import subprocess
import sys
import tempfile
import time
import types
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import test_generated_boundary as boundary  # noqa: E402  (the import helpers)

ROOT = boundary.ROOT
HECTORGEN = None  # set from argv
SPEC = ROOT / "tests" / "specs" / "rgcn_auto.yaml"  # compact_relations: 0.6
MODEL = "rgcn_auto"
DIM = 64


class _Ops:
    """Stands in for torch.ops.hectorgen_<model>: records (op, args) and returns zeros; a backward returns each
    gradient in the shape of the argument it belongs to."""

    def __init__(self, module, arg_shapes, delay_s=None):
        self.module, self.arg_shapes, self.calls = module, arg_shapes, []
        self.delay_s = delay_s or {}   # program -> seconds each of its ops takes (time_programs' tests)

    def __getattr__(self, op):
        torch = boundary.torch

        def call(*args):
            self.calls.append((op, args))
            program = "compact" if op.startswith("compact_") else "vanilla"
            if self.delay_s.get(program):
                time.sleep(self.delay_s[program])
            phase = op[len("compact_"):] if program == "compact" else op
            if phase == "backward":
                slots = self.module._GRAD_SLOTS[program]
                shapes = {r: self.arg_shapes[i] for r, i in slots}
                return [torch.zeros(shapes.get(r, (1,))) for r in range(max(shapes) + 1)]
            outs = [torch.zeros(boundary.N, DIM)]
            if phase == "forward_train":
                outs += [torch.zeros(1) for _ in self.module.SAVED_FOR_BACKWARD[program]]
            return outs

        return call


class _Torch(types.ModuleType):
    def __init__(self, ops, model):
        super().__init__("torch")
        self._ops = types.SimpleNamespace(**{f"hectorgen_{model}": ops})

    def __getattr__(self, name):
        return self._ops if name == "ops" else getattr(boundary.torch, name)


def counts(nodes, edges, pairs, etypes=4, ntypes=1):
    """A Graph's counts alone (what the cost model reads)."""
    return types.SimpleNamespace(num_nodes=nodes, num_edges=edges, num_unique_src=pairs, num_etypes=etypes,
                                 num_ntypes=ntypes, tensors=dict)


def _groups(m, rows):
    """The groups of the compact backward's gather sum over rows of `rows` (1: nodes, 3: pairs), checked > 1."""
    (groups,) = [k for r, _, below, k in m.COST_MODEL["compact"]["backward"][4] if r == rows and below == 4]
    assert groups > 1, groups
    return groups


def node_groups(m):
    return _groups(m, 1)


def pair_groups(m):
    return _groups(m, 3)


@unittest.skipUnless(boundary.HAVE_TORCH, "needs torch (the graph is prepared by the runtime's PyTorch reference)")
class AutoModule(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = pathlib.Path(cls.tmp.name)
        result = subprocess.run([HECTORGEN, str(SPEC), "-o", str(cls.out)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        # The module needs runtime 1.3 (compact_relations); the runtime's reference path prepares the graph on the
        # CPU, and a runtime from before 1.3 gets the call without compact_relations (recorded all the same).
        self.isolation = boundary.isolated(version=(boundary.MAJOR, max(boundary.MINOR, 3), 0))
        self.runtime = self.isolation.__enter__()
        self.prepared = []
        real = self.runtime.prepare_graph
        takes_policy = "compact_relations" in inspect.signature(real).parameters

        def prepare_graph(*args, **kwargs):
            self.prepared.append(dict(kwargs))
            if not takes_policy:
                kwargs.pop("compact_relations", None)
            return real(*args, backend="reference", **kwargs)

        self.runtime.prepare_graph = prepare_graph
        self.module = boundary.load_file(MODEL, self.out / f"{MODEL}.py")
        self.module.load_extension = lambda *args, **kwargs: None

    def tearDown(self):
        self.isolation.__exit__(None, None, None)

    def graph(self, **kwargs):
        src, dst, etype, _ = boundary.hand_graph()
        return self.module.prepare_graph(src, dst, etype, boundary.N, boundary.R, **kwargs)

    def test_prepare_graph_asks_for_both_programs_and_the_spec_theta(self):
        g = self.graph()
        (call,) = self.prepared
        self.assertEqual(tuple(call["layouts"]), self.module.GRAPH_LAYOUTS)
        self.assertIn("compact_src_etype", call["layouts"])
        self.assertEqual(call["compact_relations"], 0.6)  # the spec's options.compact_relations
        self.assertEqual(set(g.materialization_choices), {"inference", "training"})
        self.assertEqual(self.module.RUNTIME_VERSION, "1.7")  # its self GEMM: a one-segment tensor-core GEMM (1.7)

    def test_compact_relations_argument_wins_over_the_spec(self):
        self.graph(compact_relations=[True, False, True])
        self.assertEqual(self.prepared[0]["compact_relations"], [True, False, True])

    def test_forced_vanilla_builds_only_its_layouts(self):
        g = self.graph(materialization="vanilla")
        (call,) = self.prepared
        self.assertEqual(tuple(call["layouts"]), self.module.PROGRAM_LAYOUTS["vanilla"])
        self.assertNotIn("compact_src_etype", call["layouts"])
        self.assertNotIn("compact_relations", call)
        self.assertEqual(self.module.materialization(g, training=True), "vanilla")
        self.assertIsNone(self.module.estimated_seconds(g)["compact"])

    def test_forced_compact(self):
        g = self.graph(materialization="compact")
        self.assertEqual(self.module.materialization(g), "compact")
        self.assertEqual(self.module.materialization(g, training=True), "compact")

    def test_bad_materialization_is_refused(self):
        with self.assertRaisesRegex(ValueError, "materialization must be 'auto', 'vanilla' or 'compact', got 'both'"):
            self.graph(materialization="both")

    def test_estimated_seconds_evaluates_the_module_tables(self):
        m = self.module
        g = counts(1000, 50000, 2000)
        row = m.TUNING["default"]  # no GPU: the default row
        for training, phases in ((False, ("forward",)), (True, ("forward_train", "backward"))):
            expected = {}
            for program in m.PROGRAMS:
                total = 0.0
                for phase in phases:
                    launches, per_byte, per_gather_row, per_search_row, grouped = m.COST_MODEL[program][phase]
                    n = (1, 1000, 50000, 2000, 4, 1)
                    at = lambda per: sum(c * k for c, k in zip(per, n))  # noqa: E731
                    # a gather sum with a rows variant: a row is 1 / groups of a gather row below `below` entries a row
                    rows = at(per_gather_row) + sum(n[r] / k if n[e] < below * n[r] else n[r] for r, e, below, k in grouped)
                    total += (launches * row["launch_us"] * 1e-6 + at(per_byte) / (row["bandwidth_gbs"] * 1e9) +
                              rows * row["gather_row_ns"] * 1e-9 +
                              at(per_search_row) * row["search_round_ns"] * 1e-9)   # 4 relations: one round
                expected[program] = total
            got = m.estimated_seconds(g, training)
            for program in m.PROGRAMS:
                self.assertAlmostEqual(got[program], expected[program], delta=1e-12 + 1e-9 * expected[program])
            terms = m.cost_terms(g, training)  # what bench/calibrate_auto.py fits the tuning table with
            for program in m.PROGRAMS:
                launches = sum(m.COST_MODEL[program][phase][0] for phase in phases)
                self.assertEqual(terms[program][0], launches)
                self.assertEqual(len(terms[program]), 4)   # launches, bytes, gather rows, search rounds
            # RGCN's compact backward sums over each pair's edges (25 a pair: a warp a row, a gather row per pair) and
            # each node's pairs (2 a node: the rows variant, 1 / groups of a gather row per node); the vanilla program
            # has none
            self.assertEqual(terms["vanilla"][2], 0)
            self.assertEqual(terms["compact"][2], 2000 + 1000 / node_groups(m) if training else 0)
        # 1.5 edges a pair: the pairs' sum runs its rows variant too
        few = m.cost_terms(counts(1000, 3000, 2000), True)
        self.assertEqual(few["compact"][2], 2000 / pair_groups(m) + 1000 / node_groups(m))

    def test_cost_terms_leave_out_the_gradients_not_asked_for(self):
        m = self.module
        g = counts(1000, 50000, 2000)
        every = m.cost_terms(g, True)
        self.assertEqual(every, m.cost_terms(g, True, grads=m.ARGUMENTS))
        weights = m.cost_terms(g, True, grads=m.WEIGHTS)   # a layer whose input features do not require grad
        for program in m.PROGRAMS:
            skipped = [part[1:] for part in m.BACKWARD_PARTS[program] if not set(part[0]) & set(m.WEIGHTS)]
            self.assertTrue(skipped)   # the feature's gradient has kernels of its own
            self.assertEqual(weights[program][0], every[program][0] - sum(part[0] for part in skipped))
            self.assertLess(weights[program][1], every[program][1])
        # compact: a gather row per pair (the relation weight's gradient reads each pair's sum), and one per node
        # only for the feature's gradient (the sum over each node's pairs)
        self.assertEqual(weights["compact"][2], 2000)
        self.assertEqual(every["compact"][2], 2000 + 1000 / node_groups(m))
        self.assertEqual(m.cost_terms(g, False, grads=m.WEIGHTS), m.cost_terms(g, False))   # inference: no backward
        self.assertEqual(m.cost_terms(g, True, grads="W"), m.cost_terms(g, True, grads=("W",)))
        self.assertLess(m.cost_terms(g, True, grads="W")["compact"][0], weights["compact"][0])
        with self.assertRaisesRegex(ValueError, r"grads names no argument of forward\(\): 'features' \(its tensor "
                                                r"arguments: feature, W0, W\)"):
            m.cost_terms(g, True, grads=("features",))

    def test_training_program_follows_the_gradients_asked_for(self):
        m = self.module
        g = self.graph()
        weights = frozenset(m.WEIGHTS)
        # The cost model chooses for a step without the feature's gradient once per graph and set of arguments.
        choice = m.materialization(g, True, grads=m.WEIGHTS)
        self.assertEqual(choice, m._choose(g, True, m.WEIGHTS))
        self.assertEqual(g.materialization_by_grads, {weights: choice})
        self.assertEqual(m.materialization(g, True, grads=m.ARGUMENTS), g.materialization_choices["training"])
        # forward() passes what requires grad: the weights only here, so it runs that choice ...
        g.materialization_choices["training"] = "vanilla"
        g.materialization_by_grads[weights] = "compact"
        called, _ = self.run_layer(g, True)
        self.assertEqual(called, ["compact_forward_train", "compact_backward"])
        # ... and with the features requiring grad too, the choice for every gradient.
        layer, feature, ops = self.layer_and_ops(True)
        layer(g, feature.requires_grad_()).sum().backward()
        self.assertEqual([op for op, _ in ops.calls], ["forward_train", "backward"])
        # A program fixed by prepare_graph (or by choose_by_timing) runs whatever requires grad.
        g = self.graph(materialization="vanilla")
        g.materialization_by_grads = {weights: "compact"}
        called, _ = self.run_layer(g, True)
        self.assertEqual(called, ["forward_train", "backward"])

    def test_choice_follows_the_graph(self):
        m = self.module
        # mag-like: 21M edges, 0.87M unique (source, relation) pairs.
        self.assertEqual(m.materialization(counts(1_900_000, 21_000_000, 870_000), training=True), "compact")
        self.assertEqual(m.materialization(counts(1_900_000, 21_000_000, 870_000)), "compact")
        # Every pair unique: compaction only adds indirections.
        self.assertEqual(m.materialization(counts(1_000_000, 5_000_000, 5_000_000), training=True), "vanilla")
        # A few hundred edges: the launches decide.
        self.assertEqual(m.materialization(counts(300, 600, 200), training=True), "vanilla")

    def test_choice_is_cached_on_the_graph(self):
        g = counts(1_900_000, 21_000_000, 1_450_000)
        self.assertEqual(self.module.materialization(g), "compact")
        g.num_unique_src = g.num_edges  # the counts are not read again
        self.assertEqual(self.module.materialization(g), "compact")
        self.assertEqual(g.materialization_choices["inference"], "compact")

    def layer_and_ops(self, requires_grad, delay_s=None):
        torch = boundary.torch
        layer = self.module.Rgcn_auto(boundary.R)
        for p in layer.parameters():
            p.requires_grad_(requires_grad)
        feature = torch.randn(boundary.N, DIM)
        shapes = [tuple(feature.shape)] + [tuple(p.shape) for p in (layer.W0, layer.W)]
        ops = _Ops(self.module, shapes, delay_s)
        self.module.torch = _Torch(ops, MODEL)
        return layer, feature, ops

    def run_layer(self, g, requires_grad):
        layer, feature, ops = self.layer_and_ops(requires_grad)
        out = layer(g, feature)
        if requires_grad:
            out.sum().backward()
        return [op for op, _ in ops.calls], ops

    def test_forward_runs_the_chosen_program(self):
        for forced in ("vanilla", "compact"):
            g = self.graph(materialization=forced)
            prefix = "" if forced == "vanilla" else "compact_"
            with boundary.torch.no_grad():
                called, ops = self.run_layer(g, False)
            self.assertEqual(called, [prefix + "forward"])
            # The graph arguments are that program's: the compact ops take the pair layout and the pair count.
            args = ops.calls[0][1]
            n_arrays = len(self.module.PROGRAM_GRAPH_ARRAYS[forced])
            self.assertEqual(args[n_arrays:n_arrays + 4], (g.num_nodes, g.num_edges, g.num_etypes, g.num_ntypes))
            if forced == "compact":
                self.assertEqual(args[n_arrays + 4], g.num_unique_src)
            called, _ = self.run_layer(g, True)
            self.assertEqual(called, [prefix + "forward_train", prefix + "backward"])

    def test_choose_by_timing_keeps_the_faster_program(self):
        for training in (False, True):
            for slow, fast in (("compact", "vanilla"), ("vanilla", "compact")):
                g = self.graph()
                before = dict(g.materialization_choices)
                layer, feature, ops = self.layer_and_ops(training, {slow: 0.004})
                times = layer.choose_by_timing(g, feature, training=training, rounds=3, calls=2)
                self.assertEqual(set(times), {"vanilla", "compact"})
                self.assertGreater(times[slow], times[fast] + 3.0)   # ms: every call of the slow one sleeps 4 ms
                mode = "training" if training else "inference"
                self.assertEqual(g.materialization_choices[mode], fast)
                other = "inference" if training else "training"
                self.assertEqual(g.materialization_choices[other], before[other])   # the other mode is left alone
                # Every program ran its own ops: one untimed call, then rounds x calls timed ones.
                phases = ["forward_train", "backward"] if training else ["forward"]
                for program, prefix in (("vanilla", ""), ("compact", "compact_")):
                    for phase in phases:
                        self.assertEqual(sum(op == prefix + phase for op, _ in ops.calls), 1 + 3 * 2)
                # The weights' gradients are not touched, and forward() now runs the faster program.
                self.assertTrue(all(p.grad is None for p in layer.parameters()))
                ops.calls.clear()
                with boundary.torch.no_grad() if not training else boundary.torch.enable_grad():
                    layer(g, feature)
                prefix = "" if fast == "vanilla" else "compact_"
                self.assertEqual(ops.calls[0][0], prefix + ("forward_train" if training else "forward"))

    def test_time_programs_leaves_the_choice(self):
        g = self.graph()
        before = dict(g.materialization_choices)
        layer, feature, _ = self.layer_and_ops(False, {"compact": 0.002})
        times = self.module.time_programs(g, feature, layer.W0, layer.W, rounds=1, calls=1)
        self.assertGreater(times["compact"], times["vanilla"])
        self.assertEqual(g.materialization_choices, before)

    def test_time_programs_on_a_vanilla_only_graph(self):
        g = self.graph(materialization="vanilla")   # no pair layout: the compact program cannot run on it
        layer, feature, ops = self.layer_and_ops(False)
        times = layer.choose_by_timing(g, feature, rounds=1, calls=1)
        self.assertIsNone(times["compact"])
        self.assertEqual(g.materialization_choices["inference"], "vanilla")
        self.assertFalse(any(op.startswith("compact_") for op, _ in ops.calls))

    def test_time_programs_refuses_what_it_cannot_time(self):
        g = self.graph()
        layer, feature, _ = self.layer_and_ops(False)
        with self.assertRaisesRegex(ValueError, "no argument requires grad"):
            layer.choose_by_timing(g, feature, training=True)
        with self.assertRaisesRegex(ValueError, "rounds and calls must be >= 1"):
            layer.choose_by_timing(g, feature, rounds=0)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_auto_module.py HECTORGEN_BINARY [unittest options]")
    HECTORGEN = sys.argv.pop(1)
    if not boundary.HAVE_TORCH:
        print("SKIPPED: needs torch")
        sys.exit(77)
    unittest.main()
