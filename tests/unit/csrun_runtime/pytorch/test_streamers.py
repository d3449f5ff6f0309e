"""csrun binds the Model Zoo's ``cb_model`` to its streamer facts (issue 33, item 1;
``csrun_runtime/pytorch/streamers.py``, ``bind_modelzoo``), on a faithful stand-in of how
Model Zoo R1.6.1 defines it (``tests/fixtures/modelzoo_pt``: ``cb_model`` a SimpleNamespace bound
in ``modelzoo/common/pytorch/__init__.py``, not a module)."""
from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from csrun_runtime.pytorch import streamers  # noqa: E402
from csrun_runtime.pytorch.streamers import StreamerFacts, set_facts  # noqa: E402
from tests.unit.paths import REPO  # noqa: E402

ZOO = REPO / "tests" / "fixtures" / "modelzoo_pt"


def _forget_modelzoo() -> None:
    for name in [m for m in sys.modules if m == "modelzoo" or m.startswith("modelzoo.")]:
        del sys.modules[name]


@pytest.fixture
def zoo(monkeypatch):
    """The fixture Model Zoo on sys.path, fresh; the binding state reset before and after."""
    _forget_modelzoo()
    monkeypatch.syspath_prepend(str(ZOO))
    monkeypatch.setattr(streamers, "_TRIED", False)
    monkeypatch.setattr(streamers, "_BOUND", None)
    yield
    set_facts(None)
    _forget_modelzoo()


def test_the_fixture_defines_cb_model_as_the_release_does(zoo):
    pkg = importlib.import_module("modelzoo.common.pytorch")
    assert pkg.cb_model.num_streamers() == 1 and pkg.cb_model.get_streaming_rank() == 0
    with pytest.raises(ModuleNotFoundError):  # the old docs' line fails on the release
        importlib.import_module("modelzoo.common.pytorch.cb_model")


def test_set_facts_binds_cb_model_and_an_unmodified_processor_takes_its_share(zoo, caplog):
    data = importlib.import_module("modelzoo.tap.pytorch.data")  # imported before: the object is bound in place
    caplog.set_level(logging.INFO, logger="csrun.runtime")
    set_facts(StreamerFacts(6, 4, True))
    from modelzoo.common.pytorch import cb_model as cm

    assert (cm.num_streamers(), cm.get_streaming_rank(), cm.is_streamer()) == (6, 4, True)
    shares = []
    for rank in range(6):
        set_facts(StreamerFacts(6, rank, True))
        loader = data.train_input_dataloader({"train_input": {"batch_size": 10, "shuffle_seed": 3,
                                                              "num_samples": 600}})
        shares.append([int(i) for b in loader for i in b["id"]])
    assert all(len(s) == 100 for s in shares)
    seen = [i for s in shares for i in s]
    assert sorted(seen) == list(range(600))  # disjoint and covering
    set_facts(StreamerFacts(6, 0, False))  # the chief reading from input workers
    assert cm.is_streamer() is False
    bound = [r for r in caplog.records if "cb_model" in r.getMessage()]
    assert len(bound) == 1, [r.getMessage() for r in bound]  # said once


def test_a_model_zoo_imported_after_the_facts_is_bound_too(zoo):
    set_facts(StreamerFacts(3, 2, True))  # binds: the package is importable, so it is imported
    assert "modelzoo.common.pytorch" in sys.modules
    from modelzoo.common.pytorch import cb_model

    assert (cb_model.num_streamers(), cb_model.get_streaming_rank()) == (3, 2)


def test_without_a_model_zoo_nothing_is_imported_and_nothing_fails(monkeypatch):
    _forget_modelzoo()
    # no directory holding a modelzoo package on the path (an earlier test's run.py directory may be)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "modelzoo").exists()])
    importlib.invalidate_caches()
    monkeypatch.setattr(streamers, "_TRIED", False)
    monkeypatch.setattr(streamers, "_BOUND", None)
    set_facts(StreamerFacts(2, 1, True))
    try:
        assert "modelzoo" not in sys.modules
        assert streamers.bind_modelzoo() is False
    finally:
        set_facts(None)


def test_a_broken_model_zoo_is_a_warning_not_a_failure(tmp_path, monkeypatch, caplog):
    pkg = tmp_path / "modelzoo" / "common" / "pytorch"
    pkg.mkdir(parents=True)
    (tmp_path / "modelzoo" / "__init__.py").write_text("")
    (tmp_path / "modelzoo" / "common" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("raise RuntimeError('no cerebras here')\n")
    _forget_modelzoo()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(streamers, "_TRIED", False)
    monkeypatch.setattr(streamers, "_BOUND", None)
    caplog.set_level(logging.INFO, logger="csrun.runtime")
    try:
        set_facts(StreamerFacts(2, 0, True))
        assert streamers.num_streamers() == 2
        assert any("failed to import" in r.getMessage() and "no cerebras here" in r.getMessage()
                   for r in caplog.records)
    finally:
        set_facts(None)
        _forget_modelzoo()


def test_an_input_worker_build_binds_before_the_data_function_runs(tmp_path):
    """Through the input worker's own build (:func:`csrun_runtime.pytorch.worker.build_loader`),
    in a fresh process: the processor's constructor reads csrun's facts."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.append({str(ZOO)!r})
        from csrun_runtime.pytorch.worker import build_loader
        from modelzoo.tap.pytorch.data import train_input_dataloader
        params = {{"train_input": {{"batch_size": 5, "shuffle_seed": 1, "num_samples": 60}}, "runconfig": {{}}}}
        loader, _, _ = build_loader(train_input_dataloader, params, 2, 3, 2)
        print(sorted(int(i) for b in loader for i in b["id"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own list of ints
    assert len(got) == 20 and len(set(got)) == 20  # a third of 60, not all of them


def test_streamer_facts():
    try:
        streamers.set_facts(streamers.StreamerFacts(6, 5, True))
        assert (streamers.num_streamers(), streamers.get_streaming_rank(), streamers.is_streamer()) == (6, 5, True)
        streamers.set_facts(None)
        assert streamers.facts() == streamers.StreamerFacts(1, 0, True) or os.environ.get("CSRUN_ROLE")
    finally:
        streamers.set_facts(None)
    with pytest.raises(ValueError, match="streaming rank 3 outside"):
        streamers.StreamerFacts(3, 3, True)
