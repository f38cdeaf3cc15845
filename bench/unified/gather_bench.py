#!/usr/bin/env python3
"""Microbenchmark of gathering rows of a host-resident table onto the GPU (issue 10, item 4).

For each row width, `--gather-gib` of rows chosen at random from a `--table-gib` table in pinned host memory are
brought into GPU memory by
  ideal      bytes / this machine's pinned host-to-device copy bandwidth (measured first);
  pytorch    PyTorch's way: CPU index_select into a pinned staging buffer, then one copy (non_blocking);
  naive      zero-copy with PyTorch's own CUDA index_select over the table's CUDA alias (no alignment care);
  zc         hectorgen_runtime.gather(path="zero_copy"): the line-aligned zero-copy kernel;
  zc_sorted  the same over the sorted index, the result un-permuted (path="zero_copy_sorted");
  cpu        the pipelined CPU gather + DMA (path="cpu");
  ours       hectorgen_runtime.gather(path="auto"), which picks one of the three per call from the calibration
             (the table says which).
Each time is the median of --repeats CUDA-event timings after a warm-up; every method's output is compared with
PyTorch's, byte for byte. Our paths get the index on the GPU (as a GPU sampler gives it), PyTorch's a CPU one.

    python3 bench/unified/gather_bench.py                         # 8 GiB table, 1 GiB gathered, 7 widths
    python3 bench/unified/gather_bench.py --table-gib 1 --gather-gib 0.25 --widths 256,2052   # a quick look

Writes gather_bench.{json,md,log} and gather_bench.png (with matplotlib) into --out (default: $OUT, else
bench/unified/results).
"""

import argparse
import json
import os
import pathlib
import platform
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "runtime" / "python"))
import hectorgen_runtime as hr  # noqa: E402

um = sys.modules["hectorgen_runtime.unified"]

WIDTHS = (128, 256, 512, 1024, 2052, 4096, 16384)
METHODS = ("pytorch", "naive", "zc", "zc_sorted", "cpu", "ours")
GiB = 1 << 30


class Log:
    def __init__(self, path: pathlib.Path):
        self.file = path.open("w")

    def __call__(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def cuda_time(fn, repeats: int) -> float:
    """Median seconds of fn() between two CUDA events on the current stream, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def h2d_bandwidth(repeats: int) -> float:
    host = torch.empty(GiB, dtype=torch.uint8).pin_memory()
    device = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    seconds = cuda_time(lambda: device.copy_(host, non_blocking=True), repeats)
    del host, device
    return GiB / seconds


def fill(memory: torch.Tensor, log: Log) -> None:
    """Random bytes into the unified table, written by the GPU through its CUDA alias (fast, no CPU loop)."""
    view = memory.cuda_view()
    step = 256 << 20
    generator = torch.Generator(device="cuda").manual_seed(0)
    for begin in range(0, view.numel(), step):
        end = min(begin + step, view.numel())
        view[begin:end].copy_(torch.randint(0, 256, (end - begin,), dtype=torch.uint8, device="cuda",
                                            generator=generator))
    torch.cuda.synchronize()
    log(f"  filled the {memory.numel() / GiB:.2f} GiB table")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gib", type=float, default=8.0)
    parser.add_argument("--gather-gib", type=float, default=1.0)
    parser.add_argument("--widths", default=",".join(str(w) for w in WIDTHS), help="row widths in bytes (x4)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "unified" / "results"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gather_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    widths = [int(w) for w in args.widths.split(",")]
    if any(w <= 0 or w % 4 for w in widths):
        parser.error("row widths must be positive multiples of 4 bytes (float32 rows)")
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = Log(out_dir / "gather_bench.log")
    began = time.perf_counter()

    log(f"gather_bench: {torch.cuda.get_device_name()} | torch {torch.__version__} | {os.cpu_count()} CPUs | "
        f"table {args.table_gib} GiB, gathered {args.gather_gib} GiB | widths {widths}")
    log("building/loading the hectorgen runtime extension ...")
    hr.load_extension()
    bandwidth = h2d_bandwidth(args.repeats)
    log(f"pinned H2D bandwidth: {bandwidth / 1e9:.2f} GB/s")
    started = time.perf_counter()
    calibration = um.calibrate(verbose=True)
    log(f"calibration: {time.perf_counter() - started:.1f} s")

    table_bytes = int(args.table_gib * GiB)
    gather_bytes = int(args.gather_gib * GiB)
    memory = hr.empty_unified(table_bytes, dtype=torch.uint8)
    fill(memory, log)
    stats = um.pool_stats()
    log(f"unified pool: {stats['reserved_bytes'] / GiB:.2f} GiB reserved in {stats['chunks']} chunk(s), "
        f"{stats['source_allocations']} cudaHostAlloc call(s) so far")

    rows_out = []
    cpu_generator = torch.Generator().manual_seed(args.seed)
    for width in widths:
        rows = table_bytes // width
        count = gather_bytes // width
        cols = width // 4
        plain = memory.plain()[: rows * width].view(torch.float32).view(rows, cols)
        table = hr.UnifiedTensor(plain)
        alias = table.cuda_view()
        index_cpu = torch.randint(0, rows, (count,), generator=cpu_generator)
        index = index_cpu.cuda()
        stage = torch.empty(count, cols).pin_memory()
        expected = torch.empty(count, cols, device="cuda")
        got = torch.empty(count, cols, device="cuda")

        def pytorch():
            torch.index_select(plain, 0, index_cpu, out=stage)
            expected.copy_(stage, non_blocking=True)

        methods = {
            "pytorch": pytorch,
            "naive": lambda: torch.index_select(alias, 0, index, out=got),
            "zc": lambda: hr.gather(table, index, out=got, path="zero_copy", check=False),
            "zc_sorted": lambda: hr.gather(table, index, out=got, path="zero_copy_sorted", check=False),
            "cpu": lambda: hr.gather(table, index, out=got, path="cpu", check=False),
            "ours": lambda: hr.gather(table, index, out=got, check=False),
        }
        times, exact = {}, {}
        for name, fn in methods.items():
            times[name] = cuda_time(fn, args.repeats)
            torch.cuda.synchronize()
            exact[name] = True if name == "pytorch" else bool(torch.equal(got.view(torch.uint8).view(-1),
                                                                          expected.view(torch.uint8).view(-1)))
        hr.check_gather_errors()
        plan = hr.load_extension().unified_gather_plan(plain, got)
        ideal = count * width / bandwidth
        row = {"row_bytes": width, "rows_gathered": count, "table_rows": rows, "ideal_s": ideal,
               **{f"{name}_s": times[name] for name in METHODS}, "auto_path": calibration.choose(width, count),
               "exact": exact, "kernel_plan": dict(plan)}
        rows_out.append(row)
        log(f"  {width:6d} B  ideal {ideal * 1e3:7.2f} ms | " +
            " | ".join(f"{name} {times[name] * 1e3:7.2f} ms ({times[name] / ideal:4.2f}x)" for name in METHODS) +
            f" | auto: {row['auto_path']} | exact: {all(exact.values())} | {time.perf_counter() - began:.0f} s")
        del stage, expected, got, alias, table, plain

    result = {
        "device": torch.cuda.get_device_name(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "h2d_bandwidth_bytes_per_s": bandwidth,
        "table_bytes": table_bytes,
        "gather_bytes": gather_bytes,
        "repeats": args.repeats,
        "calibration": calibration.to_json(),
        "rows": rows_out,
    }
    (out_dir / "gather_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    markdown = report(result)
    (out_dir / "gather_bench.md").write_text(markdown)
    log(markdown)
    plot(result, out_dir / "gather_bench.png", log)
    log(f"gather_bench: done in {time.perf_counter() - began:.0f} s; results in {out_dir}")
    return 0 if all(all(r["exact"].values()) for r in rows_out) else 1


def report(result: dict) -> str:
    lines = [
        f"Gather of {result['gather_bytes'] / GiB:g} GiB of random rows from a {result['table_bytes'] / GiB:g} GiB "
        f"pinned host table on {result['device']} ({result['cpus']} CPUs, torch {result['torch']}); pinned H2D "
        f"bandwidth {result['h2d_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s. Median of {result['repeats']} runs, ms "
        "(x ideal).",
        "",
        "| row B | ideal | PyTorch (CPU gather + copy) | naive zero-copy | zc | zc sorted | CPU pipelined | "
        "ours (auto) | auto chose | ours vs PyTorch | exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for row in result["rows"]:
        ideal = row["ideal_s"]

        def cell(name):
            return f"{row[name + '_s'] * 1e3:.2f} ({row[name + '_s'] / ideal:.2f}x)"

        lines.append(f"| {row['row_bytes']} | {ideal * 1e3:.2f} | {cell('pytorch')} | {cell('naive')} | "
                     f"{cell('zc')} | {cell('zc_sorted')} | {cell('cpu')} | {cell('ours')} | {row['auto_path']} | "
                     f"{row['pytorch_s'] / row['ours_s']:.2f}x | {'yes' if all(row['exact'].values()) else 'NO'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: pathlib.Path, log: Log) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib: no plot (the table is in gather_bench.md)")
        return
    widths = [row["row_bytes"] for row in result["rows"]]
    labels = {"pytorch": "PyTorch (CPU gather + copy)", "naive": "naive zero-copy", "zc": "zero-copy, aligned",
              "zc_sorted": "zero-copy, sorted", "cpu": "CPU gather, pipelined", "ours": "ours (auto)"}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    positions = range(len(widths))
    for name in METHODS:
        ax.plot(positions, [row[name + "_s"] / row["ideal_s"] for row in result["rows"]], marker="o",
                label=labels[name], linewidth=2.5 if name == "ours" else 1.2)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ideal (pinned H2D copy)")
    ax.set_xticks(list(positions), [str(w) for w in widths])
    ax.set_xlabel("row width (bytes)")
    ax.set_ylabel("time / ideal (lower is better)")
    ax.set_yscale("log")
    ax.set_title(f"Gathering {result['gather_bytes'] / GiB:g} GiB from a {result['table_bytes'] / GiB:g} GiB host "
                 f"table, {result['device']}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
