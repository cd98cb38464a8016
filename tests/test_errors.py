"""Bad input gets a typed error that says what to do, and changes nothing."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import placer
from placer import DeviceSpec
from placer.errors import (
    AutoplaceError,
    DeviceError,
    InputSignatureError,
    InsufficientMemoryError,
    ModelError,
    NoFeasiblePlanError,
)
from tests.models import Subclassed, branchy


@pytest.fixture()
def model():
    return branchy(width=32)


def snapshot(m):
    return [(v.path, v.value.device, v.numpy().copy()) for v in m.variables]


def assert_untouched(m, before):
    after = snapshot(m)
    assert [(p, d) for p, d, _ in after] == [(p, d) for p, d, _ in before]
    for (_, _, a), (_, _, b) in zip(after, before):
        assert np.array_equal(a, b)


def test_not_a_keras_model(devices):
    with pytest.raises(ModelError, match="keras.Model"):
        placer.autoplace(lambda x: x, devices)
    with pytest.raises(ModelError):
        placer.autoplace(tf.Module(), devices)


def test_unbuilt_model_without_shapes(devices):
    m = Subclassed()
    with pytest.raises(InputSignatureError, match="input_signature"):
        placer.autoplace(m, devices, batch_size=4)
    assert not m.variables


def test_unknown_batch_needs_batch_size(model, devices):
    before = snapshot(model)
    with pytest.raises(InputSignatureError, match="batch_size"):
        placer.autoplace(model, devices)
    assert_untouched(model, before)


@pytest.mark.parametrize("bad,match", [([], "empty"), (["/CPU:0", "/CPU:0"], "twice"), (["/GPU:0"], "not available"),
                                       (["/CPU:7"], "not available"), (["CPU zero"], "cannot parse")])
def test_bad_devices(model, bad, match):
    before = snapshot(model)
    with pytest.raises(DeviceError, match=match):
        placer.autoplace(model, bad, batch_size=4)
    assert_untouched(model, before)


def test_memory_exceeded_names_variables_and_shortfall(model, devices):
    before = snapshot(model)
    total = sum(int(np.prod(v.shape)) * 4 for v in model.variables)
    specs = [DeviceSpec(d, memory_bytes=total // 8) for d in devices]
    with pytest.raises(InsufficientMemoryError) as e:
        placer.autoplace(model, specs, batch_size=4)
    msg = str(e.value)
    assert f"{total:,} bytes" in msg and f"{total - 4 * (total // 8):,} bytes short" in msg
    assert "kernel" in msg  # names the largest variables
    assert_untouched(model, before)


def test_a_layer_larger_than_every_device_is_named_or_split(devices):
    # One huge layer that fits no single device although the total would fit: without splits the problem
    # stage names it before any search; by default its product is split over the devices.
    inp = keras.Input((256,))
    m = keras.Model(inp, keras.layers.Dense(8)(keras.layers.Dense(512, name="huge")(inp)))
    before = snapshot(m)
    huge = 256 * 512 * 4
    specs = [DeviceSpec(d, memory_bytes=huge // 2) for d in devices]
    with pytest.raises(InsufficientMemoryError, match=r"\[problem stage\] colocation group '.*huge.*' needs 526,336 "
                                                      "bytes.*splits='auto'") as e:
        placer.autoplace(m, specs, batch_size=2, time_limit_s=1, splits="none")
    assert e.value.stage == "problem"
    assert_untouched(m, before)
    placed = placer.autoplace(m, specs, batch_size=2, time_limit_s=1)
    # split by columns, paired with the product after it (split by rows: no join between them, one sum)
    assert set(placed.plan.splits.values()) == {len(devices)} and len(placed.plan.splits) == 2
    assert any("huge" in op for op in placed.plan.splits)
    x = np.ones((2, 256), "float32")
    np.testing.assert_allclose(placed(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    assert_untouched(m, before)


def test_no_feasible_plan_says_what_was_tried(devices):
    # Three layers of 0.6 devices each on two devices: the total fits, no packing does.
    inp = keras.Input((256,))
    h = inp
    for i in range(3):
        h = keras.layers.Dense(256, name=f"d{i}")(h)
    m = keras.Model(inp, h)
    before = snapshot(m)
    layer = (256 * 256 + 256) * 4
    specs = [DeviceSpec(d, memory_bytes=int(layer / 0.6)) for d in devices[:2]]
    with pytest.raises(NoFeasiblePlanError, match=r"\[solve stage\].*tried: single.*cpsat") as e:
        placer.autoplace(m, specs, batch_size=2, time_limit_s=1)
    assert e.value.stage == "solve"
    assert_untouched(m, before)


@pytest.mark.parametrize("opts,match", [({"algorithm": "magic"}, "unknown algorithm"),
                                        ({"compression": "int3"}, "unknown compression"),
                                        ({"time_limit_s": 0}, "time_limit_s"),
                                        ({"batch_size": 0}, "batch_size"),
                                        ({"ready_order": "random"}, "ready_order must be 'detect'"),
                                        ({"pipeline": "zigzag"}, "pipeline must be 'auto'"),
                                        ({"colour": "red"}, "unknown option")])
def test_bad_options(model, devices, opts, match):
    before = snapshot(model)
    with pytest.raises(AutoplaceError, match=match):
        placer.autoplace(model, devices, **{"batch_size": 4, **opts})
    assert_untouched(model, before)


def test_success_leaves_the_model_untouched(model, devices):
    before = snapshot(model)
    p = placer.autoplace(model, devices, batch_size=4, algorithm="round_robin")
    assert_untouched(model, before)
    # the placed copies are separate variables
    assert not {id(v) for v in p.variables} & {id(v.value) for v in model.variables}


def test_fit_on_an_inference_placement_says_how_to_place_for_training(model, devices):
    p = placer.autoplace(model, devices[:1], batch_size=2)
    x, y = np.zeros((4, 16), "float32"), np.zeros((4, 3), "float32")
    for call in (lambda: p.fit(x, y, verbose=0), lambda: p.evaluate(x, y, verbose=0)):
        with pytest.raises(placer.TrainingError, match="training=True"):
            call()
    # the forward pass in training mode runs placed (no dropout here: the same outputs)
    np.testing.assert_array_equal(p(x, training=True).numpy(), model(x, training=True).numpy())
