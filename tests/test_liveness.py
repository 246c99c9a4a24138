"""tenferro._liveness: holds, fences, byte fences, captures and deferred frees, without a GPU.

The driver's event and free calls are replaced by a recording stand-in whose events complete
when the test says so, so each rule is checked on both sides of its boundary.
"""

import weakref

import numpy as np
import pytest
from _sources import AXPY

import tenferro as tf
from tenferro import _driver, _liveness
from tenferro.session import state_of


class FakeDriver:
    def __init__(self):
        self.next_event = 1
        self.recorded = []  # (event, stream)
        self.passed = set()  # events the "GPU" has passed
        self.freed = []
        self.destroyed = []

    def event_create(self):
        self.next_event += 1
        return self.next_event

    def event_record(self, ev, stream, op):
        assert op == "session.launch"  # what a driver failure here would be named after
        self.recorded.append((ev, stream))

    def event_query(self, ev, op):
        assert op == "session.launch"
        return ev in self.passed

    def mem_free_async(self, ptr, stream):
        self.freed.append((ptr, stream))

    def event_destroy(self, ev):
        self.destroyed.append(ev)


@pytest.fixture
def fake(monkeypatch):
    d = FakeDriver()
    for name in ("event_create", "event_record", "event_query", "mem_free_async", "event_destroy"):
        monkeypatch.setattr(_liveness._driver, name, getattr(d, name))
    return d


def test_holds_fence_every_n_and_go_when_the_gpu_has_passed(fake):
    live = _liveness.Liveness(stream=7, fence_every=3, fence_bytes=1 << 30)
    owners = [object() for _ in range(5)]
    live.hold(owners[0])
    live.hold(owners[1])  # the last hold before the count: no fence yet
    assert fake.recorded == [] and live.held == owners[:2]
    gen = live.generation
    live.hold(owners[2])  # the third: a fence on the session's stream takes the list
    assert fake.recorded == [(fake.next_event, 7)] and live.held == []
    assert live.generation != gen
    ((ev, fenced),) = live.fences
    assert fenced == owners[:3]
    live.hold(owners[3])
    fake.passed.add(ev)
    live.hold(owners[4])
    last = object()
    live.hold(last)  # the next fence retires the one the GPU passed
    assert [f[1] for f in live.fences] == [[owners[3], owners[4], last]]
    assert live.spare_events == [ev]  # its event is kept for the next fence
    made = fake.next_event
    live.hold("x")
    live.hold("y")
    live.hold("z")  # the next fence records the kept event instead of making one
    assert fake.next_event == made and fake.recorded[-1] == (ev, 7)


def test_small_blocks_are_kept_up_to_the_limit_outside_captures_and_freed_on_the_stream(fake):
    live = _liveness.Liveness(stream=7, fence_every=1000, fence_bytes=1 << 30)
    assert live.take_block() == 0  # none kept yet: the caller allocates
    kept = [0x1000 + 256 * i for i in range(_liveness.SPARE_BLOCKS_MAX)]
    assert all(live.keep_block(p) for p in kept)  # up to the last one the limit takes
    assert not live.keep_block(0x9000)  # the first past it: the caller frees it
    assert live.take_block() == kept[-1] and live.keep_block(kept[-1])  # room again
    live.begin_capture()
    assert live.take_block() == kept[-1]
    assert not live.keep_block(kept[-1])  # a capture keeps no block: a graph may reuse it
    live.end_capture([])
    assert fake.freed == []
    live.free_spare_blocks()
    assert fake.freed == [(p, 7) for p in kept[:-1]] and live.take_block() == 0
    live.keep_block(0x5000)
    live.close()  # the session's end frees what is kept
    assert fake.freed[-1] == (0x5000, 7)


def test_a_fences_worth_of_small_results_all_find_their_blocks_kept():
    from tenferro.session import FENCE_EVERY

    # A fence retires up to FENCE_EVERY launches' owners at once; each result Tensor among
    # them leaves a block, and all of them must fit, or a loop allocates again.
    assert _liveness.SPARE_BLOCKS_MAX >= FENCE_EVERY


def test_byte_fences(fake):
    live = _liveness.Liveness(stream=1, fence_every=1000, fence_bytes=100)
    live.hold("a")
    live.allocated_bytes(99)  # one byte short of the budget
    assert fake.recorded == []
    live.allocated_bytes(1)  # the budget reached: a fence, and the count starts again
    assert len(fake.recorded) == 1 and live.allocated == 0 and live.fences[0][1] == ["a"]


def test_release_all_and_caches(fake):
    class Cache:
        forgot = 0

        def forget(self):
            self.forgot += 1

    live = _liveness.Liveness(stream=1, fence_every=2, fence_bytes=1 << 30)
    cache = Cache()
    live.add_cache(cache)
    live.hold("a")
    live.hold("b")  # fenced
    live.hold("c")
    gen = live.generation
    live.release_all()
    assert live.held == [] and not live.fences and cache.forgot == 1
    assert live.generation != gen and live.spare_events == [fake.next_event]  # the fence's event


def test_capture_collects_apart_and_defers_frees(fake):
    live = _liveness.Liveness(stream=3, fence_every=2, fence_bytes=1 << 30)
    live.hold("before")
    saved = live.begin_capture()
    assert live.capturing and live.held == []
    for x in ("k1", "k2", "k3"):  # past fence_every: no fence while capturing
        live.hold(x)
    live.defer_free(0x1000)
    assert fake.recorded == [] and fake.freed == []
    owners = live.end_capture(saved)
    assert owners == ["k1", "k2", "k3"] and live.held == ["before"] and not live.capturing
    live.free_deferred()
    assert fake.freed == [(0x1000, 3)] and live.deferred_frees == []


def test_releases_deferred_in_a_capture_run_after_it_before_the_frees(fake):
    # A graph dropped mid-capture is destroyed after it: on a blocking stream a destroy during
    # the capture invalidates it. A release that raises does not stop the others or the frees.
    live = _liveness.Liveness(stream=3, fence_every=8, fence_bytes=1 << 30)
    order = []
    saved = live.begin_capture()
    live.defer_free(0x1000)
    live.defer_release(lambda: order.append("first"))

    def refused():
        order.append("refused")
        raise tf.BackendError("cuGraphExecDestroy failed")

    live.defer_release(refused)
    live.defer_release(lambda: order.append(("last", list(fake.freed))))
    live.end_capture(saved)
    assert order == [] and fake.freed == []  # nothing runs before the capture's end is seen
    live.free_deferred()
    assert order == ["first", "refused", ("last", [])]  # every release, each before the frees
    assert fake.freed == [(0x1000, 3)] and live.deferred_releases == []
    live.free_deferred()
    assert len(order) == 3  # run once


def test_close_runs_the_releases_a_capture_deferred(fake):
    live = _liveness.Liveness(stream=5, fence_every=8, fence_bytes=1 << 30)
    ran = []
    live.end_capture(live.begin_capture())
    live.defer_release(lambda: ran.append(1))
    live.close()
    assert ran == [1] and live.deferred_releases == []


def test_the_generation_grows_at_every_change_of_the_holds_list(fake):
    # A bound launch holds itself again when the generation differs from the one it saw:
    # a value seen before must never come back.
    live = _liveness.Liveness(stream=1, fence_every=1, fence_bytes=1 << 30)
    seen = [live.generation]
    live.hold("a")  # a fence
    seen.append(live.generation)
    live.hold("b")  # another: the count goes on from the last, not from a fixed value
    seen.append(live.generation)
    saved = live.begin_capture()
    seen.append(live.generation)
    live.end_capture(saved)
    seen.append(live.generation)
    live.release_all()
    seen.append(live.generation)
    live.close()
    seen.append(live.generation)
    assert seen == sorted(set(seen)), seen


def test_close_destroys_every_event_once(fake):
    live = _liveness.Liveness(stream=1, fence_every=1, fence_bytes=1 << 30)

    class Owner:
        pass

    kept = Owner()
    gone = weakref.ref(kept)
    live.retain(kept)
    del kept
    assert gone() is not None  # retained until close
    live.hold("a")  # fenced at once
    live.hold("b")
    events = sorted(ev for ev, _ in live.fences)
    live.close()
    assert sorted(fake.destroyed) == events and live.retained == [] and not live.fences
    assert live.held == [] and gone() is None


def test_close_frees_what_a_capture_deferred(fake):
    # A capture another library ran (tenferro.torch) may end after the session's last call.
    live = _liveness.Liveness(stream=5, fence_every=8, fence_bytes=1 << 30)
    live.end_capture(live.begin_capture())
    live.defer_free(0x2000)
    live.close()
    assert fake.freed == [(0x2000, 5)] and live.deferred_frees == []


def test_close_goes_on_when_a_deferred_free_is_refused(fake, monkeypatch):
    live = _liveness.Liveness(stream=5, fence_every=1, fence_bytes=1 << 30)
    live.hold("a")  # fenced: its event must still be destroyed

    def refuse(ptr, stream):
        raise tf.BackendError("cuMemFreeAsync failed")

    monkeypatch.setattr(_liveness._driver, "mem_free_async", refuse)
    live.defer_free(0x3000)
    live.close()
    assert fake.destroyed and not live.fences and live.deferred_frees == []


@pytest.mark.gpu
def test_kernel_survives_dropping_its_inputs_and_reusing_memory(session, rng):
    """The stream-ordered free and the session's holds keep a running kernel's inputs valid."""
    n = 1 << 18
    fn = session.compile(AXPY).function("slow_scale")
    x0 = rng.standard_normal(n)
    x = session.upload(x0)
    y = session.upload(np.full(n, np.nan))
    session.launch(
        fn, tf.LaunchConfig.flat(n), [session.tensor_mut(y), session.tensor(x), 2.5, n, 100_000_000]
    )  # ~50 ms of spinning
    del x  # the last Python reference to the input goes while the kernel still spins
    garbage = [session.upload(rng.standard_normal(n) * 1e9) for _ in range(4)]
    out = session.download(y)
    np.testing.assert_array_equal(out, 2.5 * x0)
    del garbage


@pytest.mark.gpu
def test_foreign_owner_is_held_until_the_stream_passes(session, cai):
    n = 1 << 16
    fn = session.compile(AXPY).function("slow_scale")
    backing = session.upload(np.arange(n, dtype=np.float64))
    producer = cai(backing.ptr, (n,), "<f8", keep=backing)
    ref = weakref.ref(producer)
    y = session.alloc_output((n,), np.float64)
    session.launch(
        fn,
        tf.LaunchConfig.flat(n),
        [session.tensor_mut(y), session.tensor(producer), 1.0, n, 10_000_000],
    )
    del producer, backing
    assert ref() is not None, "the session must hold a foreign owner while its launch may run"
    session.synchronize()
    assert ref() is None, "after synchronize the session must let go"
    np.testing.assert_array_equal(session.download(y), np.arange(n, dtype=np.float64))


@pytest.mark.gpu
def test_long_loops_do_not_hold_everything_forever(session):
    fn = session.compile(AXPY).function("axpy")
    y = session.alloc_zeros(256, np.float32)
    xs = [session.tensor(session.alloc_zeros(256, np.float32)) for _ in range(2)]
    ym = session.tensor_mut(y)
    arglists = [[ym, x, tf.f32(1.0), tf.u32(256)] for x in xs]
    # Alternating: every launch replaces the last, one hold each; 3 past a whole number of
    # fences, so some are held and the rest went to fences.
    for i in range(tf.session.FENCE_EVERY * 4 + 3):
        session.launch(fn, tf.LaunchConfig.flat(256), arglists[i % 2])
    assert 0 < len(state_of(session).liveness.held) < tf.session.FENCE_EVERY
    live = state_of(session).liveness
    assert len(live.fences) + len(live.spare_events) >= 1
    _driver.stream_synchronize(session.stream, "test")
    for i in range(tf.session.FENCE_EVERY + 1):
        session.launch(fn, tf.LaunchConfig.flat(256), arglists[i % 2])
    assert len(state_of(session).liveness.fences) <= 2  # the fences the GPU had passed were retired
    same = arglists[0]
    session.synchronize()
    for _ in range(tf.session.FENCE_EVERY * 2):  # the very same arguments: nothing piles up
        session.launch(fn, tf.LaunchConfig.flat(256), same)
    assert len(state_of(session).liveness.held) <= 1 and not state_of(session).liveness.fences


@pytest.mark.gpu
def test_a_launch_with_new_scalars_alone_holds_nothing_more(session, rng):
    # The block still references the spans it kept, so holding them again is not needed;
    # spans it replaces are held until the stream passes the launch that used them.
    from _sources import scale_add

    k = session.numba_kernel(scale_add)
    n = 1000
    x0, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    cfg = tf.LaunchConfig.flat(n, 128)
    session.synchronize()
    for a in (0.5, 0.25, 0.125):  # the README's loop: spans and numpy scalars made each call
        session.launch(
            k, cfg, [session.tensor_mut(y), session.tensor(x), np.float32(a), np.int64(n)]
        )
        if a == 0.5:  # the first launch (compiled, then checked) holds its spans
            held = list(state_of(session).liveness.held)
    assert state_of(session).liveness.held == held
    other = session.upload(x0)
    session.launch(
        k, cfg, [session.tensor_mut(y), session.tensor(other), np.float32(1.0), np.int64(n)]
    )
    assert [s.owner for s in state_of(session).liveness.held[-1]] == [y, x]  # the spans it replaced
    np.testing.assert_allclose(
        session.download(y), y0 + 1.875 * x0.astype(np.float64), rtol=1e-5, atol=1e-5
    )


def test_a_capture_is_known_on_its_thread_only_while_it_runs(fake):
    import threading

    outer = _liveness.Liveness(stream=3, fence_every=8, fence_bytes=1 << 30)
    inner = _liveness.Liveness(stream=4, fence_every=8, fence_bytes=1 << 30)
    assert _liveness.capture_on_this_thread() is None
    saved_outer = outer.begin_capture()
    saved_inner = inner.begin_capture()
    assert _liveness.capture_on_this_thread() is inner  # the innermost
    seen = []
    other = threading.Thread(target=lambda: seen.append(_liveness.capture_on_this_thread()))
    other.start()
    other.join()
    assert seen == [None]  # another thread's frees do not wait for this capture
    inner.end_capture(saved_inner)
    assert _liveness.capture_on_this_thread() is outer
    outer.end_capture(saved_outer)
    assert _liveness.capture_on_this_thread() is None
