#!/usr/bin/env python3
"""Compiles every file that hectorgen wrote into each output directory; needs no GPU.

    tests/compile/compile_outputs.sh DIR...        (the entry point; it runs this script)

  *.cu    nvcc -c, once for sm_80 and once for sm_90; every warning is an error: nvcc's front end (e.g. #780,
          a name shadowed), ptxas (e.g. launch bounds out of range) and the host compiler (-Wall -Wextra).
          And the block sizes written as numbers, in __launch_bounds__(N) and in launches <<<grid, N, ...>>>,
          must be at most 1024 threads (ptxas accepts __launch_bounds__(2048) without a word).
  *.cpp   the libtorch host code, syntax only (c++ -fsyntax-only), against torch's headers with the flags that
          torch.utils.cpp_extension passes (torch's, Python's and CUDA's include directories as system
          directories, -DTORCH_EXTENSION_NAME, -DTORCH_API_INCLUDE_EXTENSION_H, -D_GLIBCXX_USE_CXX11_ABI, -fPIC)
          and the C++ standard of the generated CMakeLists.txt; -Wall -Wextra -Werror, except
          -Wunused-parameter (shape-only Meta kernels take every argument of the op's schema).
  *.py    python3 -W error -m py_compile (a SyntaxWarning fails too).
  *.json  parsed as JSON (manifest.json).
A directory without any of these is a failure. The compile jobs run in parallel (nproc of them, or
$HECTORGEN_COMPILE_JOBS). When PCH_MIN_FILES or more host files begin with the same #include <...> lines (as
generated host files do), those lines are precompiled once (g++ -x c++-header) and each of those files is
compiled with `-include` of them: the same text in the same order, so nothing is checked differently
(HECTORGEN_COMPILE_PCH=0 turns this off). One line per file (and architecture), as each finishes:
    ok   DIR/FILE [WHAT] (SECONDS s)
    FAIL DIR/FILE [WHAT] (SECONDS s)
    skip DIR/FILE [WHAT] (REASON)
a failure followed by the compiler's message, each line indented by four spaces; then one summary line.
Exit status: 0 when everything compiled, 1 when anything failed (a missing compiler or missing torch headers
included), 2 on a usage error.

Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), CXX (default: c++), HECTORGEN_TORCH_DIR
(see tools/torch_headers.py: by default the pinned torch's headers that tools/bootstrap.sh installs),
HECTORGEN_SKIP_NVCC=1 and HECTORGEN_SKIP_HOST_COMPILE=1 skip the .cu / .cpp files, for local use on a machine
without the CUDA toolkit or torch (CI sets neither, so there a missing tool fails).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import torch_headers  # noqa: E402  (tools/torch_headers.py)

ARCHS = ("sm_80", "sm_90")
RUNTIME_INCLUDES = (ROOT / "runtime" / "include", ROOT / "runtime" / "torch")
# Measured with torch 2.11 and GCC 12: a host file takes about 20 s of CPU, 6.5 s with the precompiled header,
# which takes 45 s (and 0.9 GB) to build; so it pays from 4 files on.
PCH_MIN_FILES = 4


@dataclass
class Pch:
    """A precompiled header: the #include <...> lines that several host files begin with."""
    header: Path
    command: list[str]
    future: Future | None = None  # True when it was built


@dataclass
class Job:
    path: Path  # the file
    what: str  # e.g. "nvcc sm_80"
    command: list[str] = field(default_factory=list)  # empty: run `check` instead
    check: object = None  # a function returning "" or an error message
    skip: str = ""  # the reason, when skipped
    pch_key: tuple = ()  # host code: (its leading #include <...> lines, the flags), the key of its Pch
    pch: Pch | None = None


def cmake_setting(directory: Path, pattern: str, default: str) -> str:
    """A value from the generated CMakeLists.txt (e.g. its CXX_STANDARD), or `default`."""
    cmake = directory / "CMakeLists.txt"
    found = re.search(pattern, cmake.read_text(errors="replace")) if cmake.is_file() else None
    return found.group(1) if found else default


def env_flag(name: str, default: str = "") -> bool:
    return os.environ.get(name, default) not in ("", "0")


def leading_includes(path: Path) -> str:
    """The #include <...> lines that `path` begins with (after comment and blank lines), or ""."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("#include <"):
            lines.append(line)
        elif line and not line.startswith("//"):
            break
    return "".join(l + "\n" for l in lines)


class Toolchain:
    """The compilers and the flags common to every output directory."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        self.nvcc_problem = "" if os.access(self.nvcc, os.X_OK) else f"nvcc not found ({self.nvcc}; set NVCC)"
        cuda_home = os.environ.get("CUDA_HOME") or (str(Path(os.path.realpath(self.nvcc)).parent.parent)
                                                    if not self.nvcc_problem else "/usr/local/cuda")
        self.cuda_include = Path(cuda_home) / "include"
        self.cxx = os.environ.get("CXX") or "c++"
        self.host_problem = ""
        found = torch_headers.find()
        if shutil.which(self.cxx) is None:
            self.host_problem = f"the C++ compiler {self.cxx} is not found (set CXX)"
        elif found is None:
            self.host_problem = (f"no torch {torch_headers.TORCH_VERSION} headers: run tools/bootstrap.sh (it installs "
                                  f"them), or set HECTORGEN_TORCH_DIR, or HECTORGEN_SKIP_HOST_COMPILE=1 to skip")
        elif not self.cuda_include.is_dir():
            self.host_problem = f"no CUDA include directory {self.cuda_include} (torch's CUDA headers need it)"
        self.torch_dir = found[0] if found else None
        self.python_include = Path(sysconfig.get_paths()["include"])
        if not self.host_problem and not (self.python_include / "Python.h").is_file():
            self.host_problem = f"no Python.h in {self.python_include} (Debian: apt-get install python3-dev)"

    def jobs_for(self, directory: Path) -> list[Job]:
        jobs: list[Job] = []
        includes = [f"-I{directory}"] + [f"-I{d}" for d in RUNTIME_INCLUDES]
        for path in sorted(directory.iterdir()):
            if not path.is_file():
                continue
            if path.suffix == ".cu":
                std = cmake_setting(directory, r"CUDA_STANDARD\s+(\d+)", "17")
                for arch in ARCHS:
                    job = Job(path, f"nvcc {arch}")
                    if env_flag("HECTORGEN_SKIP_NVCC"):
                        job.skip = "HECTORGEN_SKIP_NVCC is set"
                    elif self.nvcc_problem:
                        job.check = lambda reason=self.nvcc_problem: reason
                    else:
                        obj = Path(tempfile.mkdtemp(dir=self.scratch)) / f"{path.stem}.{arch}.o"
                        job.command = [self.nvcc, f"-std=c++{std}", f"-arch={arch}", "-c", str(path), "-o", str(obj),
                                       *includes, "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"]
                    jobs.append(job)
                jobs.append(Job(path, "block sizes", check=lambda p=path: check_block_sizes(p)))
            elif path.suffix == ".cpp":
                std = cmake_setting(directory, r"CXX_STANDARD\s+(\d+)", "17")
                extension = cmake_setting(directory, r"TORCH_EXTENSION_NAME=(\w+)", f"{directory.name}_ext")
                job = Job(path, f"{Path(self.cxx).name} -fsyntax-only, torch {torch_headers.TORCH_VERSION} headers")
                if env_flag("HECTORGEN_SKIP_HOST_COMPILE"):
                    job.skip = "HECTORGEN_SKIP_HOST_COMPILE is set"
                elif self.host_problem:
                    job.check = lambda reason=self.host_problem: reason
                else:
                    system = [self.torch_dir / "include", self.torch_dir / "include" / "torch" / "csrc" / "api" / "include",
                              self.python_include, self.cuda_include]
                    common = [self.cxx, f"-std=c++{std}", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter",
                              "-Werror", "-DTORCH_API_INCLUDE_EXTENSION_H",
                              f"-D_GLIBCXX_USE_CXX11_ABI={torch_headers.GLIBCXX_USE_CXX11_ABI}",
                              *[a for d in system for a in ("-isystem", str(d))]]
                    # (torch's headers do not use TORCH_EXTENSION_NAME, so a precompiled header may leave it out)
                    job.command = [*common, "-fsyntax-only", f"-DTORCH_EXTENSION_NAME={extension}", *includes, str(path)]
                    job.pch_key = (leading_includes(path), tuple(common))
                jobs.append(job)
            elif path.suffix == ".py":
                cache = tempfile.mkdtemp(dir=self.scratch)  # keeps __pycache__ out of DIR
                jobs.append(Job(path, "py_compile", [sys.executable, "-W", "error", "-X", f"pycache_prefix={cache}",
                                                     "-m", "py_compile", str(path)]))
            elif path.suffix == ".json":
                jobs.append(Job(path, "json", check=lambda p=path: check_json(p)))
        return jobs

    def plan_pchs(self, jobs: list[Job]) -> list[Pch]:
        """A precompiled header for each group of PCH_MIN_FILES or more host files with the same key."""
        groups: dict[tuple, list[Job]] = defaultdict(list)
        for job in jobs:
            if job.command and job.pch_key and job.pch_key[0]:
                groups[job.pch_key].append(job)
        pchs = []
        for (prelude, common), members in groups.items():
            if len(members) < PCH_MIN_FILES or not env_flag("HECTORGEN_COMPILE_PCH", "1"):
                continue
            header = Path(tempfile.mkdtemp(dir=self.scratch)) / "prelude.h"
            header.write_text(prelude)
            pch = Pch(header, [*common, "-x", "c++-header", str(header), "-o", f"{header}.gch"])
            for job in members:
                job.pch = pch
            pchs.append(pch)
        return pchs


def build_pch(pch: Pch) -> bool:
    p = subprocess.run(pch.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if p.returncode != 0:  # then the files compile without it, and show any error in those headers themselves
        print(f"note: the precompiled header {pch.header} failed; compiling without it:\n{p.stdout}", flush=True)
    return p.returncode == 0


MAX_THREADS_PER_BLOCK = 1024  # sm_80 and sm_90


def check_block_sizes(path: Path) -> str:
    """Literal block sizes over the hardware limit: a kernel that cannot launch."""
    text = path.read_text(errors="replace")
    problems = []
    for pattern, what in ((r"__launch_bounds__\(\s*(\d+)", "__launch_bounds__"),
                          (r"<<<[^,<>]+,\s*(\d+)\s*[,>]", "a launch with")):
        for found in re.finditer(pattern, text):
            if int(found.group(1)) > MAX_THREADS_PER_BLOCK:
                line = text.count("\n", 0, found.start()) + 1
                problems.append(f"{path}:{line}: {what} {found.group(1)} threads per block "
                                f"(the limit is {MAX_THREADS_PER_BLOCK})")
    return "\n".join(problems)


def check_json(path: Path) -> str:
    try:
        json.loads(path.read_text())
        return ""
    except (ValueError, UnicodeDecodeError) as e:
        return f"{path}: {e}"


def run(job: Job) -> tuple[bool, str, float]:
    if job.pch and job.pch.future.result():
        job.command = [*job.command[:-1], "-include", str(job.pch.header), job.command[-1]]
        job.what += ", precompiled #includes"
    started = time.monotonic()
    if job.command:
        p = subprocess.run(job.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        ok = p.returncode == 0 and not p.stdout.strip()  # anything printed is a warning
        message = p.stdout if p.returncode == 0 or p.stdout.strip() else f"exit code {p.returncode}"
        if not ok:
            message = f"$ {shlex.join(job.command)}\n{message}"
    else:
        message = job.check()
        ok = not message
    return ok, message, time.monotonic() - started


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__.strip().splitlines()[0] + "\nusage: compile_outputs.sh DIR...", file=sys.stderr)
        return 2
    started = time.monotonic()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="hectorgen-compile-") as scratch:
        tools = Toolchain(Path(scratch))
        jobs: list[Job] = []
        for d in argv:
            directory = Path(d)
            if not directory.is_dir():
                print(f"FAIL {d} [directory] (not a directory)")
                failed += 1
                continue
            found = tools.jobs_for(directory)
            if not found:
                print(f"FAIL {d} [directory] (no .cu, .cpp, .py or .json file to compile)")
                failed += 1
            jobs += found
        lock = threading.Lock()
        counts = {"ok": 0, "FAIL": 0, "skip": 0}

        def report(job: Job) -> None:
            if job.skip:
                status, line, message = "skip", f"({job.skip})", ""
            else:
                ok, message, secs = run(job)
                status, line = ("ok" if ok else "FAIL"), f"({secs:.1f} s)"
            with lock:
                counts[status] += 1
                print(f"{status:4} {job.path} [{job.what}] {line}", flush=True)
                if status == "FAIL":
                    print("".join(f"    {l}\n" for l in message.rstrip().splitlines()), end="", flush=True)

        workers = int(os.environ.get("HECTORGEN_COMPILE_JOBS") or len(os.sched_getaffinity(0)))
        pchs = tools.plan_pchs(jobs)
        # The longest jobs first, so that the pool finishes together: host code compiled on its own, nvcc (while
        # the precompiled headers build), host code with a precompiled header, the rest.
        jobs.sort(key=lambda j: (0 if j.path.suffix == ".cpp" and not j.pch else 1 if j.path.suffix == ".cu"
                                 else 2 if j.path.suffix == ".cpp" else 3))
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            # The precompiled headers first: a job that waits for one then never waits for a job behind it.
            for pch in pchs:
                pch.future = pool.submit(build_pch, pch)
            list(pool.map(report, jobs))
        failed += counts["FAIL"]
    print(f"compile_outputs: {counts['ok']} ok, {failed} failed, {counts['skip']} skipped, "
          f"{len(argv)} director{'y' if len(argv) == 1 else 'ies'}, {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
