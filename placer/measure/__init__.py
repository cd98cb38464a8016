"""Measurement tools on real devices: link calibration (:mod:`.links`) and local gRPC clusters (:mod:`.cluster`)."""
