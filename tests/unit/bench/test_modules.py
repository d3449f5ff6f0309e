"""Every benchmark module uses only what bench's helper modules have (``common.py``,
``clusters.py``, ``results_table.py``): the smoke test in CI runs the quick benchmarks alone, so
a helper renamed there would otherwise break a long benchmark (quiet, requeue, interrupt)
unnoticed until its next run."""
import ast
import importlib.util
import sys

import pytest

from tests.unit.paths import REPO

BENCH = REPO / "bench"
MODULES = sorted(p for p in BENCH.glob("bench_*.py"))
#: bench's helper modules, by the name the benchmarks import them as.
HELPERS = ("common", "clusters", "results_table")
#: Modules of benchmarks that are not benchmarks themselves (bench_ingest's child roles and helpers).
PARTS = sorted(BENCH.glob("ingest_*.py"))
USERS = [*MODULES, *PARTS, BENCH / "run.py", BENCH / "streaming_pt.py", *(BENCH / f"{h}.py" for h in HELPERS)]


@pytest.fixture(scope="module")
def helpers():
    """bench's helper modules loaded from their files now (one imported earlier in the session,
    e.g. by the pinned-cluster fixture, may be an older one)."""
    sys.path.insert(0, str(BENCH))
    try:
        loaded = {}
        for name in HELPERS:
            spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", BENCH / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            loaded[name] = mod
        yield loaded
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("path", USERS, ids=[p.stem for p in USERS])
def test_uses_only_what_the_helpers_have(path, helpers):
    used = {(n.value.id, n.attr) for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in helpers}
    missing = sorted(f"{mod}.{a}" for mod, a in used if not hasattr(helpers[mod], a))
    assert not missing, f"{path.name} uses {', '.join(missing)}, which bench's helper modules lack"


def test_the_check_sees_a_helper_use():
    uses = {n.attr for n in ast.walk(ast.parse((BENCH / "run.py").read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "results_table"}
    assert "generated_section" in uses


def test_every_benchmark_is_registered():
    run_py = (BENCH / "run.py").read_text()
    assert MODULES and all(f'"{p.stem}"' in run_py for p in MODULES)
