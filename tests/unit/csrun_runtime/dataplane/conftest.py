"""Fixtures of the data plane's unit tests: a receiver on loopback with its data on zmq, on the
bulk channel or through shared-memory rings, and a bare ROUTER with the DEALER peers a test
connects to it."""
from __future__ import annotations

import pytest

from csrun_runtime.dataplane import Receiver
from tests.unit.dataplane_peers import Router


@pytest.fixture(params=[{}, {"bulk": True}, {"shm_bytes": 8 << 20}], ids=["zmq", "bulk", "shm"])
def transport(request):
    """The receiver's keywords for data on zmq, on the bulk channel (csrun_runtime.dataplane.bulk) or
    through a shared-memory ring per sender (csrun_runtime.dataplane.shm: every sender of these
    tests runs on the receiver's node): the same tests hold on each."""
    return dict(request.param)


@pytest.fixture
def rx(transport):
    r = Receiver("tcp://127.0.0.1:0", **transport)
    yield r
    r.close()


@pytest.fixture
def router():
    """A bare ROUTER on loopback and the DEALER peers a test connects to it (:class:`Router`)."""
    r = Router()
    yield r
    r.close()
