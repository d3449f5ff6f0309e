"""analyzer/verify_task.py: the drain's argv (no cluster, no TensorFlow)."""
from __future__ import annotations

from analyzer import verify_task as D


def test_drain_argv_forces_training_mode():
    assert D._train_argv(["--params", "p.yaml", "--mode", "validate_only"]) == \
        ["--params", "p.yaml", "--mode", "train", "--max_steps", str(10 ** 9)]
    assert D._train_argv(["--compile_only", "--max_steps=5"]) == ["--max_steps=5", "--mode", "train"]
