#!/usr/bin/env python3
"""Builds the hectorgen_runtime CUDA extension ahead of time (e.g. on the GPU machine before the tests).

    python3 runtime/python/build_ext.py [--build-dir DIR] [--quiet]

It runs the same JIT builds that `hectorgen_runtime.load_extension()` and
`hectorgen_runtime.offload.load_offload_extension()` do on first use (torch.utils.cpp_extension,
needs nvcc and ninja), so later imports find the cached module. With --build-dir the build goes there; set
HECTORGEN_RUNTIME_BUILD_DIR to the same directory when running the tests to reuse it.
"""

import argparse
import os
import pathlib
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", help="build directory (default: $HECTORGEN_RUNTIME_BUILD_DIR or torch's)")
    parser.add_argument("--quiet", action="store_true", help="do not print the compiler commands")
    args = parser.parse_args()
    if args.build_dir:
        os.environ["HECTORGEN_RUNTIME_BUILD_DIR"] = os.path.abspath(args.build_dir)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import hectorgen_runtime

    module = hectorgen_runtime.load_extension(verbose=not args.quiet)
    print(f"hectorgen_runtime extension: {module.__file__}")
    print(f"layouts: {', '.join(module.layout_names())}")
    from hectorgen_runtime import offload

    print(f"hectorgen_runtime offload extension: {offload.load_offload_extension(verbose=not args.quiet).__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
