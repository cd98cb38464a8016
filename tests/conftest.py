"""Test set-up: four logical CPU devices, created before TensorFlow initialises."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

N_DEVICES = 4
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * N_DEVICES)
DEVICES = [f"/CPU:{i}" for i in range(N_DEVICES)]
