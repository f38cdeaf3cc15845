"""Generating and building one spec's module for the GPU tests of generated code (test_unified_generated_gpu.py,
test_unified_rows_gpu.py): the hectorgen runtime (built, or an installed one), the compiler, the extension.

Environment: HECTORGEN (the compiler; default build/hectorgen, else build/hg_bundle/hectorgen with its libraries),
HECTORGEN_RUNTIME_PREFIX (an installed runtime to reuse), HECTORGEN_CUDA_ARCH (default: this GPU's).
"""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(cmd, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stdout[-3000:]}"
                           f"\n{result.stderr[-3000:]}")
    return result


def hectorgen_command():
    """The compiler and the environment it runs in (a bundle's binary, tools/gpu_check.sh --bundle, finds its
    libraries in the lib/ folder beside it)."""
    env = dict(os.environ)
    if os.environ.get("HECTORGEN") and not pathlib.Path(os.environ["HECTORGEN"]).exists():
        pytest.fail(f"HECTORGEN={os.environ['HECTORGEN']}: no such file")
    found = next((pathlib.Path(p) for p in (os.environ.get("HECTORGEN"), ROOT / "build" / "hectorgen",
                                            ROOT / "build" / "hg_bundle" / "hectorgen") if p and pathlib.Path(p).exists()),
                 None)
    if found:
        if (found.parent / "lib").is_dir():
            env["LD_LIBRARY_PATH"] = f"{found.parent / 'lib'}:{env.get('LD_LIBRARY_PATH', '')}"
        return str(found), env
    pytest.fail("no hectorgen: build it (build/hectorgen), carry build/hg_bundle (tools/gpu_check.sh --bundle), "
                "or set HECTORGEN")


def generated_module(spec: pathlib.Path, model: str, name: str):
    """Generator (for a module-scoped fixture): yields (the generated module <model>.py of `spec`, built in a scratch
    folder and loaded as Python module `name`_module; the hectorgen_runtime package it imports), then removes the
    folder."""
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"hg_{name}_"))
    major, minor = torch.cuda.get_device_capability()
    arch = os.environ.get("HECTORGEN_CUDA_ARCH", f"{major}{minor}")
    torch_prefix = torch.utils.cmake_prefix_path
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    prefix = os.environ.get("HECTORGEN_RUNTIME_PREFIX")
    if not prefix:
        prefix = str(work / "runtime-prefix")
        print(f"building the hectorgen runtime into {prefix}", flush=True)
        run(["cmake", "-S", ROOT / "runtime", "-B", work / "runtime-build", *generator, "-DCMAKE_BUILD_TYPE=Release",
             f"-DCMAKE_CUDA_ARCHITECTURES={arch}", f"-DCMAKE_PREFIX_PATH={torch_prefix}",
             f"-DPython3_EXECUTABLE={sys.executable}", "-DHECTORGEN_RUNTIME_PYTHON_INSTALL_DIR=python"])
        run(["cmake", "--build", work / "runtime-build", "-j", str(os.cpu_count() or 4)])
        run(["cmake", "--install", work / "runtime-build", "--prefix", prefix])
    sys.path.insert(0, str(pathlib.Path(prefix) / "python"))
    hectorgen, env = hectorgen_command()
    gen = work / name
    print(f"generating {spec.name} and building it in {gen}", flush=True)
    run([hectorgen, spec, "-o", gen], env=env, cwd=ROOT)
    run(["cmake", "-S", gen, "-B", gen / "build", *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_CUDA_ARCHITECTURES={arch}", f"-DCMAKE_PREFIX_PATH={prefix};{torch_prefix}",
         f"-DPython3_EXECUTABLE={sys.executable}"])
    run(["cmake", "--build", gen / "build", "-j", str(os.cpu_count() or 4)])
    loader = importlib.util.spec_from_file_location(f"{name}_module", gen / f"{model}.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    module.load_extension(str(gen / "build"))
    import hectorgen_runtime
    yield module, hectorgen_runtime
    shutil.rmtree(work, ignore_errors=True)
