"""csrun_runtime/registry.py: the one module that names both backends: each backend's entry module
and facts by its name, the launcher words both ways, and one line for a name it does not know —
without importing a framework to read the facts."""
from __future__ import annotations

import subprocess
import sys

import pytest

from csrun_runtime import registry
from tests.unit.paths import REPO


def test_entry_and_facts_by_framework():
    for fw in registry.FRAMEWORKS:
        assert registry.entry(fw, "facts").__name__ == f"csrun_runtime.{fw}.facts"
        assert registry.facts(fw).name == fw
    assert registry.DEFAULT_FRAMEWORK == registry.FRAMEWORKS[0]


def test_launcher_words_both_ways():
    words = registry.launchers()
    assert sorted(words) == sorted(registry.FRAMEWORKS) and len(set(words.values())) == len(words)
    for fw, word in words.items():
        assert registry.framework_of_launcher(word) == fw
    with pytest.raises(registry.UnknownFramework, match=r"^launcher 'python': expected one of python-"):
        registry.framework_of_launcher("python")


def test_an_unknown_framework_or_module_is_refused():
    with pytest.raises(registry.UnknownFramework, match=r"^framework 'jax': expected one of "):
        registry.entry("jax", "runner")
    with pytest.raises(ModuleNotFoundError):
        registry.entry(registry.FRAMEWORKS[0], "no_such_module")


def test_reading_every_backends_facts_imports_no_framework():
    code = ("import sys; from csrun_runtime import registry; registry.launchers(); "
            "print(sorted(m for m in ('tensorflow', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
