"""One layout model (csrun_common.layout.LayoutSpec) and its one csrun_wse flags encoder, used by
the launcher's planning and by the analyzer's report and verify."""
from __future__ import annotations

import ast
import shlex
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer import report as RP
from analyzer import verify as V
from csrun_common.errors import CsrunError
from csrun_common.layout import FLAGS, RECORD_KEYS, LayoutSpec
from launcher.layout import plan, plan_layout
from tests.unit.paths import REPO as ROOT

specs = st.builds(LayoutSpec, nodes=st.integers(1, 64), tasks_per_node=st.integers(1, 64),
                  cpus_per_task=st.one_of(st.none(), st.integers(1, 128)), single_task_nodes=st.integers(0, 8),
                  chief_input_cpus=st.integers(0, 16), cyclic=st.booleans())


@given(specs)
def test_round_trip_flags_layout_flags(spec):
    flags = spec.to_flags()
    assert LayoutSpec.from_flags(flags) == spec
    assert LayoutSpec.from_flags(flags).to_flags() == flags
    # "--flag=value" spellings and other words on the line read the same
    joined = ["csrun_wse", *[f"{a}={b}" if b.isdigit() and a.startswith("--") else a
                            for a, b in zip(flags, flags[1:] + [""], strict=True) if not a.isdigit()],
              "python-ws", "run.py"]
    assert LayoutSpec.from_flags(joined) == spec


def test_flags_written_only_when_set():
    assert LayoutSpec(3, 2, 1).to_flags() == ["--total-nodes", "3", "--tasks-per-node", "2", "--cpus-per-task", "1"]
    assert LayoutSpec(4, 2, None, 1, 3, True).to_flags() == [
        "--total-nodes", "4", "--tasks-per-node", "2", "--single-task-nodes", "1", "--chief-input-cpus", "3",
        "--cyclic"]
    assert set(FLAGS) == {f.name for f in fields(LayoutSpec)}, "every field has its flag"


def test_record_round_trip():
    spec = LayoutSpec(3, 2, 4, 1, 2)
    assert tuple(spec.record()) == RECORD_KEYS
    assert LayoutSpec.from_record(spec.record()) == spec
    assert LayoutSpec.from_record({"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 3,
                                   "chief_input_cpus": None}) == LayoutSpec(2, 1, 3)


@pytest.mark.parametrize("argv,msg", [
    (["--tasks-per-node", "2"], "--total-nodes: missing"),
    (["--total-nodes", "x", "--tasks-per-node", "1"], "--total-nodes 'x': not an integer"),
    (["--total-nodes", "2", "--tasks-per-node"], "--tasks-per-node: needs a value"),
])
def test_bad_flags_name_the_flag(argv, msg):
    with pytest.raises(CsrunError, match=msg):
        LayoutSpec.from_flags(argv)


def test_check_node_names_the_flags():
    with pytest.raises(CsrunError, match=r"--tasks-per-node 3 × --cpus-per-task 3 = 9: more than the 8 CPUs"):
        LayoutSpec(2, 3, 3).check_node(8)
    with pytest.raises(CsrunError, match="--chief-input-cpus 3: more than the chief task's 2 CPU"):
        LayoutSpec(2, 2, 2, chief_input_cpus=3).check_node(8)
    assert LayoutSpec(2, 2, 2, 1, chief_input_cpus=8).check_node(8).chief_task_cpus(8) == 8


@given(specs)
def test_the_launcher_plans_the_spec(spec):
    try:
        lay = plan(spec, "gpu:1", node_cpus=16)
    except CsrunError:
        return
    assert lay.spec == spec and lay.total_nodes == spec.nodes and lay.chief_input_cpus == spec.chief_input_cpus
    assert lay.num_input_workers == spec.num_input_workers
    assert lay == plan_layout(spec.nodes, spec.tasks_per_node, spec.cpus_per_task, spec.single_task_nodes,
                              spec.cyclic, "gpu:1", 16, spec.chief_input_cpus)


def test_report_and_verify_use_the_one_encoder():
    rec = {"nodes": 3, "tasks_per_node": 2, "cpus_per_task": 4, "single_task_nodes": 0, "chief_input_cpus": 3}
    line = shlex.split(RP.csrun_wse_command(rec, ["python", "run.py"]))
    flags = LayoutSpec.from_record(rec).to_flags()
    assert line[1:1 + len(flags)] == flags
    rep = {"run_py": "run.py", "argv": []}
    argv = V.drain_command(rep, Path("/tmp/v"), rec, 10, 3, None)
    assert argv[1:1 + len(flags)] == flags
    assert V.drain_command(rep, Path("/tmp/v"), LayoutSpec.from_record(rec), 10, 3, None) == argv
    assert LayoutSpec.from_flags(argv[:argv.index("python-ws")]) == LayoutSpec.from_record(rec)


def test_no_second_layout_flags_encoder():
    """Layout flags are written only by LayoutSpec.to_flags: no other module of the packages
    builds an argv ``[..., "--total-nodes", str(n), ...]`` (a flag's name followed by a value
    turned into text)."""
    found = []
    for pkg in ("launcher", "analyzer", "csrun_runtime", "csrun_common"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "layout.py" and path.parent.name == "csrun_common":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.List, ast.Tuple)):
                    for a, b in zip(node.elts, node.elts[1:], strict=False):
                        text = isinstance(b, ast.JoinedStr) or (isinstance(b, ast.Call) and getattr(b.func, "id", "")
                                                                == "str")
                        if isinstance(a, ast.Constant) and a.value in FLAGS.values() and text:
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {a.value}")
    assert not found, "encode layout flags with csrun_common.layout.LayoutSpec.to_flags:\n" + "\n".join(found)


def test_layout_rules_of_several_ranks():
    spec = LayoutSpec(4, 2, 1, chief_input_cpus=1, chief_nodes=2, chief_tasks_per_node=2).check()
    assert spec.world_size == 4 and spec.num_input_workers == 8
    assert spec.to_flags()[-4:] == ["--chief-nodes", "2", "--chief-tasks-per-node", "2"]
    assert LayoutSpec.from_record(spec.record()) == spec
    with pytest.raises(CsrunError, match=r"^--total-nodes 5 --tasks-per-node 2: 6 input workers for 4 trainer "
                                         r"ranks; .*\(4, 8 would be\)$"):
        LayoutSpec(5, 2, 1, chief_nodes=2, chief_tasks_per_node=2).check()
    with pytest.raises(CsrunError, match="^--single-task-nodes 1: not with several trainer ranks"):
        LayoutSpec(4, 2, 1, single_task_nodes=1, chief_tasks_per_node=2).check()
    with pytest.raises(CsrunError, match="^--chief-nodes 2: must be less than --total-nodes 2"):
        LayoutSpec(2, 2, 1, chief_nodes=2).check()
