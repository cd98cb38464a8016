"""The exported SavedModel, reloaded in a fresh process with the same devices."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import placer
from placer.errors import OutputError
from tests.models import multi_input, sample

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    from placer.tf.export import LOAD_OPTIONS
    path, inp, out = sys.argv[1:4]
    loaded = tf.saved_model.load(path, options=LOAD_OPTIONS)
    fn = loaded.signatures["serving_default"]
    data = np.load(inp)
    result = fn(**{k: tf.constant(data[k]) for k in data.files})
    np.savez(out, **{k: v.numpy() for k, v in result.items()})
    print(json.dumps(sorted({v.device for v in loaded.placed_variables})))
""")


def test_export_reloads_in_fresh_process_with_same_outputs(tmp_path, devices):
    model = multi_input()
    p = placer.autoplace(model, devices, batch_size=4, algorithm="contiguous")
    x = sample(model, 4, seed=5)
    expected = [t.numpy() for t in p(x)]
    path = p.export(tmp_path / "saved")
    np.savez(tmp_path / "in.npz", left=x[0], right=x[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", CHILD, path, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    for i, e in enumerate(expected):
        assert np.array_equal(got[f"output_{i}"], e)
    var_devices = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(var_devices) == {v.value.device for v in p.variables}
    assert len(var_devices) > 1, "variables keep their planned devices after reload"


def test_export_refuses_non_empty_directory(tmp_path, devices):
    model = multi_input()
    p = placer.autoplace(model, devices[:1], batch_size=2)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("keep me")
    with pytest.raises(OutputError, match="not empty"):
        p.export(tmp_path / "taken")
    assert (tmp_path / "taken" / "file").read_text() == "keep me"
