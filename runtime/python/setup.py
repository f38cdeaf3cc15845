"""pip package of the hectorgen runtime: the Python package hectorgen_runtime with its CUDA extension _C.

    pip install --no-build-isolation ./runtime/python        (from the repository root)
    cd runtime/python && python3 setup.py build_ext --inplace (a source checkout, no install)

The extension is compiled against the PyTorch of the installing Python (torch.utils.cpp_extension), so the build
must see that torch: hence --no-build-isolation (an isolated build would fetch some other torch, whose ABI need not
match). Needs nvcc (of the CUDA major version torch was built with), setuptools and wheel; no GPU. The GPU
architectures: $TORCH_CUDA_ARCH_LIST, else the visible GPUs', else 8.0 and 9.0 (A100, H100) when none is visible.
The sources are runtime/src and runtime/torch, next to this directory; the version is hectorgen/runtime_version.h.
"""

import importlib.util
import os
import pathlib
import re
import sys

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
RUNTIME = HERE.parent


def runtime_version() -> str:
    header = (RUNTIME / "include" / "hectorgen" / "runtime_version.h").read_text()
    return re.search(r'#define HECTORGEN_RUNTIME_VERSION_STRING "([0-9]+\.[0-9]+\.[0-9]+)"', header).group(1)


try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
except ImportError as error:
    sys.exit(f"hectorgen_runtime builds its extension against the installed PyTorch, which this Python cannot import "
             f"({error}): install torch first, then `pip install --no-build-isolation ./runtime/python`")

if "TORCH_CUDA_ARCH_LIST" not in os.environ and not torch.cuda.is_available():
    # Without a visible GPU torch would build for every architecture it knows, some of which a recent nvcc rejects.
    os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0"
    print("hectorgen_runtime: no GPU visible, building for TORCH_CUDA_ARCH_LIST=8.0;9.0", file=sys.stderr)


# The source lists, shared with the package's just-in-time build (hectorgen_runtime/_extensions.py, loaded by path:
# importing the package, not installed yet, would run its __init__).
_spec = importlib.util.spec_from_file_location("_hectorgen_runtime_extensions",
                                               HERE / "hectorgen_runtime" / "_extensions.py")
extensions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(extensions)


def relative(path) -> str:
    # setuptools wants source paths relative to this directory.
    return os.path.relpath(path, HERE)


setup(
    name="hectorgen_runtime",
    version=runtime_version(),
    description="Graph preprocessing and activation offloading runtime of the modules that hectorgen generates",
    packages=["hectorgen_runtime"],
    python_requires=">=3.9",
    ext_modules=[
        CUDAExtension(
            name="hectorgen_runtime._C",
            sources=[relative(path) for path in extensions.sources("_C", RUNTIME)],
            include_dirs=extensions.include_dirs("_C", RUNTIME),
            extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2"]},
        ),
        # The activation offload engine (hectorgen_runtime.offload): plain C++, no CUDA compiler needed.
        CppExtension(
            name="hectorgen_runtime._offload",
            sources=[relative(path) for path in extensions.sources("_offload", RUNTIME)],
            include_dirs=extensions.include_dirs("_offload", RUNTIME),
            extra_compile_args=["-O2"],
            libraries=["dl"],
        ),
    ],
    cmdclass={"build_ext": BuildExtension},
    zip_safe=False,
)
