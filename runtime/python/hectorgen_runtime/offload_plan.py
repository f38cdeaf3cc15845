"""Adaptive placement of saved activations (issue 11, item 3): keep, offload (host or file tier) or recompute, per
scope, from a profiled step. Plain Python (no torch): the scope modules are only dictionary keys here.

    profiles = [ScopeProfile(layer, forward_seconds, offload_bytes, input_bytes=...) for each layer]
    plan = plan_placement(profiles, write_bandwidth, read_bandwidth, tier="host", max_overhead=0.05)
    cache = TensorCache(layers, placement=plan, ...)       # the plan's waits and prefetch depth come with it
    print("\\n".join(plan.explain()))

The model (docs/offload.md, "Adaptive placement"). Times are GPU times from the start of the forward pass.

* Forward: scope j computes from s_j to e_j and produces its saved bytes at an even rate. The stores of the
  offloaded scopes run first in, first out on the link (bandwidth less `margin`), each starting when both the link
  is free and its scope has started: store j ends at max(start + bytes / bandwidth, e_j). A store must end before
  the forward pass does: only then is its memory free at the peak, which is at the start of backward. The cache
  makes the CPU (which runs ahead of the GPU) wait for store j where the forward pass reaches the predicted end
  (its "due point"), so that the memory is freed, in the allocator's order, before what is allocated after it.
* Backward: scope k's backward takes backward_seconds (default backward_factor x forward), plus its forward again
  when it is recomputed, plus offload_seconds (the cache's own work on its tensors) when it is offloaded. Entering
  scope k's backward queues the loads of the offloaded scopes k, k-1, ..., k-prefetch (the cache's
  prefetch_scopes), first in, first out; a scope whose loads are not done waits (a stall).
* Memory (activation bytes resident): during the forward, what the kept scopes saved so far, the inputs of the
  recomputed ones, the offloaded bytes produced and not yet copied, and at its end what the step saves after the
  last scope (tail_bytes: the loss); entering scope k's backward, the kept bytes of scopes <= k, the recomputed
  scope k whole, and the loaded scopes. The predicted peak is the largest of these; keep's is the sum of all
  bytes.

The planner starts from "keep" everywhere and, while the peak goes down, makes the one change (a kept scope
offloaded or recomputed, an offloaded one recomputed) with the least added step time per byte of peak removed,
free changes first and then the one removing the most; a change whose store would end after the forward pass, or
that makes the step longer than `max_overhead` allows, is not made. A local search over changes of one or two
scopes follows (it finds what one change at a time misses, e.g. recomputing a scope so that another can be
offloaded). With memory_budget_bytes it stops lowering the peak once it fits, then shortens the step. For each
placement it takes the prefetch depth with the lowest peak within the allowed time.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["Plan", "ScopeDecision", "ScopeProfile", "StoreSchedule", "plan_placement", "simulate"]

PLACEMENTS = ("keep", "host", "file", "recompute")
GiB = float(1 << 30)


@dataclasses.dataclass
class ScopeProfile:
    """What a profiled step measured for one scope. backward_seconds defaults to backward_factor x forward_seconds,
    recompute_seconds to forward_seconds; input_bytes is what the scope keeps when it is recomputed (its inputs).
    offload_seconds is the step time the cache's own work adds when the scope is offloaded, beyond the transfers
    (packing, queuing the copies, unpacking and releasing its saved tensors: the scope's tensor count times the
    cache's measured time per tensor); it decides whether offloading a scope is free where the CPU, not the GPU,
    sets the pace (small batches)."""

    module: Any
    forward_seconds: float
    offload_bytes: int
    backward_seconds: Optional[float] = None
    recompute_seconds: Optional[float] = None
    input_bytes: int = 0
    offload_seconds: float = 0.0


@dataclasses.dataclass
class ScopeDecision:
    """The plan for one scope and why: predicted transfer times (seconds from the start of the forward pass), where
    the CPU waits for the stores (scope index, fraction of that scope's forward), and, for the change that chose it,
    the plan's predicted peak and step-time overhead once it was made."""

    index: int
    module: Any
    placement: str
    offload_bytes: int
    forward_start: float
    forward_end: float
    store_start: Optional[float] = None
    store_end: Optional[float] = None
    due: Optional[Tuple[int, float]] = None
    load_start: Optional[float] = None
    load_end: Optional[float] = None
    backward_start: float = 0.0
    chosen_at: Optional[int] = None  # 1, 2, ...: the order of the planner's changes; None: left as it was
    peak_after: Optional[int] = None
    overhead_after: Optional[float] = None
    reason: str = ""


class Plan(dict):
    """{module: "keep" | "host" | "file" | "recompute"}, usable as TensorCache's placement, with the prediction:
    decisions (one ScopeDecision per scope, in forward order), peak_bytes and keep_peak_bytes (activation bytes),
    step_seconds and keep_step_seconds, overhead_seconds (allowed: max_overhead_seconds), prefetch_scopes, and the
    waits (due points) that TensorCache takes from it."""

    def __init__(self, placement: Mapping[Any, str], **fields):
        super().__init__(placement)
        self.decisions: List[ScopeDecision] = fields.pop("decisions")
        for name, value in fields.items():
            setattr(self, name, value)

    def due_points(self) -> Dict[Any, Tuple[int, float]]:
        """{module: (scope index, fraction)}: where in the forward pass the stores of an offloaded scope are
        predicted done (the cache waits for them there)."""
        return {d.module: d.due for d in self.decisions if d.due is not None}

    def scope_size(self, index: int) -> int:
        return self.decisions[index].offload_bytes if index < len(self.decisions) else 0

    def forward_time(self, index: int, fraction: float) -> float:
        """Predicted GPU time at `fraction` (of its saved bytes) into scope `index`'s forward."""
        if index >= len(self.decisions):
            return self.forward_seconds
        d = self.decisions[index]
        return d.forward_start + min(1.0, max(0.0, fraction)) * (d.forward_end - d.forward_start)

    def position(self, when: float) -> Tuple[int, float]:
        """(scope index, fraction of its forward) at GPU time `when`; (number of scopes, 0.0) once it is over."""
        for d in self.decisions:
            if when < d.forward_end:
                span = d.forward_end - d.forward_start
                return d.index, (when - d.forward_start) / span if span > 0 else 0.0
        return len(self.decisions), 0.0

    def store_schedule(self) -> StoreSchedule:
        """A new StoreSchedule (one per forward pass)."""
        return StoreSchedule(self)

    def summary(self) -> dict:
        """The plan as JSON-able numbers (for benchmark records)."""
        return {
            "tier": self.tier, "placement": [d.placement for d in self.decisions],
            "prefetch_scopes": self.prefetch_scopes, "peak_gib": self.peak_bytes / GiB,
            "keep_peak_gib": self.keep_peak_bytes / GiB, "peak_where": self.peak_where,
            "step_ms": self.step_seconds * 1e3, "keep_step_ms": self.keep_step_seconds * 1e3,
            "overhead_ms": self.overhead_seconds * 1e3, "allowed_overhead_ms": self.max_overhead_seconds * 1e3,
            "offloaded_gib": self.offloaded_bytes / GiB, "floor_gib": self.floor_bytes / GiB,
            "meets_budget": self.meets_budget,
            "scopes": [{"placement": d.placement, "gib": d.offload_bytes / GiB, "chosen_at": d.chosen_at,
                        "peak_after_gib": None if d.peak_after is None else d.peak_after / GiB,
                        "overhead_after_ms": None if d.overhead_after is None else d.overhead_after * 1e3,
                        "store_end_ms": None if d.store_end is None else d.store_end * 1e3,
                        "load_end_ms": None if d.load_end is None else d.load_end * 1e3,
                        "reason": d.reason} for d in self.decisions],
        }

    def explain(self) -> List[str]:
        """Lines saying what the plan does for each scope and why, and what it predicts."""
        ms = 1e3
        lines = [f"plan for the {self.tier} tier: {self.write_bandwidth / 1e9:.1f} GB/s out, "
                 f"{self.read_bandwidth / 1e9:.1f} GB/s in (less a {self.margin:.0%} margin); forward "
                 f"{self.forward_seconds * ms:.1f} ms, keep step {self.keep_step_seconds * ms:.1f} ms; prefetch "
                 f"{self.prefetch_scopes} scope(s) ahead"]
        for d in self.decisions:
            what = f"  scope {d.index} ({_name(d.module)}, {d.offload_bytes / GiB:.2f} GiB): {d.placement}"
            if d.chosen_at is not None:
                what += (f" [change {d.chosen_at}: peak -> {d.peak_after / GiB:.2f} GiB, step "
                         f"{d.overhead_after * ms:+.1f} ms]")
            if d.store_end is not None:
                what += (f"; store {d.store_start * ms:.1f}-{d.store_end * ms:.1f} ms (forward "
                         f"{d.forward_start * ms:.1f}-{d.forward_end * ms:.1f}), waited for at scope {d.due[0]} "
                         f"{d.due[1]:.0%}; load {d.load_start * ms:.1f}-{d.load_end * ms:.1f} ms (its backward at "
                         f"{d.backward_start * ms:.1f})")
            if d.reason:
                what += f"; {d.reason}"
            lines.append(what)
        budget = ""
        if self.memory_budget_bytes is not None:
            budget = (f"; budget {self.memory_budget_bytes / GiB:.2f} GiB "
                      f"{'met' if self.meets_budget else 'NOT met within the allowed step time'}")
        reduction = 1 - self.peak_bytes / self.keep_peak_bytes if self.keep_peak_bytes else 0.0
        lines.append(f"  predicted activation peak {self.peak_bytes / GiB:.2f} GiB of keep's "
                     f"{self.keep_peak_bytes / GiB:.2f} GiB ({reduction:.0%} lower, at {self.peak_where}); step "
                     f"{self.step_seconds * ms:.1f} ms ({self.overhead_seconds * ms:+.1f} ms, allowed "
                     f"+{self.max_overhead_seconds * ms:.1f}); offloaded {self.offloaded_bytes / GiB:.2f} GiB of the "
                     f"{self.floor_bytes / GiB:.2f} GiB the link moves during the forward{budget}")
        return lines


def _name(module) -> str:
    return type(module).__name__ if not isinstance(module, str) else module


# ---------------------------------------------------------------------------------------------------------------
# The timeline of one placement


@dataclasses.dataclass
class _Timeline:
    placement: List[str]
    prefetch: int
    peak: int
    peak_where: str
    step: float
    store_start: List[Optional[float]]
    store_end: List[Optional[float]]
    load_start: List[Optional[float]]
    load_end: List[Optional[float]]
    backward_start: List[float]
    late_store: Optional[int]  # an offloaded scope whose store ends after the forward pass


def simulate(profiles: Sequence[ScopeProfile], placement: Sequence[str], prefetch: int, write_bandwidth: float,
             read_bandwidth: float, backward_factor: float = 2.0, tail_bytes: int = 0) -> _Timeline:
    """The predicted timeline and activation peak of one placement (a list in scope order) with `prefetch` scopes
    of prefetch, at the given (already derated) bandwidths; tail_bytes are saved after the last scope (the loss)
    and resident at the end of the forward only. See the module docstring for the model."""
    n = len(profiles)
    fwd = [p.forward_seconds for p in profiles]
    size = [int(p.offload_bytes) for p in profiles]
    kept_input = [min(int(p.input_bytes), int(p.offload_bytes)) for p in profiles]
    bwd = [p.backward_seconds if p.backward_seconds is not None else backward_factor * p.forward_seconds
           for p in profiles]
    recompute = [p.recompute_seconds if p.recompute_seconds is not None else p.forward_seconds for p in profiles]
    offloaded = [where in ("host", "file") for where in placement]
    cache_work = [max(0.0, p.offload_seconds) for p in profiles]
    start = [sum(fwd[:j]) for j in range(n)]
    end = [start[j] + fwd[j] for j in range(n)]
    forward_total = end[-1] if n else 0.0

    # Stores, first in first out.
    store_start: List[Optional[float]] = [None] * n
    store_end: List[Optional[float]] = [None] * n
    link = 0.0
    late = None
    for j in range(n):
        if not offloaded[j]:
            continue
        store_start[j] = max(link, start[j])
        store_end[j] = link = max(store_start[j] + size[j] / write_bandwidth, end[j])
        if late is None and store_end[j] > forward_total * (1 + 1e-12):
            late = j

    def produced(j: int, t: float) -> float:
        if fwd[j] <= 0:
            return size[j] if t >= start[j] else 0.0
        return size[j] * min(1.0, max(0.0, (t - start[j]) / fwd[j]))

    def forward_resident(t: float) -> float:
        total = 0.0
        for j in range(n):
            if start[j] > t:
                break
            if placement[j] == "recompute":
                total += kept_input[j]
            elif not offloaded[j]:
                total += produced(j, t)
            elif t < store_end[j]:  # what is produced and not yet copied
                total += max(0.0, produced(j, t) - write_bandwidth * max(0.0, t - store_start[j]))
        return total

    # The resident bytes are piecewise linear in t: their largest value is at a break.
    breaks = set(start) | set(end)
    for j in range(n):
        if offloaded[j]:
            breaks |= {store_start[j], store_end[j]}
            rate = size[j] / fwd[j] if fwd[j] > 0 else math.inf
            if rate < write_bandwidth:  # where the link, started late, catches up with the production
                breaks.add((write_bandwidth * store_start[j] - rate * start[j]) / (write_bandwidth - rate))
    peak, peak_where = 0.0, "start"
    for t in sorted(b for b in breaks if 0 <= b <= forward_total):
        resident = forward_resident(t) + (tail_bytes if t >= forward_total else 0)
        if resident > peak + 0.5:
            peak, peak_where = resident, "end of the forward" if t >= forward_total else f"forward {t * 1e3:.1f} ms"

    # Backward, scope n-1 first; entering scope k queues the loads of the offloaded scopes k .. k-prefetch.
    load_start: List[Optional[float]] = [None] * n
    load_end: List[Optional[float]] = [None] * n
    backward_start = [0.0] * n
    t = forward_total
    read_link = forward_total
    kept_below = [0] * (n + 1)  # kept bytes of scopes < k (recomputed: their inputs)
    for j in range(n):
        kept_below[j + 1] = kept_below[j] + (kept_input[j] if placement[j] == "recompute" else
                                             0 if offloaded[j] else size[j])
    loaded_resident = 0
    for k in range(n - 1, -1, -1):
        for j in range(k, max(-1, k - prefetch - 1), -1):
            if offloaded[j] and load_start[j] is None:
                load_start[j] = max(read_link, t, store_end[j])
                load_end[j] = read_link = load_start[j] + size[j] / read_bandwidth
                loaded_resident += size[j]
        if offloaded[k]:
            t = max(t, load_end[k])
        backward_start[k] = t
        resident = kept_below[k + 1] + loaded_resident
        if placement[k] == "recompute":
            resident += size[k] - kept_input[k]
        if resident > peak + 0.5:
            peak, peak_where = resident, f"the backward of scope {k}"
        t += bwd[k] + (recompute[k] if placement[k] == "recompute" else cache_work[k] if offloaded[k] else 0.0)
        if offloaded[k]:
            loaded_resident -= size[k]
    return _Timeline(list(placement), prefetch, int(round(peak)), peak_where, t, store_start, store_end, load_start,
                     load_end, backward_start, late)


# ---------------------------------------------------------------------------------------------------------------
# The planner


def plan_placement(profiles: Sequence[ScopeProfile], write_bandwidth: float, read_bandwidth: Optional[float] = None,
                   tier: str = "host", backward_factor: float = 2.0, max_overhead: float = 0.05,
                   memory_budget_bytes: Optional[int] = None, fixed: Optional[Mapping[Any, str]] = None,
                   margin: float = 0.05, recompute: bool = True, max_prefetch: int = 8, tail_bytes: int = 0) -> Plan:
    """Adaptive offloading (SSDTrain, Sec. "Adaptive Offloading", extended with recomputation): the placement per
    scope with the lowest predicted activation peak whose step is at most max_overhead (a fraction of keep's
    predicted step) longer, found greedily (module docstring). write/read_bandwidth: bytes/s of the tier, each
    taken `margin` lower. memory_budget_bytes: stop lowering the peak once it fits. fixed: {module: placement}
    that the planner leaves as given (manual override; what they cost in step time is allowed on top).
    recompute=False: keep or offload only. tail_bytes: what the step saves after the last scope (the loss; the
    cache's last_tail_bytes), resident with the kept scopes at the end of the forward: keeping the last scope and
    recomputing it are not the same peak when it is large."""
    if tier not in ("host", "file"):
        raise ValueError(f"tier must be 'host' or 'file', got {tier!r}")
    if not write_bandwidth or write_bandwidth <= 0:
        raise ValueError("write_bandwidth must be positive (bytes per second)")
    if max_overhead < 0 or not 0 <= margin < 1:
        raise ValueError("max_overhead must be >= 0 and margin in [0, 1)")
    fixed = dict(fixed or {})
    for module, where in fixed.items():
        if where not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {where!r}")
    read_bandwidth = read_bandwidth or write_bandwidth
    write, read = write_bandwidth * (1 - margin), read_bandwidth * (1 - margin)
    n = len(profiles)
    modules = [p.module for p in profiles]
    fixed_index = {j: fixed[m] for j, m in enumerate(modules) if m in fixed}

    def evaluate(placement: List[str]) -> _Timeline:
        """The best prefetch depth for this placement: the lowest peak (with a budget: down to the budget) within
        the allowed step, then the shortest step; over the allowed step, the shortest step."""
        best, best_key = None, None
        for depth in range(0, max(1, min(max_prefetch, n - 1) + 1)):
            timeline = simulate(profiles, placement, depth, write, read, backward_factor, tail_bytes)
            over = timeline.step - keep_step > allowed * (1 + 1e-9)
            if memory_budget_bytes is None:
                key = (timeline.late_store is not None, over, timeline.step if over else 0.0, timeline.peak,
                       timeline.step, depth)
            else:  # within the budget, the shortest step
                key = (timeline.late_store is not None, over, timeline.step if over else 0.0,
                       max(0, timeline.peak - memory_budget_bytes), timeline.step, timeline.peak, depth)
            if best_key is None or key < best_key:
                best, best_key = timeline, key
            if not any(where in ("host", "file") for where in placement):
                break  # the depth does not matter
        return best

    keep_timeline = simulate(profiles, ["keep"] * n, 0, write, read, backward_factor, tail_bytes)
    keep_step = keep_timeline.step
    placement = ["keep"] * n
    for j, where in fixed_index.items():
        placement[j] = where
    # The allowance is on top of what the caller's fixed placements cost.
    fixed_step = min(simulate(profiles, placement, depth, write, read, backward_factor, tail_bytes).step
                     for depth in range(0, max(1, min(max_prefetch, n - 1) + 1)))
    allowed = max_overhead * keep_step + max(0.0, fixed_step - keep_step)
    current = evaluate(placement)
    forward_total = sum(p.forward_seconds for p in profiles)
    free = [j for j in range(n) if j not in fixed_index]
    choices = ["keep", tier] + (["recompute"] if recompute else [])

    def why_not(timeline: _Timeline, target: str) -> Optional[str]:
        """Why a changed placement is not acceptable (None: it is)."""
        doing = "recomputing" if target == "recompute" else "offloading" if target == tier else "keeping"
        if timeline.late_store is not None:
            late = timeline.late_store
            return (f"offloading it: the store of scope {late} would end at {timeline.store_end[late] * 1e3:.1f} ms, "
                    f"after the forward ({forward_total * 1e3:.1f} ms)")
        overhead = timeline.step - keep_step
        if overhead > allowed * (1 + 1e-9):
            return f"{doing} it: step {overhead * 1e3:+.1f} ms > allowed +{allowed * 1e3:.1f} ms"
        return None

    def scan(placement: List[str], current: _Timeline):
        """The best single change that lowers the peak (least added step per byte, then the largest gain, then the
        earliest scope), and why each other change was not made."""
        best, best_key, rejected = None, None, {}
        for j in free:
            moves = {"keep": [tier] + (["recompute"] if recompute else []),
                     tier: ["recompute"] if recompute else []}.get(placement[j], [])
            for target in moves:
                trial = list(placement)
                trial[j] = target
                timeline = evaluate(trial)
                reason = why_not(timeline, target)
                if reason is None and timeline.peak >= current.peak:
                    reason = (f"{'recomputing' if target == 'recompute' else 'offloading'} it would not lower the "
                              f"peak (at {timeline.peak_where})")
                if reason is not None:
                    rejected.setdefault(j, []).append(reason)
                    continue
                gain = current.peak - timeline.peak
                key = (max(0.0, timeline.step - current.step) / gain, -gain, j, target != tier)
                if best_key is None or key < best_key:
                    best, best_key = (j, target, timeline), key
        return best, rejected

    def better(a: _Timeline, b: _Timeline) -> bool:
        """Objective: the lowest peak (with a budget: down to the budget, then the shortest step, then the fewest
        scopes not kept: a budget that keep's peak meets gives keep everywhere)."""
        def key(t):
            if memory_budget_bytes is None:
                return (t.peak, round(t.step, 12))
            changed = sum(where != "keep" for where in t.placement)
            return (max(0, t.peak - memory_budget_bytes), round(t.step, 12), changed, t.peak)
        return key(a) < key(b)

    chosen: Dict[int, Tuple[int, int, float]] = {}
    step_number = 0
    # Greedy: one change at a time.
    while memory_budget_bytes is None or current.peak > memory_budget_bytes:
        best, _ = scan(placement, current)
        if best is None:
            break
        j, target, current = best
        placement[j] = target
        step_number += 1
        chosen[j] = (step_number, current.peak, current.step - keep_step)
    # Then a local search over changes of one or two scopes (two only for small stacks: n^2 placements each).
    improved = True
    while improved:
        improved = False
        groups = [(j,) for j in free] + ([(i, j) for i in free for j in free if i < j] if len(free) <= 12 else [])
        for group in groups:
            for targets in itertools.product(choices, repeat=len(group)):
                if all(placement[j] == t for j, t in zip(group, targets)):
                    continue
                trial = list(placement)
                for j, target in zip(group, targets):
                    trial[j] = target
                timeline = evaluate(trial)
                if any(why_not(timeline, t) for t in targets) or not better(timeline, current):
                    continue
                placement, current, improved = trial, timeline, True
                step_number += 1
                for j in group:
                    chosen[j] = (step_number, current.peak, current.step - keep_step)
                break
            if improved:
                break
    _, rejected = scan(placement, current)

    decisions = []
    start = 0.0
    for j, profile in enumerate(profiles):
        decision = ScopeDecision(j, profile.module, placement[j], int(profile.offload_bytes), start,
                                 start + profile.forward_seconds, backward_start=current.backward_start[j])
        start += profile.forward_seconds
        if placement[j] in ("host", "file"):
            decision.store_start, decision.store_end = current.store_start[j], current.store_end[j]
            decision.load_start, decision.load_end = current.load_start[j], current.load_end[j]
        if j in chosen:
            decision.chosen_at, decision.peak_after, decision.overhead_after = chosen[j]
        if j in fixed_index:
            decision.reason = "fixed by the caller"
        elif placement[j] == "keep" or (placement[j] == tier and j in rejected):
            decision.reason = ("kept: " if placement[j] == "keep" else "not recomputed: ") + "; ".join(
                rejected.get(j, ["the budget is met"]))
        decisions.append(decision)
    offloaded = sum(p.offload_bytes for p, where in zip(profiles, placement) if where in ("host", "file"))
    total = sum(int(p.offload_bytes) for p in profiles)
    plan = Plan(
        {p.module: where for p, where in zip(profiles, placement)}, decisions=decisions, tier=tier,
        prefetch_scopes=current.prefetch, peak_bytes=current.peak, peak_where=current.peak_where,
        backward_factor=backward_factor, keep_peak_bytes=keep_timeline.peak, step_seconds=current.step,
        keep_step_seconds=keep_step,
        overhead_seconds=current.step - keep_step, max_overhead_seconds=allowed, forward_seconds=forward_total,
        write_bandwidth=write_bandwidth, read_bandwidth=read_bandwidth, margin=margin,
        offloaded_bytes=offloaded, floor_bytes=min(total, write_bandwidth * forward_total),
        memory_budget_bytes=memory_budget_bytes, tail_bytes=tail_bytes,
        meets_budget=memory_budget_bytes is None or current.peak <= memory_budget_bytes,
        # No throttling beyond the plan's own waits: the stores the plan makes are the ones the link keeps up with.
        max_inflight_bytes=max(offloaded, 1 << 20))
    for decision in decisions:
        if decision.store_end is not None:
            decision.due = plan.position(decision.store_end)
    return plan


class StoreSchedule:
    """The predicted end of each store of one forward pass, tensor by tensor, as a due point (scope index, fraction
    of that scope's saved bytes): TensorCache waits for a store when its forward pass reaches that point, so that
    the memory the store frees is free, in the allocator's (CPU) order, before what the forward allocates next. The
    link is first in, first out at the measured write bandwidth (the margin is for choosing what to offload: waiting
    later than needed keeps memory, earlier stalls the GPU by the error); a tensor is copied once produced."""

    def __init__(self, plan: "Plan"):
        self._plan = plan
        self._link = 0.0

    def store(self, index: int, offset_bytes: int, nbytes: int) -> Tuple[int, float]:
        """Due point of a store of nbytes that scope `index` saved after offset_bytes of its own."""
        produced = self._plan.forward_time(index, (offset_bytes + nbytes) / max(1, self._plan.scope_size(index)))
        self._link = max(self._link, produced) + nbytes / self._plan.write_bandwidth
        return self._plan.position(self._link)


def brute_force(profiles: Sequence[ScopeProfile], write_bandwidth: float, read_bandwidth: Optional[float] = None,
                tier: str = "host", backward_factor: float = 2.0, max_overhead: float = 0.05,
                margin: float = 0.05, max_prefetch: int = 8, tail_bytes: int = 0) -> Tuple[int, List[str]]:
    """The lowest predicted peak over every placement (3^n: small n only, for tests) within the allowed step, with
    no store ending after the forward pass: (peak, placement)."""
    read_bandwidth = read_bandwidth or write_bandwidth
    write, read = write_bandwidth * (1 - margin), read_bandwidth * (1 - margin)
    n = len(profiles)
    keep_step = simulate(profiles, ["keep"] * n, 0, write, read, backward_factor, tail_bytes).step
    best = (math.inf, None)
    for placement in itertools.product(("keep", tier, "recompute"), repeat=n):
        for depth in range(0, max(1, min(max_prefetch, n - 1) + 1)):
            timeline = simulate(profiles, list(placement), depth, write, read, backward_factor, tail_bytes)
            if timeline.late_store is None and timeline.step - keep_step <= max_overhead * keep_step * (1 + 1e-9):
                best = min(best, (timeline.peak, list(placement)), key=lambda b: b[0])
    return best
