import pytest
import tensorflow as tf

from placer.core.devices import DeviceSpec, canonical_device_name, resolve_devices
from placer.errors import AutoplaceError, DeviceError

LOCAL = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)]


@pytest.mark.parametrize("short,full", [
    ("/CPU:1", LOCAL[1]),
    ("cpu:1", LOCAL[1]),
    ("/device:CPU:1", LOCAL[1]),
    ("/job:worker/task:2/device:GPU:0", "/job:worker/replica:0/task:2/device:GPU:0"),
])
def test_canonical_names(short, full):
    assert canonical_device_name(short) == full


def test_short_and_full_names_are_duplicates():
    with pytest.raises(DeviceError, match="listed twice"):
        resolve_devices(["/CPU:0", LOCAL[0]], available=LOCAL)


@pytest.mark.parametrize("bad,match", [
    ([], "empty"),
    ("/CPU:0", "not the string"),
    (["/CPU:0", 3], "cannot use 3"),
    (["not a device"], "cannot parse"),
    (["/CPU:9"], "not available"),
    (["/GPU:0"], "not available"),
])
def test_bad_device_lists(bad, match):
    with pytest.raises(DeviceError, match=match):
        resolve_devices(bad, available=LOCAL)


def test_logical_devices_and_specs_are_accepted(devices):
    logical = tf.config.list_logical_devices("CPU")
    ds = resolve_devices([logical[0], DeviceSpec("/CPU:1", memory_bytes=1 << 20)], available=LOCAL)
    assert ds.names == (LOCAL[0], LOCAL[1])
    assert ds.devices[1].memory_bytes == 1 << 20
    assert ds.link(0, 1).seconds(0) == 0.0 and ds.link(0, 1).seconds(1e6) > 0


def test_remote_links_default_slower_than_local():
    ds = resolve_devices(["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0", "/CPU:0"])
    same_host = resolve_devices(["/CPU:0", "/CPU:1"])
    assert ds.link(0, 1).seconds(1e6) > same_host.link(0, 1).seconds(1e6)


def test_transfers_between_processes_cost_cpu_by_default():
    """Uncalibrated links between processes carry the default CPU cost per transfer (so a simulation of gRPC
    workers has transfer ops, and a busy one-thread worker's sends queue); links within one process none."""
    from placer.core.devices import DEFAULT_REMOTE_TRANSFER_CPU_S

    ds = resolve_devices(["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0",
                          "/job:worker/task:1/device:CPU:1"])
    cpu = ds.transfer_cpu()
    assert cpu[0, 1] == cpu[1, 0] == cpu[0, 2] == DEFAULT_REMOTE_TRANSFER_CPU_S > 0
    assert cpu[1, 2] == cpu[2, 1] == 0.0
    assert resolve_devices(["/CPU:0", "/CPU:1"]).transfer_cpu() is None


@pytest.mark.parametrize("kwargs", [{"memory_bytes": -1}, {"memory_bytes": 1.5}, {"speed": 0},
                                    {"speed": float("nan")}, {"bandwidth_bytes_per_s": -3.0}])
def test_device_spec_validation(kwargs):
    with pytest.raises(DeviceError):
        DeviceSpec("/CPU:0", **kwargs)


def test_errors_share_one_base():
    assert issubclass(DeviceError, AutoplaceError)


def test_shared_processors_pooled_or_one_process_each_and_their_json():
    from placer.core.devices import SharedProcessor, resolve_devices
    from placer.core.graph_io import devices_from_json, devices_to_json

    pool = SharedProcessor((0, 1), 1.3, "measured")
    machine = SharedProcessor((2, 3), 1.7, "measured", pooled=False)
    assert (pool.per_device, machine.per_device) == (1.3, 1.0)
    with pytest.raises(DeviceError, match="pooled"):
        SharedProcessor((0, 1), 1.5, pooled="no")
    devset = resolve_devices(["/CPU:0", "/CPU:1", "/job:worker/task:0/device:CPU:0",
                              "/job:worker/task:1/device:CPU:0"]).with_shared([pool, machine])
    again = devices_from_json(devices_to_json(devset))
    assert again.shared == (pool, machine)
    data = devices_to_json(devset)
    assert "pooled" not in data["shared"][0] and data["shared"][1]["pooled"] is False
