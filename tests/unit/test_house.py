"""The house rules of issues 22 ("One house for two frameworks") and 30 ("Symmetric backends"),
checked on the source tree: no import circle among csrun's packages (``TYPE_CHECKING`` imports
counted), no module importing another's private name, TensorFlow and torch imported only in
their own backend folder, the backend folders never importing each other and holding the same
entry modules, each implementing the core's Protocols (:mod:`csrun_runtime.backend`), no
function over 60 lines and no class over 250 lines outside tests, benchmarks and examples. Read
from the files with ``ast``, except the Protocol check (imports the backends' modules, which
import neither framework) and the import-time checks (``python -X importtime``)."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("csrun_common", "launcher", "analyzer", "csrun_runtime")
#: Where the length rules do not apply: the tests, the benchmarks, the examples, generated and
#: installed files.
SKIP = ("tests", "bench", "examples", ".venv", "slurm-test-cluster/run", "build")
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250
#: Each framework's package, by the backend folder that alone may import it.
FRAMEWORK_OF_FOLDER = {"csrun_runtime.tensorflow": "tensorflow", "csrun_runtime.pytorch": "torch"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement at any level: module level, inside functions and under
    ``if TYPE_CHECKING:`` (a circle through an annotation is still a circle of the design)."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _absolute(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import of module ``name`` (file ``path``) names."""
    if not node.level:
        return node.module or ""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = ".".join(here[:len(here) - node.level + 1])
    return f"{base}.{node.module}".strip(".") if node.module else base


def _imported(name: str, path: Path, modules: dict[str, Path] | None = None) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import of module ``name``; ``from m import x`` counts
    as ``m.x`` where that is one of ``modules``."""
    out = []
    for node in _imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
            continue
        base = _absolute(name, path, node)
        subs = [f"{base}.{a.name}" for a in node.names if modules and f"{base}.{a.name}" in modules]
        out += [(node.lineno, m) for m in subs or [base]]
    return out


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text())):
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


def test_no_import_circle_among_csruns_modules_type_checking_imports_counted():
    modules = _modules()
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    assert sum(len(v) for v in graph.values()) > 100  # the graph was read, not empty
    assert _cycles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_an_import_under_type_checking_is_an_edge(tmp_path):
    (tmp_path / "pkg").mkdir()
    a = tmp_path / "pkg" / "a.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    assert _edges("pkg.a", a, {"pkg.a": a, "pkg.b": a}) == {"pkg.b"}


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


def test_no_function_over_60_lines_outside_tests_benchmarks_and_examples():
    paths = _sources()
    assert any(p.parts[-2:] == ("launcher", "cli.py") for p in paths)
    assert not any(p.relative_to(REPO).parts[0] in ("tests", "bench", "examples") for p in paths)
    assert _long((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES, paths) == []


def test_no_class_over_250_lines_outside_tests_benchmarks_and_examples():
    paths = _sources()
    assert len([p for p in paths if p.relative_to(REPO).parts[0] == "csrun_runtime"]) > 20
    assert _long((ast.ClassDef,), MAX_CLASS_LINES, paths) == []


@pytest.mark.parametrize("limit, expected", [(3, 1), (10, 0)])
def test_the_length_rule_counts_lines(tmp_path, limit, expected, monkeypatch):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    a = 1\n    b = 2\n    return a + b\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert len(_long((ast.FunctionDef,), limit, [f])) == expected


#: The task runtime's framework-neutral core (docs/ARCHITECTURE.md "A framework backend"):
#: what both the TensorFlow runtime and ``csrun_runtime/pytorch/`` build on.
CORE = ("rendezvous", "supervise", "elastic", "autoscale", "preemption", "artifacts", "params", "sharding",
        "chief_input", "coverage", "capture", "task", "dataplane", "dataplane.framing", "dataplane.protocol",
        "loop", "input_backend", "streams", "bundles", "backend", "registry", "probing", "first_batch", "ranks",
        "rankgroup", "handoff", "dataplane.bulk", "dataplane.sender", "dataplane.receiver", "dataplane.workers",
        "dataplane.intake", "dataplane.auth")


def test_core_lists_every_top_level_module_of_the_runtime():
    tops = {p.stem for p in (REPO / "csrun_runtime").glob("*.py") if p.stem != "__init__"}
    tops |= {p.name for p in (REPO / "csrun_runtime").iterdir() if (p / "__init__.py").exists()}
    assert tops - set(CORE) == {"tensorflow", "pytorch"}


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


@pytest.mark.parametrize("backend, other", [("pytorch", "tensorflow"), ("tensorflow", "torch")])
def test_a_backend_loads_not_the_other_framework(backend, other):
    mods = sorted(f"csrun_runtime.{backend}.{p.stem}" for p in (REPO / "csrun_runtime" / backend).glob("*.py")
                  if p.stem != "__init__")
    loaded = _imported_at_import([f"csrun_runtime.{backend}", *mods])
    assert "csrun_runtime" in loaded
    assert other not in loaded



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


# --------------------------------------------------------------------------- the backends (issue 30)
BACKENDS = tuple(FRAMEWORK_OF_FOLDER)


def _folder_of(name: str) -> str | None:
    """The backend folder module ``name`` lies in, or ``None`` for the core and the other packages."""
    return next((b for b in BACKENDS if name == b or name.startswith(b + ".")), None)


def _everything() -> list[tuple[str, Path, int, str]]:
    """``(module, path, line, imported module)`` of every import in csrun's packages."""
    modules = _modules()
    return [(name, path, line, m) for name, path in modules.items() for line, m in _imported(name, path, modules)]


def test_tensorflow_and_torch_are_imported_only_in_their_own_backend_folder():
    found = [f"{p.relative_to(REPO)}:{line} imports {m}" for name, p, line, m in _everything()
             if m.split(".")[0] in FRAMEWORK_OF_FOLDER.values()
             and FRAMEWORK_OF_FOLDER.get(_folder_of(name) or "") != m.split(".")[0]]
    assert found == []


def test_the_framework_rule_sees_an_import_inside_a_function_and_under_type_checking(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                 "def f():\n    import tensorflow as tf\n    from tensorflow.python import x\n")
    assert [m for _, m in _imported("csrun_runtime.m", f)] == ["typing", "torch", "tensorflow", "tensorflow.python"]


def test_the_backend_folders_never_import_each_other():
    found = [f"{p.relative_to(REPO)}:{line} imports {m}" for name, p, line, m in _everything()
             if _folder_of(name) and _folder_of(m) and _folder_of(m) != _folder_of(name)]
    assert found == []


def test_only_the_registry_names_both_backends():
    both: dict[str, set[str]] = {}
    for name, _p, _line, m in _everything():
        if _folder_of(m) and not _folder_of(name):
            both.setdefault(name, set()).add(_folder_of(m) or "")
    assert sorted(n for n, b in both.items() if len(b) > 1) == []
    from csrun_runtime import registry

    assert tuple(f"csrun_runtime.{fw}" for fw in registry.FRAMEWORKS) == BACKENDS


def test_the_core_reaches_a_backend_only_through_the_registry():
    """The core (the top of csrun_runtime, csrun_common, launcher) imports no backend module;
    ``csrun_runtime.run`` is the registry's ``entry("tensorflow", "runner").run``."""
    found = [f"{p.relative_to(REPO)}:{line} imports {m}" for name, p, line, m in _everything()
             if _folder_of(m) and not _folder_of(name) and not name.startswith("analyzer")]
    assert found == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_backend_folders_hold_the_entry_modules(backend):
    from csrun_runtime.registry import ENTRY_MODULES

    folder = REPO / backend.replace(".", "/")
    assert sorted(m for m in ENTRY_MODULES if not (folder / f"{m}.py").exists()) == []


# -- the Protocols: each backend's entry modules against csrun_runtime.backend
def _params(sig: inspect.Signature, drop_self: bool) -> list[inspect.Parameter]:
    ps = list(sig.parameters.values())
    return ps[1:] if drop_self and ps and ps[0].name == "self" else ps


def _incompatible(proto: inspect.Signature, impl: inspect.Signature, impl_has_self: bool) -> list[str]:
    """Why ``impl`` cannot be called the way the Protocol's ``proto`` (a method: ``self``
    dropped) is: each positional parameter at its place (by name too, where the Protocol's may be
    passed by name), each keyword one by name (a default where the Protocol has one), and no
    required parameter of ``impl`` left unfilled."""
    P = inspect.Parameter
    pp, ip = _params(proto, True), _params(impl, impl_has_self)
    ipos = [p for p in ip if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    ikw = {p.name: p for p in ip if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    ivar, ivarkw = (any(p.kind == k for p in ip) for k in (P.VAR_POSITIONAL, P.VAR_KEYWORD))
    ppos = [p for p in pp if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    pvar, pvarkw = (any(p.kind == k for p in pp) for k in (P.VAR_POSITIONAL, P.VAR_KEYWORD))
    why = []
    for k, p in enumerate(ppos):
        if k >= len(ipos) and not ivar:
            why.append(f"no positional parameter {k} ({p.name})")
        elif p.kind == P.POSITIONAL_OR_KEYWORD and (k >= len(ipos) or ipos[k].name != p.name):
            why.append(f"positional parameter {k} is not named {p.name}")
    for p in (p for p in pp if p.kind == P.KEYWORD_ONLY):
        q = ikw.get(p.name)
        if q is None and not ivarkw:
            why.append(f"no parameter {p.name}")
        elif q is not None and p.default is not P.empty and q.default is P.empty:
            why.append(f"{p.name} has no default")
    names = {p.name for p in pp if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    for k, q in enumerate(ipos):
        if q.default is P.empty and k >= len(ppos) and not pvar and q.name not in names:
            why.append(f"required parameter {q.name} is never passed")
    why += [f"required keyword-only {q.name} is never passed" for q in ip
            if q.kind == P.KEYWORD_ONLY and q.default is P.empty and q.name not in names and not pvarkw]
    return why


def _members(proto: type) -> dict[str, object]:
    """A Protocol's own members: its methods and its annotated attributes (``None``)."""
    out: dict[str, object] = {n: None for n in getattr(proto, "__annotations__", {})}
    out.update({n: v for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")})
    return out


def _implements(cls: type, proto: type) -> list[str]:
    """Why instances of ``cls`` do not implement the instance Protocol ``proto`` (its methods)."""
    why = []
    for n, fn in _members(proto).items():
        if fn is None:
            continue  # instance data, set by the constructor: read by the runtime, not checked here
        got = getattr(cls, n, None)
        if not callable(got):
            why.append(f"{cls.__qualname__}.{n} missing")
            continue
        why += [f"{cls.__qualname__}.{n}: {w}" for w in
                _incompatible(inspect.signature(fn), inspect.signature(got), impl_has_self=True)]
    return why


def _protocol_problems(framework: str, module: str) -> list[str]:
    from csrun_runtime import backend
    from csrun_runtime.registry import entry

    proto = backend.MODULES[module]
    assert proto is not None
    mod = entry(framework, module)
    why = []
    for n, fn in _members(proto).items():
        if not hasattr(mod, n):
            why.append(f"{n} missing")
            continue
        got = getattr(mod, n)
        if fn is not None:
            why += [f"{n}: {w}" for w in _incompatible(inspect.signature(fn), inspect.signature(got),
                                                       impl_has_self=False)]
        inst = backend.INSTANCES.get((module, n))
        if inst is not None:
            for cls in got if isinstance(got, tuple) else (got,):
                why += _implements(cls, inst)
    return [f"csrun_runtime.{framework}.{module}: {w}" for w in why]


def _protocol_cases() -> list[tuple[str, str]]:
    from csrun_runtime import backend
    from csrun_runtime.registry import FRAMEWORKS

    return [(fw, m) for fw in FRAMEWORKS for m, p in backend.MODULES.items() if p is not None]


@pytest.mark.parametrize("framework, module", _protocol_cases())
def test_each_backend_implements_the_cores_protocols(framework, module):
    assert _protocol_problems(framework, module) == []


def test_every_entry_module_has_its_protocol_entry():
    from csrun_runtime import backend
    from csrun_runtime.registry import ENTRY_MODULES

    assert set(backend.MODULES) == set(ENTRY_MODULES)


def test_the_protocol_check_finds_a_mismatch():
    class Proto:
        def run(self, role: int, *, argv: list | None = None) -> int: ...

    def ok(role, argv=None, env=None):
        return 0

    def bad(rank, env, *, argv):
        return 0

    assert _incompatible(inspect.signature(Proto.run), inspect.signature(ok), impl_has_self=False) == []
    assert _incompatible(inspect.signature(Proto.run), inspect.signature(bad), impl_has_self=False) == [
        "positional parameter 0 is not named role", "argv has no default", "required parameter env is never passed"]


# -- private names
#: Private names the analyzer still imports, to be fixed where its node-side code moves to the
#: backends' probe.py and drain.py (issue 30, item 2): "path: what".
KNOWN_PRIVATE: set[str] = set()


def _private_uses(name: str, path: Path, ours: set[str]) -> list[str]:
    """``from m import _x`` and ``m._x`` where ``m`` is one of csrun's modules (``ours``)."""
    rel = str(path.relative_to(REPO))
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}
    found = []
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            bound.update({a.asname or a.name.split(".")[0]: a.name for a in node.names})
            continue
        base = _absolute(name, path, node)
        for a in node.names:
            bound[a.asname or a.name] = f"{base}.{a.name}"
            if a.name.startswith("_") and not a.name.startswith("__") and base.split(".")[0] in ours:
                found.append(f"{rel}: from {base} import {a.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_")
                and not node.attr.startswith("__") and bound.get(node.value.id, "").split(".")[0] in ours
                and bound[node.value.id] in _modules()):
            found.append(f"{rel}: {node.value.id}.{node.attr}")
    return sorted(set(found))


def test_no_module_imports_another_modules_private_name():
    ours = set(PACKAGES)
    found = {u for name, p in _modules().items() for u in _private_uses(name, p, ours)}
    assert sorted(found - KNOWN_PRIVATE) == []
    assert sorted(KNOWN_PRIVATE - found) == [], "fixed: remove it from KNOWN_PRIVATE"


def test_the_private_rule_sees_both_forms(tmp_path, monkeypatch):
    (tmp_path / "csrun_common").mkdir()
    f = tmp_path / "csrun_common" / "m.py"
    f.write_text("from csrun_common.x import _y\nfrom csrun_common import x\nimport os\nx._z()\nos._exit(0)\n")
    (tmp_path / "csrun_common" / "x.py").write_text("")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    assert _private_uses("csrun_common.m", f, {"csrun_common"}) == [
        "csrun_common/m.py: from csrun_common.x import _y", "csrun_common/m.py: x._z"]
