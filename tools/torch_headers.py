#!/usr/bin/env python3
"""The torch C++ headers that the compile check of generated host code needs (tests/compile/).

    torch_headers.py find       print the torch package directory (the one holding include/), or exit 1
    torch_headers.py install    make sure there is one (tools/bootstrap.sh runs this); prints where it is

Where the headers come from, first match wins:
  1. $HECTORGEN_TORCH_DIR, a torch package directory of the user's choice (any version);
  2. the torch that this Python has installed, when it is the pinned version TORCH_VERSION (found through
     its package metadata: torch is not imported, so a CPU-only machine or a partial install is fine);
  3. a headers-only copy of the pinned wheel in the cache, ${XDG_CACHE_HOME:-~/.cache}/hectorgen/.
`install` makes 3. when neither 1. nor 2. is there: `pip download --no-deps` of the pinned torch wheel from
PyPI, then only its include/ and share/cmake/ (about 65 MB of the 1.2 GB an install unpacks) are extracted.
Nothing is installed into any Python environment, so an existing torch (full or not) is never touched, and
no half-installed torch that cannot be imported is left behind. The compile needs no CUDA libraries from
PyPI: the CUDA headers come from the toolkit (/usr/local/cuda).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# The torch of the GPU machines; generated host code is checked against its headers.
TORCH_VERSION = "2.11.0"
# torch >= 2.7 wheels on PyPI are built with the C++11 ABI only (torch._C._GLIBCXX_USE_CXX11_ABI is True).
GLIBCXX_USE_CXX11_ABI = 1
# What the host compile needs from the wheel (the CMake files say which definitions a CMake build adds).
_WHEEL_PARTS = ("torch/include/", "torch/share/cmake/")


def _has_headers(torch_dir: Path) -> bool:
    return (torch_dir / "include" / "torch" / "extension.h").is_file()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hectorgen" / f"torch-{TORCH_VERSION}-headers"


def python_torch() -> tuple[Path, str] | None:
    """This Python's torch package directory and version, without importing torch."""
    try:
        version = importlib.metadata.version("torch")
        spec = importlib.util.find_spec("torch")
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]), version


def find() -> tuple[Path, str] | None:
    """(torch package directory, where it came from), or None."""
    override = os.environ.get("HECTORGEN_TORCH_DIR")
    if override:
        path = Path(override)
        if not _has_headers(path):
            sys.exit(f"torch_headers: HECTORGEN_TORCH_DIR={override} has no include/torch/extension.h")
        return path, "HECTORGEN_TORCH_DIR"
    found = python_torch()
    if found and found[1].split("+")[0] == TORCH_VERSION and _has_headers(found[0]):
        return found[0], f"torch {found[1]} of {sys.executable}"
    cached = cache_dir() / "torch"
    if _has_headers(cached):
        return cached, f"headers of torch {TORCH_VERSION} in the cache"
    return None


def install() -> Path:
    found = find()
    if found:
        print(f"torch headers: {found[0]} ({found[1]})")
        return found[0]
    target = cache_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    other = python_torch()
    why = f"{sys.executable} has torch {other[1]}" if other else f"{sys.executable} has no torch"
    print(f"torch headers: {why}; downloading the torch=={TORCH_VERSION} wheel from PyPI for its headers", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".torch-download-") as tmp:
        # The download is the wheel for this interpreter and platform; the headers are the same in all of them.
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        f"torch=={TORCH_VERSION}", "--dest", tmp], check=True)
        wheels = list(Path(tmp).glob("torch-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"torch_headers: expected one torch wheel from pip download, got {[w.name for w in wheels]}")
        staged = Path(tmp) / "staged"
        with zipfile.ZipFile(wheels[0]) as wheel:
            names = [n for n in wheel.namelist() if n.startswith(_WHEEL_PARTS)]
            wheel.extractall(staged, names)
        if not _has_headers(staged / "torch"):
            sys.exit(f"torch_headers: {wheels[0].name} has no torch/include/torch/extension.h")
        (staged / "VERSION").write_text(f"{TORCH_VERSION} {wheels[0].name}\n")
        try:
            staged.rename(target)  # atomic: a concurrent run either sees all of it or nothing
        except OSError:
            if not _has_headers(target / "torch"):  # not another run that finished first
                shutil.rmtree(target, ignore_errors=True)
                staged.rename(target)
    print(f"torch headers: {target / 'torch'} ({len(names)} files from {wheels[0].name}, "
          f"{time.monotonic() - started:.0f} s)")
    return target / "torch"


def main() -> int:
    command = sys.argv[1] if len(sys.argv) == 2 else ""
    if command == "find":
        found = find()
        if not found:
            print(f"torch_headers: no torch {TORCH_VERSION} headers (neither {sys.executable}'s torch nor "
                  f"{cache_dir()}); run tools/bootstrap.sh or set HECTORGEN_TORCH_DIR", file=sys.stderr)
            return 1
        print(found[0])
        return 0
    if command == "install":
        try:
            install()
        except (subprocess.CalledProcessError, OSError, zipfile.BadZipFile) as e:
            print(f"torch_headers: cannot install the torch {TORCH_VERSION} headers: {e}", file=sys.stderr)
            return 1
        return 0
    print(__doc__.strip().splitlines()[0], "\nusage: torch_headers.py find|install", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
