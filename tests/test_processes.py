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
    from tenferro import _driver, scope
    from tenferro import _state as state_part
    from tenferro._driver import devices

    class _Context:  # as the device's primary context answers an open and a close
        def make_current(self):
            return 0

        def trim_pool(self, keep, op):
            pass

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
    try:
        st.check_use("session.launch")  # the parent's session is unaffected
        assert st.fast_path_ok and st.thread == threading.get_ident() and s.is_open
    finally:  # closed as its block's end would, with nothing to synchronize
        scope.left(s)
        st.close()
    assert not s.is_open and released == [("event", 0x9), ("event", 0x9), ("stream", 0x5)]


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


# --- on a GPU: what real programs do with sessions ---------------------------------------------

GPU_SCRIPT = textwrap.dedent(
    '''
    import os, signal, sys, threading, time
    import numpy as np
    import tenferro as tf

    AXPY = r"""
    extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) {
        unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }
    extern "C" __global__ void add_one(int* y, unsigned n) {
        unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] += 1;
    }"""
    N = 1 << 16
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)


    def axpy_right(s, fn, a=2.0):
        """One launch of y = a x + y on fresh inputs, compared with numpy in float64."""
        x, y = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
        dx, dy = s.upload(x), s.upload(y)
        cfg = tf.LaunchConfig.flat(N, 256)
        s.launch(fn, cfg, [s.tensor_mut(dy), s.tensor(dx), tf.f32(a), tf.u32(N)])
        return bool(np.allclose(s.download(dy), a * x.astype(np.float64) + y, atol=1e-5))
    '''
)


def _run_gpu_script(tmp_path, body, seed, timeout=240):
    """Run GPU_SCRIPT + ``body`` as a file (spawned workers import it); stdout, stderr, rc."""
    path = tmp_path / "program.py"
    path.write_text(GPU_SCRIPT + textwrap.dedent(body))
    out = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(path), str(seed)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env=dict(os.environ, NUMBA_DISABLE_PERFORMANCE_WARNINGS="1"),
    )
    return out.stdout.splitlines(), out.stderr, out.returncode


def _seed(rng):
    return int(rng.integers(1 << 31))


@pytest.mark.gpu
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_child_forked_after_a_session_is_refused_and_the_parent_goes_on(device, rng, tmp_path):
    lines, err, rc = _run_gpu_script(
        tmp_path,
        """
        import warnings

        # Python 3.12 warns that a process with threads (the driver's, numba's) forks: true,
        # and what this test is about; the refusals below are what the child sees.
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
        s = tf.Session.open(0)
        fn = s.compile(AXPY).function("axpy")
        print("parent before:", axpy_right(s, fn))
        sys.stdout.flush()
        if os.fork() == 0:
            calls = (("a new session", lambda: tf.Session(0).__enter__()),
                     ("the parent's session", lambda: axpy_right(s, fn)))
            for name, call in calls:
                try:
                    call()
                    print("child:", name, "worked")
                except tf.RuntimeStateError as exc:
                    print("child:", name, "refused:", exc)
            sys.stdout.flush()
            sys.exit(0)  # a normal exit: atexit handlers (tenferro's, numba's) run here too
        print("child exit:", os.waitstatus_to_exitcode(os.wait()[1]))
        sys.stdout.flush()
        if os.fork() == 0:
            sys.exit(0)  # a child that never touches tenferro
        print("quiet child exit:", os.waitstatus_to_exitcode(os.wait()[1]))
        print("parent after:", axpy_right(s, fn))
        """,
        _seed(rng),
    )
    assert (rc, err) == (0, ""), err
    from tenferro._driver import FORKED_WHY

    assert lines[0] == "parent before: True" and lines[3:] == [
        "child exit: 0",
        "quiet child exit: 0",
        "parent after: True",
    ]
    assert lines[1].startswith("child: a new session refused: ") and FORKED_WHY in lines[1]
    assert lines[2] == (
        "child: the parent's session refused: session.upload: the session was opened before "
        f"this process was forked from its parent: {FORKED_WHY}"
    )


@pytest.mark.gpu
def test_spawned_workers_launch_on_cuda_tensors_the_parent_shares_with_them(device, rng, tmp_path):
    pytest.importorskip("torch", reason="torch.multiprocessing shares CUDA tensors (CUDA IPC)")
    lines, err, rc = _run_gpu_script(
        tmp_path,
        """
        import torch
        import torch.multiprocessing as mp

        W = 3


        def worker(rank, x, y, results):
            # x and y came through CUDA IPC; this worker writes row `rank` of y in place.
            with tf.Session(0) as s:
                fn = s.compile(AXPY).function("axpy")
                own = axpy_right(s, fn)  # its own tensors, from its own pool
                args = [s.tensor_mut(y[rank]), s.tensor(x[rank]), tf.f32(rank + 1.0), tf.u32(N)]
                s.launch(fn, tf.LaunchConfig.flat(N, 256), args)
            results.put((rank, own))  # the block's end synchronized: the row is written


        if __name__ == "__main__":
            mp.set_start_method("spawn")
            g = torch.Generator(device="cuda").manual_seed(int(sys.argv[1]))
            x = torch.randn(W, N, device="cuda", generator=g)
            y = torch.randn(W, N, device="cuda", generator=g)
            x64, y64 = x.double().cpu().numpy(), y.double().cpu().numpy()
            results = mp.Queue()
            procs = [mp.Process(target=worker, args=(r, x, y, results)) for r in range(W)]
            for p in procs:
                p.start()
            got = sorted(results.get(timeout=180) for _ in range(W))
            for p in procs:
                p.join(timeout=60)
            want = np.arange(1.0, W + 1)[:, None] * x64 + y64
            print("own tensors right:", [ok for _, ok in got])
            print("shared tensors right:", np.allclose(y.double().cpu().numpy(), want, atol=1e-5))
            print("worker exit codes:", [p.exitcode for p in procs])
        """,
        _seed(rng),
    )
    assert rc == 0 and "Traceback" not in err, err
    assert lines == [
        "own tensors right: [True, True, True]",
        "shared tensors right: True",
        "worker exit codes: [0, 0, 0]",
    ]


@pytest.mark.gpu
def test_four_threads_each_with_a_session_launch_and_copy_at_once(device, rng):
    import threading
    import time

    import numpy as np
    from _sources import AXPY

    import tenferro as tf

    seeds, rounds, errors = rng.integers(1 << 31, size=4), [], []
    go, until = threading.Barrier(4), time.monotonic() + 3.0

    def worker(seed):
        r = np.random.default_rng(seed)
        try:
            with tf.Session(device) as s:
                fn = s.compile(AXPY).function("axpy")
                go.wait(timeout=60)
                done = 0
                while time.monotonic() < until or done == 0:
                    n = int(r.integers(1, 1 << 16))
                    x, y = (r.standard_normal(n).astype(np.float32) for _ in range(2))
                    dx, dy, out = s.upload(x), s.upload(y), s.alloc_output(n, np.float32)
                    s.copy(out, dy)
                    a = float(r.standard_normal())
                    cfg = tf.LaunchConfig.flat(n, 256)
                    s.launch(fn, cfg, [s.tensor_mut(out), s.tensor(dx), tf.f32(a), tf.u32(n)])
                    want = np.float32(a) * x.astype(np.float64) + y
                    if not np.allclose(s.download(out), want, atol=1e-5):
                        errors.append(f"thread {seed}: wrong result at n={n}")
                    done += 1
                rounds.append(done)
        except Exception as exc:  # reported with the others below
            errors.append(f"thread {seed}: {type(exc).__name__}: {exc}")

    from conftest import UNDER_SANITIZER, pool_bytes_used

    before = pool_bytes_used(device)  # earlier tests' garbage freed first
    with tf.Session(device):  # the main thread has its own session open meanwhile
        threads = [threading.Thread(target=worker, args=(int(seed),)) for seed in seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == [] and len(rounds) == 4 and min(rounds) > 0, (errors, rounds)
    print("rounds per thread:", rounds)
    after = pool_bytes_used(device)  # the threads' last Tensors too, freed after their sessions
    if not UNDER_SANITIZER:
        assert after == before, f"{after - before} bytes of the threads' memory not back"


@pytest.mark.gpu
def test_a_thread_that_ends_with_its_session_open_closes_it_and_its_memory_goes_back(device, rng):
    import threading

    import numpy as np
    from _sources import AXPY

    import tenferro as tf

    got = []

    def worker():  # a server's thread that opened a session and never closed it
        w = tf.Session.open(device)
        fn = w.compile(AXPY).function("axpy")
        n = 1 << 24  # 64 MiB a tensor
        x = w.upload(rng.standard_normal(n).astype(np.float32))
        y = w.alloc_zeros(n, np.float32)
        w.launch(fn, tf.LaunchConfig.flat(n, 256), [w.tensor_mut(y), w.tensor(x), 2.0, n])
        got.append((w, w.memory_stats()["reserved_bytes"]))

    with tf.Session(device) as s:
        s.trim_memory()
        before = s.memory_stats()
        t = threading.Thread(target=worker)
        t.start()
        t.join(timeout=120)
        w, reserved_then = got[0]
        assert reserved_then >= before["reserved_bytes"] + (128 << 20)
        assert not w.is_open  # closed by its own thread as it ended
        after = s.memory_stats()
        assert after["used_bytes"] == before["used_bytes"]
        assert after["reserved_bytes"] <= before["reserved_bytes"]  # the pool was trimmed


@pytest.mark.gpu
def test_ctrl_c_from_a_timer_mid_loop_leaves_the_session_usable_and_memory_comes_back(
    device, rng, tmp_path
):
    # SIGINT from a timer lands between any two lines of the loop or of tenferro's own code
    # (packing, holding, the launch), forty times at random moments.
    lines, err, rc = _run_gpu_script(
        tmp_path,
        """
        n = 4096
        cfg = tf.LaunchConfig.flat(n, 256)
        with tf.Session(0) as s:
            base = s.memory_stats()["used_bytes"]
        interrupted, wrong = 0, []
        with tf.Session(0) as s:
            fn = s.compile(AXPY).function("axpy")
            one = s.compile(AXPY).function("add_one")
            for k in range(40):
                y0 = rng.integers(-1000, 1000, n).astype(np.int32)
                dy = s.upload(y0)
                bound = s.bind(one, cfg, [s.tensor_mut(dy), tf.u32(n)])
                timer = threading.Timer(rng.uniform(0, 0.01), os.kill, (os.getpid(), signal.SIGINT))
                launched = 0
                try:
                    timer.start()  # inside the try: the signal may come as soon as it starts
                    while True:  # until Ctrl-C; the count lags the launches by at most one
                        if launched % 2:
                            bound()
                        else:
                            s.launch(one, cfg, [s.tensor_mut(dy), tf.u32(n)])
                        launched += 1
                except KeyboardInterrupt:
                    interrupted += 1
                timer.join()
                added = s.download(dy).astype(np.int64) - y0
                # every launch that ran wrote every element: one count for all, never a part
                if not (added.min() == added.max() and launched <= added[0] <= launched + 1):
                    wrong.append((k, launched, added.min(), added.max()))
                if not axpy_right(s, fn):  # the session goes on: a fresh launch is right
                    wrong.append((k, "axpy after the interrupt"))
                del bound, dy
        print("interrupted:", interrupted, "wrong:", wrong)
        import gc
        from tenferro import _driver

        gc.collect()
        with tf.Session(0) as s:
            _driver.context_synchronize()  # frees of the loop's last Tensors have run
            print("bytes not back:", s.memory_stats()["used_bytes"] - base)
        """,
        _seed(rng),
    )
    from conftest import UNDER_SANITIZER

    assert rc == 0 and "Traceback" not in err, err
    assert lines[0] == "interrupted: 40 wrong: []"
    if not UNDER_SANITIZER:
        assert lines[1] == "bytes not back: 0"


EXIT_CASES = {
    "a session kept open, a launch in flight": """
        s = tf.Session.open(0)
        fn = s.compile(AXPY).function("axpy")
        x = s.upload(rng.standard_normal(N).astype(np.float32))
        y = s.alloc_zeros(N, np.float32)
        for _ in range(200):
            s.launch(fn, tf.LaunchConfig.flat(N, 256), [s.tensor_mut(y), s.tensor(x), 2.0, N])
        print("done")
        """,
    "a daemon thread launching as the interpreter exits": """
        started = threading.Event()

        def forever():
            with tf.Session(0) as s:
                fn = s.compile(AXPY).function("axpy")
                x = s.upload(rng.standard_normal(N).astype(np.float32))
                y = s.alloc_zeros(N, np.float32)
                cfg = tf.LaunchConfig.flat(N, 256)
                while True:
                    s.launch(fn, cfg, [s.tensor_mut(y), s.tensor(x), 2.0, N])
                    started.set()

        threading.Thread(target=forever, daemon=True).start()
        started.wait(timeout=120)
        time.sleep(0.2)
        print("done")
        """,
    "a graph and a bound launch alive": """
        s = tf.Session.open(0)
        fn = s.compile(AXPY).function("axpy")
        x = s.upload(rng.standard_normal(N).astype(np.float32))
        y = s.alloc_zeros(N, np.float32)
        cfg = tf.LaunchConfig.flat(N, 256)
        bound = s.bind(fn, cfg, [s.tensor_mut(y), s.tensor(x), tf.f32(1.0), tf.u32(N)])
        with s.capture() as cap:
            bound()
            bound()
        graph = cap.graph
        for _ in range(10):
            graph.launch()
            bound()
        print("done")
        """,
    "torch and numba in use, a user's atexit handler reading results": """
        import atexit

        import torch
        from numba import cuda

        def double(y):
            i = cuda.grid(1)
            if i < y.size:
                y[i] *= 2

        s = tf.Session.open(0)
        t = torch.randn(N, device="cuda")
        kern = s.numba_kernel(double)
        s.launch(kern, tf.LaunchConfig.flat(N, 256), [s.tensor_mut(t)])
        s.synchronize()  # before torch reads what the session's stream wrote
        want = t.double().cpu().numpy()
        dev = cuda.to_device(np.ones(N, np.float32))  # numba's own context use
        fn = s.compile(AXPY).function("axpy")
        s.launch(fn, tf.LaunchConfig.flat(N, 256), [s.tensor_mut(dev), s.tensor(t), 1.0, N])
        def report():  # runs before tenferro's own exit hook, which registered first
            s.synchronize()
            got = dev.copy_to_host()
            print("at exit, numba's array right:", np.allclose(got, want + 1, atol=1e-5))

        atexit.register(report)
        print("done")
        """,
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(EXIT_CASES), ids=lambda c: c.split(",")[0])
def test_the_interpreter_exits_cleanly_with_work_left_open(device, rng, tmp_path, case):
    if "torch" in case:
        pytest.importorskip("torch", reason="the case uses torch tensors")
    lines, err, rc = _run_gpu_script(tmp_path, EXIT_CASES[case], _seed(rng))
    assert (rc, err) == (0, ""), f"exit status {rc}, stderr:\n{err}"
    assert lines[0] == "done"
    if "atexit" in case:
        assert lines[1:] == ["at exit, numba's array right: True"]
