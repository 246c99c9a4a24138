"""What CPU tests' stand-ins for a session's state share."""

import sys

import tenferro as tf


class RecordsFaults:
    """A session state's `record_fault`: records the fault, returns it naming one last launch 'k'.

    The stand-in sets ``self.faults = []`` in its ``__init__``.
    """

    def record_fault(self, exc):
        self.faults.append(exc)
        return tf.KernelFault(
            f"{exc}; last launches: ['k']", exc.result_name, exc.result_code, ("k",)
        )


class ImportingSession:
    """What `import_span` asks of a session on the direct path: its thread, device, stream;
    the producer streams it was told to order after before its next kernel; what it holds.
    Memory operations (`tensor.memset`) ask it for the same stream and holds."""

    def __init__(self):
        import threading

        self.fast_path_ok, self.thread, self.device, self.stream = True, threading.get_ident(), 0, 7
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


class TwoDevices:
    """cuda.bindings' driver for two stand-in devices, as far as their primary contexts, pushing
    them and peer access between them ask it; real `PrimaryContext`s are made from it.

    Device ``n`` has the device handle 0xD0 + n and the primary context 0xC0 + n. ``peers``
    holds the (device, peer) handle pairs cuDeviceCanAccessPeer allows, ``enable_result`` is
    what cuCtxEnablePeerAccess returns, and ``asked`` records those calls and the pushes and
    pops in order. The process's record of enabled pairs starts empty and is put back after.
    """

    def __init__(self, monkeypatch):
        from cuda.bindings import driver as cu

        from tenferro import _driver
        from tenferro._driver import context

        ok = cu.CUresult.CUDA_SUCCESS
        self.peers = {(0xD0, 0xD1), (0xD1, 0xD0)}
        self.enable_result = ok
        self.asked = []
        calls = {
            "cuDeviceGet": lambda n: (ok, cu.CUdevice(0xD0 + n)),
            "cuDevicePrimaryCtxRetain": lambda dev: (ok, cu.CUcontext(int(dev) - 0xD0 + 0xC0)),
            "cuDeviceGetName": lambda size, dev: (ok, b"Stand-in GPU\0"),
            "cuMemPoolCreate": lambda props: (ok, cu.CUmemoryPool(0x9000 + props.location.id)),
            "cuMemPoolSetAttribute": lambda pool, attr, value: (ok,),
            "cuCtxPushCurrent": lambda ctx: self.asked.append(("push", int(ctx))) or (ok,),
            "cuCtxPopCurrent": lambda: self.asked.append(("pop",)) or (ok, cu.CUcontext(0)),
            "cuDeviceCanAccessPeer": lambda dev, peer: (
                self.asked.append(("can", int(dev), int(peer)))
                or (ok, int((int(dev), int(peer)) in self.peers))
            ),
            "cuCtxEnablePeerAccess": lambda ctx, flags: (
                self.asked.append(("enable", int(ctx), flags)) or (self.enable_result,)
            ),
        }
        for name, call in calls.items():
            monkeypatch.setattr(cu, name, call)
        monkeypatch.setattr(context, "_peer_enabled", set())
        self.contexts = (_driver.PrimaryContext(0), _driver.PrimaryContext(1))


class MemorySession:
    """A session for the memory operations without a GPU: the allocator, the liveness counts
    and the driver's copies and memsets as records."""

    device, stream, is_open = 0, 7, True

    def __init__(self, monkeypatch, capturing=False):
        import threading

        from tenferro import _driver

        self.thread = threading.get_ident()
        self.context = self.liveness = self
        self.capturing, self.calls, self.held, self.allocated = capturing, [], [], 0
        self.spare = []  # the small blocks kept for reuse, as Liveness keeps them
        self.next_ptr = 0x10000
        monkeypatch.setattr(
            _driver, "memset_d8_async", lambda *a: self.calls.append(("memset", *a))
        )
        monkeypatch.setattr(
            _driver, "memcpy_htod_async", lambda *a: self.calls.append(("htod", *a))
        )
        monkeypatch.setattr(_driver, "mem_free_async", lambda *a: self.calls.append(("free", *a)))

    def check_use(self, op):
        pass

    def refuse_in_capture(self, op, why):
        if self.capturing:
            raise tf.RuntimeStateError(f"{op}: not allowed during s.capture(): {why}")

    def alloc_async(self, nbytes, stream, op):
        self.calls.append(("alloc", nbytes, stream, op))
        self.next_ptr += 0x1000
        return self.next_ptr

    def allocated_bytes(self, nbytes):
        self.allocated += nbytes

    def hold(self, obj):
        self.held.append(obj)

    def take_block(self):
        return self.spare.pop() if self.spare else 0

    def keep_block(self, ptr):
        self.spare.append(ptr)
        return True

    def free_spare_blocks(self):
        self.calls += [("free", ptr, 7) for ptr in self.spare]
        self.spare = []

    def trim_pool(self, keep_bytes, op):
        self.calls.append(("trim", keep_bytes, op))


def refusal_in_another_thread(call):
    """The message of the `RuntimeStateError` that ``call()`` raises on a new thread, or None."""
    import threading

    seen = []

    def other():
        try:
            call()
        except tf.RuntimeStateError as exc:
            seen.append(str(exc))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    return seen[0] if seen else None


def finishes_despite_interrupt_at(n, where, call):
    """Run ``call()`` with KeyboardInterrupt raised at the n-th line run in code objects that
    ``where(code)`` accepts (Ctrl-C arriving there); True if ``call`` finished before it."""
    seen = 0

    def trace(frame, event, arg):
        nonlocal seen
        if event == "line" and where(frame.f_code):
            seen += 1
            if seen == n:
                raise KeyboardInterrupt
        return trace

    sys.settrace(trace)
    try:
        call()
        return True
    except KeyboardInterrupt:
        return False
    finally:
        sys.settrace(None)
