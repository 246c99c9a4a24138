"""Launches: s.launch and its checked path, bound launches, and launches on the device."""

import threading

import numpy as np
import pytest
from _sources import AXPY, N
from _sources import raw_and_numba_axpy as _kernels
from numba import cuda

import tenferro as tf
from tenferro.session import state_of

# --- launches refused before the driver, and nothing changed after a refusal -------------------

NOT_CONFIGS = [None, 0, (1, 32), "flat", object()]


def _axpy(session, rng, n=1000):
    fn = session.compile(AXPY).function("axpy")
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    return fn, x, y, session.upload(x), session.upload(y)


@pytest.mark.gpu
@pytest.mark.parametrize("config", NOT_CONFIGS, ids=repr)
def test_launch_refuses_a_config_that_is_not_a_launchconfig(session, rng, config):
    # A function that never launched must not reach the driver with an unset launch record.
    fn, x, y, tx, ty = _axpy(session, rng)
    args = [session.tensor_mut(ty), session.tensor(tx), tf.f32(2.0), tf.u32(x.size)]
    with pytest.raises(
        tf.ValidationError, match=r"session\.launch: config must be a LaunchConfig, got "
    ):
        session.launch(fn, config, args)
    with pytest.raises(tf.ValidationError, match=r"session\.bind: config must be a LaunchConfig"):
        session.bind(fn, config, args)
    np.testing.assert_array_equal(session.download(ty), y)  # nothing ran
    cfg = tf.LaunchConfig.flat(x.size, 128)
    session.launch(fn, cfg, args)
    # After a launch the fast path is armed for cfg; the same args with a bad config are refused.
    with pytest.raises(tf.ValidationError, match=r"session\.launch: config must be a LaunchConfig"):
        session.launch(fn, config, args)
    np.testing.assert_allclose(session.download(ty), 2.0 * x.astype(np.float64) + y, rtol=1e-6)


@pytest.mark.gpu
def test_refused_bound_launch_update_changes_nothing(session, rng):
    fn, x, y, tx, ty = _axpy(session, rng)
    other = session.upload(rng.standard_normal(x.size).astype(np.float32))
    bound = session.bind(
        fn,
        tf.LaunchConfig.flat(x.size, 128),
        [session.tensor_mut(ty), session.tensor(tx), tf.f32(2.0), tf.u32(x.size)],
    )
    args, spans = list(bound.args), list(bound.spans)
    # Each refusal leaves the bound launch as it was: y aliasing the written y, a wrong type.
    with pytest.raises(
        tf.ValidationError,
        match=r"bound_launch\.update: args\[0\] .* and "
        r"args\[1\] .* overlap in memory",
    ):
        bound.update(1, session.tensor(ty))
    with pytest.raises(
        tf.ValidationError,
        match=r"bound_launch\.update: args\[2\] 'a' is an f64 "
        r"scalar, the kernel takes float$",
    ):
        bound.update(2, tf.f64(5.0))
    with pytest.raises(
        tf.ValidationError, match=r"bound_launch\.update: args\[1\] is str; expected a span"
    ):
        bound.update(1, "x")
    assert bound.args == args and bound.spans == spans
    bound()
    np.testing.assert_allclose(session.download(ty), 2.0 * x.astype(np.float64) + y, rtol=1e-6)
    # An accepted update takes effect: x replaced by other.
    bound.update(1, session.tensor(other))
    before = session.download(ty).astype(np.float64)
    bound()
    np.testing.assert_allclose(
        session.download(ty), 2.0 * session.download(other).astype(np.float64) + before, rtol=1e-6
    )


@pytest.mark.gpu
@pytest.mark.parametrize("args", [5, None, "abc", {0: 1}], ids=repr)
def test_launch_refuses_args_that_are_not_a_list(session, rng, args):
    fn, x, y, tx, ty = _axpy(session, rng)
    cfg = tf.LaunchConfig.flat(x.size, 128)
    good = [session.tensor_mut(ty), session.tensor(tx), tf.f32(2.0), tf.u32(x.size)]
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args must be a list or tuple "
        r"of kernel arguments, got ",
    ):
        session.launch(fn, cfg, args)
    session.launch(fn, cfg, good)  # arms the fast path for cfg
    with pytest.raises(tf.ValidationError, match=r"session\.launch: args must be a list or tuple"):
        session.launch(fn, cfg, args)
    session.launch(fn, cfg, tuple(good))  # a tuple is a list of arguments too
    # Two float32 roundings (y + 2x, then + 2x): bound the error by the terms, not the result,
    # which can cancel to near zero.
    np.testing.assert_allclose(
        session.download(ty),
        4.0 * x.astype(np.float64) + y,
        rtol=1e-6,
        atol=1e-6 * (4 * np.abs(x).max() + np.abs(y).max()),
    )


@pytest.mark.gpu
def test_no_config_or_args_reach_the_launcher_unchecked(session, rng):
    # Every launch that reaches the driver carries a record made from a checked LaunchConfig.
    fn, x, y, tx, ty = _axpy(session, rng, n=256)
    real = state_of(session).launcher
    seen = []

    def recording(address):
        seen.append(address)
        return real(address)

    state_of(session).launcher = recording
    args = [session.tensor_mut(ty), session.tensor(tx), tf.f32(1.0), tf.u32(256)]
    cfg = tf.LaunchConfig.flat(256, 64)
    junk = [
        None,
        0,
        1,
        (1, 64),
        [1, 64],
        "cfg",
        object(),
        cfg.dims,
        tf.LaunchConfig,
        type("Fake", (), {"dims": cfg.dims})(),
    ]
    for bad in junk:
        for call in (
            lambda b=bad: session.launch(fn, b, args),
            lambda b=bad: session.bind(fn, b, args),
        ):
            with pytest.raises(
                tf.ValidationError,
                match=r"session\.(launch|bind): config must "
                r"be a LaunchConfig",
            ):
                call()
    assert seen == []
    session.launch(fn, cfg, args)
    assert len(seen) == 1 and seen[0]  # the checked launch, with its record's address
    for bad in junk:  # with the fast path armed
        with pytest.raises(
            tf.ValidationError,
            match=r"session\.launch: config must be a "
            r"LaunchConfig",
        ):
            session.launch(fn, bad, args)
    assert len(seen) == 1
    np.testing.assert_allclose(session.download(ty), x.astype(np.float64) + y, rtol=1e-6)


@pytest.mark.gpu
def test_bound_launch_matches_launch_and_rechecks_one_slot(session, rng):
    axpy, nk = _kernels(session)
    x0, y0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    cfg = tf.LaunchConfig.flat(N)
    bound = session.bind(
        axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(0.5), tf.u32(N)]
    )
    for _ in range(5):
        bound()
    np.testing.assert_allclose(
        session.download(y), y0 + 2.5 * x0.astype(np.float64), rtol=1e-5, atol=1e-5
    )
    bound.update(2, tf.f32(-1.0))
    bound()
    np.testing.assert_allclose(
        session.download(y), y0 + 1.5 * x0.astype(np.float64), rtol=1e-5, atol=1e-5
    )
    with pytest.raises(
        tf.ValidationError,
        match=r"bound_launch\.update: args\[2\] 'a' is an f64 "
        r"scalar, the kernel takes float$",
    ):
        bound.update(2, tf.f64(1.0))
    with pytest.raises(
        tf.ValidationError,
        match=r"bound_launch\.update: args\[1\] \(TensorRef\) "
        r"and|args\[0\] \(TensorMut\) and args\[1\]",
    ):
        bound.update(1, session.tensor(y))
    with pytest.raises(tf.ValidationError, match=r"bound_launch\.update: index=7 is out of range"):
        bound.update(7, tf.f32(1.0))
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.bind: args\[3\] 'n' is an f64 scalar, "
        r"the kernel takes unsigned int$",
    ):
        session.bind(axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(1), tf.f64(1)])
    nb = session.bind(nk, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(2.0), N])
    nb()
    np.testing.assert_allclose(
        session.download(y), y0 + 3.5 * x0.astype(np.float64), rtol=1e-5, atol=1e-5
    )


@pytest.mark.gpu
def test_bound_launch_refused_after_the_block(rng):
    from conftest import gpu_reason

    if gpu_reason():
        pytest.skip(gpu_reason())
    with tf.Session() as s:
        fn = s.compile(AXPY).function("axpy")
        y = s.alloc_zeros(8, np.float32)
        bound = s.bind(
            fn,
            tf.LaunchConfig.flat(8),
            [s.tensor_mut(y), s.tensor(s.alloc_zeros(8, np.float32)), tf.f32(1), tf.u32(8)],
        )
    with pytest.raises(tf.RuntimeStateError, match=r"bound_launch: the session is closed"):
        bound()


@pytest.mark.gpu
def test_launch_refusals_on_device(session):
    fn = session.compile(AXPY).function("axpy")
    y = session.alloc_zeros(64, np.float32)
    ym = session.tensor_mut(y)
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[0\] \(TensorMut\) and args\[1\] "
        r"\(TensorRef\) overlap",
    ):
        session.launch(fn, tf.LaunchConfig.flat(64), [ym, session.tensor(y), tf.f32(1), tf.u32(64)])
    with pytest.raises(tf.ValidationError, match=r"session\.launch: config must be a LaunchConfig"):
        session.launch(fn, [1, 256], [ym, ym, tf.f32(1), tf.u32(64)])
    with pytest.raises(tf.ValidationError, match=r"session\.launch: args\[0\] is Tensor"):
        session.launch(fn, tf.LaunchConfig.flat(64), [y, session.tensor(y), 1.0, 64])
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[2\] 'a' is an f64 "
        r"scalar, the kernel takes float$",
    ):
        session.launch(
            fn,
            tf.LaunchConfig.flat(64),
            [ym, session.tensor(session.alloc_zeros(64, np.float32)), tf.f64(1.0), tf.u32(64)],
        )
    with pytest.raises(tf.ValidationError, match=r"LaunchConfig: block=\(2048, 1, 1\) exceeds"):
        tf.LaunchConfig(1, 2048)
    with pytest.raises(tf.ValidationError, match=r"module\.function: no kernel named 'nope'.*axpy"):
        session.compile(AXPY).function("nope")


@pytest.mark.gpu
def test_dynamic_shared_memory_is_raised_and_bounded(session):
    fn = session.compile(r"""
    extern "C" __global__ void fill_shared(float* out) {
        extern __shared__ float buf[];
        buf[threadIdx.x] = threadIdx.x;
        __syncthreads();
        out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
    }""").function("fill_shared")
    out = session.upload(np.full(256, np.nan, np.float32))
    session.launch(
        fn, tf.LaunchConfig(1, 256, shared_mem_bytes=100 * 1024), [session.tensor_mut(out)]
    )
    np.testing.assert_array_equal(session.download(out), np.arange(255, -1, -1))
    optin = session.context.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
    with pytest.raises(tf.ValidationError, match=r"session\.launch: shared_mem_bytes=.* exceeds"):
        session.launch(
            fn, tf.LaunchConfig(1, 256, shared_mem_bytes=optin + 1024), [session.tensor_mut(out)]
        )


# --- the C signature at launch: element types, const, signedness --------------------------------


@pytest.mark.gpu
def test_a_float64_array_for_a_float_pointer_is_refused_and_float32_computes(session, rng, cai):
    fn = session.compile(AXPY).function("axpy")
    n = 1000
    x64, y0 = rng.standard_normal(n), rng.standard_normal(n).astype(np.float32)
    y = session.upload(y0)
    cfg = tf.LaunchConfig.flat(n, 128)
    wrong = [session.tensor_mut(y), session.tensor(session.upload(x64)), tf.f32(2.0), tf.u32(n)]
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[1\] 'x' is float64, "
        r"the kernel takes const float\*$",
    ):
        session.launch(fn, cfg, wrong)
    with pytest.raises(tf.ValidationError, match=r"^session\.bind: args\[1\] 'x' is float64, "):
        session.bind(fn, cfg, wrong)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[3\] 'n' is an i32 "
        r"scalar, the kernel takes unsigned int$",
    ):
        session.launch(fn, cfg, [*wrong[:1], session.tensor(y), tf.f32(2.0), tf.i32(n)])
    frozen = cai(y.ptr, (n,), "<f4", readonly=True, keep=y)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[0\] 'y' is memory its "
        r"producer marked read-only, the kernel takes "
        r"float\*; declare it const",
    ):
        session.launch(
            fn,
            cfg,
            [
                session.tensor(frozen),
                session.tensor(session.upload(x64.astype(np.float32))),
                tf.f32(2.0),
                tf.u32(n),
            ],
        )
    np.testing.assert_array_equal(session.download(y), y0)  # nothing ran
    x32 = x64.astype(np.float32)
    session.launch(
        fn,
        cfg,
        [session.tensor_mut(y), session.tensor(session.upload(x32)), tf.f32(2.0), tf.u32(n)],
    )
    np.testing.assert_allclose(session.download(y), 2.0 * x32.astype(np.float64) + y0, rtol=1e-6)


# --- clusters and cooperative launches on the GPU ----------------------------------------------

CLUSTER_SRC = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// Each block reads the next block's shared memory in its cluster (distributed shared memory).
extern "C" __global__ void next_in_cluster(unsigned* out) {
    __shared__ unsigned mine;
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) mine = blockIdx.x * 1000u + cluster.block_rank();
    cluster.sync();
    unsigned next = (cluster.block_rank() + 1) % cluster.num_blocks();
    unsigned* theirs = cluster.map_shared_rank(&mine, next);
    unsigned v = *theirs;
    cluster.sync();  // no block leaves while another may still read its shared memory
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) pairs(unsigned* out) {
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) out[blockIdx.x] = cluster.block_rank() * 10u + cluster.num_blocks();
}

// Sums x: every block's part, a grid-wide barrier, then one thread adds the parts in order.
extern "C" __global__ void grid_sum(unsigned long long* partial, unsigned long long* total,
                                    const unsigned* x, unsigned n) {
    cg::grid_group grid = cg::this_grid();
    __shared__ unsigned long long acc;
    if (threadIdx.x == 0) acc = 0;
    __syncthreads();
    unsigned long long mine = 0;
    for (unsigned long long i = grid.thread_rank(); i < n; i += grid.size()) mine += x[i];
    atomicAdd(&acc, mine);
    __syncthreads();
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
    grid.sync();
    if (grid.thread_rank() == 0) {
        unsigned long long t = 0;
        for (unsigned b = 0; b < gridDim.x; ++b) t += partial[b];
        *total = t;
    }
}
"""


def _needs_clusters(session):
    if session.context.compute_capability < (9, 0):
        pytest.skip("thread-block clusters need sm_90 or later")


@pytest.mark.gpu
@pytest.mark.parametrize("size", [1, 2, 4, 8, 16])
def test_a_cluster_launch_shares_memory_across_its_blocks(session, size):
    _needs_clusters(session)
    fn = session.compile(CLUSTER_SRC).function("next_in_cluster")
    grid = 64
    out = session.upload(np.full(grid, 0xDEADBEEF, dtype=np.uint32))  # poison: all written
    cfg = tf.LaunchConfig(grid, 32, cluster=size)
    session.launch(fn, cfg, [session.tensor_mut(out)])
    session.launch(fn, cfg, [session.tensor_mut(out)])  # again: the checked path, not the fast
    b = np.arange(grid)
    rank = b % size
    nxt = (rank + 1) % size
    np.testing.assert_array_equal(session.download(out), ((b - rank + nxt) * 1000 + nxt))
    bound = session.bind(fn, cfg, [session.tensor_mut(out)])
    bound()
    np.testing.assert_array_equal(session.download(out), ((b - rank + nxt) * 1000 + nxt))


@pytest.mark.gpu
def test_max_active_clusters_is_within_the_device_and_a_grid_of_them_runs(session):
    # A persistent kernel sizes its grid by it: clusters of 2 blocks of 200 KiB (one block an
    # SM) are at most half the SMs, and a grid of that many clusters runs right.
    _needs_clusters(session)
    fn = session.compile(CLUSTER_SRC).function("next_in_cluster")
    sms = session.context.attribute("MULTIPROCESSOR_COUNT")
    n = fn.max_active_clusters(tf.LaunchConfig(2, 32, 200 * 1024, cluster=2))
    assert 1 <= n <= sms // 2
    assert fn.max_active_clusters(tf.LaunchConfig(2, 32, cluster=2)) >= n  # less memory: more
    out = session.upload(np.full(2 * n, 0xDEADBEEF, dtype=np.uint32))
    session.launch(fn, tf.LaunchConfig(2 * n, 32, 200 * 1024, cluster=2), [session.tensor_mut(out)])
    b = np.arange(2 * n)
    np.testing.assert_array_equal(session.download(out), (b ^ 1) * 1000 + (b ^ 1) % 2)


@pytest.mark.gpu
def test_cluster_refusals_on_the_device(session):
    _needs_clusters(session)
    m = session.compile(CLUSTER_SRC)
    fn, pairs = m.function("next_in_cluster"), m.function("pairs")
    out = session.upload(np.full(64, 7, dtype=np.uint32))
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: clusters of 32 blocks of "
        r"block=\(32, 1, 1\) with shared_mem_bytes=0 "
        r"cannot run 'next_in_cluster'",
    ):
        session.launch(fn, tf.LaunchConfig(64, 32, cluster=32), [session.tensor_mut(out)])
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.bind: grid=\(3, 1, 1\) is not a "
        r"whole number of the clusters \(2, 1, 1\) "
        r"that 'pairs' was compiled with",
    ):
        session.bind(pairs, tf.LaunchConfig(3, 32), [session.tensor_mut(out)])
    with pytest.raises(
        tf.ValidationError,
        match=r"cluster=\(4, 1, 1\) but 'pairs' was compiled "
        r"with __cluster_dims__\(2, 1, 1\)",
    ):
        session.launch(pairs, tf.LaunchConfig(4, 32, cluster=4), [session.tensor_mut(out)])
    np.testing.assert_array_equal(session.download(out), np.full(64, 7))  # nothing ran
    session.launch(pairs, tf.LaunchConfig(64, 32), [session.tensor_mut(out)])  # plain launch
    np.testing.assert_array_equal(session.download(out), np.tile([2, 12], 32))


@pytest.mark.gpu
def test_a_cooperative_grid_sum_is_exact_and_its_grid_bounded(session, rng):
    fn = session.compile(CLUSTER_SRC).function("grid_sum")
    cfg = tf.LaunchConfig.resident(fn, 256)
    sms = session.context.attribute("MULTIPROCESSOR_COUNT")
    assert cfg.cooperative and cfg.grid[0] % sms == 0 and cfg.block == (256, 1, 1)
    assert cfg.grid[0] == fn.occupancy(256).blocks_per_multiprocessor * sms
    n = 3_000_017
    x0 = rng.integers(0, 2**32, n, dtype=np.uint32)
    x = session.upload(x0)
    partial = session.upload(np.full(cfg.grid[0], 2**64 - 1, dtype=np.uint64))
    total = session.upload(np.array([2**64 - 1], dtype=np.uint64))
    args = [session.tensor_mut(partial), session.tensor_mut(total), session.tensor(x), tf.u32(n)]
    session.launch(fn, cfg, args)
    want = int(x0.sum(dtype=np.uint64))
    assert int(session.download(total)[0]) == want
    assert int(session.download(partial).sum(dtype=np.uint64)) == want  # every part written
    total2 = session.upload(np.array([2**64 - 1], dtype=np.uint64))
    bound = session.bind(
        fn,
        cfg,
        [session.tensor_mut(partial), session.tensor_mut(total2), session.tensor(x), tf.u32(n)],
    )
    bound()
    assert int(session.download(total2)[0]) == want
    most = cfg.grid[0]
    with pytest.raises(
        tf.ValidationError,
        match=rf"session\.launch: cooperative grid=\({most + 1}"
        rf", 1, 1\) has {most + 1} blocks but at most "
        rf"{most} of block=\(256, 1, 1\)",
    ):
        session.launch(fn, tf.LaunchConfig(most + 1, 256, cooperative=True), args)
    session.launch(fn, tf.LaunchConfig(most, 256, cooperative=True), args)  # the last accepted
    assert int(session.download(total)[0]) == want


@pytest.mark.gpu
def test_a_numba_grid_sync_kernel_launches_cooperatively(session):
    from numba import cuda

    @cuda.jit
    def rotate(x, out):
        i = cuda.grid(1)
        x[i] = 2 * i + 1
        cuda.cg.this_grid().sync()  # every x written before any is read
        out[i] = x[(i + 1) % x.size]

    fn = session.numba_kernel(rotate, "void(int32[::1], int32[::1])")
    assert fn.grid_sync
    cfg = tf.LaunchConfig.resident(fn, 128)
    n = cfg.grid[0] * 128
    x = session.upload(np.full(n, -7, dtype=np.int32))
    out = session.upload(np.full(n, -7, dtype=np.int32))
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: 'rotate' synchronizes the "
        r"whole grid; launch it with LaunchConfig",
    ):
        session.launch(
            fn, tf.LaunchConfig(cfg.grid, 128), [session.tensor_mut(x), session.tensor_mut(out)]
        )
    np.testing.assert_array_equal(session.download(out), np.full(n, -7))
    session.launch(fn, cfg, [session.tensor_mut(x), session.tensor_mut(out)])
    want = 2 * np.arange(n, dtype=np.int64) + 1
    np.testing.assert_array_equal(session.download(out), np.roll(want, -1))


@pytest.mark.gpu
def test_an_empty_argument_list_after_a_synchronize_is_refused_not_launched(session, rng):
    # The synchronize forgets the last arguments; an empty list must not pass as "the same".
    n = 512
    from _sources import scale_add

    raw, numba_fn = _kernels(session)
    x = session.upload(rng.standard_normal(n).astype(np.float32))
    for fn, count in (
        (raw, np.uint32(n)),
        (numba_fn, np.int64(n)),
        (session.numba_kernel(scale_add), np.int64(n)),
    ):
        y = session.upload(np.full(n, np.nan, np.float32))
        session.launch(
            fn,
            tf.LaunchConfig.flat(n, 128),
            [session.tensor_mut(y), session.tensor(x), np.float32(1.0), count],
        )
        session.synchronize()
        session.copy(y, session.upload(np.full(n, np.nan, np.float32)))  # poisoned again
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.launch: .*takes 4 "
            r"argument\(s\), got 0",
        ):
            session.launch(fn, tf.LaunchConfig.flat(n, 128), [])
        session.synchronize()
        assert np.isnan(session.download(y)).all()  # nothing ran


# --- the launch path fuzzed: accepted and right, or refused and nothing written ----------------

AFFINE = r"""
template <typename T, typename Wide>
__device__ void affine(T* y, const T* x, T a, T b, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (T)((Wide)a * (Wide)x[i] + (Wide)b);  // integers wrap: unsigned Wide
}
extern "C" __global__ void affine_f32(float* y, const float* x, float a, float b, unsigned n) {
    affine<float, float>(y, x, a, b, n);
}
extern "C" __global__ void affine_f64(double* y, const double* x, double a, double b,
                                      unsigned n) {
    affine<double, double>(y, x, a, b, n);
}
extern "C" __global__ void affine_i32(int* y, const int* x, int a, int b, unsigned n) {
    affine<int, unsigned>(y, x, a, b, n);
}
extern "C" __global__ void affine_i64(long long* y, const long long* x, long long a,
                                      long long b, unsigned n) {
    affine<long long, unsigned long long>(y, x, a, b, n);
}
"""
_F32_MAX = float(np.finfo(np.float32).max)
_F32_PAST = float(np.nextafter(np.float64(_F32_MAX), np.inf)) * (1 + 2**-24)  # rounds to inf
_FUZZ_TYPES = {
    "f32": (np.float32, tf.f32),
    "f64": (np.float64, tf.f64),
    "i32": (np.int32, tf.i32),
    "i64": (np.int64, tf.i64),
}


def _fits(name, v):
    """Whether ``v`` is a value the kernel's parameter type holds (else a refusal is due)."""
    if name == "f32":
        with np.errstate(over="ignore"):  # round to nearest: past max + half an ulp is inf
            return bool(np.isfinite(np.float32(np.float64(v))))
    if name == "f64":
        return True
    bits = 32 if name == "i32" else 64
    return -(1 << (bits - 1)) <= v < 1 << (bits - 1)


def _fuzz_scalars(name):
    from hypothesis import strategies as st

    if name in ("i32", "i64"):
        bits = 32 if name == "i32" else 64
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        edges = st.sampled_from([lo, hi, lo - 1, hi + 1, 0, -1, 1])
        return st.one_of(edges, st.integers(lo, hi))
    if name == "f32":
        edges = st.sampled_from([_F32_MAX, -_F32_MAX, _F32_PAST, -_F32_PAST, 1e-45, -0.0, 1.0])
        return st.one_of(edges, st.floats(-_F32_MAX, _F32_MAX, width=32))
    return st.floats(-1e300, 1e300, allow_nan=False)


def _affine_want(name, x, a, b):
    """What the kernel must write: wrapped integers exactly; floats in float64, with a bound."""
    if name in ("i32", "i64"):
        bits = 32 if name == "i32" else 64
        wrapped = [((a * int(v) + b) % (1 << bits)) for v in x]
        return np.array([v - (1 << bits) if v >> (bits - 1) else v for v in wrapped]), 0.0
    dt = _FUZZ_TYPES[name][0]
    a64, b64 = np.float64(dt(a)), np.float64(dt(b))
    exact = a64 * x.astype(np.float64) + b64
    info = np.finfo(dt)
    # two ulps of the larger term, and the smallest subnormal for an underflowed product
    return exact, 2 * float(info.eps) * (np.abs(a64 * x) + abs(b64)) + float(
        info.smallest_subnormal
    )


@pytest.mark.gpu
def test_fuzzed_launches_are_right_against_numpy_or_refused_with_nothing_written(session):
    from conftest import CAI
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    module = session.compile(AFFINE)
    fns = {name: module.function(f"affine_{name}") for name in _FUZZ_TYPES}

    @st.composite
    def cases(draw):
        name = draw(st.sampled_from(sorted(_FUZZ_TYPES)))
        length = draw(st.integers(1, 3000))
        return (
            name,
            length,
            draw(st.integers(0, length)),  # n: elements the kernel writes; the rest stay
            draw(st.integers(0, 3)),  # elements the views start into their buffers
            draw(_fuzz_scalars(name)),
            draw(_fuzz_scalars(name)),
            draw(st.booleans()),  # bare Python numbers, or typed scalars (tf.f32(a))
            draw(st.integers(0, 2**32 - 1)),
        )

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(cases())
    def launch_one(case):
        name, length, n, offset, a, b, typed, seed = case
        dt, scalar = _FUZZ_TYPES[name]
        r = np.random.default_rng(seed)
        if dt in (np.int32, np.int64):
            info = np.iinfo(dt)
            x = r.integers(info.min, info.max, length + offset, dtype=dt, endpoint=True)
            y0 = r.integers(info.min, info.max, length + offset, dtype=dt, endpoint=True)
        else:
            x, y0 = (r.uniform(-1, 1, length + offset).astype(dt) for _ in range(2))
        tx, ty = session.upload(x), session.upload(y0)
        item = np.dtype(dt).itemsize
        typestr = np.dtype(dt).str

        def view(t):
            return CAI(
                t.__cuda_array_interface__["data"][0] + offset * item, (length,), typestr, keep=t
            )

        fits = _fits(name, a) and _fits(name, b)
        try:
            a_arg, b_arg = (scalar(v) for v in (a, b)) if typed else (a, b)
            made = True
        except tf.ValidationError:  # the typed scalar itself refused the value
            made = False
        assert made or not fits, f"{name} refused {a!r}, {b!r} it holds"
        if not made:
            return
        args = [session.tensor_mut(view(ty)), session.tensor(view(tx)), a_arg, b_arg, n]
        cfg = tf.LaunchConfig.flat(max(n, 1), 128)
        if not fits:
            with pytest.raises(tf.ValidationError, match=r"session\.launch: args\[[23]\]"):
                session.launch(fns[name], cfg, args)
            np.testing.assert_array_equal(session.download(ty), y0)  # nothing written
            return
        session.launch(fns[name], cfg, args)
        got = session.download(ty)
        want, bound = _affine_want(name, x[offset : offset + n], a, b)
        np.testing.assert_array_equal(got[:offset], y0[:offset])
        np.testing.assert_array_equal(got[offset + n :], y0[offset + n :])
        if name in ("i32", "i64"):
            np.testing.assert_array_equal(got[offset : offset + n], want)
            return
        got64 = got[offset : offset + n].astype(np.float64)
        finite = np.ones(n, bool)
        if name == "f32":  # a x + b past float32's range is infinite, as the kernel stores it
            threshold = _F32_MAX + 2.0**103  # from here on float32 rounds to infinity
            near = np.abs(np.abs(want) - threshold) <= 2.0**105  # either, by one rounding
            over = (np.abs(want) > threshold) & ~near
            assert np.all(got64[over] == np.copysign(np.inf, want[over])), (a, b)
            assert np.all(np.isinf(got64[near]) | (np.abs(got64[near]) <= _F32_MAX)), (a, b)
            finite = ~over & ~near
        err = np.abs(got64[finite] - want[finite])
        assert np.all(err <= bound[finite]), f"{name} a={a!r} b={b!r}: {err.max()} past the bound"

    launch_one()


def _strided_double(out, x):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = x[i, j] * 2 + 1


@pytest.mark.gpu
def test_fuzzed_strided_views_reach_a_numba_kernel_right_and_a_flat_kernel_never(session):
    from conftest import CAI
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    kern = session.numba_kernel(_strided_double)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.sampled_from([np.float32, np.float64, np.int32]),
        st.integers(1, 40),
        st.integers(1, 40),
        st.integers(1, 3),
        st.integers(1, 3),
        st.booleans(),
        st.integers(0, 2**32 - 1),
    )
    def launch_one(dt, rows, cols, row_step, col_step, transposed, seed):
        r = np.random.default_rng(seed)
        host = (r.standard_normal((rows * row_step, cols * col_step)) * 100).astype(dt)
        t = session.upload(host)
        sub = host[::row_step, ::col_step]
        if transposed:
            sub = sub.T
        strides = sub.strides  # a view of the host array has the device copy's strides
        view = CAI(
            t.__cuda_array_interface__["data"][0],
            sub.shape,
            host.dtype.str,
            strides=strides,
            keep=t,
        )
        compact = sub.flags.c_contiguous
        if not compact:
            with pytest.raises(tf.ValidationError, match=r"session\.tensor: .*strides"):
                session.tensor(view)
        out = session.upload(np.full(sub.shape, -7, dt))
        cfg = tf.LaunchConfig(((sub.shape[0] + 7) // 8, (sub.shape[1] + 7) // 8), (8, 8))
        session.launch(
            kern, cfg, [session.tensor_mut(out), session.tensor(view, allow_strided=True)]
        )
        want = (sub.astype(np.float64) * 2 + 1).astype(dt)  # rounded once, as the kernel does
        np.testing.assert_array_equal(session.download(out), want)

    launch_one()


ZAXPY = r"""
#include <cuComplex.h>
extern "C" __global__ void zaxpy(cuFloatComplex* y, const cuFloatComplex* x, cuFloatComplex a,
                                 unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = cuCaddf(cuCmulf(a, x[i]), y[i]);
}
extern "C" __global__ void zaxpy64(cuDoubleComplex* y, const cuDoubleComplex* x,
                                   cuDoubleComplex a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = cuCadd(cuCmul(a, x[i]), y[i]);
}
"""


@pytest.mark.gpu
def test_a_python_complex_and_a_ctypes_count_launch_a_complex_kernel(session, rng):
    import ctypes

    module = session.compile(ZAXPY)
    n = 10_001
    for name, dt, tol in (("zaxpy", np.complex64, 1e-5), ("zaxpy64", np.complex128, 1e-13)):
        x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
        y = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
        a = complex(rng.standard_normal(), rng.standard_normal())
        ty, tx = session.upload(y), session.upload(x)
        args = [session.tensor_mut(ty), session.tensor(tx), a, ctypes.c_uint(n)]
        session.launch(module.function(name), tf.LaunchConfig.flat(n, 256), args)
        want = a * x.astype(np.complex128) + y
        np.testing.assert_allclose(session.download(ty), want, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_a_block_past_a_kernels_launch_bounds_is_refused_naming_them(session, rng):
    src = 'extern "C" __global__ void __launch_bounds__(128) k(float* y) { y[threadIdx.x] = 1; }'
    fn = session.compile(src).function("k")
    y0 = rng.standard_normal(256).astype(np.float32)
    y = session.upload(y0)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: block=\(256, 1, 1\) has 256 threads but 'k' allows at most "
        r"128: its __launch_bounds__ \(or PTX \.maxntid\) caps a block at 128 threads$",
    ):
        session.launch(fn, tf.LaunchConfig(1, 256), [session.tensor_mut(y)])
    np.testing.assert_array_equal(session.download(y), y0)  # nothing ran
    session.launch(fn, tf.LaunchConfig(1, 128), [session.tensor_mut(y)])  # the bound itself
    np.testing.assert_array_equal(session.download(y)[:128], 1)


PDL = r"""
extern "C" __global__ void produce(float* y, const float* x, unsigned n, long long spin) {
    asm volatile("griddepcontrol.launch_dependents;");  // the next kernel may start now
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
extern "C" __global__ void consume(float* z, const float* y, unsigned n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // the previous kernel's writes, all
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = y[i] + 1.0f;
}
"""


@pytest.mark.gpu
def test_a_pdl_launch_waits_where_its_kernel_says_and_reads_every_write_before(session, rng):
    if session.context.compute_capability < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    module = session.compile(PDL)
    produce, consume = module.function("produce"), module.function("consume")
    n = 1 << 18
    x = rng.standard_normal(n).astype(np.float32)
    tx, ty = session.upload(x), session.upload(np.full(n, np.nan, np.float32))
    plain, dependent = (
        tf.LaunchConfig.flat(n, 256),
        tf.LaunchConfig((n + 255) // 256, 256, pdl=True),
    )
    want = 2 * x.astype(np.float64) + 1
    for round_ in range(3):  # s.launch, a bound launch, a captured graph
        ty = session.upload(np.full(n, np.nan, np.float32))  # each round reads its own writes
        tz = session.upload(np.full(n, np.nan, np.float32))
        first = [session.tensor_mut(ty), session.tensor(tx), n, 200_000]
        second = [session.tensor_mut(tz), session.tensor(ty), n]
        if round_ == 0:
            session.launch(produce, plain, first)
            session.launch(consume, dependent, second)
        elif round_ == 1:
            session.bind(produce, plain, first)()
            session.bind(consume, dependent, second)()
        else:
            with session.capture() as cap:
                session.launch(produce, plain, first)
                session.launch(consume, dependent, second)
            cap.graph.launch()
        np.testing.assert_allclose(session.download(tz), want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_a_launch_with_a_priority_runs_and_one_past_the_devices_range_is_refused(session, rng):
    fn = session.compile(AXPY).function("axpy")
    n = 4096
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    tx, ty = session.upload(x), session.upload(y)
    args = [session.tensor_mut(ty), session.tensor(tx), 2.0, n]
    with pytest.raises(
        tf.ValidationError, match=r"^session\.launch: priority=1 is out of this device's range: "
    ):
        session.launch(fn, tf.LaunchConfig(16, 256, priority=1), args)
    np.testing.assert_array_equal(session.download(ty), y)  # nothing ran
    session.launch(fn, tf.LaunchConfig(16, 256, priority=0), args)  # 0: the lowest, always in
    np.testing.assert_allclose(session.download(ty), 2 * x.astype(np.float64) + y, atol=1e-5)


def test_a_checked_launch_is_noted_as_a_graph_node_only_inside_a_capture():
    # launch_checked asks the state to note the kernel only while a capture lists kernels:
    # outside one a launch pays an attribute test, not the call.
    import types

    from tenferro.args import ParamBlock
    from tenferro.dtypes import by_name
    from tenferro.launch import launch_checked
    from tenferro.module import Function

    enqueued, noted = [], []
    st = types.SimpleNamespace(
        capture_kernels=None,
        launcher=lambda address: 0,
        check_use=lambda op: None,
        liveness=types.SimpleNamespace(hold=lambda held: None),
        enqueue=lambda op, name, *rest: enqueued.append(name),
        note_captured_kernel=lambda op, fn, *rest: noted.append(fn),
    )
    fn = object.__new__(Function)
    fn.state, fn.name, fn.record_address = st, "axpy", 1
    fn.param_block = ParamBlock(tf.compile_cuda(AXPY).signatures["axpy"])
    cfg = tf.LaunchConfig.flat(8)
    fn.checked_configs, fn.record_config = {cfg}, cfg
    f32 = by_name("f32")
    y = tf.TensorMut(0x1000, (8,), (4,), f32, 0, None, st)
    x = tf.TensorRef(0x2000, (8,), (4,), f32, 0, None, st)
    launch_checked(st, fn, cfg, [y, x, tf.f32(2.0), tf.u32(8)])
    assert enqueued == ["axpy"] and noted == []  # no capture: nothing noted
    st.capture_kernels = []
    launch_checked(st, fn, cfg, [y, x, tf.f32(3.0), tf.u32(8)])
    assert enqueued == ["axpy", "axpy"] and noted == [fn]


def test_the_fast_launcher_is_built_on_request_and_not_when_switched_off(
    fresh_fast_calls, monkeypatch
):
    from tenferro._driver import fast_launch

    built = []
    monkeypatch.setattr(
        fast_launch, "_make_njit_launcher", lambda: built.append(1) or (lambda r: 0)
    )
    monkeypatch.setattr(fast_launch, "_make_njit_wait", lambda: None)
    monkeypatch.setenv("TENFERRO_FAST_LAUNCH", "0")
    assert tf.build_fast_launcher() is False and built == []  # off: nothing built
    monkeypatch.setenv("TENFERRO_FAST_LAUNCH", "1")
    for bad in (1, None, "yes"):
        with pytest.raises(
            tf.ValidationError, match=r"^build_fast_launcher: wait=.* must be True or False$"
        ):
            tf.build_fast_launcher(bad)
    assert built == [] and fast_launch._build_thread is None  # a refusal starts nothing
    go = threading.Event()
    monkeypatch.setattr(fast_launch, "_make_njit_wait", lambda: go.wait(timeout=30) and None)
    assert tf.build_fast_launcher(wait=False) is False  # started, still compiling
    go.set()
    assert tf.build_fast_launcher() is True and built == [1]  # waits for that same build
    assert tf.build_fast_launcher(wait=False) is True and built == [1]  # once a process
