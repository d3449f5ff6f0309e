"""csrun_runtime/elastic.py: the chief's record of lost input workers, their replacements and streams,
and giving up with the supervisor. The cluster test through csrun_wse is
tests/integration/test_elastic_cluster.py."""
from __future__ import annotations

import time

from csrun_common.atomic import write_json
from csrun_runtime.elastic import MAX_DEATHS, WorkerWatch
from csrun_runtime.rendezvous import Rendezvous


class Source:
    """The two things WorkerWatch asks of the chief's ServiceSource (plain data, no TF)."""

    def __init__(self):
        self.counts = {0: 5, 1: 5}
        self.stopped_set: set[int] = set()
        self.reopened: list[int] = []

    def stopped(self) -> set[int]:
        return set(self.stopped_set)

    def reopen(self, index, registration) -> str:
        self.reopened.append(index)
        self.stopped_set.discard(index)
        return "reopened"


def test_watch_records_loss_replacement_and_stream(tmp_path):
    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    regs = {i: {"status": "ok", "node": f"node{i + 2}", "pid": 100 + i, "attempt": 0} for i in (0, 1)}
    watch, src = WorkerWatch(rdv, regs), Source()
    t_death = time.time() - 1.0
    rdv.mark_lost(1, {"time": t_death, "pid": 101, "node": "node3", "signal": "SIGKILL",
                      "deaths": 1, "given_up": False})
    watch.poll(src)
    assert [(r["index"], r["node"], r["time"]) for r in watch.lost] == [(1, "node3", round(t_death, 3))]
    assert watch.awaiting() == {1}
    src.stopped_set.add(1)  # the stream error arrives later: the same loss, not a second one
    watch.poll(src)
    assert len(watch.lost) == 1 and src.reopened == []
    write_json(rdv.workers_dir / "1.json", {**regs[1], "pid": 201, "attempt": 1})
    watch.poll(src)
    assert src.reopened == [1] and watch.awaiting() == set()
    (rep,) = watch.replaced
    assert rep["index"] == 1 and rep["pid"] == 201 and rep["seconds_after_loss"] >= 1.0
    assert "streaming_again" not in rep
    src.counts[1] += 1
    watch.poll(src)
    assert rep["seconds_loss_to_stream"] >= 1.0
    assert watch.describe()["workers_given_up"] == []


def test_watch_gives_up_with_the_supervisor(tmp_path):
    rdv = Rendezvous(tmp_path, "1.0")
    rdv.reset()
    watch, src = WorkerWatch(rdv, {0: {"status": "ok", "node": "node2", "pid": 1}}), Source()
    for k in range(1, MAX_DEATHS + 1):
        rdv.mark_lost(0, {"time": time.time(), "pid": k, "node": "node2", "signal": "SIGKILL",
                          "deaths": k, "given_up": k == MAX_DEATHS})
    watch.poll(src)
    assert [g["deaths"] for g in watch.given_up] == [MAX_DEATHS]
    assert watch.awaiting() == set()
