"""Sessions open on a thread, and sessions kept open across notebook cells (``Session.open``):
the bookkeeping through a stand-in session class (no GPU), then real sessions on a GPU."""

import threading

import numpy as np
import pytest

import tenferro as tf
from tenferro import scope


class Stand:
    """Enters and leaves as a Session does, counting both; opened and closed by Session's own
    `open` and `close`, which see its state through ``_state`` (itself here)."""

    open = classmethod(tf.Session.open.__func__)
    close = tf.Session.close

    @property
    def _state(self):
        return self

    def __init__(self, device=0, stream=None):
        self.device, self.stream, self.is_open, self.thread, self.exits = (
            device,
            stream,
            False,
            None,
            0,
        )

    def __enter__(self):
        self.is_open, self.thread = True, threading.get_ident()
        scope.entered(self)
        return self

    def __exit__(self, exc_type, exc, tb):  # as a Session's: three arguments
        self.is_open = False
        self.exits += 1
        scope.left(self)


@pytest.fixture(autouse=True)
def clean():
    yield
    scope._close_at_exit()


def test_an_opened_session_is_the_innermost_until_closed():
    s = Stand.open(1, stream=7)
    assert s.is_open and (s.device, s.stream) == (1, 7) and scope.innermost() is s
    s.close()
    assert not s.is_open and s.exits == 1 and scope.innermost() is None
    s.close()  # closing again changes nothing
    assert s.exits == 1


def test_opening_again_on_a_device_closes_the_earlier_session_only_there():
    a0 = Stand.open(0)
    b1 = Stand.open(1)
    a0_again = Stand.open(0)  # a notebook cell run a second time
    assert not a0.is_open and a0.exits == 1
    assert a0_again.is_open and b1.is_open and b1.exits == 0
    a0.close()  # the earlier one stays closed; the new one is not touched
    assert a0_again.is_open


def test_a_session_is_closed_only_by_the_thread_that_opened_it():
    from _stand_ins import refusal_in_another_thread

    s = Stand.open(0)
    assert refusal_in_another_thread(s.close) == (
        "session.close: the session belongs to the thread that opened it; close it there"
    )
    assert s.is_open and s.exits == 0


def test_interpreter_exit_closes_what_is_still_open():
    a, b = Stand.open(0), Stand.open(3)
    b.close()
    scope._close_at_exit()
    assert (a.exits, b.exits) == (1, 1) and not a.is_open


def test_a_kept_session_not_innermost_leaves_the_users_default_alone():
    with Stand() as users:
        kept = Stand(2, 9).__enter__()  # as tenferro.torch opens one behind an operator
        scope.keep_open(kept, ("ops", 2, 9), innermost=False)
        assert scope.innermost() is users and scope.kept(("ops", 2, 9)) is kept
        assert scope.kept(("ops", 2, 8)) is None
    assert scope.innermost() is None and kept.is_open
    kept.is_open = False  # closed without telling scope (a failed close): not handed out
    assert scope.kept(("ops", 2, 9)) is None
    kept.is_open = True
    kept.__exit__(None, None, None)  # closed: forgotten
    assert scope.kept(("ops", 2, 9)) is None


def test_close_kept_closes_this_threads_matching_sessions_only():
    ops, mine = Stand(0).__enter__(), Stand.open(1)
    scope.keep_open(ops, ("ops", 0), innermost=False)
    theirs, kept, done = [], threading.Event(), threading.Event()

    def other():
        theirs.append(Stand(0).__enter__())
        scope.keep_open(theirs[0], ("ops", 1), innermost=False)
        kept.set()
        done.wait(timeout=30)  # alive while the main thread closes its own

    t = threading.Thread(target=other)
    t.start()
    kept.wait(timeout=30)
    scope.close_kept(lambda key: key[0] == "ops")
    assert not ops.is_open and mine.is_open and theirs[0].is_open  # another thread's stays
    assert scope.kept(("ops", 1)) is theirs[0]
    done.set()
    t.join()


@pytest.mark.parametrize("how", ["returns", "raises"])
def test_a_thread_that_ends_closes_the_sessions_it_kept_open_itself(how):
    # A worker thread (a server's, a DataLoader's pin thread) that ends with sessions open
    # must not leave them, and their memory, behind until the process exits.
    kept, closed_by = [], []

    class Closing(Stand):
        def __exit__(self, exc_type, exc, tb):
            closed_by.append(threading.get_ident())
            super().__exit__(exc_type, exc, tb)

    def worker():
        kept.append(Closing.open(0))
        ops = Closing(1).__enter__()
        scope.keep_open(ops, ("ops", 1), innermost=False)
        kept.append(ops)
        if how == "raises":
            raise RuntimeError("the worker failed")

    errors = []
    t = threading.Thread(target=worker)
    previous, threading.excepthook = threading.excepthook, lambda args: errors.append(args)
    try:
        t.start()
        t.join()
    finally:
        threading.excepthook = previous
    assert [type(e.exc_value) for e in errors] == ([RuntimeError] if how == "raises" else [])
    assert [s.is_open for s in kept] == [False, False] and [s.exits for s in kept] == [1, 1]
    assert closed_by == [t.ident, t.ident]  # closed by their own thread, as they must be
    assert scope.kept(("ops", 1)) is None and scope.kept((t.ident, 0)) is None


def test_a_thread_that_closed_its_sessions_itself_ends_without_closing_them_again():
    kept = []

    def worker():
        kept.append(Stand.open(0))
        kept[0].close()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert kept[0].exits == 1


def test_the_main_threads_kept_sessions_wait_for_the_exit_hook():
    s = Stand.open(0)
    assert not hasattr(scope._local, "end") and s.is_open  # the interpreter's exit closes it


def test_the_exit_hook_is_registered_once(monkeypatch):
    registered = []
    monkeypatch.setattr(scope, "_exit_hook", False)
    monkeypatch.setattr(scope.atexit, "register", registered.append)
    Stand.open(0)
    Stand.open(1)
    assert registered == [scope._close_at_exit]


def test_forgetting_a_session_on_a_thread_that_never_entered_one():
    errors = []

    def other():
        try:
            scope.left(Stand())  # a thread with no sessions of its own yet
            assert scope.innermost() is None
        except Exception as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors == []


def test_sessions_of_a_with_block_nest_on_their_thread():
    with Stand() as outer:
        with Stand() as inner:
            assert scope.innermost() is inner
        assert scope.innermost() is outer
    assert scope.innermost() is None


@pytest.mark.gpu
def test_a_session_lives_across_cells_until_closed(device, rng):
    s = tf.Session.open(device)
    x0 = rng.standard_normal(100).astype(np.float32)
    x = s.upload(x0)  # one cell
    np.testing.assert_array_equal(s.download(x), x0)  # a later cell
    assert tf.from_dlpack(x).session is s  # the thread's innermost open session
    again = tf.Session.open(device)  # the first cell run again
    assert not s.is_open and again.is_open
    with pytest.raises(tf.RuntimeStateError, match=r"session\.download: the session is closed"):
        s.download(x)
    again.close()
    again.close()
    assert not again.is_open
    with pytest.raises(tf.RuntimeStateError, match=r"session\.upload: the session is closed"):
        again.upload(x0)
