"""tenferro in processes and threads: importing, a fork after import, workers and threads
that compile at once.

The driver cannot be used in a child forked after the parent initialised it, so importing
tenferro must not initialise it: a program may import tenferro, then fork workers (a torch
DataLoader does), and each of them may still use CUDA.
"""

import os
import subprocess
import sys
import textwrap

import pytest

CHECK_IMPORT = textwrap.dedent(
    """
    import os, sys
    from cuda.bindings import driver as cu

    asked = []
    real_init = cu.cuInit
    cu.cuInit = lambda flags: asked.append(flags) or real_init(flags)

    import tenferro as tf
    import tenferro.kernels
    from tenferro import _driver

    SRC = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }'
    assert tf.compile_cuda(SRC, cache=False).signatures["k"]  # NVRTC: no driver needed
    print("after import and compile, cuInit calls:", len(asked))
    pid = os.fork()
    if pid == 0:  # the child compiles too, then leaves without running atexit handlers
        ok = bool(tf.compile_cuda(SRC, cache=False).signatures["k"]) and not asked
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    print("child exit status:", os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_importing_and_compiling_leave_the_driver_alone_so_a_fork_after_import_is_safe():
    out = subprocess.run(
        [sys.executable, "-c", CHECK_IMPORT], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "after import and compile, cuInit calls: 0",
        "child exit status: 0",
    ]


def test_the_check_sees_an_import_that_initialises_the_driver():
    # The same check, with an import that does initialise it: the count shows it.
    planted = CHECK_IMPORT.replace(
        "from tenferro import _driver\n",
        "from tenferro import _driver\ntry:\n    _driver.ensure_init('test')\n"
        "except tf.RuntimeStateError:  # no driver here: cuInit was still called\n    pass\n",
        1,
    )
    out = subprocess.run(
        [sys.executable, "-c", planted], capture_output=True, text=True, timeout=180
    )
    assert "after import and compile, cuInit calls: 1" in out.stdout.splitlines()


COMPILE_ONCE = textwrap.dedent(
    """
    import sys
    import tenferro as tf

    r = tf.compile_cuda(sys.argv[1])
    print(sorted(r.signatures), len(r.image) > 0)
    """
)


def test_worker_processes_compiling_one_source_at_once_share_one_whole_cache_entry(tmp_path):
    # Workers started together (a DataLoader's, torchrun's) race to write the same entry: each
    # gets its kernels, and the cache ends with that one entry, no temporary file beside it.
    source = 'extern "C" __global__ void raced(float* y, unsigned n) { if (n) y[0] = 1.0f; }'
    env = dict(os.environ, TENFERRO_CACHE_DIR=str(tmp_path))
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", COMPILE_ONCE, source],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [w.communicate(timeout=180) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0, 0], [err for _, err in outs]
    assert [out for out, _ in outs] == ["['raced'] True\n"] * 4
    assert [
        p.name.endswith(".tfmod") and not p.name.startswith(".") for p in tmp_path.iterdir()
    ] == [True]


def test_threads_compiling_at_once_each_get_the_kernels_and_the_cache_counts_every_call():
    import threading

    import tenferro as tf

    source = 'extern "C" __global__ void threaded(float* y) { y[0] = 2.0f; }'
    before = tf.cache_stats()
    results, errors = [], []

    def compile_one():
        try:
            results.append(sorted(tf.compile_cuda(source).signatures))
        except Exception as exc:  # reported below, with the thread's error
            errors.append(exc)

    threads = [threading.Thread(target=compile_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    after = tf.cache_stats()
    assert errors == [] and results == [["threaded"]] * 6
    assert (after["hits"] - before["hits"]) + (after["misses"] - before["misses"]) == 6


def _in_a_forked_child(check):
    """Run ``check()`` in a child forked now; return what it printed (its last line)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without the parent's atexit handlers
        try:
            said = check()
        except BaseException as exc:
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        said = got.read()
    os.waitpid(pid, 0)
    return said


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_child_forked_after_the_driver_started_is_told_to_spawn(monkeypatch):
    import tenferro as tf
    from tenferro._driver import devices

    monkeypatch.setattr(devices, "_initialised", True)  # as after a session (no GPU needed)

    def first_call():
        tf.Session(0).__enter__()
        return "opened"

    said = _in_a_forked_child(first_call)
    assert said.startswith(
        "RuntimeStateError: session: this process was forked from one that had initialised "
        "CUDA, and the driver cannot be used after a fork; start worker processes with the "
        "'spawn' method"
    ), said
    devices.ensure_init("the parent")  # the parent itself is untouched


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_session_open_at_the_fork_refuses_use_in_the_child_and_serves_the_parent(monkeypatch):
    import threading

    import tenferro as tf
    from tenferro import _driver
    from tenferro import _state as state_part
    from tenferro._driver import devices

    class _Context:  # as the device's primary context answers an open
        def make_current(self):
            return 0

    released = []
    monkeypatch.setattr(_driver.PrimaryContext, "get", lambda device, op: _Context())
    monkeypatch.setattr(state_part, "open_stream", lambda ext, ctx, op: (0x5, frozenset({0x5})))
    monkeypatch.setattr(_driver, "event_create", lambda *a: 0x9)
    monkeypatch.setattr(_driver, "launcher", lambda: None)
    monkeypatch.setattr(_driver, "event_destroy", lambda h: released.append(("event", h)))
    monkeypatch.setattr(_driver, "stream_destroy", lambda h: released.append(("stream", h)))
    monkeypatch.setattr(_driver, "set_current", lambda c: None)
    monkeypatch.setattr(devices, "_initialised", True)  # as after the session's cuInit
    s = tf.Session(0).__enter__()
    st = s._state

    def use_then_close():
        try:
            s.launch(None, None, [])
            return "used"
        except Exception as exc:
            s.close()  # releases nothing of the parent's, and does not raise
            return f"{exc} | closed {not s.is_open} | released {released}"

    said = _in_a_forked_child(use_then_close)
    assert said.startswith(
        "session.launch: the session was opened before this process was forked from its "
        "parent: this process was forked from one that had initialised CUDA"
    ), said
    assert said.endswith("| closed True | released []")
    st.check_use("session.launch")  # the parent's session is unaffected
    assert st.fast_path_ok and st.thread == threading.get_ident() and s.is_open


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_the_parents_tensors_events_and_graphs_dropped_in_a_forked_child_release_nothing(
    monkeypatch,
):
    # The child's garbage collector (or its exit) drops what it inherited; a driver call for
    # it would act on the parent's objects through a driver this process cannot use.
    import tenferro as tf
    from tenferro import _driver
    from tenferro._driver import devices
    from tenferro.graph import Graph

    calls = []
    for name in ("mem_free", "mem_free_async", "event_destroy", "graph_destroy"):
        monkeypatch.setattr(_driver, name, lambda *a, name=name: calls.append(name))
    monkeypatch.setattr(devices, "_initialised", True)

    class _State:  # an open session's state, on this thread
        is_open, forked, stream = True, False, 5

        def __init__(self):
            import threading

            self.thread = threading.get_ident()

    class _Exec:
        def destroy(self):
            calls.append("exec_destroy")

    class _Context:  # a tensor of a closed session frees with its context current
        def push(self):
            pass

        def pop(self):
            pass

    def objects():
        t = object.__new__(tf.Tensor)
        t.ptr, t.nbytes, t.state, t.context = 0x5000, 4096, _State(), _Context()
        t.state.is_open = False
        ev = object.__new__(tf.Event)
        ev.handle, ev.state = 0x9, _State()
        g = object.__new__(Graph)
        g._exec, g._graph, g.state = _Exec(), 0x7, _State()
        return [t, ev, g]

    def drop_them():
        kept = objects()
        del kept[:]
        return f"driver calls {calls}"

    assert _in_a_forked_child(drop_them) == "driver calls []"
    kept = objects()  # the same objects dropped in the parent do reach the driver
    del kept[:]
    assert sorted(calls) == ["event_destroy", "exec_destroy", "graph_destroy", "mem_free"]
