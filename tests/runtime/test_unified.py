"""Tests of unified tensors (runtime/python/hectorgen_runtime/unified.py) that need no GPU.

The placement table, affinity switching, views, host-affine operators and indexing, the argument errors of
gather, and the calibration model, run over a fake backend whose "pinned" memory is ordinary CPU memory (the
memory and kernels themselves are covered by tests/unit/test_unified_pool.cpp and, on a GPU,
tests/runtime/test_unified_gpu.py). Without a GPU, the real backend must refuse with a clear error.

Run with pytest, or as a script (CTest `runtime_unified`): `python3 tests/runtime/test_unified.py`, which exits 77
(skipped) without torch or pytest.
"""

import importlib.util
import json
import os
import pathlib
import pickle
import sys

if __name__ == "__main__":
    _missing = [name for name in ("pytest", "torch") if importlib.util.find_spec(name) is None]
    if _missing:
        print(f"runtime_unified: SKIPPED: needs python3 with {' and '.join(_missing)}")
        sys.exit(77)

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

sys.path.insert(0, os.environ.get("HECTORGEN_RUNTIME_PYTHON")
                or str(pathlib.Path(__file__).resolve().parents[2] / "runtime" / "python"))
import hectorgen_runtime as hr  # noqa: E402
from hectorgen_runtime import unified as hu  # noqa: E402  (the function; the module is below)

um = sys.modules["hectorgen_runtime.unified"]


class FakeBackend:
    """Unified memory without a GPU: allocations are ordinary CPU tensors, pinning is recorded, and anything that
    needs the GPU raises."""

    def __init__(self):
        self.allocations = 0
        self.pinned = []

    def empty(self, sizes, dtype):
        self.allocations += 1
        return torch.empty(tuple(sizes), dtype=dtype)

    def pin(self, t):
        self.pinned.append(t.untyped_storage().data_ptr())
        return True

    def is_mapped(self, t):
        return True

    def _no_gpu(self, *args, **kwargs):
        raise RuntimeError("fake backend: no GPU")

    cuda_view = gather = gather_cpu = plan = _no_gpu

    def pool_stats(self):
        return {"in_use_bytes": 0}

    def trim_pool(self):
        return 0

    def set_pool_limit(self, nbytes):
        pass


@pytest.fixture
def fake():
    backend = FakeBackend()
    previous = um._use_backend(backend)
    yield backend
    um._use_backend(previous)


def table(rows=6, cols=4, dtype=torch.float32):
    return torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols).to(dtype)


# ---------------------------------------------------------------------------------------------------------------
# The placement table (the thesis's "Rules of placements", one case per row and the affinity variants)


@pytest.mark.parametrize("kinds, expected", [
    # all unified operands GPU-affine
    (["gpu", "cpu"], ("gpu", "unified_host")),
    (["gpu", "cpu", "cuda"], ("gpu", "unified_host")),
    (["gpu", "cuda"], ("gpu", "cuda")),
    (["gpu", "cuda", "cpu_scalar"], ("gpu", "cuda")),
    (["gpu", "gpu"], ("gpu", "cuda")),
    (["gpu", "cpu_scalar"], ("gpu", "cuda")),
    (["gpu"], ("gpu", "cuda")),
    # some unified operand host-affine
    (["host", "cpu"], ("cpu", "unified_host")),
    (["host", "gpu", "cpu"], ("gpu", "unified_host")),
    (["host", "cuda"], ("gpu", "unified_host")),
    (["host", "cuda", "cpu_scalar"], ("gpu", "unified_host")),
    (["host", "cpu_scalar"], ("cpu", "unified_host")),
    (["host"], ("cpu", "unified_host")),
    (["host", "gpu"], ("gpu", "unified_host")),
    (["host", "gpu", "cpu_scalar"], ("gpu", "unified_host")),
])
def test_placement_table(kinds, expected):
    assert hr.unified.__module__  # the function exists
    assert um.placement(kinds) == expected
    assert um.placement(list(reversed(kinds))) == expected  # operand order does not matter


def test_placement_needs_a_unified_operand_and_known_kinds():
    with pytest.raises(ValueError, match="at least one unified operand"):
        um.placement(["cpu", "cuda"])
    with pytest.raises(ValueError, match="unknown operand kinds"):
        um.placement(["gpu", "tpu"])


def test_operand_kinds():
    assert um._operand_kind(torch.zeros(3)) == "cpu"
    assert um._operand_kind(torch.tensor(2.0)) == "cpu_scalar"
    assert um._operand_kind(3) == "cpu_scalar"
    assert um._operand_kind(2.5) == "cpu_scalar"
    assert um._operand_kind("add") is None


# ---------------------------------------------------------------------------------------------------------------
# Making unified tensors, affinity, views


def test_to_unified_copies(fake):
    x = table()
    u = hr.to_unified(x)
    assert hr.is_unified(u) and isinstance(u, hr.UnifiedTensor) and u.is_unified
    assert not hr.is_unified(x)
    assert u.affinity == "gpu"
    assert u.plain().data_ptr() != x.data_ptr()
    assert torch.equal(u.plain(), x)
    assert fake.allocations == 1
    assert u.shape == x.shape and u.dtype == x.dtype and u.device.type == "cpu"


def test_unified_pins_in_place(fake):
    x = table()
    u = hr.unified(x, affinity="host")
    assert u.plain().data_ptr() == x.data_ptr()
    assert fake.pinned == [x.untyped_storage().data_ptr()]
    assert fake.allocations == 0
    x[0, 0] = 100.0  # same memory
    assert u.plain()[0, 0] == 100.0
    assert u.affinity == "host"
    assert hr.unified(u) is not u and hr.unified(u, affinity="host") is u


def test_unified_argument_errors(fake):
    with pytest.raises(TypeError, match="expects a tensor"):
        hr.unified([1, 2])
    with pytest.raises(TypeError, match="expects a tensor"):
        hr.to_unified(3)
    with pytest.raises(ValueError, match="affinity must be one of"):
        hr.to_unified(table(), affinity="device")
    meta = torch.empty(3, device="meta")
    with pytest.raises(ValueError, match="to_unified"):
        hr.unified(meta)


def test_affinity_switch_moves_no_data(fake):
    u = hr.to_unified(table())
    pointer = u.plain().data_ptr()
    assert u.set_affinity("host") is u
    assert u.affinity == "host" and u.plain().data_ptr() == pointer
    v = u.with_affinity("gpu")
    assert v is not u and v.affinity == "gpu" and u.affinity == "host"
    assert v.plain().data_ptr() == pointer
    with pytest.raises(ValueError, match="affinity"):
        u.set_affinity("cuda")


def test_views_stay_unified_with_their_affinity(fake):
    u = hr.to_unified(table(), affinity="host")
    for view in (u[1:3], u[2], u.view(-1), u.t(), u.reshape(3, 8), u.narrow(1, 1, 2), u.unsqueeze(0)):
        assert hr.is_unified(view), view
        assert view.affinity == "host"
    assert torch.equal(u[1:3].plain(), table()[1:3])
    # Results in new memory are ordinary CPU tensors.
    assert not hr.is_unified(u.sum())
    assert not hr.is_unified(u.clone())
    assert u.sum().item() == table().sum().item()


def test_repr_and_pickle(fake):
    u = hr.to_unified(table(2, 2), affinity="host")
    assert repr(u).startswith("unified(tensor(") and "affinity='host'" in repr(u)
    back = pickle.loads(pickle.dumps(u))
    assert type(back) is torch.Tensor and torch.equal(back, table(2, 2))


def test_empty_unified(fake):
    u = hr.empty_unified(3, 5, dtype=torch.float16, affinity="host")
    assert u.shape == (3, 5) and u.dtype == torch.float16 and u.affinity == "host"
    assert hr.empty_unified((2, 2)).shape == (2, 2)


# ---------------------------------------------------------------------------------------------------------------
# Host-affine operators compute on the CPU and stay unified


def test_host_affine_elementwise(fake):
    x = table()
    u = hr.to_unified(x, affinity="host")
    cases = [
        (u + 1, x + 1),
        (2 * u, 2 * x),
        (u - torch.ones(4), x - 1),
        (torch.relu(u - 10), torch.relu(x - 10)),
        (torch.nn.functional.relu(u - 10), torch.relu(x - 10)),
        (torch.add(u, x, alpha=2), x + 2 * x),
        (u * torch.tensor(3.0), 3 * x),
        (u > 5, x > 5),
        (torch.where(u > 5, u, torch.zeros(())), torch.where(x > 5, x, torch.zeros(()))),
    ]
    for got, expected in cases:
        assert hr.is_unified(got) and got.affinity == "host"
        assert torch.equal(got.plain(), expected)


def test_host_affine_in_place(fake):
    x = table()
    u = hr.to_unified(x, affinity="host")
    pointer = u.plain().data_ptr()
    result = u.add_(1)
    assert result is u and u.plain().data_ptr() == pointer
    u *= 2
    assert torch.equal(u.plain(), (x + 1) * 2)


def test_host_affine_indexing_by_a_cpu_index(fake):
    x = table(10, 3)
    u = hr.to_unified(x, affinity="host")
    index = torch.tensor([9, 0, 3, 3])
    for got in (u[index], torch.index_select(u, 0, index), u.index_select(0, index.int())):
        assert hr.is_unified(got) and got.affinity == "host"
        assert torch.equal(got.plain(), x[index])
    assert torch.equal(u[index, :].plain(), x[index])
    assert torch.equal(u[index, ...].plain(), x[index])
    mixed = u[index, 1:]  # not a row gather: CPU semantics, a new (plain) tensor
    assert not hr.is_unified(mixed) and torch.equal(mixed, x[index, 1:])
    two_d = torch.tensor([[1, 2], [3, 4]])
    assert torch.equal(u[two_d].plain(), x[two_d])
    mask = torch.arange(10) % 3 == 0
    assert torch.equal(u[mask].plain(), x[mask])
    assert u[torch.zeros(0, dtype=torch.long)].shape == (0, 3)


def test_indexing_errors(fake):
    u = hr.to_unified(table(10, 3), affinity="host")
    with pytest.raises(IndexError, match=r"index 10 at position 2 is out of range for a table of 10 rows"):
        u[torch.tensor([1, 2, 10])]
    with pytest.raises(IndexError, match=r"index -1 at position 0"):
        u[torch.tensor([-1])]
    with pytest.raises(TypeError, match="int32 or int64"):
        u[torch.tensor([1.0])]
    with pytest.raises(IndexError, match="boolean index"):
        u[torch.ones(3, dtype=torch.bool)]


def test_gpu_affine_operators_need_the_gpu(fake):
    u = hr.to_unified(table())
    with pytest.raises(RuntimeError, match="no GPU"):
        u + 1


# ---------------------------------------------------------------------------------------------------------------
# gather's argument checks (before any GPU work)


def test_gather_argument_errors(fake):
    x = table(8, 4)
    u = hr.to_unified(x)
    index = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="must be a unified tensor"):
        hr.gather(x, index)
    with pytest.raises(TypeError, match="must be a unified tensor"):
        hr.gather([1], index)
    with pytest.raises(TypeError, match="int32 or int64"):
        hr.gather(u, index.float())
    with pytest.raises(TypeError, match="index must be a tensor"):
        hr.gather(u, [1, 2])
    with pytest.raises(ValueError, match="contiguous"):
        hr.gather(u.t(), index)
    with pytest.raises(ValueError, match="path must be"):
        hr.gather(u, index, path="dma")
    with pytest.raises(TypeError, match="out has dtype torch.float64"):
        hr.gather(u, index, out=torch.empty(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"out has shape \(3, 4\), expected \(2, 4\)"):
        hr.gather(u, index, out=torch.empty(3, 4))
    with pytest.raises(ValueError, match="contiguous CUDA or unified"):
        hr.gather(u, index, out=torch.empty(2, 4))
    with pytest.raises(ValueError, match="at least one dimension"):
        hr.gather(hr.to_unified(torch.tensor(1.0)), index)


def test_real_backend_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        hr.to_unified(table())
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        hr.unified(table())


# ---------------------------------------------------------------------------------------------------------------
# Calibration: the per-call choice from measured costs, and its cache


def synthetic_calibration():
    widths = [128, 1024, 16384]
    # CPU path: cheap to start, 4 GB/s-ish per row at small widths; zero-copy: launch cost, slow for small rows
    # unless sorted; all near the same bandwidth for large rows.
    return um.Calibration(
        key="test",
        widths=widths,
        fixed={"zero_copy": [20e-6] * 3, "zero_copy_sorted": [60e-6] * 3, "cpu": [5e-6] * 3},
        per_row={"zero_copy": [128 / 8e9, 1024 / 40e9, 16384 / 52e9],
                 "zero_copy_sorted": [128 / 45e9, 1024 / 48e9, 16384 / 51e9],
                 "cpu": [128 / 20e9, 1024 / 26e9, 16384 / 27e9]},
    )


def test_calibration_chooses_the_fastest_predicted_path():
    c = synthetic_calibration()
    assert c.choose(128, 10) == "cpu"                       # tiny batch: fixed costs dominate
    assert c.choose(128, 1 << 20) == "zero_copy_sorted"     # many small rows: sorting wins
    assert c.choose(16384, 1 << 16) == "zero_copy"          # large rows: plain zero-copy
    assert c.choose(1 << 20, 1000) == "zero_copy"           # wider than calibrated: clamps to the last width
    for path in um.PATHS:
        times = [c.predict(path, 2052, n) for n in (1, 10, 1000, 100000)]
        assert times == sorted(times)
    # Interpolation on log(width) lies between the neighbours' per-byte costs.
    per_byte = c.predict("zero_copy", 362, 1 << 20) / (362 << 20)
    assert 1 / 40e9 <= per_byte <= 1 / 8e9 * 1.001


def test_calibration_json_round_trip_and_validation(tmp_path, monkeypatch):
    c = synthetic_calibration()
    assert um.Calibration.from_json(json.loads(json.dumps(c.to_json()))) == c
    broken = c.to_json()
    broken["widths"] = [1024, 128, 16384]
    with pytest.raises(ValueError, match="malformed"):
        um.Calibration.from_json(broken)
    broken = c.to_json()
    broken["per_row"]["cpu"] = [1.0]
    with pytest.raises(ValueError, match="malformed"):
        um.Calibration.from_json(broken)
    path = tmp_path / "sub" / "calibration.json"
    monkeypatch.setenv("HECTORGEN_UNIFIED_CALIBRATION", str(path))
    assert um.calibration_file() == path
    um._store_calibration(path, c)
    other = um.Calibration.from_json({**c.to_json(), "key": "other"})
    um._store_calibration(path, other)
    stored = json.loads(path.read_text())
    assert set(stored) == {"test", "other"}
    assert um.Calibration.from_json(stored["test"]) == c
    monkeypatch.delenv("HECTORGEN_UNIFIED_CALIBRATION")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert um.calibration_file() == tmp_path / "hectorgen" / "unified_calibration.json"


def test_unreadable_calibration_cache_is_ignored(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text("{not json")
    assert um._load_calibrations(path) == {}
    assert um._load_calibrations(tmp_path / "missing.json") == {}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
