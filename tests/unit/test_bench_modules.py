"""Every benchmark module uses only what bench/common.py has: the smoke test in CI runs the
quick benchmarks alone, so a helper renamed in common.py would otherwise break a long
benchmark (quiet, requeue, interrupt) unnoticed until its next run."""
import ast
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p for p in BENCH.glob("bench_*.py"))
#: Modules of benchmarks that are not benchmarks themselves (their child roles, their helpers).
HELPERS = sorted(BENCH.glob("ingest_*.py"))


@pytest.fixture(scope="module")
def common():
    """bench/common.py loaded from its file now (a ``common`` imported earlier in the session,
    e.g. by the pinned-cluster fixture, may be an older one)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_common_under_test", BENCH / "common.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("path", MODULES + HELPERS, ids=[p.stem for p in MODULES + HELPERS])
def test_uses_only_what_common_has(path, common):
    used = {n.attr for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "common"}
    missing = sorted(a for a in used if not hasattr(common, a))
    assert not missing, f"{path.name} uses common.{', common.'.join(missing)}, which bench/common.py lacks"


def test_every_benchmark_is_registered():
    run_py = (BENCH / "run.py").read_text()
    assert MODULES and all(f'"{p.stem}"' in run_py for p in MODULES)
