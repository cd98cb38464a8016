"""The BFC pool replay (``cost_models.pool``): its invariants on random allocation sequences, and the cases
measured on TensorFlow workers."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.pool import (FIRST_REGION, MAX_INTERNAL_FRAGMENTATION, MIN_ALLOCATION, SMALL_ALLOCATION, BFCPool,
                              replay_pool)

MiB = 1 << 20


def _check(pool: BFCPool, live: dict) -> None:
    """Every region is tiled by its chunks; the free ones are listed and never adjacent; in use is the sum of
    the chunks handed out, each at least its request rounded."""
    in_use = 0
    for r, chunks in enumerate(pool._regions):
        assert chunks[0][0] == 0
        for a, b in zip(chunks, chunks[1:]):
            assert a[0] + a[1] == b[0]
            assert not (a[2] is None and b[2] is None), "two free neighbours were not merged"
        in_use += sum(c[1] for c in chunks if c[2] is not None)
    assert in_use == pool.in_use
    assert sum(c[1] for chunks in pool._regions for c in chunks) == pool.reserved <= pool.limit
    free = sorted((c[1], -r, c[0]) for r, chunks in enumerate(pool._regions) for c in chunks if c[2] is None)
    assert free == pool._free
    for key, nbytes in live.items():
        held = pool._held[key]
        if nbytes < SMALL_ALLOCATION:
            assert held == nbytes
            continue
        r, offset = held
        (chunk,) = [c for c in pool._regions[r] if c[0] == offset]
        assert chunk[1] >= math.ceil(nbytes / MIN_ALLOCATION) * MIN_ALLOCATION
    assert pool.small == pytest.approx(sum(b for b in live.values() if b < SMALL_ALLOCATION))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 300 * MiB)), max_size=60),
       st.one_of(st.just(math.inf), st.integers(64 * MiB, 2048 * MiB)))
def test_the_pool_keeps_its_regions_tiled_and_refuses_only_without_room(steps, limit):
    """Random allocations and frees (a free takes the oldest live key): after each, the pool's invariants
    hold; a refused request had no free chunk as large and no room left under the limit for it; freeing
    everything leaves each region one free chunk."""
    pool, live, n = BFCPool(limit), {}, 0
    for alloc, nbytes in steps:
        if alloc or not live:
            key, n = n, n + 1
            largest = max((c[0] for c in pool._free), default=0)
            room = pool.limit - pool.reserved
            if pool.allocate(key, nbytes):
                live[key] = nbytes
            else:
                rounded = math.ceil(nbytes / MIN_ALLOCATION) * MIN_ALLOCATION
                assert nbytes >= SMALL_ALLOCATION and largest < rounded and room < rounded
        else:
            key = next(iter(live))
            pool.free(key)
            del live[key]
        _check(pool, live)
        assert pool.bytes >= sum(live.values())
    for key in list(live):
        pool.free(key)
    _check(pool, {})
    assert pool.in_use == 0 and pool.small == pytest.approx(0)
    assert all(len(chunks) == 1 for chunks in pool._regions)


def test_regions_double_and_chunks_split_as_tensorflow_s_bfc_allocator():
    """The cases measured and derived on TF 2.21 workers (oneDNN's ``mklcpu`` pool)."""
    # three 53.3 MiB shards on a fresh pool: chunks of 64, 64 and 53.3 MiB (the first two whole: less than
    # twice the request and under 128 MiB of waste) -- the allocator reported 181.3 MiB in use
    shard = 218_453 * 64 * 4
    use = replay_pool([(name, shard) for name in ("table", "m", "v")])
    assert use.peak_bytes == 2 * 64 * MiB + math.ceil(shard / MIN_ALLOCATION) * MIN_ALLOCATION
    assert round(use.peak_bytes / MiB, 1) == 181.3 and use.reserved_bytes == (64 + 64 + 128) * MiB
    # a chunk wasting 128 MiB or more is split however large the request
    pool = BFCPool()
    assert pool.allocate("a", 300 * MiB) and pool.in_use == 300 * MiB and pool.reserved == 512 * MiB
    assert MAX_INTERNAL_FRAGMENTATION == 128 * MiB and FIRST_REGION == 2 * MiB
    # a region never holds two tensors' bytes across its end: 628 MiB free in three chunks, none 275 MiB
    tight = replay_pool([(i, 275 * MiB) for i in range(5)], limit=1728 * MiB)
    assert (tight.failed, tight.failed_bytes, tight.reserved_bytes) == (4, 275 * MiB, 1728 * MiB)
    # small requests go to malloc: counted, outside the pool
    small = replay_pool([("s", 100), ("t", SMALL_ALLOCATION - 1)])
    assert small.peak_bytes == 100 + SMALL_ALLOCATION - 1 and small.reserved_bytes == 0
    pool = BFCPool()
    pool.allocate("x", 1)
    with pytest.raises(ValueError, match="allocated already"):
        pool.allocate("x", 1)
    with pytest.raises(ValueError, match="positive"):
        BFCPool(0)


SHARD = 218_453 * 64 * 4  # 53.3 MiB: a table's half with Adam's two moments beside it


def _update_step():
    """Three resident shards (nodes 0-2) and a shard-sized gradient (node 3 to node 4)."""
    import numpy as np

    from cost_models import MemoryTraits, TensorEdge

    return (np.ones((5, 1)), [TensorEdge(3, (4,), float(SHARD))],
            MemoryTraits(resident_bytes=[SHARD, SHARD, SHARD, 0.0, 0.0]))


def test_a_pooled_device_peaks_at_what_its_pool_holds_and_over_its_limit_where_the_pool_cannot_serve():
    """The simulator's peak of a device with a pool (``SimOptions.memory_pools``) is the pool's chunks in use:
    the gradient takes the third region's whole 74.7 MiB rest (256 MiB, where the tensors are 213.3 MiB).
    Under a 240 MiB limit the third region is 112 MiB and fits (240 MiB in use); under 230 MiB it is 102 MiB,
    takes the third shard whole, and the gradient finds neither a chunk nor room: the limit plus its bytes."""
    import numpy as np

    from cost_models import SimOptions, simulate

    durations, tensors, memory = _update_step()
    a = np.zeros(5, dtype=int)
    plain = simulate(durations, tensors, a, lambda i, j, b: 0.0, memory=memory, options=SimOptions(peak_memory=True))
    assert plain.peak_memory_bytes[0] == 4 * SHARD
    peaks = {limit: simulate(durations, tensors, a, lambda i, j, b: 0.0, memory=memory,
                             options=SimOptions(peak_memory=True, memory_pools=(limit,))).peak_memory_bytes[0]
             for limit in (math.inf, 240 * MiB, 230 * MiB)}
    assert peaks == {math.inf: 256 * MiB, 240 * MiB: 240 * MiB, 230 * MiB: 230 * MiB + SHARD}
    # every way of simulating keeps the pool: with transfer costs (gRPC workers), shared processors, in lifo
    for extra in (dict(transfer_cpu_s=np.zeros((1, 1))), dict(shared=(((0,), 1.0),)), dict(ready_order="lifo")):
        options = SimOptions(peak_memory=True, memory_pools=(math.inf,), **extra)
        assert simulate(durations, tensors, a, lambda i, j, b: 0.0, memory=memory,
                        options=options).peak_memory_bytes[0] == 256 * MiB, extra
    with pytest.raises(ValueError, match="memory_pools has 2 entries for 1 devices"):
        simulate(durations, tensors, a, lambda i, j, b: 0.0, memory=memory,
                 options=SimOptions(peak_memory=True, memory_pools=(1.0, 1.0)))


def _step_graph():
    """:func:`_update_step` as a graph for ``placer.solve``: three resident shards, a shard-sized gradient."""
    import networkx as nx

    g = nx.DiGraph()
    for v in "abc":
        g.add_node(v, compute_us=1.0, memory_bytes=SHARD)
    g.add_node("grad", compute_us=1.0)
    g.add_node("update", compute_us=1.0)
    g.add_edge("grad", "update", bytes=SHARD)
    return g


def test_a_plan_on_pooled_devices_is_refused_where_only_the_tensors_would_fit():
    """``placer.solve`` with ``DeviceSpec(memory_pool_bytes=)``: 250 MiB holds the step's 213.3 MiB of tensors
    but not the 256 MiB of chunks its pool hands out, and a pool capped at 230 MiB cannot serve the step at
    all, so one device is refused either way (the same device without a pool is not); two devices place it,
    each peak within its memory."""
    import numpy as np

    import placer
    from placer.errors import InsufficientMemoryError

    g = _step_graph()
    cap = 250 * MiB
    plain = placer.solve(g, [placer.DeviceSpec("/CPU:0", memory_bytes=cap)], memory="peak")
    assert plain.predicted_peak_memory_bytes == (4 * SHARD,)
    for pool in (1 << 40, 230 * MiB):
        with pytest.raises(InsufficientMemoryError, match=r"(?s)over.*BFC allocator pool.*Add devices"):
            placer.solve(g, [placer.DeviceSpec("/CPU:0", memory_bytes=cap, memory_pool_bytes=pool)], memory="peak")
    two = placer.solve(g, [placer.DeviceSpec(f"/CPU:{i}", memory_bytes=cap, memory_pool_bytes=230 * MiB)
                           for i in range(2)], memory="peak")
    assert max(two.predicted_peak_memory_bytes) <= cap
    with pytest.raises(placer.DeviceError, match="memory_pool_bytes"):
        placer.DeviceSpec("/CPU:0", memory_pool_bytes=0)
    from placer.core.problem import PlacementProblem
    from placer.errors import GraphError

    arrays = dict(names=["a"], compute_s=np.ones((1, 2)), memory_bytes=np.zeros(1), capacity_bytes=np.full(2, 1.0),
                  tensors=[], bandwidth=np.full((2, 2), 1e9), latency=np.zeros((2, 2)))
    for pools in ((1.0,), (0.0, None)):  # one per device, each positive or None
        with pytest.raises(GraphError, match="memory_pools must be empty or one positive limit"):
            PlacementProblem.build(**arrays, memory_pools=pools)
    assert PlacementProblem.build(**arrays, memory_pools=(None, 8.0)).memory_pools == (None, 8.0)


def test_pool_caps_travel_in_graph_files_and_the_cli_plans_with_them(tmp_path, capsys):
    """``memory_pool_bytes`` is kept by a graph file's devices, and ``autoplace plan-graph --memory-pool-bytes``
    replays the pools: the step that fits 250 MiB as tensors is refused once its pool is replayed."""
    import placer
    from placer.cli import main as cli_main
    from placer.core.graph_io import load_graph, save_graph

    g = _step_graph()
    path = tmp_path / "step.json"
    save_graph(path, g, [placer.DeviceSpec("/CPU:0", memory_bytes=250 * MiB, memory_pool_bytes=1 << 40)])
    (device,) = load_graph(path)[1].devices
    assert (device.memory_bytes, device.memory_pool_bytes) == (250 * MiB, 1 << 40)
    assert cli_main(["plan-graph", str(path), "--memory", "peak", "-q"]) == 2  # the file's pool: refused
    assert "BFC allocator pool" in capsys.readouterr().err
    base = ["plan-graph", str(path), "--devices", "/CPU:0", "--memory-bytes", str(250 * MiB), "--memory", "peak",
            "-q"]
    assert cli_main(base) == 0
    assert cli_main([*base, "--memory-pool-bytes", str(1 << 40)]) == 2
    assert "BFC allocator pool" in capsys.readouterr().err
    assert cli_main(["plan-graph", str(path), "--memory-pool-bytes", "1000", "-q"]) == 2
    assert "--devices" in capsys.readouterr().err


def test_a_tensor_freed_the_moment_it_is_made_holds_nothing_in_the_pool():
    """A zero-time op's output that nothing reads is made and freed at one moment (its free would sort before its
    allocation among the simulated events): it gets no events, so the pool replay never frees what it did not
    allocate."""
    import numpy as np

    from cost_models import MemoryTraits, SimOptions, TensorEdge, simulate

    durations = np.array([[0.0], [1.0]])
    tensors = [TensorEdge(0, (), float(SHARD)), TensorEdge(1, (), float(SHARD))]
    r = simulate(durations, tensors, np.zeros(2, dtype=int), lambda i, j, b: 0.0, memory=MemoryTraits(),
                 options=SimOptions(peak_memory=True, memory_pools=(math.inf,)))
    assert r.peak_memory_bytes[0] == 64 * MiB  # node 1's output alone, in a 64 MiB chunk


def test_what_ran_before_on_a_pool_decides_whether_a_large_shard_splits_its_region():
    """A 360 MiB shard on a worker whose pool is capped at 528 MiB (the SGD recommender's): on a fresh pool it
    takes 360 MiB of a 512 MiB region (the 152 MiB rest is split off); after the link calibration's payloads
    (``calibration_pool_events``: 62 MiB of regions) it takes the 466 MiB region the cap leaves whole, as
    its allocator reported on the workers; after a profile that also held a 64 MiB stand-in table there
    (``profile_pool_events``), 400 MiB (measured: 404 MiB in use with the small requests); after a 40 MiB weight
    copied there and dropped (``written_weight_events``), 400 MiB, and after a 100 MiB one nothing (measured: out
    of memory). The history reaches
    the simulator through the device set and the problem, and only for the devices whose pool is replayed."""
    import networkx as nx
    import numpy as np

    from placer.core.build import build_problem
    from placer.core.devices import DeviceSpec, resolve_devices
    from placer.errors import DeviceError
    from placer.measure.links import calibration_pool_events
    from placer.tf.costs import profile_pool_events

    from cost_models.pool import written_weight_events

    calibration = calibration_pool_events(("link calibration", 0, 1))
    stand_in = profile_pool_events({"table:0": np.zeros(16 * MiB, np.float32)})
    copied = {size: written_weight_events("copies", {"w": size * MiB}, 16 * MiB) for size in (40, 100)}
    g = nx.DiGraph()
    g.add_node("shard", compute_us=1.0, memory_bytes=360 * MiB)
    g.add_node("gather", compute_us=1.0)
    g.add_edge("shard", "gather", bytes=1024)
    specs = [DeviceSpec(f"/CPU:{i}", memory_bytes=1 << 30, memory_pool_bytes=528 * MiB) for i in range(2)]
    peaks = []
    for history in ((), calibration, [*stand_in, *calibration], copied[40], copied[100]):
        devset = resolve_devices(specs)
        if history:
            devset = devset.with_pool_events(1, history)
        built = build_problem(g, devset)
        assert built.problem.symmetric == (not history)
        peaks.append(built.simulate(np.array([1, 1])).peak_memory_bytes[1] / MiB)
    # after a 100 MiB weight copied and dropped (two 128 MiB regions) the pool cannot serve the shard: its cap
    # plus the shard, as the worker ran out of memory there
    assert [round(p) for p in peaks] == [360, 466, 400, 400, 528 + 360]
    # a device without a pool replays nothing: its peak is the shard
    plain = resolve_devices([DeviceSpec("/CPU:0"), DeviceSpec("/CPU:1")]).with_pool_events(1, calibration)
    assert plain.memory_pool_history() == ()
    assert build_problem(g, plain).simulate(np.array([1, 1])).peak_memory_bytes[1] == 360 * MiB + 1024
    with pytest.raises(DeviceError, match="no device 2"):
        plain.with_pool_events(2, calibration)
