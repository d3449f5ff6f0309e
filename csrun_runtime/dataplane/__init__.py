"""A framework-neutral data plane: batches (nests of numpy arrays) from input workers to the
chief over zmq, without TensorFlow or any other framework (docs/DATAPLANE.md).

Input worker::

    from csrun_runtime.dataplane import Sender
    with Sender("tcp://chief:5555", worker_index=3, attempt=0) as s:
        for features, labels in batches:
            s.send((features, labels))           # stacked into ~1 MiB bundles, zero-copy send
    # leaving the block sends the last bundle and the end of stream

Chief::

    from csrun_runtime.dataplane import Receiver
    with Receiver("tcp://*:5555", expected=4) as r:
        while True:
            b = r.get_bundle(timeout=60)          # b.worker, b.n batches, b.nest: arrays on the frames
            ...                                   # or r.get(timeout) -> (worker_index, one batch)

One endpoint for every sender (a zmq ROUTER bound once, DEALER senders), credit-based flow
control (each sender keeps at most ``window_bytes`` unacknowledged), per-worker counts,
pause/resume of one worker's stream, replaced workers (a higher ``attempt``) read again, bad
messages refused naming the worker, and an end-of-stream message. Both ends prove they know the
job's secret before any data moves (:mod:`.auth`, docs/SECURITY.md): a peer that cannot is refused.
Imports only the standard library, numpy and pyzmq.
"""
from .framing import FrameError, decode, encode_header, flatten, parse_header, stack, unflatten
from .protocol import BUNDLE_BYTES, WINDOW_BYTES, EndOfStream, NotAuthenticated, ReceiverGone
from .receiver import Bundle, Receiver
from .sender import Sender

__all__ = ["BUNDLE_BYTES", "WINDOW_BYTES", "Bundle", "EndOfStream", "FrameError", "NotAuthenticated", "Receiver",
           "ReceiverGone", "Sender", "decode", "encode_header", "flatten", "parse_header", "stack", "unflatten"]
