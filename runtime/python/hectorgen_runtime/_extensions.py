"""How the runtime finds its compiled extensions: the module built ahead of time (pip or CMake install, or
setup.py build_ext --inplace), else in a source checkout a JIT build of the sources with
torch.utils.cpp_extension.load (cached in $HECTORGEN_RUNTIME_BUILD_DIR or PyTorch's extension directory, rebuilt
only when a source changes). Both extensions (the graph/unified one, `_C`, and the offload engine, `_offload`) load
through `load_compiled`, and both must have been built from this version of the runtime."""
from __future__ import annotations

import importlib
import os
import pathlib
import time
import warnings
from typing import Sequence

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
# runtime/ of a source checkout (python/hectorgen_runtime is two levels below it); an installed package has no
# sources next to it and needs its compiled modules.
RUNTIME_ROOT = PACKAGE_DIR.parents[1]


def sources(extension: str, root: pathlib.Path = RUNTIME_ROOT) -> list:
    """The source files of `extension` ("_C": graph preprocessing and unified tensors, CUDA; "_offload": the offload
    engine, plain C++) under `root` (runtime/): what load_compiled builds just in time and setup.py ahead of time."""
    if extension == "_C":
        return [str(root / "src" / "graph_preprocess.cu"), str(root / "src" / "unified.cu"),
                str(root / "torch" / "graph_preprocess_torch.cpp"), str(root / "torch" / "unified_torch.cpp"),
                str(root / "torch" / "python_module.cpp"), str(root / "torch" / "unified_python.cpp")]
    if extension == "_offload":
        engine = sorted((root / "src" / "offload").glob("*.cpp"))
        return [str(root / "torch" / "offload_torch.cpp")] + [str(path) for path in engine]
    raise ValueError(f"no extension {extension!r} (the runtime's are '_C' and '_offload')")


def include_dirs(extension: str, root: pathlib.Path = RUNTIME_ROOT) -> list:
    """The include directories of `extension` under `root` (see sources)."""
    dirs = [root / "include"] + ([root / "torch" / "include"] if extension == "_C" else [])
    return [str(d) for d in dirs]


def checked(module):
    """`module` if it was compiled from this version of the runtime, else ImportError naming both versions."""
    from . import __version__

    built = module.version() if hasattr(module, "version") else "unknown (before 1.0)"
    if built != __version__:
        raise ImportError(
            f"hectorgen_runtime {__version__} ({PACKAGE_DIR}) found the compiled extension {module.__file__} of "
            f"runtime {built}: rebuild it from the same sources (runtime/README.md)"
        )
    return module


# torch's JIT build holds a `lock` file in its build directory while it compiles, and a later build waits for as
# long as the file exists; a build killed half-way (Ctrl-C, a test timeout) leaves it behind, and every later load
# would hang. A lock older than this is no build's any more (the runtime's take minutes).
STALE_LOCK_S = 30 * 60


def clear_stale_lock(build_dir: str, max_age_s: float = STALE_LOCK_S) -> bool:
    """Removes `build_dir`/lock when it is older than `max_age_s`, with a warning; True if it did."""
    lock = os.path.join(build_dir, "lock")
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:
        return False   # no lock
    if age <= max_age_s:
        return False   # a build in progress: torch waits for it
    try:
        os.remove(lock)
    except FileNotFoundError:
        return False   # its build finished meanwhile
    warnings.warn(f"hectorgen_runtime: removed the stale lock {lock} ({age / 60:.0f} minutes old: left by a JIT build "
                  "that was interrupted); building again", RuntimeWarning, stacklevel=3)
    return True


def load_compiled(prebuilt: str, *, jit_name: str, sources: Sequence[str], include_dirs: Sequence[str],
                  cflags: Sequence[str] = ("-O2",), cuda_cflags: Sequence[str] = (), ldflags: Sequence[str] = (),
                  verbose: bool = False):
    """The extension `hectorgen_runtime.<prebuilt>` if it was built ahead of time, else the JIT build `jit_name`
    of `sources`; version-checked either way. ImportError saying why when neither exists."""
    from . import __version__

    try:
        module = importlib.import_module(f".{prebuilt}", __package__)
    except ImportError:
        pass
    else:
        return checked(module)
    missing = [source for source in sources if not os.path.isfile(source)]
    if not sources or missing:
        raise ImportError(
            f"hectorgen_runtime {__version__} ({PACKAGE_DIR}) has no compiled extension ({prebuilt}) and no sources "
            "to build one: install the runtime with its extensions (runtime/README.md)"
        )
    from torch.utils import cpp_extension

    build_dir = os.environ.get("HECTORGEN_RUNTIME_BUILD_DIR")
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    try:
        clear_stale_lock(build_dir or cpp_extension._get_build_directory(jit_name, verbose=False))
    except (AttributeError, TypeError):
        pass   # a torch without that (private) helper: its default directory is left to it
    return checked(cpp_extension.load(name=jit_name, sources=list(sources), extra_include_paths=list(include_dirs),
                                      extra_cflags=list(cflags), extra_cuda_cflags=list(cuda_cflags),
                                      extra_ldflags=list(ldflags), build_directory=build_dir, verbose=verbose))
