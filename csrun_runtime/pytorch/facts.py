"""The PyTorch backend's facts (:class:`csrun_runtime.facts.BackendFacts`): its name, its
``csrun_wse`` launcher word, its own ``runconfig`` keys, the analyzer's wording. Imports no torch."""
from __future__ import annotations

from collections.abc import Mapping

from ..facts import BackendFacts, Key, ProbeFacts, int_min

__all__ = ["FACTS", "DDP_KEYS"]

#: ``runconfig.ddp``'s keys: PyTorch ``DistributedDataParallel``'s own keyword arguments, passed to
#: it as they are (:meth:`csrun_runtime.pytorch.ranks.TorchRanks.wrap`; torch's defaults otherwise).
DDP_KEYS = ("find_unused_parameters", "gradient_as_bucket_view", "static_graph", "broadcast_buffers")


def _ddp(v):
    """a mapping of find_unused_parameters, gradient_as_bucket_view, static_graph, broadcast_buffers to true/false"""
    if not isinstance(v, Mapping):
        raise ValueError(f"must be a mapping of {', '.join(DDP_KEYS)} to true or false")
    for key, value in v.items():
        if key not in DDP_KEYS:
            raise ValueError(f"has {key!r}, not a DistributedDataParallel option csrun passes "
                             f"({', '.join(DDP_KEYS)})")
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
    return dict(v)

FACTS = BackendFacts(
    name="pytorch", launcher="python-pt", input_what="train_input: the DataLoader",
    probe=ProbeFacts(title="PyTorch", ingest_probe=False, dataloader_workers=True,
                     via="over csrun's data plane", input_note=" (PyTorch: train_data_fn's DataLoader)",
                     coverage_built="the DataLoader built as streamers 0 and 1 of 2"),
    runconfig={
        "input_read_ahead_batches": Key(int_min(0), 32,
                                        "PyTorch: batches an input worker reads at most ahead of what the chief "
                                        "took (0: bounded by the data plane's 4 MiB byte window only)"),
        "ddp": Key(_ddp, {},
                   "several trainer ranks: DistributedDataParallel's keyword arguments, by DDP's names "
                   "(find_unused_parameters, gradient_as_bucket_view, static_graph, broadcast_buffers; torch's "
                   "defaults for those not given; docs/PYTORCH.md \"Several trainer ranks\")"),
    },
)
