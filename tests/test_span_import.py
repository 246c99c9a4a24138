"""The span import (tenferro.span_import): s.tensor / s.tensor_mut / import_span on the
direct, one-call (torch) and foreign paths, with stand-in sessions and producers."""

import re
import sys

import numpy as np
import pytest
from _stand_ins import ImportingSession

import tenferro as tf
from tenferro import dtypes
from tenferro.spans import c_strides


@pytest.mark.gpu
def test_torch_tensors_zero_copy_on_a_torch_stream(session, rng):
    torch = pytest.importorskip("torch")
    stream = torch.cuda.Stream()
    a = rng.standard_normal((64, 48))
    with torch.cuda.stream(stream):
        t = torch.from_numpy(a).cuda() * 2.0  # produced on torch's non-default stream
        ref = session.tensor(t)  # ordered after torch's stream through __dlpack__(stream=)
        assert ref.ptr == t.data_ptr() and ref.shape == (64, 48) and ref.dtype == np.float64
        np.testing.assert_array_equal(session.download(ref), 2.0 * a)
        mut = session.tensor_mut(t)
        session.copy(mut, session.upload(a))  # a write through tenferro ...
        session.synchronize()
        np.testing.assert_array_equal(t.cpu().numpy(), a)  # ... is seen by torch
        tt = t.t()
        with pytest.raises(tf.ValidationError, match=r"session\.tensor: x has non-compact"):
            session.tensor(tt)
        np.testing.assert_array_equal(session.download(session.tensor(tt, allow_strided=True)), a.T)
        half = torch.ones(8, dtype=torch.bfloat16, device="cuda")
        assert session.tensor(half).scalar_type.name == "bf16"


@pytest.mark.gpu
def test_torch_tensor_that_requires_grad_is_refused_by_name(session):
    torch = pytest.importorskip("torch")
    w = torch.ones(8, device="cuda", requires_grad=True)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x\.__dlpack__\(\) of Tensor "
        r"refused to export: \w+Error: ",
    ):
        session.tensor(w)
    assert session.tensor(w.detach()).ptr == w.data_ptr()


class _Fields:
    """A producer read directly, as torch tensors are: its reader returns its fields."""

    def __init__(self, ptr, shape=(4, 3)):
        self.ptr, self.shape, self.type_name, self.strides = ptr, shape, "f32", None
        self.stream = 7  # the producer's stream: the session's own unless changed


@pytest.fixture
def direct_fields(monkeypatch):
    from tenferro.interop import producers

    def read(x, device, op):
        t = dtypes.by_name(x.type_name)
        strides = x.strides or c_strides(x.shape, t.itemsize)
        compact = x.strides is None or strides == c_strides(x.shape, t.itemsize)
        nbytes = t.itemsize * int(np.prod(x.shape)) if compact else -1
        return x.ptr, x.shape, strides, t, x.stream, nbytes

    monkeypatch.setitem(producers.readers, _Fields, read)


def test_a_directly_read_array_gets_its_span_again_while_the_fields_are_the_same(direct_fields):
    import weakref

    from tenferro import span_import as imports

    s, x = ImportingSession(), _Fields(0x1000)
    mut = imports.tensor_mut(s, x)
    assert imports.tensor_mut(s, x) is mut and (mut.ptr, mut.shape, mut.nbytes, mut.device) == (
        0x1000,
        (4, 3),
        48,
        0,
    )
    ref = imports.tensor(s, x)
    assert type(ref) is tf.TensorRef and imports.tensor(s, x) is ref and ref is not mut
    x.ptr = 0x2000  # moved (torch's set_): a new span over the new place
    moved = imports.tensor_mut(s, x)
    assert moved is not mut and (moved.ptr, moved.hi) == (0x2000, 0x2000 + 48)
    x.shape = (4, 2)  # resized in place
    resized = imports.tensor_mut(s, x)
    assert resized is not moved and (resized.shape, resized.nbytes) == ((4, 2), 32)
    x.type_name = "i32"  # another type of the same size (torch's .data = x.view(torch.int32))
    retyped = imports.tensor_mut(s, x)
    assert retyped is not resized and retyped.scalar_type is dtypes.by_name("i32")
    x.strides = (4, 1024)  # an extent of one may have any stride and still be compact
    x.shape = (4, 1)
    strided = imports.tensor_mut(s, x)
    assert strided.strides == (4, 1024)
    x.strides = (4, 4)
    assert imports.tensor_mut(s, x).strides == (4, 4)
    x.shape, x.type_name, x.strides = (4, 2), "f32", None
    resized = imports.tensor_mut(s, x)
    other = ImportingSession()
    theirs = imports.tensor_mut(other, x)
    assert theirs is not resized and theirs.state is other and resized.state is s
    gone, owner_gone = weakref.ref(theirs), weakref.ref(x)
    del mut, moved, resized, theirs, ref, retyped, strided
    assert gone() is None  # the table keeps spans weakly
    del x
    assert owner_gone() is None  # and no array alive through them


def test_the_table_of_kept_spans_stays_bounded(direct_fields):
    from tenferro import span_import as imports
    from tenferro.interop import producers

    s = ImportingSession()
    table = producers.kept[tf.TensorRef]  # a table a span class
    table.clear()
    held = [imports.tensor(s, _Fields(0x1000 + 16 * i)) for i in range(producers.KEPT_MAX)]
    assert len(table) == producers.KEPT_MAX  # the last size kept whole
    held += [
        imports.tensor(s, _Fields(0x1000 + 16 * i))
        for i in range(producers.KEPT_MAX, producers.KEPT_MAX + 5)
    ]
    assert len(table) == 5  # the first past it dropped the table and began again
    assert imports.tensor(s, held[-1].owner) is held[-1]  # the newest entries stay
    assert [h.ptr for h in held[:2]] == [0x1000, 0x1010]


@pytest.mark.parametrize("op", ["tensor", "tensor_mut"])
def test_a_directly_read_array_is_refused_naming_the_call_and_ordered_before_the_kernel(
    direct_fields, op
):
    from tenferro import span_import as imports

    s, x = ImportingSession(), _Fields(0x1000)
    make = getattr(imports, op)
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.{op}: dtype=f64 was asked but x "
        r"is f32$",
    ):
        make(s, x, np.float64)
    assert make(s, x, np.float32).scalar_type is dtypes.by_name("f32")
    x.strides, x.shape = (4, 8), (4, 1)  # compact: an extent of one
    assert make(s, x).strides == (4, 8)
    x.strides, x.shape = (16, 8), (4, 2)  # every other element
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.{op}: x has non-compact "
        r"strides=\(16, 8\)",
    ):
        make(s, x)
    assert make(s, x, allow_strided=True).strides == (16, 8)
    assert s.deferred == []
    x.stream = 9  # the producer works on another stream: ordered before the next kernel
    make(s, x, allow_strided=True)
    assert s.deferred == [9] and s.held == []


def test_a_direct_import_refuses_misplaced_memory_and_a_session_off_its_fast_path(
    direct_fields, monkeypatch
):
    from tenferro import span_import as imports
    from tenferro.spans import ADDRESS_END

    s = ImportingSession()
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x's data pointer 0x1002 is "
        r"not aligned to the 4 bytes its f32 elements need",
    ):
        imports.tensor(s, _Fields(0x1002))
    last = _Fields(ADDRESS_END - 48)  # its 48 bytes end where the address space does
    assert imports.tensor(s, last).hi == ADDRESS_END
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x's 48 bytes from 0x.* "
        r"reach outside the address space",
    ):
        imports.tensor(s, _Fields(ADDRESS_END - 44))
    empty = _Fields(0x1000, (0, 3))
    assert imports.tensor(s, empty) is imports.tensor(s, empty)  # kept too, though it has no bytes
    s.fast_path_ok = False
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.tensor_mut: the session is closed"):
        imports.tensor_mut(s, _Fields(0x1000))
    s.fast_path_ok, s.thread = True, -1  # another thread's session
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.tensor: the session is closed"):
        imports.tensor(s, _Fields(0x1000))


def test_a_memory_operation_orders_after_a_producer_now_not_at_the_next_kernel(
    direct_fields, monkeypatch
):
    from tenferro import span_import as imports

    ordered = []
    monkeypatch.setattr(imports, "_order_after", lambda s, stream, op: ordered.append((stream, op)))
    s, x = ImportingSession(), _Fields(0x1000)
    x.stream = 9
    imports.import_span(s, x, tf.TensorRef, None, False, "session.copy: src")
    assert ordered == [(9, "session.copy: src")] and s.deferred == []


@pytest.mark.parametrize(
    "path",
    [
        "one call",
        "direct",
        "direct, memory op",
        "CAI",
        "CAI, memory op",
        "another session's Tensor",
    ],
)
def test_no_event_for_a_stream_the_driver_orders_with_the_sessions(
    fake_torch, direct_fields, cai, monkeypatch, path
):
    # A blocking session stream and the legacy default stream (torch's default) wait for each
    # other in the driver: an import from the legacy stream needs no event, also in a capture.
    # Any other stream still gets one, and the legacy stream gets one on a non-blocking stream.
    from tenferro import span_import as imports

    ordered = []  # (session, stream, operation) of each ordering made at once
    monkeypatch.setattr(
        imports, "_order_after", lambda sess, stream, op: ordered.append((sess, stream, op))
    )
    monkeypatch.setattr(imports, "check_memory", lambda f, device, op: None)
    made = []

    def span_from(s, producer):
        op = "session.copy: src"
        if path == "one call":
            x = _TorchTensor(0x1000)
            fake_torch.stream = 0 if producer == 1 else producer
            return imports.tensor(s, x)
        if path.startswith("direct"):
            x = _Fields(0x1000)
            x.stream = producer
            return imports.import_span(s, x, tf.TensorRef, None, False, op, defer="op" not in path)
        if path.startswith("CAI"):
            x = cai(0x1000, (4, 3), "<f4", stream=producer)
            return imports.import_span(s, x, tf.TensorRef, None, False, op, defer="op" not in path)
        other = ImportingSession()
        other.stream = producer
        t = tf.Tensor.allocate(other, (4, 3), dtypes.by_name("f32"), "test")
        made.append(t)
        return imports.import_span(s, t, tf.TensorRef, None, False, op)

    def orders(s, producer):
        ordered.clear()
        s.deferred.clear()
        span_from(s, producer)
        assert all(sess is s and op == "session.copy: src" for sess, _, op in ordered)
        return [stream for _, stream, _ in ordered] + s.deferred

    s = ImportingSession()
    s.in_order_with = frozenset((7, 1))  # the session's own stream is blocking
    assert orders(s, 1) == []
    assert orders(s, 9) == [9]
    s.capturing, s.fast_path_ok = True, False  # no event to make: nothing a capture refuses
    assert orders(s, 1) == []
    why = (
        "a Tensor of another open session needs an event"
        if path.startswith("another")
        else "ordering after the producer's stream needs an event; make the span before the capture"
    )
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"^session\.\w+(: src)?: not allowed during "
        rf"s\.capture\(\): {re.escape(why)}$",
    ):
        span_from(s, 9)
    s = ImportingSession()  # a non-blocking session stream
    assert orders(s, 1) == [1]
    assert orders(s, 7) == []
    for t in made:
        t.ptr = 0  # the stand-in has no driver to free it with


@pytest.fixture
def foreign_reads(monkeypatch):
    """`import_span`'s foreign path on the CPU: its calls of read_foreign and check_memory."""
    from tenferro import span_import as imports

    calls = []
    real = imports.read_foreign

    def read(x, stream, device, capturing, op, **kw):
        calls.append(("read", stream, device, capturing, op, kw))
        return real(x, stream, device, capturing, op, **kw)

    monkeypatch.setattr(imports, "read_foreign", read)
    monkeypatch.setattr(
        imports, "check_memory", lambda f, device, op: calls.append(("check", f.ptr, device, op))
    )
    return calls


def test_a_foreign_span_is_what_the_producer_describes_for_this_session(cai, foreign_reads):
    from tenferro import span_import as imports

    s = ImportingSession()
    s.device = 3
    x = cai(0x1000, (4, 3), "<f4", stream=7)
    op = "session.copy: src"
    span = imports.import_span(s, x, tf.TensorMut, np.float32, False, op)
    assert foreign_reads == [
        ("read", 7, 3, False, op, {"dlpack_only": False}),
        ("check", 0x1000, 3, op),
    ]
    assert (
        type(span),
        span.ptr,
        span.shape,
        span.strides,
        span.device,
        span.owner,
        span.state,
        span.producer_readonly,
    ) == (tf.TensorMut, 0x1000, (4, 3), (12, 4), 3, x, s, False)
    ro = cai(0x2000, (4,), "<f4", readonly=True, stream=7)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.copy: src: x is read-only \(its "
        r"producer says so\); use s\.tensor\(x\)",
    ):
        imports.import_span(s, ro, tf.TensorMut, None, False, op)
    ref = imports.import_span(s, ro, tf.TensorRef, None, False, op)
    assert ref.producer_readonly and ref.owner is ro and ref.state is s
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.copy: src: 'no such dtype' is "
        r"not a dtype",
    ):
        imports.import_span(s, x, tf.TensorRef, "no such dtype", False, op)


@pytest.mark.parametrize(
    ("shape", "strides", "cls", "refused"),
    [
        ((2, 3), (24, 4), tf.TensorMut, None),  # every other row: taken with allow_strided
        ((2, 3), (26, 4), tf.TensorRef, "not multiples of its 4-byte"),  # an extent of two
        ((1, 2, 3), (6, 24, 4), tf.TensorRef, None),  # an extent of one: its stride is never used
        ((2, 3), (0, 4), tf.TensorRef, None),  # a broadcast view may be read
        ((2, 3), (0, 4), tf.TensorMut, "a zero stride"),
        ((1, 2, 3), (0, 24, 4), tf.TensorMut, None),  # a zero stride on an extent of one: no race
        ((2, 3), (-24, 4), tf.TensorRef, None),  # one row back from address 24: lo is 0
        ((3, 3), (-24, 4), tf.TensorRef, "reach outside the address space"),  # two rows from 40
    ],
)
def test_a_strided_foreign_span_is_checked_on_both_sides(
    cai, foreign_reads, shape, strides, cls, refused
):
    from tenferro import span_import as imports

    s = ImportingSession()
    ptr = (24 if shape == (2, 3) else 40) if strides[0] < 0 else 0x1000
    x = cai(ptr, shape, "<f4", strides=strides, stream=7)
    op = "session.tensor"
    if refused is None:
        span = imports.import_span(s, x, cls, None, True, op)
        assert (span.shape, span.strides, type(span)) == (shape, strides, cls)
    else:
        with pytest.raises(tf.ValidationError, match=rf"^session\.tensor: .*{refused}"):
            imports.import_span(s, x, cls, None, True, op)


def test_a_record_array_is_aligned_as_its_widest_field_not_as_its_size(cai, foreign_reads):
    # A 12-byte struct of f32/i32 fields sits at any 4-byte address (numba places them so).
    from tenferro import span_import as imports

    record = np.dtype([("x", "<f4"), ("v", "<f4"), ("hits", "<i4")])
    s, op = ImportingSession(), "session.tensor_mut"

    def producer(ptr):
        x = cai(ptr, (5,), record.str, stream=7)
        x.__cuda_array_interface__["descr"] = record.descr
        return x

    span = imports.import_span(s, producer(0x1004), tf.TensorMut, None, False, op)
    assert (span.ptr, span.scalar_type.alignment, span.scalar_type.itemsize) == (0x1004, 4, 12)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor_mut: x's data pointer 0x1002 is not aligned to the 4 bytes "
        r"its record\(x f32 @0, v f32 @4, hits i32 @8; 12 bytes\) elements need",
    ):
        imports.import_span(s, producer(0x1002), tf.TensorMut, None, False, op)
    wide = np.dtype([("n", "<i2"), ("d", "<f8")], align=True)  # 16 bytes, aligned as its f8
    assert dtypes.from_numpy(wide).alignment == 8


def test_a_foreign_span_reaches_the_last_address_and_not_past_it(cai, foreign_reads):
    from tenferro import span_import as imports
    from tenferro.spans import ADDRESS_END

    s = ImportingSession()
    op = "session.tensor"
    last = imports.import_span(
        s, cai(ADDRESS_END - 16, (4,), "<f4", stream=7), tf.TensorRef, None, False, op
    )
    assert last.hi == ADDRESS_END
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x's 16 bytes from "
        r"0x[0-9a-f]+ reach outside the address space",
    ):
        imports.import_span(
            s, cai(ADDRESS_END - 12, (4,), "<f4", stream=7), tf.TensorRef, None, False, op
        )
    strided = imports.import_span(
        s,
        cai(ADDRESS_END - 28, (2, 2), "<f4", strides=(20, 4), stream=7),
        tf.TensorRef,
        None,
        True,
        op,
    )
    assert strided.hi == ADDRESS_END  # its last element ends at the last byte
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x's strides=\(20, 4\) .*"
        r"reach outside the address space",
    ):
        imports.import_span(
            s,
            cai(ADDRESS_END - 24, (2, 2), "<f4", strides=(20, 4), stream=7),
            tf.TensorRef,
            None,
            True,
            op,
        )


def test_the_sessions_own_tensor_is_its_kept_span_unless_a_dtype_is_asked():
    from tenferro import span_import as imports

    s, other = ImportingSession(), ImportingSession()
    other.device = 1
    f32 = dtypes.by_name("f32")
    t = tf.Tensor.allocate(s, (4, 3), f32, "test")
    assert imports.tensor(s, t) is t.span(tf.TensorRef) and imports.tensor_mut(s, t) is t.span(
        tf.TensorMut
    )
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: dtype=f64 was asked but x "
        r"is f32$",
    ):
        imports.tensor(s, t, np.float64)
    assert imports.tensor(s, t, np.float32).ptr == 0x8000
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x lives on device 0, this "
        r"session is on device 1",
    ):
        imports.tensor(other, t)  # a Tensor of another session, on another device
    t.ptr = 0  # the stand-in has no driver to free it with


class _TorchTensor:
    """What the torch readers read of a tensor: its fields, as torch's own methods give them."""

    def __init__(self, ptr, shape=(4, 3), dtype="float32", device=0):
        self.ptr, self.shape, self.dtype, self.device = ptr, shape, dtype, device
        self.requires_grad, self.is_cuda, self.neg, self.strides = False, True, False, None
        self.fail = None  # a field that raises, as a sparse tensor's data_ptr() does

    def is_neg(self):
        return self.neg

    def is_contiguous(self):
        return self.strides is None

    def get_device(self):
        return self.device

    def data_ptr(self):
        if self.fail:
            raise RuntimeError(self.fail)
        return self.ptr

    def stride(self):
        return self.strides


@pytest.fixture
def fake_torch(monkeypatch):
    """sys.modules["torch"] a stand-in whose Tensor class is `_TorchTensor` and whose current
    stream is ``fake_torch.stream``; the readers' decisions per class start empty."""
    import types

    from tenferro import span_import as imports
    from tenferro import spans
    from tenferro.interop import producers

    torch = types.SimpleNamespace(**{n: n for n in ("float32", "float64", "int32", "bool")})
    torch.Tensor = _TorchTensor
    torch.nn = types.SimpleNamespace(Parameter=type("Parameter", (_TorchTensor,), {}))
    torch.stream = 7
    # the stream of the device asked (another device's is another stream)
    torch._C = types.SimpleNamespace(
        _cuda_getCurrentRawStream=lambda device: torch.stream if device == 0 else 99
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    saved = [
        (table, dict(table)) for table in (producers.readers, producers.fast_spans, spans.layouts)
    ]  # layouts made anew
    for table, _ in saved:
        table.clear()
    imports.forget_fast_paths()
    yield torch
    for table, contents in saved:
        table.clear()
        table.update(contents)
    imports.forget_fast_paths()


@pytest.mark.parametrize("op", ["tensor", "tensor_mut"])
def test_a_compact_torch_tensor_takes_one_call_and_gets_its_span_again(fake_torch, op):
    from tenferro import span_import as imports
    from tenferro.interop import producers

    s, x = ImportingSession(), _TorchTensor(0x1000)
    make = getattr(imports, op)
    span = make(s, x)
    cls = tf.TensorRef if op == "tensor" else tf.TensorMut
    assert type(span) is cls and (
        span.ptr,
        span.shape,
        span.strides,
        span.nbytes,
        span.owner,
        span.device,
    ) == (0x1000, (4, 3), (12, 4), 48, x, 0)
    assert make(s, x) is span and s.deferred == []  # torch's stream is the session's
    assert producers.fast_spans[_TorchTensor] is not None  # decided once for the class
    fake_torch.stream = 0  # torch's default stream: the legacy handle, ordered before the kernel
    assert make(s, x) is span and s.deferred == [1]
    fake_torch.stream = 7
    for change, value in (("ptr", 0x2000), ("shape", (4, 2)), ("dtype", "int32")):
        setattr(x, change, value)  # torch's set_, resize_, .data = another type
        again = make(s, x)
        assert again is not span and (again.ptr, again.shape, again.scalar_type.name) == (
            x.ptr,
            x.shape,
            "i32" if x.dtype == "int32" else "f32",
        )
        span = again
    other = ImportingSession()
    assert make(other, x).state is other and make(s, x).state is s


@pytest.mark.parametrize(
    ("change", "value", "msg"),
    [
        ("device", 1, r"x lives on device 1, this session is on device 0"),
        ("neg", True, r"x is a negated view"),
        ("ptr", 0x1002, r"x.s data pointer 0x1002 is not aligned to the 4 bytes its f32"),
        ("ptr", (1 << 64) - 44, r"x.s 48 bytes from 0x[0-9a-f]+ reach outside the address space"),
        ("strides", (1, 4), r"x has non-compact strides=\(4, 16\)"),
    ],
)
def test_a_torch_tensor_the_one_call_cannot_take_is_refused_by_the_general_path(
    fake_torch, monkeypatch, change, value, msg
):
    from tenferro import span_import as imports
    from tenferro.interop import producers

    s, x = ImportingSession(), _TorchTensor(0x1000)
    setattr(x, change, value)
    handed = []
    general = imports.import_span
    monkeypatch.setattr(
        imports, "import_span", lambda s, x, *a, **k: handed.append(x) or general(s, x, *a, **k)
    )
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: " + msg):
        imports.tensor(s, x)
    assert handed == [x] and s.deferred == [] and s.held == []
    assert not producers.kept[tf.TensorRef].get(id(x))  # nothing kept for it


def test_tensors_and_parameters_in_turn_both_take_the_one_call(fake_torch, monkeypatch):
    from tenferro import span_import as imports

    s = ImportingSession()
    x, w = _TorchTensor(0x1000), fake_torch.nn.Parameter(0x2000)
    spans = [imports.tensor(s, x), imports.tensor(s, w)]
    monkeypatch.setattr(imports, "import_span", lambda *a, **k: "general")
    for _ in range(3):  # each class decided once: neither goes to the general path again
        assert [imports.tensor(s, x), imports.tensor(s, w)] == spans
    assert [sp.ptr for sp in spans] == [0x1000, 0x2000]


def test_the_one_call_keeps_the_boundaries_of_the_general_path(fake_torch, monkeypatch):
    from tenferro import span_import as imports

    s = ImportingSession()
    monkeypatch.setattr(imports, "import_span", lambda *a, **k: "general")
    make = imports.tensor
    last = _TorchTensor((1 << 64) - 48)  # its last byte is the address space's last
    assert make(s, last).hi == 1 << 64
    assert make(s, _TorchTensor((1 << 64) - 44)) == "general"
    assert make(s, _TorchTensor(0x1004)).ptr == 0x1004  # aligned to 4
    assert make(s, _TorchTensor(0x1002)) == "general"
    for field, value in (
        ("requires_grad", True),
        ("is_cuda", False),
        ("dtype", "complex64"),
        ("fail", "sparse tensors have no data_ptr"),
        ("neg", True),
        ("strides", (1, 4)),
        ("device", 1),
    ):
        x = _TorchTensor(0x1000)
        setattr(x, field, value)
        assert make(s, x) == "general", field  # the general path says why
    assert s.deferred == []


def test_a_torch_tensor_off_the_fast_path_goes_through_the_checks(fake_torch):
    from tenferro import span_import as imports

    s, x = ImportingSession(), _TorchTensor(0x1000)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor_mut: dtype=f64 was asked "
        r"but x is f32$",
    ):
        imports.tensor_mut(s, x, np.float64)
    s.fast_path_ok = False  # closed, faulted or capturing: the session says which
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.tensor: the session is closed"):
        imports.tensor(s, x)
    s.fast_path_ok = True
    s.thread = -1  # another thread's session
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.tensor_mut: the session is "):
        imports.tensor_mut(s, x)


# --- the producers' readers (tenferro.interop.producers) on the stand-in torch above: kept here
# because test_interop_producers.py needs the real torch and skips as a whole without it ---


def test_the_torch_reader_reads_fields_and_hands_on_what_it_does_not_take(fake_torch):
    from tenferro.interop import producers

    read = producers.direct_reader(_TorchTensor)
    assert producers.readers[_TorchTensor] is read and producers.direct_reader(_TorchTensor) is read
    assert producers.direct_reader(fake_torch.nn.Parameter) is not None
    x = _TorchTensor(0x1000, (4, 3), "float64")
    assert read(x, 0, "op") == (0x1000, (4, 3), (24, 8), dtypes.by_name("f64"), 7, 96)
    fake_torch.stream = 0  # torch's default stream: the legacy handle
    assert read(x, 0, "op")[4] == 1
    x.strides = (1, 4)  # a transposed view: byte strides from torch's element strides
    assert read(x, 0, "op")[2:] == ((8, 32), dtypes.by_name("f64"), 1, -1)
    for field, value in (("requires_grad", True), ("is_cuda", False), ("dtype", "complex64")):
        y = _TorchTensor(0x1000)
        setattr(y, field, value)
        assert read(y, 0, "op") is None, field  # the general path says why
    y = _TorchTensor(0x1000)
    y.fail = "a sparse tensor has no data_ptr"
    assert read(y, 0, "op") is None
    y = _TorchTensor(0x1000)
    y.neg = True
    with pytest.raises(tf.ValidationError, match=r"^op: x is a negated view"):
        read(y, 0, "op")
    with pytest.raises(
        tf.ValidationError,
        match=r"^op: x lives on device 0, this session is on "
        r"device 1$",
    ):
        read(_TorchTensor(0x1000), 1, "op")


def test_only_torch_tensors_are_read_directly_and_each_class_is_decided_once(
    fake_torch, monkeypatch
):
    from tenferro.interop import producers

    class Other:
        pass

    for decide, table in (
        (producers.direct_reader, producers.readers),
        (producers.fast_span, producers.fast_spans),
    ):
        assert decide(Other) is None and table[Other] is None
        assert decide(np.ndarray) is None
        assert decide(_TorchTensor) is not None and decide(_TorchTensor) is table[_TorchTensor]
    import types

    cupy = types.SimpleNamespace(
        ndarray=type("ndarray", (), {}), cuda=types.SimpleNamespace(get_current_stream=lambda: None)
    )
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert producers.direct_reader(cupy.ndarray) is not None  # CuPy: a reader, no fast span
    assert producers.fast_span(cupy.ndarray) is None
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delitem(sys.modules, "cupy")
    producers.fast_spans.clear()
    producers.readers.clear()
    assert producers.fast_span(_TorchTensor) is None  # torch not imported: not recognised
    assert producers.direct_reader(_TorchTensor) is None
    assert producers.direct_reader(cupy.ndarray) is None


def test_torchs_public_stream_query_serves_where_the_raw_one_is_missing(fake_torch):
    import types

    from tenferro.interop import producers

    fake_torch._C = types.SimpleNamespace()
    fake_torch.cuda = types.SimpleNamespace(
        current_stream=lambda device: types.SimpleNamespace(cuda_stream=40 + device)
    )
    assert producers.torch_current_stream(fake_torch)(2) == 42


def test_a_torch_span_given_again_is_found_without_making_one(fake_torch, monkeypatch):
    from tenferro import span_import as imports
    from tenferro.interop import producers

    s, x = ImportingSession(), _TorchTensor(0x1000)
    span = imports.tensor(s, x)
    made = []
    monkeypatch.setattr(producers, "kept_compact", lambda *a: made.append(a))
    monkeypatch.setattr(producers, "compact_layout", lambda *a: made.append(a))
    assert imports.tensor(s, x) is span and made == []  # the fields match: no layout, no span


def test_a_torch_tensors_read_only_and_writable_spans_are_kept_apart(fake_torch):
    from tenferro import span_import as imports
    from tenferro.interop import producers

    s, x = ImportingSession(), _TorchTensor(0x1000)
    ref, mut = imports.tensor(s, x), imports.tensor_mut(s, x)
    assert type(ref) is tf.TensorRef and type(mut) is tf.TensorMut
    assert imports.tensor(s, x) is ref and imports.tensor_mut(s, x) is mut  # each its own
    assert producers.kept[tf.TensorRef][id(x)]() is ref
    assert producers.kept[tf.TensorMut][id(x)]() is mut
