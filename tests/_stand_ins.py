"""What CPU tests' stand-ins for a session's state share."""

import tenferro as tf


class RecordsFaults:
    """A session state's `record_fault`: records the fault, returns it naming one last launch 'k'.

    The stand-in sets ``self.faults = []`` in its ``__init__``.
    """

    def record_fault(self, exc):
        self.faults.append(exc)
        return tf.KernelFault(f"{exc}; last launches: ['k']", exc.result_name, exc.result_code,
                              ("k",))


class ImportingSession:
    """What `import_span` asks of a session on the direct path: its thread, device, stream;
    the producer streams it was told to order after before its next kernel; what it holds.
    Memory operations (`tensor.memset`) ask it for the same stream and holds."""

    def __init__(self):
        import threading

        self.fast_path_ok, self.thread, self.device, self.stream = \
            True, threading.get_ident(), 0, 7
        self.ordering = self.liveness = self
        self.pending, self.deferred, self.held, self.capturing = [], [], [], False
        self.in_order_with = frozenset((7,))  # a non-blocking stream: ordered with itself only

    def refuse_in_capture(self, op, why):
        if self.capturing:
            raise tf.RuntimeStateError(f"{op}: not allowed during s.capture(): {why}")

    def check_use(self, op):  # off its fast path: capturing (let by), or closed and so on
        if not self.capturing:
            raise tf.RuntimeStateError(f"{op}: the session is closed")

    # What a Tensor of this stand-in needs (tf.Tensor.allocate): its context and allocator.
    context = property(lambda self: self)
    is_open = True

    def alloc_async(self, nbytes, stream, op):
        return 0x8000

    def take_block(self):  # no small blocks kept for reuse
        return 0

    def defer(self, stream):
        self.deferred.append(stream)

    def hold(self, owners):
        self.held.append(owners)
