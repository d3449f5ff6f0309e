"""The TensorFlow backend's facts (:class:`csrun_runtime.facts.BackendFacts`): its name, its
``csrun_wse`` launcher word, its own ``runconfig`` keys, the analyzer's wording. Imports no
TensorFlow."""
from __future__ import annotations

from ..facts import BackendFacts, Key, ProbeFacts, auto_or_int

__all__ = ["FACTS"]


def _jit(v):
    """auto, true or false"""
    if v in ("auto", True, False):
        return v
    raise ValueError("must be auto, true or false")


def _transport(v):
    """service or dataplane"""
    if v in ("service", "dataplane"):
        return v
    raise ValueError("must be service (tf.data service) or dataplane (csrun's zmq data plane, docs/DATAPLANE.md)")


FACTS = BackendFacts(
    name="tensorflow", launcher="python-ws", input_what="train_input: input_fn",
    probe=ProbeFacts(title="TensorFlow", ingest_probe=True, dataloader_workers=False,
                     via="through the tf.data service", input_note="",
                     coverage_built="input_fn built as workers 0 and 1 of 2"),
    runconfig={
        "jit_compile": Key(_jit, "auto", "XLA for the train step: auto (try, fall back with a message), true, false"),
        "input_bundle": Key(auto_or_int, "auto",
                            "batches per element an input worker sends (auto: ~1 MiB elements; 1: off)"),
        "transport": Key(_transport, "dataplane",
                         "how input workers' batches reach the chief: dataplane (csrun's zmq data plane, "
                         "every connection authenticated with the job's secret; docs/DATAPLANE.md \"The "
                         "TensorFlow path\") or service (tf.data service: no authentication of its own, "
                         "docs/SECURITY.md)"),
    },
    generated_files=("__autograph_generated_file",),
)
