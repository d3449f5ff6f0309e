"""csrun_common/exits.py: an exit status of csrun's written as a number is caught (the check itself and the tree)."""
from __future__ import annotations

import ast
import re

from csrun_common import exits
from tests.unit.csrun_common.test_env import package_sources
from tests.unit.paths import REPO as ROOT

#: Numbers that are exit statuses wherever they appear as an int in the packages' code (2 and
#: 1 are too common: they are checked only as the argument of an exit call).
STATUS_NUMBERS = {exits.REQUEUE, exits.TIMEOUT, exits.EXEC_FAILED, exits.INTERRUPTED, exits.TERMINATED}
EXIT_CALLS = {"exit", "_exit", "SystemExit"}


def _ints(node: ast.AST) -> list[int]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and type(n.value) is int]


def _status_like(target: ast.AST) -> bool:
    name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
    return bool(re.search(r"(^rc$|_rc$|code|status|exit)", name))


def status_literals(tree: ast.AST) -> list[str]:
    """75 (the requeue status) anywhere; 124, 127, 130, 143 where a status is made or tested
    (a ``return``, a comparison, an assignment to ``rc`` / ``*code*`` / ``*status*``); any
    status but 0 and 1 written as the argument of an exit call."""
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value == exits.REQUEUE:
            found.append(f"{line}: {node.value}")
        made = (isinstance(node, (ast.Return, ast.Compare))
                or (isinstance(node, ast.Assign) and any(_status_like(t) for t in node.targets)))
        if made:
            found += [f"{line}: {v}" for v in _ints(node) if v in STATUS_NUMBERS - {exits.REQUEUE}]
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], (ast.Constant, ast.IfExp)):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in EXIT_CALLS:
                found += [f"{line}: {name}({v})" for v in _ints(node.args[0]) if v not in (exits.OK, exits.FAILED)]
    return found


def test_the_status_check_catches_literals():
    src = ("import os, sys\nsys.exit(75)\nos._exit(2)\nraise SystemExit(143 if x else 0)\n"
           "def f(rc):\n    return 124 if rc == 130 else 0\nrc = 127\nmask = 0x7F\nraise SystemExit(128 + s)\n")
    hits = {f.split(": ", 1)[1] for f in status_literals(ast.parse(src))}
    assert hits == {"exit(75)", "75", "_exit(2)", "SystemExit(143)", "124", "130", "127"}  # not 0x7F, 128 + s


def test_no_module_writes_an_exit_status_as_a_number():
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in package_sources()
             for hit in status_literals(ast.parse(path.read_text(), str(path)))]
    assert not found, "use csrun_common.exits:\n" + "\n".join(found)
