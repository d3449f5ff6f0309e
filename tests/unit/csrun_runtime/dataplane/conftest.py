"""Fixtures of the data plane's unit tests: a receiver on loopback with its data on zmq or on the
bulk channel, and a bare ROUTER with the DEALER peers a test connects to it."""
from __future__ import annotations

import pytest

from csrun_runtime.dataplane import Receiver
from tests.unit.dataplane_peers import Router


@pytest.fixture(params=[False, True], ids=["zmq", "bulk"])
def bulk(request):
    """Data on zmq, or on the bulk channel (csrun_runtime.dataplane.bulk): the same tests hold."""
    return request.param


@pytest.fixture
def rx(bulk):
    r = Receiver("tcp://127.0.0.1:0", bulk=bulk)
    yield r
    r.close()


@pytest.fixture
def router():
    """A bare ROUTER on loopback and the DEALER peers a test connects to it (:class:`Router`)."""
    r = Router()
    yield r
    r.close()
