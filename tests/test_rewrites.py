"""The rewrite contract: one file and one line in the declared list add a rewrite; a failing rewrite is named;
schedule rewrites come last and an export stores the graph before them."""

import importlib.util
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import placer
import placer.tf.rewrites as rewrites
from placer.errors import GraphError
from placer.tf.emit import emit, rewrite_context
from placer.tf.rewrites import REWRITES, Rewrite, RewriteRecord, schedule_split
from placer.tf.trace import trace_model

#: A toy rewrite, as a new file of placer/tf/rewrites/ would hold it: it renames nothing and records its visit.
TOY = textwrap.dedent('''
    """Rewrite: nothing; records how many nodes it saw."""
    from placer.tf.rewrites.base import Rewrite, RewriteContext, RewriteRecord

    VISITS = []


    def visit(gd, context: RewriteContext) -> RewriteRecord:
        VISITS.append((context.step, len(gd.node)))
        return RewriteRecord("toy", changes=0, summary=f"saw {len(gd.node)} nodes")


    REWRITE = Rewrite("toy", visit)
''')


@pytest.fixture()
def toy(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy_rewrite", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model():
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(16, activation="relu", name="a")(x)
    return keras.Model(x, keras.layers.Dense(4, name="b")(h), name="toy_model")


def test_a_new_rewrite_is_one_file_and_one_line_in_the_declared_list(toy, devices, monkeypatch):
    split = schedule_split(REWRITES)
    # the one line: the toy rewrite in the declared list, after the rewrites of the placed graph
    monkeypatch.setattr(rewrites, "REWRITES", (*REWRITES[:split], toy.REWRITE, *REWRITES[split:]))
    model = _model()
    placed = placer.autoplace(model, devices[:2], batch_size=4, algorithm="round_robin", time_limit_s=1,
                              shared_capacity=None, measure_call=False)
    record = placed.emitted.record("toy")
    assert record is not None and record.summary.startswith("saw ")
    assert [r.rewrite for r in placed.emitted.records][:4] == ["bypass", "devices", "codecs", "toy"]
    assert toy.VISITS and toy.VISITS[-1][0] == "predict"
    x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    assert np.array_equal(placed(x).numpy(), model(x).numpy())


def test_a_failing_rewrite_is_named_in_the_error(devices):
    def broken(gd, context):
        raise GraphError("no such node")

    traced = trace_model(_model(), batch_size=2)
    ops = {op.name: "/CPU:0" for op in traced.dynamic.graph.get_operations()}
    context = rewrite_context(traced, ops)
    variables = {ph: v for ph, v in traced.variables.items()}
    with pytest.raises(GraphError, match=r"^\[broken rewrite\] no such node"):
        emit(traced, variables, context, rewrites=(*REWRITES, Rewrite("broken", broken, schedule=True)))

    def crash(gd, context):
        raise KeyError("x")

    with pytest.raises(KeyError) as info:  # not one of ours: its own type, with a note naming the rewrite
        emit(traced, variables, context, rewrites=(Rewrite("crash", crash),))
    if sys.version_info >= (3, 11):
        assert any("'crash' rewrite" in note for note in info.value.__notes__)


def test_schedule_rewrites_come_last():
    noop = lambda gd, context: RewriteRecord("noop")  # noqa: E731
    with pytest.raises(GraphError, match="listed after the schedule's 'late'"):
        schedule_split([Rewrite("early", noop), Rewrite("late", noop, schedule=True), Rewrite("placed", noop)])
    assert [r.name for r in REWRITES] == ["bypass", "split", "gathers", "devices", "codecs", "update-after-reads",
                                          "order", "gates", "copies", "sends"]
    assert schedule_split(REWRITES) == 6


def test_the_placed_graph_is_the_graph_before_the_schedule(devices, tmp_path):
    chain = keras.Sequential([keras.Input((8,))] + [keras.layers.Dense(8, activation="relu") for _ in range(3)],
                             name="chain")
    piped = placer.autoplace(chain, devices[:2], batch_size=8, algorithm="contiguous", objective="throughput",
                             microbatches=4, split_margin=0, time_limit_s=1, shared_capacity=None)
    emitted = piped.emitted
    assert emitted.microbatches == 4 and emitted.record("copies") is not None
    copied = [n.name for n in emitted.graph_def.node if n.name.startswith("mb3/")]
    assert copied and not any(n.name.startswith("mb") for n in emitted.placed_graph_def.node)
    path = piped.export(tmp_path / "saved")
    stored = tf.compat.v1.GraphDef()
    stored.ParseFromString((tmp_path / "saved" / "assets.extra" / "autoplace" / "graph_def.pb").read_bytes())
    assert len(stored.node) == len(emitted.placed_graph_def.node)
    loaded = placer.load(path)
    assert [r.rewrite for r in loaded.records if r.changes] == ["devices", "copies"]
    x = np.random.default_rng(1).standard_normal((8, 8)).astype("float32")
    assert np.array_equal(loaded(x).numpy(), piped(x).numpy())


def test_row_gathers_only_where_the_table_is_updated_by_rows_and_read_by_gathers_alone():
    from placer.tf.graphdef import row_gathers
    from placer.tf.rewrites.gathers import gather_rows

    def graph(dense_read=False, sparse_update=True):
        g = tf.Graph()
        with g.as_default():
            h = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[4, 2], name="table")
            read = tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32, name="read")
            rows = tf.gather(read, [1, 3], name="rows")
            if dense_read:
                tf.matmul(tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32, name="whole"), tf.ones((2, 1)))
            ids, ones = tf.constant([1]), tf.ones((1, 2) if sparse_update else (4, 2))
            with tf.control_dependencies([read]):  # as automatic control dependencies order them
                if sparse_update:
                    tf.raw_ops.ResourceScatterSub(resource=h, indices=ids, updates=ones, name="upd")
                else:
                    tf.raw_ops.AssignSubVariableOp(resource=h, value=ones, name="upd")
            tf.identity(rows, name="out")
        return g

    assert row_gathers(graph()) == {"rows": "table:0"}
    assert row_gathers(graph(dense_read=True)) == {}      # a whole read elsewhere: TF copies it anyway
    assert row_gathers(graph(sparse_update=False)) == {}  # no copy-on-read mode: nothing to save
    g = graph()
    gd = g.as_graph_def()
    assert gather_rows(gd, row_gathers(g)) == ["rows"]
    nodes = {n.name: n for n in gd.node}
    assert "read" not in nodes and nodes["rows"].op == "ResourceGather"
    assert "^rows" in nodes["upd"].input and "^read" not in nodes["upd"].input  # waits for the gather instead
    with tf.Graph().as_default():  # the rewritten graph imports and gathers the same rows
        tf.graph_util.import_graph_def(gd, name="")
