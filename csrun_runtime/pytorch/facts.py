"""The PyTorch backend's facts (:class:`csrun_runtime.facts.BackendFacts`): its name, its
``csrun_wse`` launcher word, its own ``runconfig`` keys, the analyzer's wording. Imports no torch."""
from __future__ import annotations

from ..facts import BackendFacts, Key, ProbeFacts, int_min

__all__ = ["FACTS"]

FACTS = BackendFacts(
    name="pytorch", launcher="python-pt", input_what="train_input: the DataLoader",
    probe=ProbeFacts(title="PyTorch", ingest_probe=False, dataloader_workers=True,
                     via="over csrun's data plane", input_note=" (PyTorch: train_data_fn's DataLoader)",
                     coverage_built="the DataLoader built as streamers 0 and 1 of 2"),
    runconfig={
        "input_read_ahead_batches": Key(int_min(0), 32,
                                        "PyTorch: batches an input worker reads at most ahead of what the chief "
                                        "took (0: bounded by the data plane's 4 MiB byte window only)"),
    },
)
