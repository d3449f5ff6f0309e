"""One name per concept (issue 30, item 4): csrun's input-worker count is ``num_input_workers``
and the DataLoader's worker-process count is ``dataloader_workers``; the identifier ``num_workers``
appears in csrun's packages only where it is someone else's name:

- as a string key (``"num_workers"`` of the shard plan, drain.json, performance.json,
  endpoints.json, and the Model Zoo YAML's ``train_input.num_workers``): not an identifier,
  so the ``ast`` walk below never sees it;
- as the keyword of torch's ``DataLoader(..., num_workers=...)`` call;
- as torch's own ``DataLoader.num_workers`` attribute, read where listed in :data:`ALLOWED`.

Read from the files with ``ast`` (docstrings and comments are strings: not checked)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("csrun_common", "launcher", "analyzer", "csrun_runtime")
NAME = "num_workers"
#: Files not checked yet, with the reason.
EXCLUDED: dict[str, str] = {}
#: ``(file, expression)`` uses of the name that are torch's, with the reason.
ALLOWED = {
    ("csrun_runtime/pytorch/report.py", "loader.num_workers"): "torch DataLoader's own attribute (validate report)",
    ("csrun_runtime/pytorch/worker.py", "loader.num_workers"): "torch DataLoader's own attribute (the worker's log)",
    ("csrun_runtime/pytorch/input_backend.py", "loader.num_workers"): "torch DataLoader's own attribute (probe info)",
    ("csrun_runtime/pytorch/resume.py", "loader.num_workers"): "torch DataLoader's own attribute (whose "
                                                                "processes hold an IterableDataset's state)",
}


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def uses(source: str) -> list[tuple[int, str]]:
    """``(line, expression)`` of every identifier ``num_workers`` in ``source`` that is not the
    keyword of a ``DataLoader(...)`` call: names, parameters, attributes, keywords, definitions."""
    tree = ast.parse(source)
    loader_keywords = {id(k) for n in ast.walk(tree) if isinstance(n, ast.Call) and _callee(n) == "DataLoader"
                       for k in n.keywords}
    out = []
    for n in ast.walk(tree):
        hit = ((isinstance(n, ast.Name) and n.id == NAME)
               or (isinstance(n, ast.Attribute) and n.attr == NAME)
               or (isinstance(n, ast.arg) and n.arg == NAME)
               or (isinstance(n, ast.keyword) and n.arg == NAME and id(n) not in loader_keywords)
               or (isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == NAME)
               or (isinstance(n, ast.alias) and NAME in (n.name, n.asname)))
        if hit:
            text = f"{NAME}=" if isinstance(n, ast.keyword) else NAME if isinstance(n, ast.arg) else ast.unparse(n)
            out.append((getattr(n, "lineno", 0), text.splitlines()[0]))
    return sorted(out)


def _files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]


def test_the_check_sees_identifiers_and_spares_keys_and_torch_keywords():
    code = ("def f(num_workers):\n    return num_workers\n"
            "x = role.num_workers\ng(num_workers=3)\n"
            "d = {'num_workers': 1}\ny = d['num_workers']\nDataLoader(ds, num_workers=2)\n"
            "torch.utils.data.DataLoader(ds, num_workers=0)\n")
    assert uses(code) == [(1, "num_workers"), (2, "num_workers"), (3, "role.num_workers"), (4, "num_workers=")]


def test_num_workers_is_never_a_name_of_csrun():
    files = _files()
    assert len(files) > 100  # the packages were found
    missing = [f for f in EXCLUDED if not (REPO / f).exists()]
    assert not missing, f"stale exclusions (the file is gone: drop it from EXCLUDED): {missing}"
    found, seen = [], set()
    for p in files:
        rel = p.relative_to(REPO).as_posix()
        if rel in EXCLUDED:
            continue
        for line, text in uses(p.read_text()):
            if (rel, text) in ALLOWED:
                seen.add((rel, text))
            else:
                found.append(f"{rel}:{line}: {text}")
    assert not found, ("`num_workers` as a csrun identifier (the input-worker count is num_input_workers, the "
                       "DataLoader's processes dataloader_workers; keys stay strings):\n" + "\n".join(found))
    assert seen == set(ALLOWED), f"stale entries in ALLOWED: {sorted(set(ALLOWED) - seen)}"
