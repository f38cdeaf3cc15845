"""Ahead-of-time build of hectorgen_runtime with its CUDA extension hectorgen_runtime._C.

    cd runtime/python && python3 setup.py build_ext --inplace

(`hectorgen_runtime.load_extension()` prefers this in-place `_C` and JIT-builds the same sources otherwise.)
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="hectorgen_runtime",
    version="0.1.0",
    packages=["hectorgen_runtime"],
    ext_modules=[
        CUDAExtension(
            name="hectorgen_runtime._C",
            # Relative to this directory: the sources live beside it in runtime/.
            sources=["../src/graph_preprocess.cu", "../torch/graph_preprocess_torch.cpp", "../torch/python_module.cpp"],
            include_dirs=["../include", "../torch"],
            extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
