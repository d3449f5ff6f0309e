"""The PyTorch served probe's chief (csrun_runtime.pytorch.probe.plane_role, index 0) receives as
the training chief would: on the data plane's bulk channel when the user's params say
``runconfig.dataplane_bulk``, on zmq otherwise; and a batch sent by an input worker's Sender
reaches its counter either way."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from csrun_runtime.dataplane import Sender  # noqa: E402
from csrun_runtime.pytorch.probe import plane_role  # noqa: E402
from csrun_runtime.rendezvous import ENDPOINTS  # noqa: E402


@pytest.mark.parametrize("bulk", [True, False, None])
def test_the_probes_chief_follows_the_users_dataplane_bulk(tmp_path, bulk):
    rc = {} if bulk is None else {"dataplane_bulk": bulk}
    entry = SimpleNamespace(params={"runconfig": rc}, backend=None)
    counter = plane_role(entry, {"seq": 7, "tasks": 2, "cpus_per_task": 1, "barrier_timeout_s": 5}, 0, tmp_path)
    try:
        assert (counter.source.source.r.bulk_port is not None) is bool(bulk)
        assert counter.built.info["dataplane_bulk"] is bool(bulk)
        assert list(tmp_path.rglob(ENDPOINTS))  # published for the input workers
        endpoint = counter.source.source.endpoint.replace("localhost", "127.0.0.1")

        def send():
            with Sender(endpoint, 0, bundle=1) as s:
                for i in range(3):
                    s.send({"x": np.full((4, 5), i, np.float32)})

        t = threading.Thread(target=send, daemon=True)
        t.start()
        for _ in range(3):
            counter.step()
        assert counter.batches == 3 and counter.samples == 12
    finally:
        counter.close()  # the sender's close learns the receiver closed
    t.join(10)
    assert not t.is_alive()
