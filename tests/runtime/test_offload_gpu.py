"""GPU checks of activation offloading (hectorgen_runtime.offload on CUDA tensors): gradients bit-identical to no
offloading on a small bf16 transformer stack in every mode, a lower activation peak, no leaked GPU or pinned memory
over 50 steps, the file tier with O_DIRECT on the machine's disk, forwarding, and the error paths.

    python3 -m pytest -q tests/runtime/test_offload_gpu.py        # about a minute after the extension is built

Skipped without a GPU. $HECTORGEN_OFFLOAD_DIR picks the file tier's directory (default /tmp; tmpfs has no
O_DIRECT, which is reported, not failed). The CPU-side logic is tests/runtime/test_offload.py.
"""

import errno
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, os.environ.get("HECTORGEN_RUNTIME_PYTHON")
                or str(pathlib.Path(__file__).resolve().parents[2] / "runtime" / "python"))
from hectorgen_runtime import offload  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

H, LAYERS, SEQ, BATCH = 1024, 4, 512, 4
DIRECTORY = os.environ.get("HECTORGEN_OFFLOAD_DIR", tempfile.gettempdir())


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([
        torch.nn.TransformerEncoderLayer(H, H // 128, 4 * H, dropout=0.0, batch_first=True, norm_first=True,
                                         activation="gelu", device="cuda", dtype=torch.bfloat16)
        for _ in range(LAYERS)])
    x = torch.randn(BATCH, SEQ, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return layers, x


@pytest.fixture(scope="module")
def engine():
    return offload.make_engine(host_budget_bytes=4 << 30, host_arena_bytes=256 << 20, directories=[DIRECTORY],
                               file_bytes=4 << 30, load_threads=2)


def step(layers, x, cache=None):
    h = x
    if cache is not None:
        with cache:
            for layer in layers:
                h = layer(h)
            loss = h.float().pow(2).mean()
    else:
        for layer in layers:
            h = layer(h)
        loss = h.float().pow(2).mean()
    loss.backward()


def gradients(layers, x, cache=None):
    layers.zero_grad(set_to_none=True)
    x.grad = None
    with sdpa_kernel([SDPBackend.MATH]):  # deterministic attention backward
        step(layers, x, cache)
    torch.cuda.synchronize()
    return [x.grad.clone()] + [p.grad.clone() for p in layers.parameters()]


@pytest.fixture(scope="module")
def reference(model):
    torch.use_deterministic_algorithms(True, warn_only=True)
    layers, x = model
    first, second = gradients(layers, x), gradients(layers, x)
    if not all(torch.equal(a, b) for a, b in zip(first, second)):
        pytest.skip("training without offloading is not deterministic on this machine: nothing to compare with")
    return first


def clean(cache):
    cache.wait_io()
    stats = cache.engine_stats()
    return cache.live_records() == 0 and stats["entries"] == 0 and stats["host_used"] == 0 and stats["file_used"] == 0


@pytest.mark.parametrize("mode", ["host", "file", "mixed", "keep_last", "host_throttled"])
def test_gradients_bit_identical(model, engine, reference, mode):
    layers, x = model
    options = {"host": dict(tier="host"), "file": dict(tier="file"),
               "mixed": dict(tier="host", placement={layers[1]: "file", layers[3]: "keep"}),
               "keep_last": dict(tier="host", keep_last=1),
               "host_throttled": dict(tier="host", max_inflight_bytes=8 << 20)}[mode]
    cache = offload.TensorCache(layers, engine=engine, **options)
    try:
        for _ in range(2):
            got = gradients(layers, x, cache)
            assert all(torch.equal(a, b) for a, b in zip(reference, got))
            assert clean(cache)
        assert cache.stats["stored_host"] + cache.stats["stored_file"] > 0, cache.stats
        if mode == "host_throttled":
            assert cache.stats["throttled"] > 0, cache.stats
    finally:
        cache.remove()


def test_file_tier_uses_o_direct_on_a_disk(engine):
    assert engine.file_available, engine.status
    if not engine.direct_io:
        pytest.skip(f"{DIRECTORY} does not take O_DIRECT (tmpfs?): the buffered path was used")
    print(f"file tier: {engine.file_paths}, O_DIRECT, GDS {'on' if engine.gds else 'off'} ({engine.status})")


def test_peak_is_lower_and_nothing_leaks_over_50_steps(model, engine):
    layers, x = model
    step(layers, x)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    step(layers, x)
    torch.cuda.synchronize()
    keep_peak = torch.cuda.max_memory_reserved() - base

    # A small in-flight window (the stack's activations are ~250 MiB): the CPU may not run far ahead of the copies.
    cache = offload.TensorCache(layers, tier="host", engine=engine, max_inflight_bytes=32 << 20)
    try:
        step(layers, x, cache)
        cache.wait_io()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_reserved()
        allocated = torch.cuda.memory_allocated()
        host = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else None
        for _ in range(50):
            step(layers, x, cache)
            torch.cuda.synchronize()
            assert clean(cache)
            assert torch.cuda.memory_allocated() == allocated  # no GPU memory kept across steps
        offload_peak = torch.cuda.max_memory_reserved() - base
        if host is not None:
            after = torch.cuda.host_memory_stats()
            # The pinned arenas are allocated once: 50 steps allocate no more pinned memory.
            assert after.get("allocated_bytes.current", 0) <= host.get("allocated_bytes.current", 0) + (64 << 20)
        print(f"activation peak: keep {keep_peak / 2**20:.0f} MiB, host offload {offload_peak / 2**20:.0f} MiB")
        assert offload_peak < keep_peak
    finally:
        cache.remove()


def test_forwarding_on_the_gpu(model, engine, reference):
    layers, x = model
    cache = offload.TensorCache(layers, tier="file", engine=engine)  # the file tier keeps tensors while storing
    try:
        engine.pause_stores(True)
        got = gradients(layers, x, cache)
        engine.pause_stores(False)
        assert all(torch.equal(a, b) for a, b in zip(reference, got))
        assert cache.stats["forwarded"] > 0
        assert clean(cache)
    finally:
        engine.pause_stores(False)
        cache.remove()


def test_io_errors_on_the_gpu(model, reference):
    layers, x = model
    faulty = offload.make_engine(directories=[DIRECTORY], file_bytes=1 << 30, fault_injection=True)
    # A small in-flight window: the stores finish during the forward pass, so backward reads them back.
    cache = offload.TensorCache(layers, tier="file", engine=faulty, fallback=False, max_inflight_bytes=1 << 20)
    try:
        faulty.inject_fault("write", errno.EIO, count=2)
        with pytest.warns(RuntimeWarning, match="Input/output error"):
            got = gradients(layers, x, cache)
        assert all(torch.equal(a, b) for a, b in zip(reference, got))
        faulty.inject_fault("read", errno.EIO, count=1)
        with pytest.raises(RuntimeError, match="could not be loaded back"):
            gradients(layers, x, cache)
    finally:
        cache.remove()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s", "-p", "no:cacheprovider"]))
