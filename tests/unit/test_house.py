"""The house rules of issue 22 ("One house for two frameworks"), checked on the source tree:
no import circle among csrun's packages, no function over 80 lines outside tests and
benchmarks, no class over 250 lines in the task runtime. Read from the files with ``ast``:
nothing is imported or run."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("csrun_common", "launcher", "analyzer", "csrun_runtime")
#: Where the length rules do not apply: the tests, the benchmarks, generated and installed files.
SKIP = ("tests", "bench", ".venv", "slurm-test-cluster/run", "build")
MAX_FUNCTION_LINES = 80
MAX_RUNTIME_CLASS_LINES = 250


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that runs: module level and inside functions, but not the ones
    under ``if TYPE_CHECKING:`` (they exist for the type checker only)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in skipped]


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    targets: set[str] = set()
    for node in _runtime_imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bases = [a.name for a in node.names]
            names: list[str] = []
        else:
            base = ".".join(here[:len(here) - node.level + 1] if node.level else [])
            mod = node.module or ""
            bases = [f"{base}.{mod}".strip(".") if node.level else mod]
            names = [a.name for a in node.names]
        for b in bases:
            subs = [f"{b}.{n}" for n in names if f"{b}.{n}" in modules]
            targets.update(subs or ([b] if b in modules else []))
    targets.discard(name)
    return targets


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_among_csruns_modules():
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    assert sum(len(v) for v in graph.values()) > 100  # the graph was read, not empty
    assert _cycles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _sources() -> list[Path]:
    return [p for p in sorted(REPO.rglob("*.py"))
            if not str(p.relative_to(REPO)).startswith(SKIP)]


def _long(kind: tuple[type, ...], limit: int, paths: list[Path]) -> list[str]:
    found = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, kind) and node.end_lineno - node.lineno + 1 > limit:
                found.append(f"{p.relative_to(REPO)}:{node.lineno} {node.name} "
                             f"({node.end_lineno - node.lineno + 1} lines)")
    return found


def test_no_function_over_80_lines_outside_tests_and_benchmarks():
    paths = _sources()
    assert any(p.parts[-2:] == ("launcher", "cli.py") for p in paths)
    assert _long((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES, paths) == []


def test_no_class_over_250_lines_in_the_task_runtime():
    paths = [p for p in _sources() if p.relative_to(REPO).parts[0] == "csrun_runtime"]
    assert len(paths) > 20
    assert _long((ast.ClassDef,), MAX_RUNTIME_CLASS_LINES, paths) == []


@pytest.mark.parametrize("limit, expected", [(3, 1), (10, 0)])
def test_the_length_rule_counts_lines(tmp_path, limit, expected, monkeypatch):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    a = 1\n    b = 2\n    return a + b\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert len(_long((ast.FunctionDef,), limit, [f])) == expected


#: The task runtime's framework-neutral core (docs/ARCHITECTURE.md "A framework backend"):
#: what both the TensorFlow runtime and ``csrun_runtime/pytorch/`` build on.
CORE = ("rendezvous", "supervise", "elastic", "autoscale", "preemption", "artifacts", "params", "sharding",
        "chief_input", "coverage", "capture", "task", "dataplane", "dataplane.framing", "dataplane.transport",
        "loop", "input_backend", "streams")


def _imported_at_import(modules: list[str]) -> set[str]:
    """Top-level packages that ``import <modules>`` loads, read from ``python -X importtime``."""
    import subprocess
    import sys

    code = "; ".join(f"import {m}" for m in modules)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          cwd=str(REPO), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}


def test_the_runtime_core_imports_neither_framework():
    loaded = _imported_at_import([f"csrun_runtime.{m}" for m in CORE])
    assert "csrun_runtime" in loaded  # the check reads the import log at all
    assert not {"tensorflow", "torch"} & loaded, sorted({"tensorflow", "torch"} & loaded)


def test_the_pytorch_runtime_imports_no_tensorflow():
    mods = sorted(f"csrun_runtime.pytorch.{p.stem}" for p in (REPO / "csrun_runtime" / "pytorch").glob("*.py")
                  if p.stem != "__init__")
    loaded = _imported_at_import(["csrun_runtime.pytorch", *mods])
    assert "tensorflow" not in loaded


# --------------------------------------------------------------------------- issue 30: flags once
#: Where a layout flag's text may not appear twice: every source module but the tests, the
#: benchmarks and the examples (docs are Markdown, not modules).
FLAG_SKIP = (*SKIP, "examples")


def _layout_flag_modules() -> dict[str, list[str]]:
    """Layout flag text -> the source modules that write it. Slurm's own options that share a
    name (srun's ``--cpus-per-task=N``) are always written with their ``=`` by csrun's builders,
    so an occurrence followed by ``=`` is Slurm's, not the flag's."""
    import re

    from csrun_common.layout import LAYOUT_FLAGS

    paths = [p for p in sorted(REPO.rglob("*.py")) if not str(p.relative_to(REPO)).startswith(FLAG_SKIP)]
    out: dict[str, list[str]] = {}
    for spec in LAYOUT_FLAGS:
        pattern = re.compile(re.escape(spec.flag) + r"(?![=\w-])")
        out[spec.flag] = [str(p.relative_to(REPO)) for p in paths if pattern.search(p.read_text())]
    return out


def test_each_layout_flag_is_written_in_one_module():
    """Every layout flag's text (``--tasks-per-node`` ...) appears in one source module,
    ``csrun_common/layout.py``: the CLIs' options, messages and help read it from there."""
    found = _layout_flag_modules()
    assert "--tasks-per-node" in found and len(found) >= 6  # LAYOUT_FLAGS was read
    assert {flag: mods for flag, mods in found.items() if mods != ["csrun_common/layout.py"]} == {}


def test_the_layout_flag_grep_sees_a_second_module(tmp_path, monkeypatch):
    (tmp_path / "csrun_common").mkdir()
    (tmp_path / "csrun_common" / "layout.py").write_text('F = "--tasks-per-node"\n')
    (tmp_path / "other.py").write_text('X = "--tasks-per-node 2"\nY = "--cpus-per-task=2"\n')
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    found = _layout_flag_modules()
    assert found["--tasks-per-node"] == ["csrun_common/layout.py", "other.py"]
    assert found["--cpus-per-task"] == []  # srun's option, with its '='


#: At most this many source files change for a new layout flag (issue 30).
MAX_LAYOUT_FLAG_FILES = 6


def test_adding_a_layout_flag_touches_at_most_6_source_files():
    """docs/ARCHITECTURE.md's recipe "A layout flag" names, in its numbered steps, the source
    files a new layout flag changes: at most :data:`MAX_LAYOUT_FLAG_FILES` (docs and tests apart)."""
    import re

    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    start = text.index("**A layout flag**")
    section = text[start:text.index("\n**", start + 10)]
    steps = re.findall(r"^\d+\. .*(?:\n   .*)*", section, flags=re.M)
    assert len(steps) >= 3  # the numbered steps were read
    files = set(re.findall(r"`((?:csrun_common|launcher|analyzer|csrun_runtime)/[\w/]+\.py)`", "\n".join(steps)))
    assert "csrun_common/layout.py" in files  # the recipe was read
    assert len(files) <= MAX_LAYOUT_FLAG_FILES, sorted(files)
    assert all((REPO / f).exists() for f in files), sorted(f for f in files if not (REPO / f).exists())
