"""Tests of activation offloading (runtime/python/hectorgen_runtime/offload.py over the engine in runtime/src/offload)
in the CPU tensor mode: no GPU needed. Gradients must be bit-identical to training without the cache in every mode;
forwarding, deduplication, release, micro-batches, error fallback and the absence of leaks over 50 steps are checked
through the cache's and the engine's accounting.

The extension is JIT-built on first use (plain C++, ~1 minute; cached in $HECTORGEN_RUNTIME_BUILD_DIR or PyTorch's
extension directory). Run with pytest, or as a script (CTest `runtime_offload`), which exits 77 (skipped) without
torch or pytest. The GPU checks are tests/runtime/test_offload_gpu.py.
"""

import contextlib
import errno
import gc
import importlib.util
import os
import pathlib
import sys
import threading
import warnings

def test_a_stale_jit_lock_is_removed_a_fresh_one_kept(tmp_path):
    """torch's JIT build waits for as long as its build directory holds a `lock` file; one left by an interrupted
    build (older than any build) is removed with a warning, a recent one (a build in progress) is left to torch."""
    from hectorgen_runtime import _extensions

    assert not _extensions.clear_stale_lock(str(tmp_path))   # no lock
    lock = tmp_path / "lock"
    lock.touch()
    assert not _extensions.clear_stale_lock(str(tmp_path))
    assert lock.exists()
    old = lock.stat().st_mtime - _extensions.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="removed the stale lock .*lock .31 minutes old"):
        assert _extensions.clear_stale_lock(str(tmp_path))
    assert not lock.exists()


if __name__ == "__main__":
    _missing = [name for name in ("pytest", "torch") if importlib.util.find_spec(name) is None]
    if _missing:
        print(f"runtime_offload: SKIPPED: needs python3 with {' and '.join(_missing)}")
        sys.exit(77)

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

sys.path.insert(0, os.environ.get("HECTORGEN_RUNTIME_PYTHON")
                or str(pathlib.Path(__file__).resolve().parents[2] / "runtime" / "python"))
from hectorgen_runtime import offload  # noqa: E402

WIDTH, HIDDEN, LAYERS, BATCH = 48, 192, 4, 40


class Block(torch.nn.Module):
    """An MLP block with a residual connection; `square` also saves an activation and a view of it (h * h.t().t())."""

    def __init__(self, square: bool = False):
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, WIDTH)
        self.square = square

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x))
        if self.square:
            h = h * h.t().t()  # saves h and a view of h: one storage
        return x + self.down(h)


def make_model(square: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.ModuleList([Block(square) for _ in range(LAYERS)]).double()


def inputs(seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, WIDTH, dtype=torch.float64, generator=generator).requires_grad_()


def forward(model, x):
    h = x
    for block in model:
        h = block(h)
    return h.pow(2).mean()


def gradients(model, x, cache=None, settle=False):
    """One training step's gradients (input and parameters), with or without the cache. settle: every store has
    run before the backward starts (none is forwarded: a test that counts stores or injects I/O faults must not
    depend on how fast the machine is)."""
    model.zero_grad(set_to_none=True)
    x.grad = None
    if cache is None:
        loss = forward(model, x)
    else:
        with cache:
            loss = forward(model, x)
        if settle:
            cache.wait_io()
    loss.backward()
    return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]


def assert_identical(expected, got):
    assert len(expected) == len(got)
    for index, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"gradient {index} differs (max |diff| {(a - b).abs().max().item()})"


def assert_clean(cache):
    """Nothing left between steps: no records, no engine entries, no room in use."""
    cache.wait_io()
    assert cache.live_records() == 0
    stats = cache.engine_stats()
    assert stats["entries"] == 0, stats
    assert stats["host_used"] == 0 and stats["file_used"] == 0, stats


def make_cache(model, **options):
    options.setdefault("cpu_tensors", True)
    options.setdefault("min_bytes", 1024)
    options.setdefault("host_budget_bytes", 32 << 20)
    options.setdefault("host_arena_bytes", 8 << 20)
    options.setdefault("chunk_bytes", 64 << 10)
    return offload.TensorCache(model, **options)


@pytest.fixture(scope="module", autouse=True)
def extension():
    try:
        return offload.load_offload_extension()
    except Exception as error:  # noqa: BLE001 - a broken build is a failure, reported with its cause
        pytest.fail(f"the offload extension does not build: {error}")


@pytest.mark.parametrize("mode", ["host", "file", "host_keep_last", "mixed", "file_full_falls_back_to_host",
                                  "two_threads_deep_queue", "recompute_and_offload"])
def test_gradients_bit_identical(mode, tmp_path):
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    options = {
        "host": dict(tier="host"),
        "file": dict(tier="file", directories=[str(tmp_path)], file_bytes=16 << 20),
        "host_keep_last": dict(tier="host", keep_last=2),
        "mixed": dict(tier="host", placement={model[1]: "file", model[3]: "keep"}, directories=[str(tmp_path)],
                      file_bytes=16 << 20),
        "file_full_falls_back_to_host": dict(tier="file", directories=[str(tmp_path)], file_bytes=64 << 10),
        "two_threads_deep_queue": dict(tier="file", directories=[str(tmp_path)], file_bytes=16 << 20,
                                       store_threads=2, load_threads=2, queue_depth=8, chunk_bytes=16 << 10),
        "recompute_and_offload": dict(tier="host", placement={model[1]: "recompute", model[2]: "recompute"}),
    }[mode]
    cache = make_cache(model, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert_identical(expected, gradients(model, x, cache, settle=True))
            assert_clean(cache)
    stats = cache.stats
    assert stats["stored_host"] + stats["stored_file"] > 0, stats
    if mode == "file":
        assert stats["stored_host"] == 0 and stats["stored_file"] > 0
        # Every stored tensor came back through a prefetch, or stayed in memory when backward reached it first.
        assert stats["prefetched"] + stats["kept_wanted"] == stats["stored_file"], stats
        assert cache.engine_stats()["loaded_bytes"] <= cache.engine_stats()["stored_bytes"]
    if mode == "host_keep_last":
        assert stats["kept_placement"] > 0
    if mode == "mixed":
        assert stats["stored_host"] > 0 and stats["stored_file"] > 0 and stats["kept_placement"] > 0
    if mode == "recompute_and_offload":
        assert stats["recomputed_scopes"] == 2 * 3 and stats["stored_host"] > 0, stats
        # A recomputed scope saves only its input (checkpoint's), which is kept; scopes 0 and 3 save everything.
        assert stats["offered_bytes"] == 3 * 2 * (2 * BATCH * WIDTH + 2 * BATCH * HIDDEN) * 8, stats
        assert stats["kept_placement"] == 3 * 2, stats
    if mode == "file_full_falls_back_to_host":
        assert stats["stored_host"] > 0
        assert any("offload files are full" in str(w.message) for w in caught)
    # Everything offloaded was loaded back through prefetching, not on demand.
    assert stats["load_misses"] == 0, stats


def test_parameters_small_and_outside_tensors_are_kept():
    model, x = make_model(), inputs()
    cache = make_cache(model, min_bytes=BATCH * HIDDEN * 8)  # the [BATCH, WIDTH] tensors are too small
    gradients(model, x, cache)
    stats = cache.stats
    assert stats["kept_small"] > 0
    # Only the [BATCH, HIDDEN] activations (up's output saved by gelu, gelu's output saved by down) went out;
    # weights (saved as transposed views of the parameters) never did.
    assert stats["offered_bytes"] == LAYERS * 2 * BATCH * HIDDEN * 8, stats
    assert_clean(cache)
    cache = make_cache(model)
    gradients(model, x, cache)
    assert cache.stats["kept_outside"] == 1, cache.stats  # the loss's input, saved outside every scope
    # Each block: its input (saved by up) and the two [BATCH, HIDDEN] activations.
    assert cache.stats["offered_bytes"] == LAYERS * (BATCH * WIDTH + 2 * BATCH * HIDDEN) * 8, cache.stats


def test_same_activation_saved_twice_is_stored_once():
    model, x = make_model(square=True), inputs()
    expected = gradients(model, x)
    cache = make_cache(model)
    assert_identical(expected, gradients(model, x, cache, settle=True))
    stats = cache.stats
    assert stats["deduplicated"] == LAYERS and stats["forwarded"] == 0, stats  # h * h.t().t(): one storage
    assert cache.engine_stats()["stored_bytes"] == stats["offered_bytes"]
    assert_clean(cache)


def test_kept_scopes_leave_the_tensors_to_autograd():
    # A scope placed "keep" costs one check per saved tensor: no record, no handle (autograd holds the tensor itself,
    # nothing to unpack or release), none of the cache's timed work; its bytes and tensors are still counted once.
    model, x = make_model(square=True), inputs()
    expected = gradients(model, x)
    cache = make_cache(model, placement={block: "keep" for block in model})
    model.zero_grad(set_to_none=True)
    x.grad = None
    with cache:
        loss = forward(model, x)
    assert cache.live_records() == 0
    loss.backward()
    assert_identical(expected, [x.grad] + [p.grad for p in model.parameters()])
    stats = cache.stats
    assert stats["records"] == 0 and stats["hook_ns"] == 0 and stats["deduplicated"] == LAYERS, stats
    # Each block: its input (saved by up), gelu's input, h (saved twice by h * h.t().t(), counted once) and the
    # product (saved by down).
    assert all(cache.last_scope_bytes[block] == (BATCH * WIDTH + 3 * BATCH * HIDDEN) * 8 for block in model)
    assert all(cache.last_scope_tensors[block] == 4 for block in model)
    assert cache.last_tail_bytes == BATCH * WIDTH * 8  # the loss's pow saves the last block's output
    # Offloaded, the same storages make records (and the same bytes), and the cache times its own work on them.
    cache.remove()
    offered = stats["offered_bytes"]
    cache = make_cache(model)
    assert_identical(expected, gradients(model, x, cache))
    assert cache.stats["records"] == 4 * LAYERS and cache.stats["hook_ns"] > 0, cache.stats
    assert cache.stats["offered_bytes"] == offered
    assert_clean(cache)


class Project(torch.nn.Module):
    """Saves its input (the linear layer's), nothing else of its own."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, HIDDEN)

    def forward(self, x):
        return self.linear(x)


@pytest.mark.parametrize("order", ["kept_first", "offloaded_first"])
def test_a_tensor_saved_by_a_kept_and_an_offloaded_scope(order):
    # x saved by a kept scope and by an offloaded one: kept first, it stays (a copy would free nothing while the
    # kept scope holds it); offloaded first, the kept scope shares the record, as any second saver does.
    torch.manual_seed(0)
    kept, offloaded = Project().double(), Project().double()
    scopes = [kept, offloaded] if order == "kept_first" else [offloaded, kept]
    x = inputs()

    def step(cache=None):
        kept.zero_grad(set_to_none=True)
        offloaded.zero_grad(set_to_none=True)
        x.grad = None
        with cache if cache is not None else contextlib.nullcontext():
            first, second = (scope(x) for scope in scopes)
            loss = (first * second).sum()
        if cache is not None:
            cache.wait_io()
        loss.backward()
        return [x.grad.clone()] + [p.grad.clone() for p in (*kept.parameters(), *offloaded.parameters())]

    expected = step()
    cache = make_cache(scopes, placement={kept: "keep", offloaded: "host"})
    assert_identical(expected, step(cache))
    stats = cache.stats
    assert stats["deduplicated"] == 1, stats
    if order == "kept_first":
        assert stats["records"] == 0 and stats["stored_host"] == 0, stats
    else:
        assert stats["records"] == 1 and stats["stored_host"] == 1 and stats["prefetched"] == 1, stats
    assert_clean(cache)


def test_forwarding_returns_the_tensor_still_being_stored():
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    cache = make_cache(model)
    cache.engine.pause_stores(True)  # every store stays queued: backward finds them all in memory
    got = gradients(model, x, cache)
    cache.engine.pause_stores(False)
    assert_identical(expected, got)
    stats = cache.stats
    assert stats["forwarded"] > 0 and stats["stored_host"] == 0 and stats["prefetched"] == 0, stats
    assert_clean(cache)
    assert cache.engine_stats()["stores_done"] == 0


def test_tensors_are_released_as_backward_passes_their_scopes():
    model, x = make_model(), inputs()
    cache = make_cache(model)
    live = []
    for block in model:  # registered after the cache's hooks: runs when the block's backward is over
        block.register_full_backward_hook(lambda *args: live.append(cache.live_records()))
    with cache:
        loss = forward(model, x)
    before = cache.live_records()
    loss.backward()
    assert before == LAYERS * 3  # each block's input and its two [BATCH, HIDDEN] activations
    assert live == sorted(live, reverse=True) and live[0] < before and live[-1] == 0, (before, live)


def test_micro_batches_backward_in_any_order():
    model = make_model()
    xs = [inputs(seed) for seed in (1, 2, 3)]
    model.zero_grad(set_to_none=True)
    losses = [forward(model, x) for x in xs]
    for k in (2, 0, 1):  # the same order below: gradients accumulate in the order of the backward passes
        losses[k].backward()
    expected = [p.grad.clone() for p in model.parameters()] + [x.grad.clone() for x in xs]
    for x in xs:
        x.grad = None
    model.zero_grad(set_to_none=True)
    cache = make_cache(model)
    losses = []
    for k, x in enumerate(xs):
        with cache.micro_batch(k), cache:
            losses.append(forward(model, x))
    for k in (2, 0, 1):  # a pipeline schedule's order, not the forward's
        cache.prefetch(k)
        with cache.micro_batch(k):
            losses[k].backward()
    got = [p.grad.clone() for p in model.parameters()] + [x.grad.clone() for x in xs]
    assert_identical(expected, got)
    assert cache.stats["load_misses"] == 0
    assert_clean(cache)


def test_two_caches_over_the_same_tensors():
    # The input and the parameters outlive a cache: a second cache must not take another storage for them.
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    first, second = make_cache(model), make_cache(model, tier="host", keep_last=1)
    for cache in (first, second, first, second):
        assert_identical(expected, gradients(model, x, cache))
        assert_clean(cache)


def test_in_flight_limit_waits_or_keeps():
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    # wait: beyond one activation in flight, saving waits for the oldest store; everything is still offloaded.
    cache = make_cache(model, max_inflight_bytes=BATCH * HIDDEN * 8)
    cache.engine.pause_stores(True)
    resume = threading.Timer(0.2, cache.engine.pause_stores, (False,))
    resume.start()
    assert_identical(expected, gradients(model, x, cache))
    resume.join()
    assert cache.stats["throttled"] > 0 and cache.stats["kept_busy"] == 0, cache.stats
    assert_clean(cache)
    # keep: with the stores held, only what fits in the window goes out; the rest stays in memory.
    cache = make_cache(model, max_inflight_bytes=2 * BATCH * HIDDEN * 8, when_busy="keep")
    cache.engine.pause_stores(True)
    got = gradients(model, x, cache)
    cache.engine.pause_stores(False)
    assert_identical(expected, got)
    assert cache.stats["kept_busy"] > 0 and cache.stats["throttled"] == 0, cache.stats
    assert_clean(cache)
    with pytest.raises(ValueError, match="when_busy"):
        make_cache(model, when_busy="drop")


def test_write_errors_keep_tensors_in_memory_with_a_warning(tmp_path):
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    cache = make_cache(model, tier="file", directories=[str(tmp_path)], file_bytes=16 << 20, fault_injection=True,
                       fallback=False)
    cache.engine.inject_fault("write", errno.EIO, count=3, skip=2)
    with pytest.warns(RuntimeWarning, match="Input/output error"):
        got = gradients(model, x, cache, settle=True)
    assert_identical(expected, got)
    assert cache.stats["store_failed"] == 3 and cache.stats["stored_file"] > 0, cache.stats
    assert_clean(cache)


def test_disk_full_keeps_tensors_with_a_warning(tmp_path):
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    cache = make_cache(model, tier="file", directories=[str(tmp_path)], file_bytes=100 << 10, fallback=False)
    with pytest.warns(RuntimeWarning, match="offload files are full"):
        got = gradients(model, x, cache, settle=True)
    assert_identical(expected, got)
    assert cache.stats["kept_full"] > 0 and cache.stats["stored_file"] > 0, cache.stats
    assert_clean(cache)


def test_unusable_directory_falls_back_to_host(tmp_path):
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    with pytest.warns(UserWarning, match="file tier unavailable.*cannot create an offload file"):
        cache = make_cache(model, tier="file", directories=[str(tmp_path / "missing")], file_bytes=1 << 20)
    assert_identical(expected, gradients(model, x, cache, settle=True))
    assert cache.stats["stored_host"] > 0 and cache.stats["stored_file"] == 0
    assert_clean(cache)


def test_read_errors_raise_a_clear_error_never_wrong_gradients(tmp_path):
    model, x = make_model(), inputs()
    cache = make_cache(model, tier="file", directories=[str(tmp_path)], file_bytes=16 << 20, fault_injection=True)
    gradients(model, x, cache)  # a good step first
    cache.engine.inject_fault("read", errno.EIO, count=1)
    model.zero_grad(set_to_none=True)
    with cache:
        loss = forward(model, x)
    cache.wait_io()  # every tensor stored, so the backward reads (none is forwarded from memory)
    with pytest.raises(RuntimeError, match="could not be loaded back.*Input/output error"):
        loss.backward()
    del loss
    gc.collect()
    assert_clean(cache)
    # The next step works again.
    expected = gradients(model, x)
    assert_identical(expected, gradients(model, x, cache))


def test_no_leaks_over_50_steps(tmp_path):
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    cache = make_cache(model, tier="host", placement={model[2]: "file"}, directories=[str(tmp_path)],
                       file_bytes=4 << 20)
    for step in range(50):
        got = gradients(model, x, cache)
        if step % 10 == 0:
            assert_identical(expected, got)
        assert_clean(cache)
    gc.collect()
    assert not [obj for obj in gc.get_objects() if type(obj) is offload._Handle]
    stats = cache.engine_stats()
    assert stats["stores_done"] == cache.stats["stored_host"] + cache.stats["stored_file"]
    assert stats["host_peak"] > 0 and stats["file_peak"] > 0
    assert os.listdir(tmp_path) == []  # the offload file was unlinked when it was opened


def test_arguments_are_checked():
    model = make_model()
    with pytest.raises(ValueError, match="tier must be"):
        offload.TensorCache(model, tier="ssd", cpu_tensors=True)
    cache = make_cache(model)
    with pytest.raises(ValueError, match="placement must be one of"):
        cache.set_placement(model[0], "gpu")
    with pytest.raises(ValueError, match="not one of this cache's scopes"):
        cache.set_placement(torch.nn.Linear(2, 2), "keep")
    with cache, pytest.raises(RuntimeError, match="already active"):
        cache.__enter__()
    cache.set_placement(model[0], "recompute")
    cache.remove()
    assert "forward" not in vars(model[0])  # the recompute wrapper is gone with the hooks


class SlowLink:
    """An engine whose stores seem to run until waited for (a link much slower than the CPU): the state a GPU run
    is in, where the CPU queues the whole forward pass long before the copies end."""

    def __init__(self, engine, cache_of):
        self._engine, self._cache_of = engine, cache_of
        self._done, self._waited = [], set()
        self.waits = []  # (engine id, the forward's scope index when the cache waited, or None in backward)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def wait_store(self, engine_id):
        cache = self._cache_of()
        self.waits.append((engine_id, cache._stack[-1].index if cache._stack else None))
        self._waited.add(engine_id)
        return self._engine.wait_store(engine_id)

    def store_state(self, engine_id):
        state = self._engine.store_state(engine_id)
        return "running" if state == "done" and engine_id not in self._waited else state

    def take_finished_stores(self):
        self._done += self._engine.take_finished_stores()
        finished = [(i, state) for i, state in self._done if i in self._waited or state != "done"]
        self._done = [(i, state) for i, state in self._done if not (i in self._waited or state != "done")]
        return finished


def test_a_plan_makes_the_cache_wait_for_stores_where_predicted():
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    scope_bytes = (2 * BATCH * WIDTH + 2 * BATCH * HIDDEN) * 8
    profiles = [offload.ScopeProfile(block, 1e-3, scope_bytes) for block in model]
    # A link that moves one scope's bytes in 1.5 scopes of forward: the first two scopes fit under the forward.
    plan = offload.plan_placement(profiles, write_bandwidth=scope_bytes / 1.5e-3, recompute=False)
    assert [plan[block] for block in model] == ["host", "host", "keep", "keep"]
    assert plan.prefetch_scopes >= 1

    def run(placement):
        holder = {}
        engine = SlowLink(offload.make_engine(host_budget_bytes=32 << 20, host_arena_bytes=8 << 20,
                                              chunk_bytes=64 << 10, pinned=False), lambda: holder["cache"])
        cache = holder["cache"] = make_cache(model, placement=placement, engine=engine)
        assert_identical(expected, gradients(model, x, cache))
        assert_clean(cache)
        cache.remove()
        return cache, engine

    cache, engine = run(plan)
    stored = cache.stats["stored_host"]
    assert stored > 0 and cache.stats["forwarded"] == 0 and cache.stats["kept_wanted"] == 0, cache.stats
    assert cache.stats["waited_due"] == stored and cache.stats["load_misses"] == 0
    # Every store was waited for during the forward pass, in order, where the link would have moved it: the last
    # of scope 1 (3 ms of link time for two scopes) once the forward is in scope 2 or later.
    indices = [index for _, index in engine.waits]
    assert len(indices) == stored and None not in indices and indices == sorted(indices), engine.waits
    assert indices[-1] >= 2
    # The same placement without the plan's waits: backward reaches the tensors while their stores "run", and
    # forwards them; nothing would have left memory before the peak.
    cache, engine = run(dict(plan))
    assert cache.stats["forwarded"] > 0 and cache.stats["waited_due"] == 0, cache.stats


def test_a_plan_that_offloads_nothing_installs_no_hooks():
    """keep and recompute only: the cache is the recompute wrappers alone (no saved-tensor or scope hooks), so it
    costs what the same placement written by hand costs; set_placement to an offloading tier turns the hooks on."""
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    scope_bytes = (2 * BATCH * WIDTH + 2 * BATCH * HIDDEN) * 8
    profiles = [offload.ScopeProfile(block, 1e-3, scope_bytes) for block in model]
    plan = offload.plan_placement(profiles, write_bandwidth=scope_bytes / 1.5e-3,
                                  fixed={block: ("recompute" if i % 2 else "keep") for i, block in enumerate(model)})
    assert [plan[block] for block in model] == ["keep", "recompute", "keep", "recompute"]
    cache = make_cache(model, placement=plan)
    assert_identical(expected, gradients(model, x, cache))
    assert cache.stats["packed"] == 0 and cache.stats["recomputed_scopes"] == 2, cache.stats
    assert cache.last_scope_bytes == {}  # nothing tracked
    cache.set_placement(model[0], "host")
    assert_identical(expected, gradients(model, x, cache, settle=True))
    assert cache.stats["stored_host"] > 0 and cache.stats["recomputed_scopes"] == 4, cache.stats
    assert_clean(cache)
    cache.remove()


def test_synchronous_stores_and_loads_on_demand():
    """max_inflight_bytes=0 waits for every store as it is queued, prefetch_scopes=-1 loads nothing ahead: each
    tensor comes back when backward unpacks it (the lowest peak; save_on_cpu's schedule over the engine)."""
    model, x = make_model(), inputs()
    expected = gradients(model, x)
    cache = make_cache(model, max_inflight_bytes=0, prefetch_scopes=-1)
    assert_identical(expected, gradients(model, x, cache))
    stored = cache.stats["stored_host"]
    assert stored > 0 and cache.stats["throttled"] <= stored, cache.stats  # a store may end before the check
    assert cache.stats["prefetched"] == 0 and cache.stats["load_misses"] == stored, cache.stats
    assert cache.stats["forwarded"] == 0
    assert_clean(cache)
    cache.remove()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
