"""GPU tests of unified tensors (runtime/python/hectorgen_runtime/unified.py, runtime/src/unified.cu).

Bit-exact gathers for every path, row width, table alignment, dtype, index dtype and device, and output kind;
index errors (checked on the GPU, reported with their position, bad rows zero-filled with check=False); the
affinity switch and the placement of indexing and elementwise operators; in-place pinning (no copy, the mapping
undone with the storage, already-pinned and unpinnable memory); the pool (few cudaHostAlloc calls, the limit);
gathers on a side stream; the calibration cache.

    python3 tests/runtime/test_unified_gpu.py            (JIT-builds the extension on first use; about 2 minutes)

Skips everything without a CUDA GPU. HECTORGEN_RUNTIME_BUILD_DIR reuses a prebuilt extension
(runtime/python/build_ext.py).
"""

import mmap
import os
import warnings
import pathlib
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.environ.get("HECTORGEN_RUNTIME_PYTHON")
                or str(pathlib.Path(__file__).resolve().parents[2] / "runtime" / "python"))
import hectorgen_runtime as hr  # noqa: E402

um = sys.modules["hectorgen_runtime.unified"]

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PATHS = ("zero_copy", "zero_copy_sorted", "cpu")


@pytest.fixture(autouse=True, scope="module")
def calibration_in_tmp():
    # Tests never read or write the user's calibration cache.
    with tempfile.TemporaryDirectory() as directory:
        os.environ["HECTORGEN_UNIFIED_CALIBRATION"] = str(pathlib.Path(directory) / "calibration.json")
        yield
        del os.environ["HECTORGEN_UNIFIED_CALIBRATION"]


def random_bytes(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def byte_table(rows, row_bytes, offset, seed=0):
    """A unified uint8 table [rows, row_bytes] starting `offset` bytes into a pool block (misaligned on purpose),
    filled with random bytes; and a plain CPU copy of it."""
    memory = hr.empty_unified(rows * row_bytes + offset + 256, dtype=torch.uint8)
    data = random_bytes(rows * row_bytes, seed).view(rows, row_bytes)
    view = memory.plain()[offset: offset + rows * row_bytes].view(rows, row_bytes)
    view.copy_(data)
    return hr.UnifiedTensor(view), data


def random_index(count, rows, dtype, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, rows, (count,), generator=g).to(dtype).to(device)


# ---------------------------------------------------------------------------------------------------------------
# Bit-exact gathers


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("row_bytes", [1, 3, 4, 12, 100, 128, 130, 256, 1024, 2052, 4096, 4100, 16384])
@pytest.mark.parametrize("offset", [0, 4, 100])
def test_gather_is_bit_exact_for_every_width_and_alignment(path, row_bytes, offset):
    rows = max(64, (4 << 20) // row_bytes)
    table, data = byte_table(rows, row_bytes, offset)
    for index_dtype in (torch.int64, torch.int32):
        for device in ("cuda", "cpu"):
            index = random_index(3000, rows, index_dtype, device)
            got = hr.gather(table, index, path=path)
            assert got.is_cuda and got.shape == (3000, row_bytes)
            assert torch.equal(got.cpu(), data[index.long().cpu()]), (index_dtype, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                   torch.int8])
@pytest.mark.parametrize("cols", [1, 7, 32, 513])
def test_gather_dtypes_and_shapes(dtype, cols):
    x = random_bytes(1000 * cols * torch.empty(0, dtype=dtype).element_size(), 3).view(dtype).view(1000, cols)
    u = hr.to_unified(x)
    index = random_index(5000, 1000, torch.int64, "cuda").view(50, 100)
    for path in PATHS:
        got = hr.gather(u, index, path=path)
        assert got.shape == (50, 100, cols) and got.dtype == dtype
        assert torch.equal(got.cpu().view(torch.uint8), x[index.cpu()].view(torch.uint8)), path
    three_d = hr.to_unified(x.view(1000, 1, cols))
    # Bytes, not values: random bytes hold NaNs, which never compare equal.
    got = hr.gather(three_d, index[0]).cpu()
    assert got.shape == (100, 1, cols)
    assert torch.equal(got.view(torch.uint8), x.view(1000, 1, cols)[index[0].cpu()].view(torch.uint8))


def test_gather_into_a_unified_out_and_an_empty_index():
    table, data = byte_table(500, 2052, 4)
    index = random_index(700, 500, torch.int64, "cuda")
    out = hr.empty_unified(700, 2052, dtype=torch.uint8)
    assert hr.gather(table, index, out=out) is out
    torch.cuda.synchronize()
    assert torch.equal(out.plain(), data[index.cpu()])
    empty = hr.gather(table, torch.zeros(0, dtype=torch.long, device="cuda"))
    assert empty.shape == (0, 2052) and empty.is_cuda


def test_sorted_path_with_duplicates_keeps_the_order():
    table, data = byte_table(50, 256, 0)
    index = torch.tensor([7, 3, 7, 7, 0, 49, 3] * 100, device="cuda")
    got = hr.gather(table, index, path="zero_copy_sorted")
    assert torch.equal(got.cpu(), data[index.cpu()])


def test_gather_on_a_side_stream():
    table, data = byte_table(4096, 1024, 0)
    index = random_index(100000, 4096, torch.int64, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = hr.gather(table, index, path="zero_copy_sorted", check=False)
        busy = torch.randn(2048, 2048, device="cuda")
    for _ in range(4):
        busy = busy @ busy.T / 2048  # compute on the default stream meanwhile
    torch.cuda.current_stream().wait_stream(stream)
    hr.check_gather_errors()
    assert torch.equal(got.cpu(), data[index.cpu()])


# ---------------------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("path", PATHS)
def test_index_out_of_range_is_an_index_error_with_its_position(path):
    table, _ = byte_table(100, 2052, 0)
    for bad, position in ((100, 5), (-1, 0), (1 << 40, 9)):
        index = torch.arange(10, device="cuda")
        index[position] = bad
        with pytest.raises(IndexError, match=rf"index {bad} at position {position} is out of range for a table of "
                                             r"100 rows"):
            hr.gather(table, index, path=path)
    index32 = torch.tensor([1, 2, 100], dtype=torch.int32, device="cuda")
    with pytest.raises(IndexError, match="position 2"):
        hr.gather(table, index32, path=path)


def test_unchecked_gather_zero_fills_bad_rows_and_reports_later():
    table, data = byte_table(100, 4100, 0)
    index = torch.tensor([3, 100, 5, -7], device="cuda")
    for path in ("zero_copy", "zero_copy_sorted"):
        got = hr.gather(table, index, path=path, check=False)
        torch.cuda.synchronize()
        assert torch.equal(got[0].cpu(), data[3]) and torch.equal(got[2].cpu(), data[5])
        assert int(got[1].abs().sum()) == 0 and int(got[3].abs().sum()) == 0
        with pytest.raises(IndexError, match="output row 1"):
            hr.check_gather_errors()
        hr.check_gather_errors()  # cleared


def test_dtype_and_device_mismatches():
    u = hr.to_unified(torch.randn(10, 4))
    index = torch.tensor([1, 2], device="cuda")
    with pytest.raises(TypeError, match="out has dtype torch.float16"):
        hr.gather(u, index, out=torch.empty(2, 4, dtype=torch.float16, device="cuda"))
    with pytest.raises(TypeError, match="must be a unified tensor"):
        hr.gather(torch.randn(10, 4, device="cuda"), index)
    with pytest.raises(TypeError, match="int32 or int64"):
        hr.gather(u, index.float())
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="out is on cuda:1"):
            hr.gather(u, index, out=torch.empty(2, 4, device="cuda:1"))


def test_pool_limit_and_exhaustion_are_pinned_memory_errors():
    limit = um.pool_stats()["in_use_bytes"] + (1 << 20)  # what earlier tests still hold, plus 1 MiB
    um.set_pool_limit(limit)
    try:
        small = hr.empty_unified(1000, dtype=torch.uint8)
        with pytest.raises(hr.PinnedMemoryError, match=f"limit of {limit} bytes"):
            hr.empty_unified(2 << 20, dtype=torch.uint8)
        assert isinstance(hr.PinnedMemoryError("x"), MemoryError)
        del small
    finally:
        um.set_pool_limit(0)


def test_pool_makes_few_cuda_calls():
    before = um.pool_stats()["source_allocations"]
    tensors = [hr.empty_unified(1000 + i, dtype=torch.uint8) for i in range(200)]
    assert um.pool_stats()["source_allocations"] - before <= 1
    del tensors
    again = [hr.empty_unified(1000 + i, dtype=torch.uint8) for i in range(200)]
    assert um.pool_stats()["source_allocations"] - before <= 1
    del again


# ---------------------------------------------------------------------------------------------------------------
# In-place pinning


def test_in_place_pinning_shares_memory_and_gathers():
    x = torch.randn(3000, 77)
    u = hr.unified(x)
    assert u.plain().data_ptr() == x.data_ptr()
    assert x.is_pinned()
    index = random_index(999, 3000, torch.int64, "cuda")
    for path in PATHS:
        assert torch.equal(hr.gather(u, index, path=path).cpu(), x[index.cpu()])
    x[5] = 1.5  # the GPU sees CPU writes
    assert torch.equal(hr.gather(u, torch.tensor([5], device="cuda")).cpu()[0], x[5])
    # A view pins its whole storage; pinning again is a no-op.
    v = hr.unified(x[10:20])
    assert torch.equal(hr.gather(v, torch.tensor([0, 9], device="cuda")).cpu(), x[[10, 19]])


def test_in_place_pinning_is_undone_with_the_storage():
    import ctypes

    import numpy as np

    x = torch.randn(1 << 18)
    u = hr.unified(x)
    assert x.is_pinned()
    mapped = hr.load_extension().unified_is_mapped
    assert mapped(u.plain())
    pointer, count = x.data_ptr(), x.numel()
    del u, x
    # The storage died: an alias of its old address (never dereferenced) is neither pinned nor registered.
    alias = torch.from_numpy(np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (count,)))
    assert not mapped(alias)
    assert not alias.is_pinned()


def test_already_pinned_memory_is_used_as_is():
    x = torch.randn(1000, 8).pin_memory()
    u = hr.unified(x)
    index = torch.tensor([0, 999, 5], device="cuda")
    assert torch.equal(hr.gather(u, index).cpu(), x[index.cpu()])


def test_unpinnable_memory_is_a_not_pinnable_error():
    # A read-only file mapping cannot be pinned for the GPU to write; CUDA refuses to register it.
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"\0" * (1 << 20))
        f.flush()
        with open(f.name, "rb") as readable:
            mapped = mmap.mmap(readable.fileno(), 1 << 20, prot=mmap.PROT_READ)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "the given buffer is not writable"
                t = torch.frombuffer(mapped, dtype=torch.uint8)
            with pytest.raises(hr.NotPinnableError, match="cudaHostRegister"):
                hr.unified(t)
            # (the mapping is not closed here: the exception's traceback may still hold t)
    with pytest.raises(ValueError, match="to_unified"):
        hr.unified(torch.zeros(3, device="cuda"))


# ---------------------------------------------------------------------------------------------------------------
# Affinity and placement


def test_indexing_follows_the_affinity_without_moving_data():
    x = torch.randn(100, 16)
    u = hr.to_unified(x)
    pointer = u.plain().data_ptr()
    cuda_index = torch.tensor([4, 2, 99], device="cuda")
    got = u[cuda_index]
    assert got.is_cuda and not hr.is_unified(got)
    assert torch.equal(got.cpu(), x[[4, 2, 99]])
    cpu_index = torch.tensor([1, 3])
    got = u[cpu_index]  # GPU affinity + a CPU tensor: host-affine unified result
    assert hr.is_unified(got) and got.affinity == "host" and torch.equal(got.plain(), x[[1, 3]])
    u.set_affinity("host")
    assert u.plain().data_ptr() == pointer
    got = u[cuda_index]
    assert hr.is_unified(got) and got.affinity == "host" and torch.equal(got.plain(), x[[4, 2, 99]])
    got = u[cpu_index]
    assert hr.is_unified(got) and torch.equal(got.plain(), x[[1, 3]])


def test_elementwise_placement():
    x = torch.randn(64, 8)
    y = torch.randn(64, 8)
    u = hr.to_unified(x)  # GPU affinity
    result = u + y.cuda()
    assert result.is_cuda and torch.allclose(result.cpu(), x + y)
    result = u * 2
    assert result.is_cuda and torch.allclose(result.cpu(), x * 2)
    result = u - y  # a non-scalar CPU operand: computed on the GPU, result host-affine unified
    assert hr.is_unified(result) and result.affinity == "host" and torch.allclose(result.plain(), x - y)
    h = hr.to_unified(x, affinity="host")
    result = h + y.cuda()
    assert hr.is_unified(result) and result.affinity == "host" and torch.allclose(result.plain(), x + y)
    result = torch.relu(h) + u  # host + GPU affinity: computed on the GPU, host-affine result
    assert hr.is_unified(result) and torch.allclose(result.plain(), torch.relu(x) + x)
    u.add_(1)
    torch.cuda.synchronize()
    assert torch.allclose(u.plain(), x + 1)


def test_cuda_view_aliases_the_memory():
    u = hr.to_unified(torch.zeros(10, 4))
    view = u.cuda_view()
    assert view.is_cuda and view.shape == (10, 4)
    view[3] = 7.0
    torch.cuda.synchronize()
    assert torch.equal(u.plain()[3], torch.full((4,), 7.0))


# ---------------------------------------------------------------------------------------------------------------
# Calibration


def test_calibration_is_cached_and_drives_auto():
    calibration = um.calibrate(table_bytes=64 << 20, batch_bytes=(256 << 10, 4 << 20), repeats=1, verbose=False)
    assert set(calibration.per_row) == set(PATHS)
    stored = um._load_calibrations(um.calibration_file())
    assert calibration.key in stored
    table, data = byte_table(1000, 512, 0)
    index = random_index(10000, 1000, torch.int64, "cuda")
    assert torch.equal(hr.gather(table, index).cpu(), data[index.cpu()])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
