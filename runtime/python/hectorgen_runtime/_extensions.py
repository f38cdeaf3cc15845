"""How the runtime finds its compiled extensions: the module built ahead of time (pip or CMake install, or
setup.py build_ext --inplace), else in a source checkout a JIT build of the sources with
torch.utils.cpp_extension.load (cached in $HECTORGEN_RUNTIME_BUILD_DIR or PyTorch's extension directory, rebuilt
only when a source changes). Both extensions (the graph/unified one, `_C`, and the offload engine, `_offload`) load
through `load_compiled`, and both must have been built from this version of the runtime."""
from __future__ import annotations

import importlib
import os
import pathlib
from typing import Sequence

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
# runtime/ of a source checkout (python/hectorgen_runtime is two levels below it); an installed package has no
# sources next to it and needs its compiled modules.
RUNTIME_ROOT = PACKAGE_DIR.parents[1]


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
    from torch.utils.cpp_extension import load

    build_dir = os.environ.get("HECTORGEN_RUNTIME_BUILD_DIR")
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    return checked(load(name=jit_name, sources=list(sources), extra_include_paths=list(include_dirs),
                        extra_cflags=list(cflags), extra_cuda_cflags=list(cuda_cflags), extra_ldflags=list(ldflags),
                        build_directory=build_dir, verbose=verbose))
