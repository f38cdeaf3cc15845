#!/usr/bin/env python3
"""CPU test of data-parallel training (tools/ddp_train.py): CTest "ddp_cpu", no GPU, no pytest.

    python3 tests/distributed/test_ddp_cpu.py

1. sharding: a step's global batch is a deterministic slice of a seeded permutation of the training nodes, batches
   of one epoch disjoint and of equal size (the remainder dropped); the shards of 1, 2, 3 and 4 ranks are disjoint, cover the batch and differ in size
   by at most one.
   --shard cost: balanced_shard's shards are disjoint, cover the batch, sizes within one, spread costly nodes that
   striding piles on one rank; khop_cost counts 2-hop in-paths; khop_in_subgraph against a plain BFS; StepClock
   and timing_summary (the per-phase timing).
2. the global-mean loss: the sum over ranks of the gradients of the ranks' losses (their nodes' cross-entropies
   divided by the GLOBAL batch size) equals the gradient of the mean loss over the global batch, for 2 and 3 ranks,
   with the plain-PyTorch stand-in layers of RGAT and HGT; and --mode khop's 2-hop subgraph gives the batch's nodes
   exactly the outputs of the whole graph.
3. the check, end to end, 2 processes over gloo: under torchrun (RGAT stand-in, full graph) and started directly with
   torchrun's environment (HGT stand-in, --mode khop --shard cost) it passes and writes its JSON lines (with both
   ranks' per-phase timing); with HG_DDP_BUG=1 (one
   parameter's all-reduce skipped) it fails, in both the comparison with one process and between the ranks.
4. rank_scoped_path (hectorgen_runtime.distributed): a single process keeps the base folder, each rank of a job gets
   its own.
5. --layer generated in one process, with a stand-in that has a generated module's interface: loaded the way the GPU
   runs load modules (gpu_check.load_generated); a module without a backward pass is refused with a clear message.
6. bench/ddp_scaling.py --report on summaries with known step times: speed-up and efficiency against 1 GPU of the
   same graph, model, mode and GPU type; check records left out; the per-phase breakdown and the host
   synchronisations of --sync-debug runs; the PNG when matplotlib is installed.
7. the runtime under DDP: --check --offload file (the tensor cache in its CPU tensor mode, 2 processes) gives the
   weights of the run that keeps the activations, bit for bit; every rank's offload file is named for it and lives
   in its own folder; nothing is tracked or left on disk afterwards.
Exit 0 if all pass, 1 otherwise, 77 (skipped) without torch or torch.distributed.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "bench"))

try:
    import torch
    import torch.distributed as dist
    if not dist.is_available():
        raise ImportError("torch.distributed is not available in this build of torch")
    torch.set_num_threads(1)
except ImportError as e:
    print(f"ddp_cpu: SKIPPED: needs python3 with torch and torch.distributed ({e})")
    sys.exit(77)

import ddp_train  # noqa: E402

_distributed = sys.modules[ddp_train.rank_info.__module__]   # hectorgen_runtime.distributed, as ddp_train found it
RankInfo, rank_scoped_path = _distributed.RankInfo, _distributed.rank_scoped_path

TMP = Path(tempfile.mkdtemp(prefix="hg_ddp_test_"))


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def test_sharding():
    train = torch.arange(100, 137)          # 37 training nodes, batch 10: 3 batches per epoch, 7 nodes left over
    seen = []
    for step in range(3):
        b = ddp_train.global_batch(train, step, 10, seed=3)
        check(torch.equal(b, ddp_train.global_batch(train, step, 10, seed=3)), "global_batch is not deterministic")
        seen.append(b)
    epoch = torch.cat(seen).tolist()
    check(len(set(epoch)) == 30 and set(epoch) <= set(range(100, 137)), "an epoch's batches must be disjoint")
    check([b.numel() for b in seen] == [10, 10, 10], f"batch sizes {[b.numel() for b in seen]}")
    nxt = [ddp_train.global_batch(train, s, 10, seed=3) for s in range(3, 6)]
    check(set(torch.cat(nxt).tolist()) != set(epoch), "the next epoch must be reshuffled")
    check(not torch.equal(ddp_train.global_batch(train, 0, 10, seed=4), seen[0]), "the seed must matter")
    check(sorted(ddp_train.global_batch(train, 5, 50, seed=3).tolist()) == train.tolist(),
          "a batch larger than the training set is the training set")
    for world in (1, 2, 3, 4):
        for b in seen:
            parts = [ddp_train.shard(b, r, world) for r in range(world)]
            check(sorted(torch.cat(parts).tolist()) == sorted(b.tolist()), f"world {world}: shards do not cover")
            sizes = [p.numel() for p in parts]
            check(max(sizes) - min(sizes) <= 1, f"world {world}: shard sizes {sizes}")
    try:
        ddp_train.shard(seen[0], 2, 2)
    except ValueError:
        pass
    else:
        raise AssertionError("shard(rank=2, world=2) must raise")


def test_balanced_shard():
    """--shard cost: the shards of a batch are disjoint, cover it, differ in size by at most one, keep batch order and
    spread costly nodes where striding piles them on one rank; khop_cost counts the 2-hop in-paths of a node."""
    cost = torch.ones(64, dtype=torch.int64)
    cost[::4] = 100                        # every 4th node id is costly
    batch = torch.arange(40)               # with 4 ranks, stride gives rank 0 every costly node
    for world in (1, 2, 3, 4):
        parts = [ddp_train.balanced_shard(batch, cost, r, world) for r in range(world)]
        check(sorted(torch.cat(parts).tolist()) == batch.tolist(), f"world {world}: shards do not cover the batch")
        sizes = [q.numel() for q in parts]
        check(max(sizes) - min(sizes) <= 1, f"world {world}: shard sizes {sizes}")
        check(all(bool((q[1:] > q[:-1]).all()) for q in parts), "a shard must keep batch order")
        check(all(torch.equal(q, ddp_train.balanced_shard(batch, cost, r, world)) for r, q in enumerate(parts)),
              "balanced_shard is not deterministic")
    load = lambda parts: [int(cost[q].sum()) for q in parts]  # noqa: E731
    strided = load([ddp_train.shard(batch, r, 4) for r in range(4)])
    balanced = load([ddp_train.balanced_shard(batch, cost, r, 4) for r in range(4)])
    check(max(strided) == 1000 and min(strided) == 10, f"the test needs an imbalanced stride: {strided}")
    check(max(balanced) - min(balanced) <= 100, f"cost shards are not balanced: {balanced}")
    try:
        ddp_train.balanced_shard(batch, cost, 4, 4)
    except ValueError:
        pass
    else:
        raise AssertionError("balanced_shard(rank=4, world=4) must raise")
    g = ddp_train.load_graph("mini", 0)
    kc = ddp_train.khop_cost(g.src, g.dst, g.num_nodes)
    ins = {}
    for s_, d_ in zip(g.src.tolist(), g.dst.tolist()):
        ins.setdefault(d_, []).append(s_)
    for v in range(0, g.num_nodes, 7):
        want = len(ins.get(v, [])) + sum(len(ins.get(u, [])) for u in ins.get(v, []))
        check(int(kc[v]) == want, f"khop_cost[{v}] = {int(kc[v])}, the 2-hop in-paths are {want}")


def test_khop_subgraph():
    """khop_in_subgraph against a plain-Python breadth-first search: the nodes within 2 in-steps of the seeds, every
    in-edge of the seeds and of their in-neighbours, and the old -> new id map."""
    g = ddp_train.load_graph("mini", 0)
    src, dst = g.src.tolist(), g.dst.tolist()
    for seeds in ([0], [5, 17, 33], list(range(0, g.num_nodes, 9)), [g.num_nodes - 1]):
        nodes, eids, new_id = ddp_train.khop_in_subgraph(g.src, g.dst, g.num_nodes, torch.tensor(seeds), hops=2)
        hop1 = set(seeds) | {s_ for s_, d_ in zip(src, dst) if d_ in seeds}
        want_e = [e for e, d_ in enumerate(dst) if d_ in hop1]
        want_n = sorted(hop1 | {src[e] for e in want_e})
        check(eids.tolist() == want_e, f"seeds {seeds}: edges {eids.tolist()[:10]}..., want {want_e[:10]}...")
        check(nodes.tolist() == want_n, f"seeds {seeds}: nodes {nodes.tolist()[:10]}..., want {want_n[:10]}...")
        check(new_id[nodes].tolist() == list(range(len(want_n))) and int((new_id >= 0).sum()) == len(want_n),
              f"seeds {seeds}: the id map")


def test_step_clock():
    """StepClock on the CPU: phases timed on the host clock, the backward split where the last bucket became ready,
    step times between consecutive marks; timing_summary: warm-up left out, fastest and slowest rank per phase,
    the slowest rank's step time, the subgraph imbalance."""
    clock = ddp_train.StepClock(torch.device("cpu"))
    for step in range(2):
        clock.mark(step)
        with clock.phase(step, "forward"):
            time.sleep(0.01)
        with clock.phase(step, "backward"):
            time.sleep(0.02)
            clock.bucket_ready()
            time.sleep(0.03)
        clock.split_backward(step)
        clock.sizes[step] = (5, 7)
    clock.mark(2)
    r = clock.result(2)
    k = ddp_train.PHASES.index
    ph = r["phases"]
    check(ph.shape == (2, len(ddp_train.PHASES), 3) and r["step_ms"].shape == (2,), f"shapes {ph.shape}")
    check(18 <= ph[1, k("backward"), 0] < 28 and 28 <= ph[1, k("allreduce"), 0] < 45,
          f"backward / allreduce not split at the bucket: {ph[1, :, 0].tolist()}")
    check(ph[1, k("khop"), 0] == 0 and r["sizes"][1].tolist() == [5.0, 7.0], "untimed phases must stay 0")
    check(60 <= r["step_ms"][1] < 90, f"step time {r['step_ms'][1]} ms for about 60 ms of phases")

    # timing_summary over 2 ranks, 3 steps, 1 warm-up step: rank 1 is slower in forward and has the larger subgraph
    phases = torch.zeros(2, 3, len(ddp_train.PHASES), 3, dtype=torch.float64)
    phases[:, :, k("forward"), 1] = torch.tensor([[100.0, 2.0, 4.0], [100.0, 6.0, 8.0]])
    phases[:, :, k("allreduce"), 1] = torch.tensor([[0.0, 5.0, 5.0], [0.0, 1.0, 1.0]])
    step_ms = torch.tensor([[500.0, 10.0, 12.0], [400.0, 11.0, 30.0]], dtype=torch.float64)
    sizes = torch.tensor([[[1, 100], [1, 100], [1, 100]], [[1, 300], [1, 300], [1, 300]]], dtype=torch.float64)
    t = ddp_train.timing_summary(phases, step_ms, sizes, torch.tensor([0.05, 0.04], dtype=torch.float64), warmup=1)
    f = t["phases"]["forward"]
    check(t["warmup"] == 1 and t["timed_steps"] == 2, f"{t['warmup']}, {t['timed_steps']}")
    check(t["median_step_ms"] == 20.5 and t["mean_step_ms"] == 20.5 and t["step_ms_spread"] == [11.0, 30.0],
          f"the step is the slowest rank's, warm-up left out: {t['median_step_ms']}, {t['step_ms_spread']}")
    check(f["gpu_ms"] == [3.0, 7.0] and f["slowest_rank"] == 1 and f["gpu_min"] == 3.0, f"forward: {f}")
    check(t["phases"]["allreduce"]["slowest_rank"] == 0, "the fast rank waits in the all-reduce")
    check(t["wall_step_ms"] == 25.0 and t["edge_imbalance"] == 1.5, f"{t['wall_step_ms']}, {t['edge_imbalance']}")
    check(t["per_step"][2]["rank_step_ms"] == [12.0, 30.0] and t["per_step"][2]["phase_ms_max"]["forward"] == 8.0,
          f"per step: {t['per_step'][2]}")
    lines = ddp_train.phase_table(t, gpu=True)
    check(any(line.split()[0] == "forward" and "(rank 1)" in line for line in lines), "\n".join(lines))


def trainer(model: str, mode: str = "full"):
    a = ddp_train.parse_args(["--device", "cpu", "--model", model, "--graph", "mini", "--mode", mode, "--batch", "24"])
    info = RankInfo(0, 1, 0)
    mod, cls = ddp_train.load_layer(a, info)
    return ddp_train.Trainer(a, info, torch.device("cpu"), mod, cls, ddp_train.load_graph("mini", 0))


def grads(tr, model, nodes, scale):
    model.zero_grad(set_to_none=True)
    g, x, at = tr.step_inputs(nodes)
    loss = torch.nn.functional.cross_entropy(model(g, x)[at], tr.y[nodes], reduction="sum") / scale
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_global_mean_loss():
    for model_name in ("rgat", "hgt"):
        tr = trainer(model_name)
        model = tr.new_model()
        batch = ddp_train.global_batch(tr.train_nodes, 0, 24, seed=0)
        g1 = grads(tr, model, batch, batch.numel())
        mean = torch.nn.functional.cross_entropy(model(tr.full, tr.x)[batch], tr.y[batch])
        model.zero_grad(set_to_none=True)
        mean.backward()
        for n, p in model.named_parameters():
            check(torch.allclose(g1[n], p.grad, rtol=1e-5, atol=1e-7), f"{model_name}: sum / B is not the mean ({n})")
        for world in (2, 3):
            parts = [grads(tr, model, ddp_train.shard(batch, r, world), batch.numel()) for r in range(world)]
            for n in g1:
                total = sum(p[n] for p in parts)
                err = (total - g1[n]).abs().max().item()
                check(err <= 1e-5 * max(g1[n].abs().max().item(), 1e-12),
                      f"{model_name}, {world} ranks: summed shard gradients differ from the global mean's by {err} ({n})")
                # DDP's default (the MEAN of the ranks' gradients) would be wrong by the factor world:
                check(not torch.allclose(total / world, g1[n]) or g1[n].abs().max() == 0, "the test cannot tell")
        # khop: the 2-hop subgraph of the batch gives the batch's nodes the full graph's outputs
        kt = trainer(model_name, "khop")
        with torch.no_grad():
            full = model(tr.full, tr.x)[batch]
            g, x, at = kt.step_inputs(batch)
            sub = model(g, x)[at]
            check(x.shape[0] < tr.x.shape[0], "the subgraph should be smaller than the graph (test graph too dense?)")
        err = (full - sub).abs().max().item()
        check(err <= 1e-5 * full.abs().max().item(), f"{model_name}: khop outputs differ from the full graph's by {err}")


COMMON = ["--device", "cpu", "--graph", "mini", "--steps", "3", "--batch", "32"]


def _env(env_extra):
    # PYTHONFAULTHANDLER: a rank that dies of a signal (an abort at exit, once in a few hundred runs on a loaded
    # machine, not reproduced since) prints every thread's Python stack into the log the test shows
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    env.pop(ddp_train.BUG_ENV, None)
    env.update(env_extra or {})
    return env


def torchrun(args, env_extra=None, timeout=150):
    """tools/ddp_train.py under torchrun, 2 processes."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tools" / "ddp_train.py"), *COMMON, *args]
    t = time.time()
    p = subprocess.run(cmd, env=_env(env_extra), capture_output=True, text=True, timeout=timeout)
    print(f"  $ {' '.join(cmd[2:])}{' (' + str(env_extra) + ')' if env_extra else ''}: rc {p.returncode}, "
          f"{time.time() - t:.1f} s")
    return p.returncode, p.stdout + p.stderr


def launch(args, env_extra=None, timeout=150):
    """tools/ddp_train.py as 2 processes started with the environment torchrun gives them (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, LOCAL_RANK): one Python start fewer than torchrun, for the slower test machines.
    Returns (rank 0's exit status if both agree, else 99; both outputs, each under a line with its rank and status)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    t = time.time()
    for rank in range(2):
        env = _env(dict(env_extra or {}, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
        procs.append(subprocess.Popen([sys.executable, str(REPO / "tools" / "ddp_train.py"), *COMMON, *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    rcs = [p.returncode for p in procs]
    print(f"  $ 2 x ddp_train.py {' '.join(COMMON + args)}{' (' + str(env_extra) + ')' if env_extra else ''}: "
          f"rc {rcs}, {time.time() - t:.1f} s")
    return rcs[0] if rcs[0] == rcs[1] else 99, "\n".join(f"--- rank {r} (rc {rc}) ---\n{out}"
                                                          for r, (rc, out) in enumerate(zip(rcs, outs)))


def summary(path: Path, steps: int = 3) -> dict:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    check([r["kind"] for r in recs] == ["step"] * steps + ["summary"], f"{path}: records {[r['kind'] for r in recs]}")
    return recs[-1]


def test_check_end_to_end():
    out = TMP / "check_full.jsonl"
    rc, log = torchrun(["--model", "rgat", "--check", "--out", str(out)])
    check(rc == 0 and "PASS: DDP check rgat (2 processes, gloo" in log, f"--check failed:\n{log[-3000:]}")
    s = summary(out)
    check(s["world_size"] == 2 and s["ok"] and all(s["check"].values()), f"summary: {s}")
    check(s["max_rel"] <= s["tol"] and s["rank_spread"] == 0.0, f"summary: {s}")
    check(not s["missing_grads"], f"missing gradients: {s['missing_grads']}")
    check(len(s["ddp"].get("bucket_bytes", [])) >= 2,
          f"one generated layer's bytes per bucket must give the layers buckets of their own: {s['ddp']}")

    out = TMP / "check_khop.jsonl"
    rc, log = launch(["--model", "hgt", "--mode", "khop", "--shard", "cost", "--check", "--out", str(out)])
    check(rc == 0 and "PASS: DDP check hgt (2 processes, gloo" in log, f"--check (hgt, khop) failed:\n{log}")
    s = summary(out)
    check(s["ok"] and s["shard"] == "cost", "khop summary")
    # the per-phase timing of both ranks, gathered to rank 0
    for name in ddp_train.PHASES:
        check(len(s["phases"][name]["gpu_ms"]) == 2, f"phase {name}: {s['phases'][name]}")
    for name in ("select", "khop", "prepare", "forward", "backward", "allreduce", "optimizer"):
        check(min(s["phases"][name]["host_ms"]) > 0, f"phase {name} was not timed on both ranks: {s['phases'][name]}")
    check(len(s["subgraph_edges"]) == 2 and min(s["subgraph_edges"]) > 0, f"subgraph sizes {s['subgraph_edges']}")
    steps = [json.loads(line) for line in out.read_text().splitlines()][:-1]
    check(all(len(r["rank_step_ms"]) == 2 and abs(r["step_ms"] - max(r["rank_step_ms"])) < 1e-3 for r in steps),
          "a step record has both ranks' times, the step's the slowest")
    check("per phase, ms per step" in log and "allreduce" in log, "no per-phase table printed")

    out = TMP / "bug.jsonl"
    rc, log = launch(["--model", "rgat", "--check", "--out", str(out)], {ddp_train.BUG_ENV: "1"})
    check(rc == 1 and "FAIL: DDP check rgat" in log, f"HG_DDP_BUG=1 must fail the check (rc {rc}):\n{log[-3000:]}")
    s = summary(out)
    check(not s["check"]["vs_one_process"] and not s["check"]["ranks_identical"],
          f"the skipped all-reduce must show in both comparisons: {s['check']}")
    check(s["check"]["rerun_bit_identical"], "the faulty run is still deterministic")
    check(s["max_rel_param"] == "layer1.W", f"the worst parameter should be the one not reduced: {s['max_rel_param']}")
    print(f"  HG_DDP_BUG=1: max rel diff {s['max_rel']:.2e} in {s['max_rel_param']}, rank spread {s['rank_spread']:.2e}")


def test_runtime_under_ddp():
    """The tensor cache under DDP (2 processes, gloo, CPU tensor mode): the activations of both layers offloaded to
    files gives the weights of the run that keeps them, bit for bit; each rank's files are named for it and live in
    its own folder, and nothing is left behind."""
    base = TMP / "offload"
    out = TMP / "offload.jsonl"
    rc, log = launch(["--model", "rgat", "--check", "--offload", "file", "--offload-dir", str(base),
                      "--offload-min-kib", "16", "--out", str(out)])
    check(rc == 0 and "PASS: DDP check rgat (2 processes, gloo backend, cpu, full, offload file)" in log,
          f"--check --offload file failed:\n{log[-3000:]}")
    s = summary(out)
    check(s["check"]["same_bits_as_kept_device_features"] and s["check"]["offload_clean"], f"checks {s['check']}")
    caches = s["tensor_cache"]
    check(len(caches) == 2, f"one tensor cache report per rank: {caches}")
    for rank, c in enumerate(caches):
        check(c["tier"] == "file" and c["stats"]["offloaded_bytes"] > 0 and c["stats"]["stored_file"] > 0,
              f"rank {rank} offloaded nothing to files: {c['stats']}")
        check(c["folder"] == str(base / "hectorgen-ddp-offload" / f"offload-rank{rank}-of-2"), f"folder {c['folder']}")
        check(len(c["files"]) == 1 and f"hectorgen-offload-r{rank}-" in c["files"][0], f"files {c['files']}")
        check(c["live_records"] == 0 and c["engine_entries"] == 0 and c["files_left"] == [], f"leftovers: {c}")
    check(not any((base / "hectorgen-ddp-offload").iterdir()), "the rank folders were not removed")
    print(f"  offloaded {[c['stats']['offloaded_bytes'] for c in caches]} bytes per rank to {[c['files'] for c in caches]}")


FAKE_MODULE = """# A stand-in with a generated module's interface (docs/generated_api.md), for the CPU test.
import sys
sys.path.insert(0, {bench!r})
import systems
_standin = systems.StandInModule("rgat")
TRAINABLE = {trainable}
Rgat = _standin.Layer
prepare_graph = _standin.prepare_graph


def load_extension(build_dir=None):
    return None
"""


def test_generated_module_path():
    """--layer generated loads DIR/<model>/<model>.py the way the GPU runs do (gpu_check.load_generated), in one
    process; a module without a backward pass is refused with a clear message."""
    for trainable in (True, False):
        gen = TMP / f"gen_{trainable}"
        (gen / "rgat" / "build").mkdir(parents=True)
        (gen / "rgat" / "rgat.py").write_text(FAKE_MODULE.format(bench=str(REPO / "bench"), trainable=trainable))
        sys.modules.pop("rgat", None)
        sys.path[:] = [p for p in sys.path if "gen_" not in p]
        out = TMP / f"generated_{trainable}.jsonl"
        argv = ["--device", "cpu", "--layer", "generated", "--generated", str(gen), "--graph", "mini", "--steps", "2",
                "--batch", "32", "--check", "--out", str(out)]
        if trainable:
            check(ddp_train.main(argv) == 0, "the check of one process must pass")
            s = summary(out, steps=2)
            check(s["layer"] == "generated" and s["world_size"] == 1 and s["max_abs"] == 0.0, f"summary: {s}")
        else:
            try:
                ddp_train.main(argv)
            except SystemExit as e:
                check("no backward pass" in str(e), f"unclear message: {e}")
            else:
                raise AssertionError("a module without a backward pass must be refused")


def test_rank_scoped_path():
    check(rank_scoped_path("/c", info=RankInfo(0, 1, 0)) == Path("/c"), "a single process keeps the base")
    check(rank_scoped_path("/c", "pool", RankInfo(0, 1, 0)) == Path("/c/pool"), "kind without ranks")
    paths = {rank_scoped_path("/c", info=RankInfo(r, 4, r % 2)) for r in range(4)}
    check(len(paths) == 4 and Path("/c/rank3-of-4") in paths, f"per-rank paths {paths}")
    check(rank_scoped_path("/c", "pool", RankInfo(1, 2, 1)) == Path("/c/pool-rank1-of-2"), "kind and rank")


def _phases(world: int, forward=(1.0, 3.0), syncs=0.0) -> dict:
    return {name: {"gpu_ms": [0.5] * world, "host_ms": [0.5] * world, "syncs": [syncs] * world, "slowest_rank": 0,
                   "fastest_rank": 0, "gpu_max": forward[1] if name == "forward" else 0.5,
                   "gpu_min": forward[0] if name == "forward" else 0.5, "host_max": 0.5, "host_min": 0.5}
            for name in ddp_train.PHASES}


def test_scaling_report():
    import ddp_scaling
    check(ddp_scaling.PHASES == ddp_train.PHASES, "bench/ddp_scaling.py's PHASES differ from tools/ddp_train.py's")
    base = dict(kind="summary", model="rgat", mode="khop", gpu="H100", batch=1024, num_nodes=10, num_edges=20,
                loss_first=2.0, loss_last=1.0, torch="x")
    recs = [dict(base, graph="mag", world_size=n, median_step_ms=ms, throughput_nodes_s=1024 / ms * 1e3)
            for n, ms in ((1, 40.0), (2, 20.0), (4, 16.0))]
    recs.append(dict(base, graph="wikikg2", world_size=2, median_step_ms=10.0, throughput_nodes_s=1.0))  # no 1 GPU
    recs.append(dict(recs[0], check={"vs_one_process": True}, median_step_ms=1.0))   # a --check run: left out
    # records with the per-phase timing: a cost-sharded 4-GPU run (against the stride run's 1 GPU) and a sync count
    recs.append(dict(base, graph="mag", world_size=4, shard="cost", median_step_ms=10.0, mean_step_ms=11.0,
                     throughput_nodes_s=1.0, prefetch=True, phases=_phases(4, forward=(2.0, 7.25)),
                     subgraph_edges=[100.0, 200.0, 300.0, 400.0], edge_imbalance=1.6))
    recs.append(dict(base, graph="mag", world_size=1, median_step_ms=5.0, throughput_nodes_s=1.0, tag="syncdebug",
                     sync_debug=True, phases=_phases(1, syncs=2.0)))
    path = TMP / "scaling.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    md, png = TMP / "scaling.md", TMP / "scaling.png"
    rc = ddp_scaling.main(["--report", str(path), "--md", str(md), "--png", str(png)])
    check(rc == 0, "report failed")
    rows = {(e["graph"], e["gpus"]): e for e in ddp_scaling.table(ddp_scaling.load_summaries([path]))}
    entries = ddp_scaling.table(ddp_scaling.load_summaries([path]))
    rows = {(e["graph"], e["gpus"], e["shard"]): e for e in entries}
    check(rows[("mag", 1, "stride")]["step_ms"] == 40.0, "the --check and --sync-debug records must be left out")
    check(rows[("mag", 2, "stride")]["speedup"] == 2.0 and rows[("mag", 4, "stride")]["efficiency"] == 0.625,
          f"{rows}")
    check(rows[("mag", 4, "cost")]["speedup"] == 4.0, "a cost-sharded run is compared with the 1-GPU run")
    check(rows[("wikikg2", 2, "stride")]["speedup"] is None, "no speed-up without a 1-GPU run")
    check(len(entries) == 5, f"{len(entries)} entries")
    text = md.read_text()
    check("| 2.50 | 62% | - (-) |" in text and "| 2.00 | 100% |" in text, text)
    # the per-phase and sync tables name each row's run first: the input file's stem
    breakdown = [line for line in text.splitlines() if line.startswith("| scaling | mag | rgat | cost +prefetch | 4 |")]
    check(len(breakdown) == 1 and "| 2.00–7.25 |" in breakdown[0] and "| 11.00 / 10.00 |" in breakdown[0]
          and "100–400 (1.60)" in breakdown[0], f"per-phase row: {breakdown}")
    check("## Host synchronisations per step" in text and "| scaling | mag | rgat | khop | 1 | 2 | 2 |" in text, text)
    try:
        import matplotlib  # noqa: F401
        check(png.is_file() and png.stat().st_size > 1000, "no plot written")
    except ImportError:
        print("  (no matplotlib: plot not checked)")


def main() -> int:
    tests = [test_sharding, test_balanced_shard, test_khop_subgraph, test_step_clock, test_global_mean_loss,
             test_rank_scoped_path, test_scaling_report,
             test_generated_module_path, test_check_end_to_end, test_runtime_under_ddp]
    failed = 0
    t0 = time.time()
    for t in tests:
        t1 = time.time()
        try:
            t()
            print(f"PASS {t.__name__} ({time.time() - t1:.1f} s)", flush=True)
        except Exception:  # noqa: BLE001
            failed += 1
            print(f"FAIL {t.__name__}\n{traceback.format_exc()}", flush=True)
    print(f"ddp_cpu: {len(tests) - failed}/{len(tests)} passed in {time.time() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
