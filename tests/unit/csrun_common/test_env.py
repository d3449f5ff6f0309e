"""One codec for csrun's environment variables (csrun_common/env.py) and its exit statuses'
declarations (csrun_common/exits.py).

Fails when a second writer/definition appears: a module of the four packages spelling a
``CSRUN_*`` name as a string of its own (instead of importing it from csrun_common.env), a
``CSRUN_*`` name anywhere in the tree that csrun_common.env does not declare, or docs/ENV.md
out of date (an exit status written as a number: tests/unit/csrun_common/test_exits.py).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from csrun_common import env as codec
from csrun_common import exits
from csrun_common.env import EnvError, TaskEnv
from csrun_common.roles import RoleError, resolve_role
from tests.unit.paths import REPO as ROOT

PACKAGES = ("launcher", "analyzer", "csrun_runtime", "csrun_common")
CODEC = {ROOT / "csrun_common" / "env.py", ROOT / "csrun_common" / "exits.py"}
NAME = re.compile(r"(?<![A-Za-z0-9_])CSRUN_[A-Z0-9_]*[A-Z0-9]")


def package_sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p not in CODEC)


def docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (any bare string expression statement)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.add(id(node.value))
    return out


def name_literals(tree: ast.AST) -> list[str]:
    """``CSRUN_*`` names a module spells itself: a string that is a whole name
    (``"CSRUN_ROLE"``), a plain string that assigns one (``"CSRUN_ROLE=worker"``), a keyword
    argument named like one (``dict(env, CSRUN_ROLE=...)``). Docstrings and names inside
    formatted messages (``f"CSRUN_NUM_WORKERS={n} must be ..."``) are not."""
    skip = docstring_nodes(tree)
    formatted = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if NAME.fullmatch(node.value) or (id(node) not in formatted
                                              and re.match(r"CSRUN_[A-Z0-9_]+=", node.value)):
                found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.keyword) and node.arg and NAME.fullmatch(node.arg):
            found.append(f"{node.value.lineno}: {node.arg}=")
    return found


def test_the_name_check_catches_spellings():
    src = ('"""Reads CSRUN_ROLE."""\nimport os\nos.environ.get("CSRUN_ROLE")\nenv = dict(os.environ, CSRUN_NICE="1")\n'
           'line = "CSRUN_ROLE=worker"\nmsg = f"CSRUN_NUM_WORKERS={n} must be >= 0"\n')
    assert sorted(name_literals(ast.parse(src))) == ["3: 'CSRUN_ROLE'", "4: CSRUN_NICE=", "5: 'CSRUN_ROLE=worker'"]


def test_no_module_spells_a_variable_name_outside_the_codec():
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in package_sources()
             for hit in name_literals(ast.parse(path.read_text(), str(path)))]
    for path in sorted((ROOT / "launcher" / "templates").glob("*.j2")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.lstrip().startswith("#") and NAME.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "import these names from csrun_common.env:\n" + "\n".join(found)


def test_the_task_contract_has_one_writer():
    """The benchmarks that start tasks by hand write their contract with TaskEnv.encode too."""
    task_vars = {v for v in codec.VARIABLES.values() if v.scope == "task"}
    found = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in task_vars and id(node) not in docstring_nodes(tree):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "write the task contract with csrun_common.env.TaskEnv(...).encode():\n" + "\n".join(found)


def test_every_variable_named_in_the_tree_is_declared():
    where: dict[str, str] = {}
    dirs = (*PACKAGES, "tests", "bench", "scripts", "slurm-test-cluster", "docs", "examples", "templates")
    files = [ROOT / "README.md"] + [p for d in dirs if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*")
                                    if p.is_file() and p.suffix in (".py", ".md", ".sh", ".j2", ".toml", ".yaml", "")
                                    and "run" not in p.relative_to(ROOT).parts[1:2]]
    for path in files:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for name in NAME.findall(text):
            where.setdefault(name, str(path.relative_to(ROOT)))
    undeclared = {n: w for n, w in where.items() if n not in codec.VARIABLES}
    assert not undeclared, f"declare these in csrun_common/env.py (docs/ENV.md): {undeclared}"


def test_env_md_is_generated_from_the_codec():
    doc = ROOT / "docs" / "ENV.md"
    assert doc.read_text() == codec.render_markdown(), "regenerate: python -m csrun_common.env > docs/ENV.md"


def test_every_declaration_is_complete():
    for var in codec.VARIABLES.values():
        assert var.kind and var.writer and var.reader and var.meaning, var
        # csrun's own are CSRUN_*; only torchrun's and TensorFlow's, set for trainer ranks, are not
        assert var.name.startswith("CSRUN_") or var.scope == "rank", var
    assert {v.name for v in codec.VARIABLES.values() if v.scope == "rank"} == {
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"}
    codes = [s.code for s in exits.STATUSES]
    assert len(set(codes)) == len(codes)
    assert all(getattr(exits, s.name) == s.code for s in exits.STATUSES)


def test_var_is_its_name_everywhere():
    env = {codec.ROLE: "worker"}
    assert env["CSRUN_ROLE"] == "worker" and f"{codec.ROLE}" == "CSRUN_ROLE" and codec.ROLE.name == "CSRUN_ROLE"
    import pickle

    assert pickle.loads(pickle.dumps(codec.ROLE)) == "CSRUN_ROLE"


@pytest.mark.parametrize("task", [
    TaskEnv("chief", 0, 0, 1, 5, 6, 2, execution_mode="weight_streaming", stop_signals="USR2:TERM",
            autoscale="1:1:6:rate:10", chief_input_cpus=1, worker_job=True),
    TaskEnv("worker", 1, 2, 1, 5, 6, None),
    TaskEnv("single-task", 2, 1, 0, 3, 4, 16),
])
def test_task_env_round_trip(task):
    encoded = task.encode()
    assert ("PYTHONUNBUFFERED", "1") in encoded
    assert TaskEnv.decode(dict(encoded)) == task


def test_task_env_encode_order_is_the_contract():
    names = [k for k, _ in TaskEnv("worker", 1, 2, 0, 4, 5, 1, stop_signals="TERM").encode()]
    assert names == ["CSRUN_ROLE", "CSRUN_HET_GROUP", "CSRUN_TASK_OFFSET", "CSRUN_WORKER_OFFSET",
                     "CSRUN_NUM_WORKERS", "CSRUN_NUM_TASKS", "CSRUN_CPUS_PER_TASK", "PYTHONUNBUFFERED",
                     "CSRUN_STOP_SIGNALS"]


def test_task_env_decode_errors_name_the_variable():
    assert TaskEnv.decode({}) == TaskEnv(None)
    with pytest.raises(EnvError, match="CSRUN_ROLE='boss'"):
        TaskEnv.decode({"CSRUN_ROLE": "boss"})
    with pytest.raises(EnvError, match="CSRUN_CHIEF_INPUT_CPUS='x' is not an integer"):
        TaskEnv.decode({"CSRUN_ROLE": "chief", "CSRUN_NUM_WORKERS": "1", "CSRUN_CHIEF_INPUT_CPUS": "x"})
    with pytest.raises(EnvError):
        TaskEnv(None).encode()


def test_resolve_role_reads_what_the_encoder_writes():
    enc = dict(TaskEnv("worker", 1, 2, 3, 8, 9, 2).encode(), SLURM_PROCID="4", SLURM_JOB_ID="7")
    role = resolve_role(enc)
    assert (role.kind, role.worker_index, role.num_input_workers, role.cpus_per_task) == ("worker", 5, 8, 2)
    with pytest.raises(RoleError):  # a RoleError is an EnvError, naming the variable
        resolve_role({"CSRUN_ROLE": "worker", "SLURM_PROCID": "0", "CSRUN_NUM_WORKERS": "-1"})
