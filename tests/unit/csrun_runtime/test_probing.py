"""The analyzer's node-side harnesses and their backends (issue 30, item 2): each framework's
``probe`` and ``drain`` modules implement the interfaces declared once in
:mod:`csrun_runtime.probing`; the analyzer never imports TensorFlow or torch (at any level) and
never a private name; the backends' facts are read without importing a framework."""
from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from csrun_runtime import probing, registry
from csrun_runtime import probing as D
from tests.unit.paths import REPO

FRAMEWORK_PACKAGES = ("tensorflow", "torch")
#: the framework-neutral harnesses and the core module they share
NEUTRAL = sorted((REPO / "analyzer").glob("*.py")) + [REPO / "csrun_runtime" / "probing.py"]


def _members(proto: type) -> dict[str, list[str]]:
    """A Protocol's methods and their parameter names (``self`` left out)."""
    out = {}
    for name, fn in vars(proto).items():
        if inspect.isfunction(fn) and not name.startswith("_"):
            out[name] = [p for p in inspect.signature(fn).parameters if p != "self"]
    return out


def _params(obj: object) -> list[str]:
    return [p for p in inspect.signature(obj).parameters if p != "self"]  # type: ignore[arg-type]


@pytest.mark.parametrize("framework", registry.FRAMEWORKS)
def test_each_backend_implements_the_probe_and_drain_interfaces(framework):
    probe = registry.entry(framework, "probe")
    assert isinstance(registry.facts(framework).probe, probing.ProbeFacts)
    for name, params in _members(probing.ProbeBackend).items():
        assert _params(getattr(probe, name)) == params, (framework, "probe", name)
    drain = registry.entry(framework, "drain")
    for name, params in _members(probing.DrainBackend).items():
        assert _params(getattr(drain, name)) == params, (framework, "drain", name)
    assert _params(drain.ChiefDrain) == ["role", "resolved", "captured", "t_proc"]
    for name, params in _members(probing.ChiefDrain).items():
        assert _params(getattr(drain.ChiefDrain, name)) == params, (framework, "ChiefDrain", name)


def test_facts_differ_where_the_frameworks_do():
    tf, pt = probing.facts("tensorflow"), probing.facts("pytorch")
    assert tf.ingest_probe and not pt.ingest_probe
    assert pt.dataloader_workers and not tf.dataloader_workers
    assert probing.facts(None) == probing.facts(probing.DEFAULT_FRAMEWORK)
    assert probing.framework_of_report(None, True) == "pytorch"
    assert probing.framework_of_report(None, False) == probing.DEFAULT_FRAMEWORK == "tensorflow"
    with pytest.raises(registry.UnknownFramework, match="jax"):
        probing.facts("jax")


def _framework_imports(path: Path) -> list[str]:
    """Every import of a framework package in ``path``: module level, in functions, under
    ``TYPE_CHECKING``, and ``__import__("...")`` calls."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("__import__", "importlib.import_module"):
            names = [ast.unparse(a) for a in node.args[:1]]
        found += [f"{path.name}:{node.lineno} {n}" for n in names
                  if any(fw in n.strip("'\"").split(".")[0] for fw in FRAMEWORK_PACKAGES)]
    return found


def test_the_analyzer_and_the_harness_core_import_no_framework(tmp_path):
    assert len(NEUTRAL) > 15 and [f for p in NEUTRAL for f in _framework_imports(p)] == []
    # the scan sees an import in a function, one under TYPE_CHECKING and an __import__ call
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                      "def f():\n    import tensorflow as tf\n    return __import__('torch')\n")
    assert len(_framework_imports(sample)) == 3


def test_the_analyzer_imports_no_private_name():
    bad = []
    for path in NEUTRAL:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                bad += [f"{path.relative_to(REPO)}:{node.lineno} {a.name}" for a in node.names
                        if a.name.startswith("_") and a.name != "__future__"]
    assert bad == []


def test_reading_the_facts_and_the_harnesses_imports_no_framework():
    script = ("import json, sys\n"
              "import analyzer.probe_worker, analyzer.verify_task, analyzer.analyze, analyzer.verify\n"
              "from csrun_runtime import probing\n"
              "facts = [probing.facts(fw).title for fw in ('tensorflow', 'pytorch')]\n"
              "loaded = [m for m in ('tensorflow', 'torch') if m in sys.modules]\n"
              "print(json.dumps({'facts': facts, 'loaded': loaded}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"facts": ["TensorFlow", "PyTorch"], "loaded": []}


def test_a_served_probe_on_a_gpu_names_the_device_feed_in_the_report():
    """The served probe's chief reads through the runtime's device feed: its device and the bytes/s
    it delivered there reach the probe row and, on CUDA, the report's ingest note (issue 31 item 3)."""
    from analyzer import findings
    from analyzer.probe_plan import summarize

    def res(index, device):
        return {"index": index, "samples_per_sec": 1000.0, "window_s": 2.0, "cpu_seconds": 1.0, "samples": 2000,
                "batches": 20, "element_bytes": 4e9, "input": {"feed_device": device} if index == 0 else {}}

    gpu = summarize("served", 2, 1, 4, [res(0, "cuda:0"), res(1, "")], "ok", "", 0.0, 3.0, 1.0, "n", 1)
    assert gpu["feed_device"] == "cuda:0" and gpu["chief_feed_bytes_per_sec"] == 2e9
    assert findings._device_feed_note([gpu]).startswith("; into cuda:0 the device feed delivered 2.00 GB/s")
    cpu = summarize("served", 2, 1, 4, [res(0, "cpu"), res(1, "")], "ok", "", 0.0, 3.0, 1.0, "n", 2)
    assert cpu["feed_device"] == "cpu" and findings._device_feed_note([cpu]) == ""



def test_process_tree_counts_the_workers_children():
    # a child (the supervisor) with a child (the worker): both are counted
    proc = subprocess.Popen([sys.executable, "-c",
                             "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                             "'import time; time.sleep(30)'])"])
    try:
        pids: list[int] = []
        for _ in range(100):
            pids = D.process_tree(proc.pid)
            if len(pids) >= 2:
                break
            time.sleep(0.05)
        assert pids[0] == proc.pid and len(pids) >= 2
    finally:
        for pid in reversed(D.process_tree(proc.pid)):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.wait()
    assert D.process_tree(proc.pid) == [proc.pid]  # gone: just itself
