"""The discrete-event simulator on hand-built graphs with known answers."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import MemoryTraits, SimOptions, TensorEdge, simulate
from placer.core.order import order_edges, timeline_order


def link(lat=0.0, bw=1.0):
    return lambda i, j, b: lat + b / bw


def test_chain_across_devices_pays_one_transfer():
    d = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    es = [TensorEdge(0, (1,), 4.0), TensorEdge(1, (2,), 0.0)]
    r = simulate(d, es, [0, 1, 1], link(lat=0.5, bw=2.0))
    assert r.step_time_s == pytest.approx(1 + (0.5 + 2.0) + 2 + 3)
    assert r.link_bytes[0, 1] == 4.0 and r.link_bytes.sum() == 4.0


def test_diamond_runs_branches_in_parallel_on_two_devices():
    d = np.ones((4, 2)) * np.array([[1.0], [5.0], [5.0], [1.0]])
    es = [TensorEdge(0, (1, 2), 0.0), TensorEdge(1, (3,), 0.0), TensorEdge(2, (3,), 0.0)]
    assert simulate(d, es, [0, 0, 0, 0], link()).step_time_s == pytest.approx(12.0)
    assert simulate(d, es, [0, 0, 1, 0], link()).step_time_s == pytest.approx(7.0)


def test_fan_out_sends_once_per_device():
    d = np.ones((4, 2))
    es = [TensorEdge(0, (1, 2, 3), 10.0)]
    r = simulate(d, es, [0, 1, 1, 1], link(bw=10.0))
    assert r.link_bytes[0, 1] == 10.0
    assert len(r.transfers) == 1


def test_link_contention_serialises_transfers():
    # Two producers on device 0 send 10 s transfers to two consumers on device 1.
    d = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    es = [TensorEdge(0, (2,), 10.0), TensorEdge(1, (3,), 10.0)]
    r = simulate(d, es, [0, 0, 1, 1], link(bw=1.0))
    # op0 ends 1, transfer 1..11; op1 ends 2, waits for the link: 11..21.
    assert r.step_time_s == pytest.approx(21.0)


def test_control_edges_order_without_data():
    d = np.array([[2.0, 2.0], [1.0, 1.0]])
    r = simulate(d, [], [0, 1], link(lat=100.0), control_edges=[(0, 1)])
    assert r.step_time_s == pytest.approx(3.0)


def test_concurrency_two_overlaps_independent_ops():
    d = np.array([[3.0], [3.0]])
    assert simulate(d, [], [0, 0], link(), options=SimOptions(concurrency=2)).step_time_s == pytest.approx(3.0)
    assert simulate(d, [], [0, 0], link()).step_time_s == pytest.approx(6.0)


def two_towers_feeding_a_second_device():
    # s -> x0 -> x1 -> x2 and s -> y0 -> y1 -> y2; x2 and y2 (3 s each) on device 1, the rest (1 s) on 0
    d = np.array([[0.0], [1.0], [1.0], [1.0], [1.0], [3.0], [3.0]]) * np.ones((1, 2))
    es = [TensorEdge(0, (1, 2), 0.0), TensorEdge(1, (3,), 0.0), TensorEdge(2, (4,), 0.0),
          TensorEdge(3, (5,), 0.0), TensorEdge(4, (6,), 0.0)]
    return d, es, [0, 0, 0, 0, 0, 1, 1]


def test_fifo_runs_ready_ops_breadth_first():
    # device 0: x0 0-1, y0 1-2, x1 2-3, y1 3-4; device 1: x2 3-6, y2 6-9
    d, es, a = two_towers_feeding_a_second_device()
    r = simulate(d, es, a, link())  # the default
    assert r.step_time_s == pytest.approx(9.0)
    assert [v for v, dev, *_ in r.timeline if dev == 0] == [0, 1, 2, 3, 4]


def test_lifo_runs_ops_that_take_no_time_before_the_depth_first_chain():
    # TensorFlow's executor runs a finished op's inexpensive successors inline before any expensive one: a
    # zero-time op (a shape computation, a pipeline's gate) ready with a chain does not wait at the bottom of
    # the stack until the chain ends. Device 0: a -> b (1 s each) and z (no time), whose consumer c (1 s) runs
    # on device 1: c starts at 0, not after b.
    d = np.array([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    es = [TensorEdge(0, (1,), 4.0), TensorEdge(2, (3,), 4.0)]
    for cpu in (None, np.zeros((2, 2))):
        r = simulate(d, es, [0, 0, 0, 1], link(bw=np.inf), options=SimOptions(ready_order="lifo", transfer_cpu_s=cpu))
        start = {v: s for v, _, s, _ in r.timeline}
        assert start[2] == 0.0 and start[3] == 0.0 and r.step_time_s == 2.0, r.timeline


def test_a_fed_input_reaches_another_device_without_queueing_behind_its_own_devices_ops():
    # a model input x (node 0, no time) on device 0 feeds a 3 s op there (1) and a 3 s op on device 1 (2); on
    # one-thread workers (lifo, transfer ops of 0.1 s each end) x's send queues behind op 1, so op 2 starts
    # after it. The caller feeds a function's arguments to each device that consumes them (SimOptions.fed):
    # then op 2 starts after the link (0.5 s) and its receive op (0.1 s), and the step ends when op 1 does.
    d = np.array([[0.0, 0.0], [3.0, 3.0], [3.0, 3.0]])
    es = [TensorEdge(0, (1, 2), 1.0)]
    cpu = np.full((2, 2), 0.1)
    queued = simulate(d, es, [0, 0, 1], link(lat=0.5, bw=np.inf),
                      options=SimOptions(ready_order="lifo", transfer_cpu_s=cpu))
    fed = simulate(d, es, [0, 0, 1], link(lat=0.5, bw=np.inf),
                   options=SimOptions(ready_order="lifo", transfer_cpu_s=cpu, fed=frozenset({0})))
    start = {v: s for v, _, s, _ in fed.timeline}
    assert {v: s for v, _, s, _ in queued.timeline}[2] >= 3.0
    assert start[1] == 0.0 and start[2] == pytest.approx(0.6) and fed.step_time_s == pytest.approx(3.6)
    assert fed.busy_s[0] == pytest.approx(3.0) and fed.busy_s[1] == pytest.approx(3.1)  # no send op on 0
    assert [t[:3] for t in fed.transfers] == [(0, 0, 1)]  # the tensor still crosses once
    # without transfer ops the option changes nothing (sends take no device time there)
    assert simulate(d, es, [0, 0, 1], link(lat=0.5, bw=np.inf), options=SimOptions(
        ready_order="lifo", fed=frozenset({0}))).step_time_s == simulate(
        d, es, [0, 0, 1], link(lat=0.5, bw=np.inf), options=SimOptions(ready_order="lifo")).step_time_s


def test_lifo_runs_the_latest_ready_op_first_depth_first_like_tensorflows_executor():
    # device 0: x0 0-1, x1 1-2 (ready last), y0 2-3, y1 3-4; device 1: x2 2-5, y2 5-8
    d, es, a = two_towers_feeding_a_second_device()
    r = simulate(d, es, a, link(), options=SimOptions(ready_order="lifo"))
    assert r.step_time_s == pytest.approx(8.0)
    assert [v for v, dev, *_ in r.timeline if dev == 0] == [0, 1, 3, 2, 4]
    # the same through the transfer-op path, and a bad order is named
    assert simulate(d, es, a, link(), options=SimOptions(transfer_cpu_s=np.zeros((2, 2)), ready_order="lifo")).step_time_s == 8.0
    with pytest.raises(ValueError, match="ready_order"):
        simulate(d, es, a, link(), options=SimOptions(ready_order="random"))


def test_priority_runs_the_most_urgent_ready_op_first_and_needs_plain_simulation():
    """``a`` (1 s) feeds ``c`` (2 s); ``b`` (1.5 s) is independent; one device. Ready order runs ``b``
    (ready at 0) before ``c``; by priority ``c`` (the longer way to the end) goes first, ``b`` last."""
    d = np.array([[1.0], [1.5], [2.0]])
    es = [TensorEdge(0, (2,), 1.0)]
    fifo = simulate(d, es, [0, 0, 0], link())
    assert [v for v, *_ in fifo.timeline] == [0, 1, 2]
    by_priority = simulate(d, es, [0, 0, 0], link(), options=SimOptions(ready_order="priority", priority=[3, 1.5, 2]))
    assert [v for v, *_ in by_priority.timeline] == [0, 2, 1]
    assert [v for v, *_ in simulate(d, es, [0, 0, 0], link(), options=SimOptions(
        ready_order="priority", priority=[3, 9, 2])).timeline] == [1, 0, 2]  # b outranks a: both ready at 0
    with pytest.raises(ValueError, match="one finite number per node"):
        simulate(d, es, [0, 0, 0], link(), options=SimOptions(ready_order="priority"))
    with pytest.raises(ValueError, match="one finite number per node"):
        simulate(d, es, [0, 0, 0], link(), options=SimOptions(ready_order="priority", priority=[1, float("nan"), 2]))
    with pytest.raises(ValueError, match="without shared processors"):
        simulate(np.ones((3, 2)), es, [0, 1, 0], link(), options=SimOptions(ready_order="priority", priority=[1] * 3,
                                                                          shared=(((0, 1), 1.0),)))
    with pytest.raises(ValueError, match="ready_order must be"):
        simulate(d, es, [0, 0, 0], link(), options=SimOptions(ready_order="urgent"))


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_durations_rejected(bad):
    with pytest.raises(ValueError, match="duration"):
        simulate(np.array([[bad]]), [], [0], link())


def test_cycle_detected():
    d = np.ones((2, 1))
    with pytest.raises(ValueError, match="cycle"):
        simulate(d, [TensorEdge(0, (1,), 0.0), TensorEdge(1, (0,), 0.0)], [0, 0], link())


def test_peak_memory_counts_live_tensors_and_resident_bytes():
    # chain a -> b -> c on one device: a's output (10) is freed when b ends, b's (20) lives
    # from b's start until c ends, so the peak is 10 + 20 while b runs.
    d = np.ones((3, 2))
    es = [TensorEdge(0, (1,), 10.0), TensorEdge(1, (2,), 20.0)]
    r = simulate(d, es, [0, 0, 0], link(), memory=MemoryTraits(resident_bytes=[5.0, 0.0, 0.0]))
    assert r.peak_memory_bytes.tolist() == [35.0, 0.0]
    # fan-out of a to two devices: the receiver holds a copy until its consumer ends
    es2 = [TensorEdge(0, (1, 2), 8.0)]
    r2 = simulate(np.ones((3, 2)), es2, [0, 0, 1], link(lat=0.5))
    assert r2.peak_memory_bytes.tolist() == [8.0, 8.0]
    # a tensor freed at the very moment another is allocated does not double-count
    es3 = [TensorEdge(0, (1,), 10.0), TensorEdge(1, (2,), 10.0), TensorEdge(2, (3,), 10.0)]
    r3 = simulate(np.ones((4, 1)), es3, [0, 0, 0, 0], link())
    assert r3.peak_memory_bytes.tolist() == [20.0]


def test_live_at_peak_names_what_each_node_holds_at_its_devices_peak():
    # the chain of the test above: device 0 peaks while b runs, holding a's 10 and b's 20 bytes
    d = np.ones((3, 2))
    es = [TensorEdge(0, (1,), 10.0), TensorEdge(1, (2,), 20.0)]
    r = simulate(d, es, [0, 0, 0], link(), memory=MemoryTraits(resident_bytes=[5.0, 0.0, 0.0]))
    assert r.live_at_peak_bytes.tolist() == [10.0, 20.0, 0.0]
    # a sent to device 1: its copy there (8) is a's too, at device 1's peak
    r2 = simulate(np.ones((3, 2)), [TensorEdge(0, (1, 2), 8.0)], [0, 0, 1], link(lat=0.5))
    assert r2.live_at_peak_bytes.tolist() == [16.0, 0.0, 0.0]
    # with send/receive ops (device 1 holds the transfer's copy and the receive's), all of it is a's
    cpu = np.full((2, 2), 0.5)
    r3 = simulate(np.ones((3, 2)), [TensorEdge(0, (1, 2), 8.0)], [0, 0, 1], link(lat=0.5),
                  options=SimOptions(transfer_cpu_s=cpu))
    assert r3.peak_memory_bytes.tolist() == [8.0, 16.0]
    assert r3.live_at_peak_bytes.tolist() == [24.0, 0.0, 0.0]
    assert not simulate(d, es, [0, 0, 0], link(), options=SimOptions(peak_memory=False)).live_at_peak_bytes.any()


def test_an_op_that_took_no_time_keeps_its_input_until_the_op_it_feeds_ends():
    # a (1 s) -> conv (0 s: fused into bias) -> bias (2 s) -> d (1 s). The fused kernel reads a's
    # output (100 B) while bias runs, so a's output, conv's (100 B) and bias's (50 B) are live together.
    d = np.array([[1.0], [0.0], [2.0], [1.0]])
    es = [TensorEdge(0, (1,), 100.0), TensorEdge(1, (2,), 100.0), TensorEdge(2, (3,), 50.0)]
    assert simulate(d, es, [0, 0, 0, 0], link()).peak_memory_bytes.tolist() == [250.0]
    # the same chain where conv runs a kernel of its own: a's output is freed when conv ends
    d2 = np.array([[1.0], [0.5], [2.0], [1.0]])
    assert simulate(d2, es, [0, 0, 0, 0], link()).peak_memory_bytes.tolist() == [200.0]


def test_in_place_ops_reuse_their_input_buffer():
    # matmul -> relu: relu writes into the matmul output (its only consumer), so one buffer of 10 bytes
    d = np.ones((3, 1))
    es = [TensorEdge(0, (1,), 10.0), TensorEdge(1, (2,), 10.0)]
    assert simulate(d, es, [0, 0, 0], link()).peak_memory_bytes.tolist() == [20.0]
    r = simulate(d, es, [0, 0, 0], link(), memory=MemoryTraits(inplace=[False, True, False]))
    assert r.peak_memory_bytes.tolist() == [10.0]
    # no forwarding when another op still reads the input
    es2 = [TensorEdge(0, (1, 2), 10.0), TensorEdge(1, (2,), 10.0)]
    r2 = simulate(d, es2, [0, 0, 0], link(), memory=MemoryTraits(inplace=[False, True, False]))
    assert r2.peak_memory_bytes.tolist() == [20.0]
    # ... but an in-place op that is its input's *last* reader forwards it (x -> y -> z(x, y)):
    # without forwarding x, y and z are live together (30 bytes); z writes into x, so 20
    d4 = np.ones((4, 1))
    es4 = [TensorEdge(0, (1, 2), 10.0), TensorEdge(1, (2,), 10.0), TensorEdge(2, (3,), 10.0)]
    assert simulate(d4, es4, [0] * 4, link()).peak_memory_bytes.tolist() == [30.0]
    assert simulate(d4, es4, [0] * 4, link(), memory=MemoryTraits(inplace=[False, False, True, False])).peak_memory_bytes.tolist() == [20.0]
    # a fed input (held by the caller) is never forwarded and stays allocated to the end
    held = simulate(d, es, [0, 0, 0], link(), memory=MemoryTraits(inplace=[False, True, False], held=[True, False, False]))
    assert held.peak_memory_bytes.tolist() == [20.0]
    es5 = [TensorEdge(0, (1,), 10.0), TensorEdge(1, (2,), 4.0)]  # x -> small y: x would be freed at 1
    assert simulate(d, es5, [0, 0, 0], link()).peak_memory_bytes.tolist() == [14.0]
    d5 = np.ones((4, 1))
    es6 = [TensorEdge(0, (1,), 10.0), TensorEdge(1, (2,), 4.0), TensorEdge(2, (3,), 4.0)]
    assert simulate(d5, es6, [0] * 4, link()).peak_memory_bytes.tolist() == [14.0]
    assert simulate(d5, es6, [0] * 4, link(), memory=MemoryTraits(held=[True, False, False, False])).peak_memory_bytes.tolist() == [18.0]
    # a variable read aliases the variable: nothing allocated
    r3 = simulate(d, es, [0, 0, 0], link(), memory=MemoryTraits(aliasing=[True, False, False]))
    assert r3.peak_memory_bytes.tolist() == [10.0]


def test_transfer_cpu_time_is_spent_on_both_devices():
    # a (dev 0) -> b (dev 1), 1 s each, free link: 0.5 s to send on dev 0 and 0.5 s to receive on dev 1
    d = np.ones((2, 2))
    es = [TensorEdge(0, (1,), 8.0)]
    cpu = np.full((2, 2), 0.5)
    r = simulate(d, es, [0, 1], link(bw=np.inf), options=SimOptions(transfer_cpu_s=cpu))
    assert r.step_time_s == pytest.approx(3.0)
    assert r.busy_s.tolist() == pytest.approx([1.5, 1.5])
    assert [v for v, *_ in r.timeline] == [0, 1]  # the send/receive ops are not listed as ops
    assert [(ti, i, j) for ti, i, j, *_ in r.transfers] == [(0, 0, 1)]
    # the same tensor kept on one device costs nothing extra
    assert simulate(d, es, [0, 0], link(bw=np.inf), options=SimOptions(transfer_cpu_s=cpu)).step_time_s == pytest.approx(2.0)


def test_a_send_queues_behind_compute_on_its_device():
    # a -> b crosses devices; c (independent) is ready on dev 0 before the send is: FIFO runs c first,
    # so b waits for c + send + receive (without transfer CPU cost the step is 2 s); LIFO (as TensorFlow's
    # one-thread executor runs a finished op's successor inline) sends first and runs c after it
    d = np.ones((3, 2))
    es = [TensorEdge(0, (1,), 8.0)]
    free = simulate(d, es, [0, 1, 0], link(bw=np.inf))
    assert free.step_time_s == pytest.approx(2.0)
    cpu = np.full((2, 2), 0.5)
    r = simulate(d, es, [0, 1, 0], link(bw=np.inf), options=SimOptions(transfer_cpu_s=cpu))
    assert r.step_time_s == pytest.approx(1 + 1 + 0.5 + 0.5 + 1)
    lifo = simulate(d, es, [0, 1, 0], link(bw=np.inf), options=SimOptions(transfer_cpu_s=cpu, ready_order="lifo"))
    assert lifo.step_time_s == pytest.approx(1 + 0.5 + 0.5 + 1)
    with pytest.raises(ValueError, match="transfer_cpu_s"):
        simulate(d, es, [0, 1, 0], link(bw=np.inf), options=SimOptions(transfer_cpu_s=np.full((2, 2), -1.0)))


@st.composite
def shared_cases(draw):
    """A random DAG on 2-4 devices, an assignment, and one shared group with a capacity."""
    n = draw(st.integers(1, 12))
    k = draw(st.integers(2, 4))
    durations = np.array([[draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]))] * k for _ in range(n)])
    edges = [TensorEdge(u, tuple(sorted({v for v in range(u + 1, n) if draw(st.booleans())})), 1.0)
             for u in range(n - 1)]
    edges = [e for e in edges if e.dsts]
    assignment = [draw(st.integers(0, k - 1)) for _ in range(n)]
    size = draw(st.integers(2, k))
    capacity = draw(st.sampled_from([1.0, 1.3, 1.5, 2.0, 3.0]))
    lifo = draw(st.booleans())
    return durations, edges, assignment, tuple(range(size)), capacity, lifo


@settings(max_examples=150, deadline=None)
@given(shared_cases())
def test_shared_processor_keeps_dependencies_and_never_beats_its_capacity(case):
    durations, edges, a, group, capacity, lifo = case
    order = "lifo" if lifo else "fifo"
    opts = SimOptions(shared=((group, capacity),), ready_order=order)
    r = simulate(durations, edges, a, link(), options=opts)
    assert sorted(v for v, *_ in r.timeline) == list(range(len(a)))  # every op once
    end = {v: e for v, _, _, e in r.timeline}
    start = {v: s for v, _, s, _ in r.timeline}
    for t in edges:
        for w in t.dsts:
            assert start[w] >= end[t.src] - 1e-9
    work = durations[np.arange(len(a)), a]
    in_group = np.isin(a, group)
    assert r.step_time_s >= work[in_group].sum() / capacity - 1e-9  # the group does at most `capacity` at once
    assert r.step_time_s == simulate(durations, edges, a, link(), options=opts).step_time_s  # deterministic
    # a device of the group runs up to ceil(capacity) ops at once, never more work than capacity in all
    busy_at = sorted({s for _, _, s, _ in r.timeline})
    for t in busy_at:
        running = [v for v, d, s, e in r.timeline if s <= t < e and d in group]
        assert len(running) <= len(group) * np.ceil(capacity)
    one = ((0,), 1.0)  # one device that shares with nobody, one op at a time: the plain simulator's answer
    assert (simulate(durations, edges, a, link(), options=SimOptions(shared=(one,), ready_order=order)).step_time_s
            == pytest.approx(simulate(durations, edges, a, link(), options=SimOptions(ready_order=order)).step_time_s))


def test_a_shared_processor_of_one_device_is_the_plain_simulator_with_lifo():
    # found by a random draw in CI (2026-12-03): the plain simulator stacked ops ready at 1.0 while the
    # other device was still at 0, so op 5 ran before op 6 (which op 3's end made ready later) and the
    # shared one ran them the other way round (3.5 s vs 3.0 s). Both now order by ready time, then by when
    # the event that made the op ready happened: 3 -> 6 -> 5, as TF runs a finished op's successor inline.
    durations = np.zeros((11, 2))
    durations[10] = 0.5
    edges = [TensorEdge(2, (3, 5), 1.0), TensorEdge(3, (6,), 1.0), TensorEdge(5, (10,), 1.0), TensorEdge(6, (7,), 1.0)]
    a = [0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0]
    one = ((0,), 1.0)
    shared = simulate(durations, edges, a, link(), options=SimOptions(shared=(one,), ready_order="lifo"))
    plain = simulate(durations, edges, a, link(), options=SimOptions(ready_order="lifo"))
    assert shared.step_time_s == pytest.approx(plain.step_time_s) == 3.5
    assert [v for v, d, *_ in plain.timeline if d == 1] == [3, 6, 5] == [v for v, d, *_ in shared.timeline if d == 1]


@settings(max_examples=100, deadline=None)
@given(shared_cases())
def test_one_processor_shared_by_every_device_is_work_conserving(case):
    # capacity 1 over all devices and free links: the processor is never idle while an op is ready, so the
    # step is exactly the total work, wherever the ops are placed
    durations, edges, a, _, _, lifo = case
    k = durations.shape[1]
    r = simulate(durations, edges, a, link(bw=np.inf),
                 options=SimOptions(shared=((tuple(range(k)), 1.0),), ready_order="lifo" if lifo else "fifo"))
    assert r.step_time_s == pytest.approx(durations[np.arange(len(a)), a].sum())


def test_shared_processor_slows_concurrent_ops_and_bad_groups_are_refused():
    d = np.ones((4, 2))
    lk = link()
    assert simulate(d, [], [0, 1, 0, 1], lk).step_time_s == 2.0
    shared = lambda c: SimOptions(shared=(((0, 1), c),))  # noqa: E731
    assert simulate(d, [], [0, 1, 0, 1], lk, options=shared(1.0)).step_time_s == pytest.approx(4.0)
    assert simulate(d, [], [0, 1, 0, 1], lk, options=shared(1.5)).step_time_s == pytest.approx(4 / 1.5)
    assert simulate(d, [], [0, 0, 0, 0], lk, options=shared(1.0)).step_time_s == pytest.approx(4.0)  # one device: as before
    # logical devices of one process are one processor: one device's independent ops overlap as much as four's
    assert simulate(d, [], [0, 0, 0, 0], lk, options=shared(1.5)).step_time_s == pytest.approx(4 / 1.5)
    for bad in [(((0, 1), 0.5),), (((0, 5), 1.0),), (((0, 1), 1.0), ((1,), 1.0)), (((0, 1), float("nan")),),
                (((0, 1), 1.5, 2.0),), (((0, 1), 1.5, 0.5),)]:
        with pytest.raises(ValueError, match="shared"):
            simulate(d, [], [0, 1, 0, 1], lk, options=SimOptions(shared=bad))


def test_worker_processes_on_one_machine_share_it_but_each_runs_its_own_ops_one_at_a_time():
    """Not pooled (one device's share is 1): spread over both devices, four 1 s ops take 4 / 1.7 s; on
    one device they take 4 s (that device runs one op at a time), unlike a pooled group's 4 / 1.7."""
    d = np.ones((4, 2))
    lk = link()
    machine = SimOptions(shared=(((0, 1), 1.7, 1.0),))
    assert simulate(d, [], [0, 1, 0, 1], lk, options=machine).step_time_s == pytest.approx(4 / 1.7)
    assert simulate(d, [], [0, 0, 0, 0], lk, options=machine).step_time_s == pytest.approx(4.0)
    assert simulate(d, [], [0, 0, 0, 1], lk, options=machine).step_time_s == pytest.approx(
        1 / 0.85 + 2.0)  # both busy for the first op (rate 0.85 each), then device 0 alone at full speed
    assert SimOptions(shared=(((0, 1), 1.7),)).checked_shares(2) == (((0, 1), 1.7, 1.7),)  # pooled by default


def test_dependencies_given_once_give_the_same_step_and_must_match_the_graph():
    from cost_models import dependencies_of

    d = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    es = [TensorEdge(0, (1, 2, 1), 4.0), TensorEdge(1, (2,), 0.0)]
    deps = dependencies_of(3, es, [(0, 2)])
    assert deps.n_waiting == (0, 1, 3) and deps.receivers == ((1, 2), (2,))
    for a in ([0, 1, 1], [0, 0, 1], [1, 0, 1]):
        plain = simulate(d, es, a, link(lat=0.5), control_edges=[(0, 2)])
        given = simulate(d, es, a, link(lat=0.5), control_edges=[(0, 2)], deps=deps)
        assert (given.step_time_s, given.timeline, given.transfers) == (plain.step_time_s, plain.timeline,
                                                                          plain.transfers)
    with pytest.raises(ValueError, match="dependencies_of"):
        simulate(d, es[:1], [0, 1, 1], link(), deps=deps)


@settings(max_examples=100, deadline=None)
@given(shared_cases(), st.lists(st.sampled_from([0.0, 1.0, 4.0]), min_size=12, max_size=12))
def test_live_at_peak_sums_to_each_devices_peak_less_its_resident_bytes(case, resident):
    durations, edges, a, _group, _capacity, lifo = case
    n, k = durations.shape
    sized = [TensorEdge(t.src, t.dsts, float(1 + t.src % 3)) for t in edges]
    mem = MemoryTraits(resident_bytes=resident[:n])
    r = simulate(durations, sized, a, link(lat=0.25), memory=mem,
                 options=SimOptions(ready_order="lifo" if lifo else "fifo"))
    live = r.peak_memory_bytes - np.bincount(a, weights=resident[:n], minlength=k)
    assert r.live_at_peak_bytes.sum() == pytest.approx(live.sum())
    assert (r.live_at_peak_bytes >= -1e-9).all()
    produced = np.bincount([t.src for t in sized], weights=[t.nbytes for t in sized], minlength=n)
    assert (r.live_at_peak_bytes <= produced * k + 1e-9).all()  # at most a copy per device


@st.composite
def moves_of_a_plan(draw):
    """A random DAG (heterogeneous devices, several readers per tensor, control edges, some ops that take no
    time), an assignment, and three successive changes of a few nodes' devices."""
    n = draw(st.integers(2, 25))
    k = draw(st.integers(2, 4))
    durations = np.array([[draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) * (1 + 0.25 * d) for d in range(k)]
                          for _ in range(n)])
    edges = [TensorEdge(u, tuple(sorted({v for v in range(u + 1, n) if draw(st.integers(0, 3)) == 0})),
                        draw(st.sampled_from([0.0, 1.0, 3.0]))) for u in range(n - 1)]
    edges = [e for e in edges if e.dsts]
    control = [(u, v) for u in range(n) for v in range(u + 1, n) if draw(st.integers(0, 15)) == 0]
    a = [draw(st.integers(0, k - 1)) for _ in range(n)]
    moves = [[(draw(st.integers(0, n - 1)), draw(st.integers(0, k - 1))) for _ in range(draw(st.integers(1, 3)))]
             for _ in range(3)]
    order = draw(st.sampled_from(["fifo", "lifo", "priority"]))
    priority = [draw(st.sampled_from([0.0, 1.0, 2.5])) for _ in range(n)] if order == "priority" else None
    return durations, edges, control, a, moves, (order, priority), draw(st.integers(1, 2)), draw(st.integers(1, 8))


@settings(max_examples=200, deadline=None)
@given(moves_of_a_plan())
def test_a_simulation_resumed_after_a_move_is_the_simulation_from_the_start(case):
    """`resume` continues from the last snapshot a move leaves intact; every result equals a full simulation
    of the moved plan, including one resumed from a resumed simulation."""
    durations, edges, control, a, moves, (order, priority), concurrency, snapshots = case
    lat = np.full((durations.shape[1],) * 2, 0.25)
    kept = SimOptions(ready_order=order, priority=priority, concurrency=concurrency, snapshots=snapshots)
    full = SimOptions(ready_order=order, priority=priority, concurrency=concurrency)
    previous = simulate(durations, edges, a, link(bw=2.0), control_edges=control, link_latency_s=lat, options=kept)
    assert previous.simulated_ops == len(a)
    a = list(a)
    for change in moves:
        for v, d in change:
            a[v] = d
        resumed = simulate(durations, edges, a, link(bw=2.0), control_edges=control, link_latency_s=lat,
                           options=kept, resume=previous)
        fresh = simulate(durations, edges, a, link(bw=2.0), control_edges=control, link_latency_s=lat, options=full)
        assert resumed.timeline == fresh.timeline and resumed.transfers == fresh.transfers
        assert resumed.step_time_s == fresh.step_time_s
        assert np.array_equal(resumed.busy_s, fresh.busy_s) and np.array_equal(resumed.link_bytes, fresh.link_bytes)
        assert np.array_equal(resumed.peak_memory_bytes, fresh.peak_memory_bytes)
        assert 0 <= resumed.simulated_ops <= len(a)
        previous = resumed
    with pytest.raises(ValueError, match="same graph"):
        simulate(durations[:-1], [e for e in edges if max(e.src, *e.dsts) < len(a) - 1], a[:-1], link(),
                 options=replace(kept, priority=None if priority is None else priority[:-1]), resume=previous)


@settings(max_examples=200, deadline=None)
@given(moves_of_a_plan(), st.floats(0.3, 1.3))
def test_a_simulation_stops_above_a_step_only_where_the_step_ends_after_it(case, fraction):
    """With ``stop_above`` and valid tails (the longest path of fastest times after each op), the result is
    the full simulation wherever the step ends by it, and ``inf`` (after fewer ops) wherever it ends later,
    resumed or not."""
    durations, edges, control, a, moves, (order, priority), concurrency, snapshots = case
    n = len(a)
    fastest = durations.min(axis=1)
    tails = [0.0] * n  # edges and control edges go from lower to higher node indices
    for v in reversed(range(n)):
        after = [w for e in edges if e.src == v for w in e.dsts] + [w for u, w in control if u == v]
        tails[v] = max((fastest[w] + tails[w] for w in after), default=0.0)
    lat = np.full((durations.shape[1],) * 2, 0.25)
    kept = SimOptions(ready_order=order, priority=priority, concurrency=concurrency, snapshots=snapshots)
    first = simulate(durations, edges, a, link(bw=2.0), control_edges=control, link_latency_s=lat, options=kept)
    a = list(a)
    for v, d in moves[0]:
        a[v] = d
    full = simulate(durations, edges, a, link(bw=2.0), control_edges=control, link_latency_s=lat, options=kept)
    limit = fraction * full.step_time_s
    for resume in (None, first):
        r = simulate(durations, edges, a, link(bw=2.0), control_edges=control, link_latency_s=lat, options=kept,
                     resume=resume, stop_above=limit, tails=tails)
        if full.step_time_s <= limit:
            assert r.step_time_s == full.step_time_s and r.timeline == full.timeline
        else:
            assert r.step_time_s == np.inf and 0 < r.simulated_ops <= n
    with pytest.raises(ValueError, match="stop_above needs tails"):
        simulate(durations, edges, a, link(), stop_above=1.0)


def test_a_move_late_in_the_step_simulates_only_the_ops_after_its_inputs():
    """A chain of ten ops on device 0: moving the last one runs again only it and its producer."""
    d = np.ones((10, 2))
    es = [TensorEdge(i, (i + 1,), 1.0) for i in range(9)]
    first = simulate(d, es, [0] * 10, link(lat=0.5), options=SimOptions(snapshots=10))
    moved = simulate(d, es, [0] * 9 + [1], link(lat=0.5), options=SimOptions(snapshots=10), resume=first)
    assert moved.simulated_ops == 2 and moved.step_time_s == 9 + 1.5 + 1  # 1 byte over 1 B/s after 0.5 s
    assert simulate(d, es, [0] * 9 + [1], link(lat=0.5)).timeline == moved.timeline


def test_every_simulation_counts_its_ops_and_only_the_plain_one_resumes():
    """Shared processors and transfer ops simulate from the start (a resume is ignored there) and say so:
    simulated descent budgets by these counts."""
    d = np.ones((6, 2))
    es = [TensorEdge(i, (i + 1,), 1.0) for i in range(5)]
    plain = SimOptions(snapshots=6)
    for options in (SimOptions(shared=(((0, 1), 1.5),), snapshots=6),
                    SimOptions(transfer_cpu_s=np.full((2, 2), 0.1), snapshots=6)):
        first = simulate(d, es, [0] * 6, link(), options=options)
        assert first.simulated_ops == 6 and first.snapshots is None
        moved = simulate(d, es, [0] * 5 + [1], link(), options=options, resume=first)
        assert moved.simulated_ops == 6
        assert moved.timeline == simulate(d, es, [0] * 5 + [1], link(), options=options).timeline
    first = simulate(d, es, [0] * 6, link(), options=plain)
    assert first.simulated_ops == 6 and first.snapshots is not None
    assert simulate(d, es, [0] * 5 + [1], link(), options=plain, resume=first).simulated_ops < 6


@settings(max_examples=100, deadline=None)
@given(moves_of_a_plan(), st.integers(0, 5))
def test_dependencies_with_further_control_edges_are_those_of_all_the_edges(case, split):
    """A plan's order adds control edges to a graph's dependencies: the same as walking the graph with them."""
    from cost_models import dependencies_of

    durations, edges, control, *_ = case
    n = durations.shape[0]
    first, more = control[:split], control[split:]
    assert dependencies_of(n, edges, first).with_control(more) == dependencies_of(n, edges, control)


@settings(max_examples=100, deadline=None)
@given(shared_cases(), st.sampled_from([0.0, 0.5, 1.5]), st.booleans())
def test_a_simulated_order_keeps_the_graph_acyclic_and_runs_in_that_order(case, min_s, transfer_ops):
    """``execution_order="simulated"``: each device's ops of ``min_s`` or more, in the order a simulation started
    them, as control edges. Simulating again with them never finds a cycle, and each device starts its ordered
    ops in that order (shared processors, the transfer-op path and zero-time ops included)."""
    durations, edges, a, group, capacity, lifo = case
    k = durations.shape[1]
    opts = SimOptions(shared=((group, capacity),), ready_order="lifo" if lifo else "fifo",
                      transfer_cpu_s=np.full((k, k), 0.25) if transfer_ops else None)
    first = simulate(durations, edges, a, link(), options=opts)
    order = timeline_order(first.timeline, k, min_s)
    assert sorted(v for ops in order for v in ops) == sorted(v for v, _, s, e in first.timeline if e - s >= min_s)
    again = simulate(durations, edges, a, link(), control_edges=order_edges(order), options=opts)
    start = {v: s for v, _, s, _ in again.timeline}
    end = {v: e for v, _, _, e in again.timeline}
    for ops in order:
        for before, after in zip(ops, ops[1:]):
            assert start[after] >= end[before] - 1e-9
