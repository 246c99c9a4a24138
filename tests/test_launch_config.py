"""LaunchConfig: its geometry and refusals, flat / auto / resident, the kept configs, and the
checks against a function (check_against, check_launch, choose_config)."""

import numpy as np
import pytest
from _sources import AXPY
from hypothesis import given, settings
from hypothesis import strategies as st

import tenferro as tf


def test_flat_covers_threads():
    c = tf.LaunchConfig.flat(1000, 256)
    assert c.grid == (4, 1, 1) and c.block == (256, 1, 1) and c.threads_per_block == 256
    assert tf.LaunchConfig((3, 2), (16, 16), 1024).grid == (3, 2, 1)


@pytest.mark.parametrize(
    "grid,block,smem,pattern",
    [
        (0, 32, 0, r"LaunchConfig: grid=0: every dimension must be >= 1"),
        (1, (32, 0), 0, r"LaunchConfig: block=\(32, 0\)"),
        (1, 2048, 0, r"LaunchConfig: block=.*per-dimension limit"),
        (1, (64, 32), 0, r"LaunchConfig: block=\(64, 32, 1\) has 2048 threads; at most 1024"),
        (1, (1, 1, 65), 0, r"LaunchConfig: block=.*per-dimension limit"),
        ((1, 65536), 32, 0, r"LaunchConfig: grid=\(1, 65536, 1\) exceeds"),
        (1 << 31, 32, 0, r"LaunchConfig: grid=.*exceeds"),
        (1, 32, -1, r"LaunchConfig: shared_mem_bytes=-1 must be an int from 0 to 4294967295"),
        (1, 32, 1 << 32, r"LaunchConfig: shared_mem_bytes=4294967296 must be an int from 0 to "),
        (1, 32, 1 << 64, r"LaunchConfig: shared_mem_bytes=18446744073709551616 must be"),
        (1.0, 32, 0, r"LaunchConfig: grid=1.0 must be an int"),
        ((1, 2, 3, 4), 32, 0, r"LaunchConfig: grid=\(1, 2, 3, 4\) must be"),
    ],
)
def test_geometry_refusals(grid, block, smem, pattern):
    with pytest.raises(tf.ValidationError, match=pattern):
        tf.LaunchConfig(grid, block, smem)


def test_shared_memory_limits_of_the_config_itself():
    # The largest the driver's 32-bit field holds is a valid config; the device check at launch
    # decides whether a function may have it.
    assert tf.LaunchConfig(1, 32, (1 << 32) - 1).shared_mem_bytes == (1 << 32) - 1
    assert tf.LaunchConfig(1, 32, 0).shared_mem_bytes == 0


def test_flat_takes_int_subclasses_from_one_and_refuses_below():
    class Count(int):
        pass

    c = tf.LaunchConfig.flat(Count(1), Count(1))
    assert (c.grid, c.block) == ((1, 1, 1), (1, 1, 1))
    for threads, block in ((Count(0), 1), (1, Count(0))):
        with pytest.raises(
            tf.ValidationError,
            match=r"^LaunchConfig\.flat: (threads|block)="
            r"0 must be an int >= 1",
        ):
            tf.LaunchConfig.flat(threads, block)


def test_flat_refuses_zero_threads():
    with pytest.raises(tf.ValidationError, match=r"LaunchConfig\.flat: threads=0"):
        tf.LaunchConfig.flat(0)


def test_config_is_immutable_and_hashable():
    c = tf.LaunchConfig.flat(10)
    with pytest.raises(AttributeError):
        c.grid = (2, 1, 1)
    assert {c: 1}[tf.LaunchConfig.flat(10)] == 1


_dims = st.one_of(
    st.integers(-2, 70000),
    st.integers(0, 2**32),
    st.lists(st.integers(-1, 70000), min_size=0, max_size=4).map(tuple),
    st.sampled_from([None, 1.0, True, "8", (1, True)]),
)


def _as3(v):
    if isinstance(v, bool) or not isinstance(v, (int, tuple)):
        return None
    v = (v,) if isinstance(v, int) else v
    if not 1 <= len(v) <= 3 or not all(isinstance(d, int) and not isinstance(d, bool) for d in v):
        return None
    return tuple(v) + (1,) * (3 - len(v))


@settings(max_examples=500, deadline=None)
@given(_dims, _dims, st.one_of(st.integers(-1, 2**33), st.just(2**64)))
def test_launchconfig_accepts_exactly_the_cuda_limits(grid, block, smem):
    g, b = _as3(grid), _as3(block)
    valid = (
        g is not None
        and b is not None
        and all(d >= 1 for d in g + b)
        and g[0] <= 2**31 - 1
        and g[1] <= 65535
        and g[2] <= 65535
        and b[0] <= 1024
        and b[1] <= 1024
        and b[2] <= 64
        and b[0] * b[1] * b[2] <= 1024
        and 0 <= smem <= 2**32 - 1
    )
    if valid:
        c = tf.LaunchConfig(grid, block, smem)
        assert (c.grid, c.block, c.shared_mem_bytes) == (g, b, smem)
        assert c.dims == (*g, *b, smem) and c.threads_per_block == b[0] * b[1] * b[2]
    else:
        with pytest.raises(tf.ValidationError, match=r"^LaunchConfig: (grid|block|shared_mem)"):
            tf.LaunchConfig(grid, block, smem)


# --- exact boundaries of the config and of the checks against a function, without a GPU --------


@pytest.mark.parametrize(
    ("grid", "block", "ok"),
    [
        ((2**31 - 1, 65535, 65535), (1024, 1, 1), True),  # every grid limit, reached
        ((2**31, 1, 1), 1, False),
        ((1, 65536, 1), 1, False),
        ((1, 1, 65536), 1, False),
        (1, (32, 32, 1), True),
        (1, (1, 1, 64), True),  # 1024 threads; z at its 64
        (1, (1, 1, 65), False),
        (1, (1025,), False),
        (1, (1, 1025), False),
        (1, (33, 32), False),
    ],
)
def test_launchconfig_limits_on_both_sides(grid, block, ok):
    if ok:
        c = tf.LaunchConfig(grid, block)
        assert c.threads_per_block <= 1024
    else:
        with pytest.raises(tf.ValidationError, match=r"^LaunchConfig: (grid|block)="):
            tf.LaunchConfig(grid, block)


class _Fn:
    """What check_against reads of a Function."""

    name = "k"

    def __init__(self, max_threads=256, static=1024, optin=227 * 1024):
        self.max_threads_per_block = max_threads
        self.static_shared_bytes = static
        self.dynamic_shared_limit = 48 * 1024 - static
        self.device_shared_optin = optin
        self.raised = []

    def raise_dynamic_shared(self, n):
        self.raised.append(n)
        self.dynamic_shared_limit = n

    def thread_limit_reason(self, threads):  # the Function's own words are tested with it
        return f"the reason for {threads}"


def test_check_against_the_functions_thread_limit():
    from tenferro.launch_config import check_against

    fn = _Fn(max_threads=256)
    check_against(tf.LaunchConfig(1, 256), fn, "session.launch")  # the limit itself
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: block=\(257, 1, 1\) has 257 "
        r"threads but 'k' allows at most 256: the reason for 257$",
    ):
        check_against(tf.LaunchConfig(1, 257), fn, "session.launch")


def test_check_against_raises_shared_memory_up_to_the_opt_in_limit():
    from tenferro.launch_config import check_against

    fn = _Fn(static=1024, optin=227 * 1024)
    default = 48 * 1024 - 1024
    check_against(tf.LaunchConfig(1, 32, default), fn, "session.launch")
    assert fn.raised == []  # within the default: nothing to raise
    check_against(tf.LaunchConfig(1, 32, default + 1), fn, "session.launch")
    assert fn.raised == [default + 1]
    most = 227 * 1024 - 1024
    check_against(tf.LaunchConfig(1, 32, most), fn, "session.launch")  # the opt-in limit
    assert fn.raised[-1] == most
    with pytest.raises(
        tf.ValidationError,
        match=rf"session\.launch: shared_mem_bytes={most + 1} "
        rf"exceeds what 'k' can have on this device "
        rf"\({most} bytes dynamic beside 1024 static\)",
    ):
        check_against(tf.LaunchConfig(1, 32, most + 1), fn, "session.launch")
    assert fn.raised[-1] == most  # the refusal raised nothing


@pytest.mark.parametrize(
    ("threads", "block", "blocks"),
    [
        (1, 1, 1),
        (1, 256, 1),
        (255, 256, 1),
        (256, 256, 1),
        (257, 256, 2),
        (512, 256, 2),
        (513, 256, 3),
        (7, 2, 4),
    ],
)
def test_flat_takes_the_fewest_blocks_that_cover_the_threads(threads, block, blocks):
    c = tf.LaunchConfig.flat(threads, block, 96)
    assert (c.grid, c.block, c.shared_mem_bytes) == ((blocks, 1, 1), (block, 1, 1), 96)


@pytest.mark.parametrize(
    ("threads", "block", "msg"),
    [
        (0, 256, r"threads=0 must be an int >= 1"),
        (-1, 256, r"threads=-1"),
        (True, 256, r"threads=True"),
        (2.0, 256, r"threads=2\.0"),
        (1, 0, r"block=0 must be an int >= 1"),
        (1, True, r"block=True"),
        (1, -3, r"block=-3"),
        (1, 1.0, r"block=1\.0"),
    ],
)
def test_flat_refuses_by_name(threads, block, msg):
    with pytest.raises(tf.ValidationError, match=r"^LaunchConfig\.flat: " + msg):
        tf.LaunchConfig.flat(threads, block)


def test_a_block_of_1025_threads_is_refused_and_1024_accepted():
    assert tf.LaunchConfig(1, (4, 4, 64)).threads_per_block == 1024
    with pytest.raises(
        tf.ValidationError,
        match=r"^LaunchConfig: block=\(5, 5, 41\) has 1025 "
        r"threads; at most 1024",
    ):
        tf.LaunchConfig(1, (5, 5, 41))
    assert tf.LaunchConfig(1, 32).shared_mem_bytes == 0  # the default
    for bad in (True, 1.0, "0"):
        with pytest.raises(tf.ValidationError, match=r"^LaunchConfig: shared_mem_bytes="):
            tf.LaunchConfig(1, 32, bad)


def test_flat_defaults_and_configs_compare_by_value():
    c = tf.LaunchConfig.flat(1000)
    assert (c.grid, c.block, c.shared_mem_bytes) == ((4, 1, 1), (256, 1, 1), 0)
    assert c == tf.LaunchConfig.flat(1000) and c != tf.LaunchConfig.flat(2000)
    assert c != tf.LaunchConfig.flat(1000, 128) and c != (c.grid, c.block, 0)
    assert len({c, tf.LaunchConfig.flat(1000), tf.LaunchConfig.flat(1000, shared_mem_bytes=4)}) == 2


def test_a_plain_config_made_again_from_the_same_ints_is_the_same_object():
    # A launch written with its config in the call passes its Function's last config again.
    assert tf.LaunchConfig(4, 32) is tf.LaunchConfig(4, 32)
    assert tf.LaunchConfig((4, 2), (8, 8), 128) is tf.LaunchConfig((4, 2), (8, 8), 128)
    assert tf.LaunchConfig.flat(1000) is tf.LaunchConfig.flat(1000)
    assert tf.LaunchConfig.flat(1000) is tf.LaunchConfig(4, 256)
    assert tf.LaunchConfig(4, 32) is not tf.LaunchConfig((4,), 32)  # equal, kept apart
    assert tf.LaunchConfig(4, 32) == tf.LaunchConfig((4,), 32)
    coop = tf.LaunchConfig(4, 32, cooperative=True)
    assert coop == tf.LaunchConfig(4, 32, cooperative=True) and coop != tf.LaunchConfig(4, 32)


@pytest.mark.parametrize("grid,block", [(True, 32), ((1, True), 32), (4, (True,)), (4, 1025)])
def test_a_kept_config_never_answers_arguments_that_are_refused(grid, block):
    tf.LaunchConfig(1, 32), tf.LaunchConfig((1, 1), 32), tf.LaunchConfig(4, (1,))  # kept
    for _ in range(2):  # the refusal is not kept either
        with pytest.raises(tf.ValidationError, match=r"^LaunchConfig: "):
            tf.LaunchConfig(grid, block)


@pytest.mark.parametrize("smem", [True, 1.0])
def test_a_kept_config_never_answers_shared_memory_that_is_refused(smem):
    tf.LaunchConfig(4, 32, 1)  # kept; True and 1.0 are equal keys to 1
    for _ in range(2):
        with pytest.raises(
            tf.ValidationError,
            match=r"^LaunchConfig: shared_mem_bytes=.* must be "
            r"an int from 0 to 4294967295",
        ):
            tf.LaunchConfig(4, 32, smem)


def test_kept_configs_are_bounded_and_stay_right_past_the_bound():
    from tenferro import launch_config

    for g in range(1, launch_config._KEPT_CONFIGS + 2):
        c = tf.LaunchConfig(g, 64)
        assert c.grid == (g, 1, 1) and c.dims == (g, 1, 1, 64, 1, 1, 0)
    assert len(launch_config._made) <= launch_config._KEPT_CONFIGS
    assert tf.LaunchConfig(7, 64) is tf.LaunchConfig(7, 64)


@pytest.mark.parametrize(
    "config",
    [
        tf.LaunchConfig((4, 2), 32, 16),
        tf.LaunchConfig((4, 2), 32, cluster=(2, 1)),
        tf.LaunchConfig(8, 64, cooperative=True),
    ],
)
def test_a_config_survives_pickle_and_copy(config):
    import copy
    import pickle

    for again in (pickle.loads(pickle.dumps(config)), copy.copy(config), copy.deepcopy(config)):
        assert again == config and again.cluster == config.cluster
        assert again.cooperative is config.cooperative and hash(again) == hash(config)


# --- LaunchConfig.auto: the block size chosen from the occupancy, without a GPU ---------------


class _Occupied(_Fn):
    """A Function stand-in whose occupancy is a table: resident threads per block size."""

    def __init__(self, blocks_at, **kw):
        super().__init__(**kw)
        self.blocks_at, self.asked = blocks_at, []

    def occupancy(self, block, smem):
        from tenferro.launch_config import check_against

        check_against(tf.LaunchConfig(1, block, smem), self, "function.occupancy")
        self.asked.append((block, smem))
        return _Occ(self.blocks_at(block, smem))


class _Occ:
    def __init__(self, blocks):
        self.blocks_per_multiprocessor = blocks


def _choose(fn, n, smem=0):
    from tenferro.launch_config import choose_config

    return choose_config(fn, n, smem, "LaunchConfig.auto")


def test_auto_takes_the_largest_block_of_those_with_the_most_resident_threads():
    # 2048 threads a multiprocessor, registers allowing 2 blocks of up to 512 or 1 above.
    fn = _Occupied(lambda b, m: 2048 // b if b <= 512 else 1, max_threads=1024)
    c = _choose(fn, 10_000)
    assert (c.grid, c.block, c.shared_mem_bytes) == ((20, 1, 1), (512, 1, 1), 0)
    assert [b for b, _ in fn.asked] == list(range(1024, 0, -32))  # whole warps, largest first


def test_auto_covers_n_with_the_fewest_blocks_on_both_sides_of_a_multiple():
    fn = _Occupied(lambda b, m: 1, max_threads=256)
    assert [_choose(fn, n).grid[0] for n in (1, 255, 256, 257, 512, 513)] == [1, 1, 1, 2, 2, 3]


def test_auto_takes_a_single_thread_block_where_that_is_all_a_kernel_allows():
    fn = _Occupied(lambda b, m: 1, max_threads=1)
    assert _choose(fn, 5).block == (1, 1, 1) and fn.asked == [(1, 0)]


def test_auto_starts_from_the_whole_warps_that_hold_the_thread_limit():
    fn = _Occupied(lambda b, m: 1, max_threads=33)  # one thread past a warp: two warps' worth
    _choose(fn, 100)
    assert [b for b, _ in fn.asked] == [33, 32]


def test_auto_tries_the_kernels_thread_limit_then_the_whole_warps_below_it():
    fn = _Occupied(lambda b, m: 1, max_threads=100)  # __launch_bounds__(100)
    assert _choose(fn, 1000).block == (100, 1, 1)
    assert [b for b, _ in fn.asked] == [100, 96, 64, 32]
    fewer = _Occupied(lambda b, m: 2 if b == 96 else 1, max_threads=100)
    assert _choose(fewer, 1000).block == (96, 1, 1)
    tiny = _Occupied(lambda b, m: 1, max_threads=20)
    assert _choose(tiny, 1000).block == (20, 1, 1) and tiny.asked == [(20, 0)]


def test_auto_gives_each_block_size_its_own_shared_memory():
    # 48 KiB of shared memory a multiprocessor, 32 bytes a thread: the memory, not the
    # threads, decides (1024 threads: one block resident; 768: two; 512: three, fewer threads).
    fn = _Occupied(lambda b, m: min(2048 // b, 49152 // m), max_threads=1024)
    c = _choose(fn, 4096, lambda b: 32 * b)
    assert all(m == 32 * b for b, m in fn.asked)
    assert (c.block, c.shared_mem_bytes, c.grid) == ((768, 1, 1), 24576, (6, 1, 1))


def test_auto_skips_block_sizes_whose_shared_memory_does_not_fit():
    fn = _Occupied(lambda b, m: 1, max_threads=1024, static=1024, optin=48 * 1024)
    most = 47 * 1024  # beside 1 KiB static
    c = _choose(fn, 1 << 20, lambda b: most if b <= 512 else most + 1)
    assert c.block == (512, 1, 1) and c.shared_mem_bytes == most  # the last that fits
    assert fn.asked[0] == (512, most)


def test_auto_refuses_when_no_block_size_fits_naming_the_first_that_did_not():
    fn = _Occupied(lambda b, m: 1, max_threads=64, static=0, optin=4096)
    with pytest.raises(
        tf.ValidationError,
        match=r"^LaunchConfig\.auto: no block size lets 'k' run on this device: "
        r"shared_mem_bytes\(64\) = 4097 exceeds the 4096 bytes it can have$",
    ):
        _choose(fn, 100, lambda b: 4097 if b == 64 else 8192)
    assert fn.asked == [] and fn.raised == []
    idle = _Occupied(lambda b, m: 0, max_threads=64)
    with pytest.raises(
        tf.ValidationError, match=r"^LaunchConfig\.auto: no block size lets 'k' run on this device$"
    ):
        _choose(idle, 100)


@pytest.mark.parametrize(
    ("n", "smem", "msg"),
    [
        (0, 0, r"n=0 must be an int >= 1"),
        (True, 0, r"n=True must be"),
        (1.0, 0, r"n=1\.0 must"),
        (-5, 0, r"n=-5 must"),
        (1, -1, r"shared_mem_bytes=-1 must be an int >= 0 or a function of the block size"),
        (1, 1.5, r"shared_mem_bytes=1\.5 must be"),
        (1, True, r"shared_mem_bytes=True must be"),
        (1, lambda b: -1, r"shared_mem_bytes\(64\) returned -1; it must be an int >= 0"),
        (1, lambda b: 2.0, r"shared_mem_bytes\(64\) returned 2\.0"),
        (1, lambda b: None, r"shared_mem_bytes\(64\) returned None"),
        (
            (1 << 31) * 64,
            0,
            r"n=137438953472 needs 2147483648 blocks of 64; the grid holds at most "
            r"2147483647",
        ),
    ],
)
def test_auto_refusals_name_the_call_and_the_argument(n, smem, msg):
    fn = _Occupied(lambda b, m: 1, max_threads=64)
    with pytest.raises(tf.ValidationError, match=r"^LaunchConfig\.auto: " + msg):
        _choose(fn, n, smem)
    assert fn.raised == []


def test_auto_takes_the_most_blocks_the_grid_holds():
    fn = _Occupied(lambda b, m: 1, max_threads=64)
    assert _choose(fn, ((1 << 31) - 1) * 64).grid == ((1 << 31) - 1, 1, 1)


def test_auto_is_refused_for_what_is_not_a_function_of_a_module():
    with pytest.raises(
        tf.ValidationError,
        match=r"^LaunchConfig\.auto: function must be a "
        r"Function of a module, got _Occupied$",
    ):
        tf.LaunchConfig.auto(_Occupied(lambda b, m: 1), 100)


@pytest.mark.gpu
def test_auto_picks_the_block_size_the_driver_would_and_computes(session, rng):
    from cuda.bindings import driver as cu

    axpy = session.compile(AXPY).function("axpy")
    n = 1_000_003
    cfg = tf.LaunchConfig.auto(axpy, n)
    err, _, block = cu.cuOccupancyMaxPotentialBlockSize(cu.CUfunction(axpy.handle), None, 0, 0)
    assert err == cu.CUresult.CUDA_SUCCESS and cfg.block == (block, 1, 1)
    assert cfg.grid == (-(-n // block), 1, 1) and cfg.shared_mem_bytes == 0
    x0, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y = session.upload(x0), session.upload(y0)
    session.launch(axpy, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(1.5), tf.u32(n)])
    np.testing.assert_allclose(
        session.download(y), y0 + 1.5 * x0.astype(np.float64), rtol=1e-6, atol=1e-6
    )
    occupancy = axpy.occupancy(block)
    assert occupancy.blocks_per_multiprocessor >= 1 and 0 < occupancy.fraction <= 1
    attributes = axpy.attributes
    major, minor = session.context.compute_capability
    assert attributes.binary_version == major * 10 + minor and attributes.registers > 0
    assert attributes.max_threads_per_block == axpy.max_threads_per_block <= 1024
    assert attributes.static_shared_bytes == 0 and attributes.local_bytes == 0


# --- clusters and cooperative launches: the config, and its checks against a stand-in ---------


def test_a_config_with_clusters_or_cooperation_is_extended_and_says_so():
    plain = tf.LaunchConfig(8, 128)
    clustered = tf.LaunchConfig((8, 2), 128, cluster=(2, 2))
    coop = tf.LaunchConfig(8, 128, cooperative=True)
    assert not plain.extended and plain.cluster is None and plain.cooperative is False
    assert clustered.extended and clustered.cluster == (2, 2, 1)
    assert coop.extended and coop.cooperative is True
    # The grid counts blocks (not clusters, as cuda.core's does): the repr says how many.
    assert repr(clustered) == (
        "LaunchConfig(grid=(8, 2, 1), block=(128, 1, 1), "
        "shared_mem_bytes=0, cluster=(2, 2, 1); 16 blocks in 4 clusters)"
    )
    assert repr(coop).endswith("shared_mem_bytes=0, cooperative=True)")
    assert repr(plain).endswith("shared_mem_bytes=0)")
    assert repr(tf.LaunchConfig(8, 128, cluster=2, cooperative=True)).endswith(
        "shared_mem_bytes=0, cluster=(2, 1, 1); 8 blocks in 4 clusters, cooperative=True)"
    )
    # Equal only with the same cluster and cooperation: a checked config is not reused for both.
    assert len({plain, coop, tf.LaunchConfig(8, 128, cluster=1), tf.LaunchConfig(8, 128)}) == 3
    assert tf.LaunchConfig(8, 128, cluster=(8,)) == tf.LaunchConfig(8, 128, cluster=8)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        (
            {"grid": 6, "cluster": 4},
            r"grid=\(6, 1, 1\) is not a whole number of clusters of "
            r"cluster=\(4, 1, 1\)",
        ),
        ({"grid": (4, 3), "cluster": (2, 2)}, r"grid=\(4, 3, 1\) is not a whole number"),
        ({"grid": 4, "cluster": 0}, r"cluster=0: every dimension must be >= 1"),
        ({"grid": 4, "cluster": (1, 1, 1, 1)}, r"cluster=\(1, 1, 1, 1\) must be an int or a tuple"),
        ({"grid": 4, "cluster": True}, r"cluster=True must be an int or a tuple"),
        ({"grid": 4, "cooperative": 1}, r"cooperative=1 must be True or False"),
        ({"grid": 4, "cooperative": None}, r"cooperative=None must be True or False"),
    ],
)
def test_a_config_refuses_clusters_that_do_not_tile_the_grid(kwargs, msg):
    rest = {k: v for k, v in kwargs.items() if k != "grid"}  # the parameters stay as given
    with pytest.raises(tf.ValidationError, match=r"^LaunchConfig: " + msg):
        tf.LaunchConfig(kwargs["grid"], 32, **rest)


def test_a_config_takes_clusters_that_tile_the_grid():
    assert tf.LaunchConfig(8, 32, cluster=4).cluster == (4, 1, 1)  # beside 6, refused above
    assert tf.LaunchConfig((4, 4), 32, cluster=(2, 2)).cluster == (2, 2, 1)
    assert tf.LaunchConfig((4, 4), 32, cluster=(2, 2)).cluster_blocks == 4
    assert tf.LaunchConfig((4, 4), 32).cluster_blocks == 0
    assert tf.LaunchConfig(4, 32, cluster=(1, 1, 1)).cluster == (1, 1, 1)


class _Context:
    def __init__(self, clusters=True, cooperative=True, sms=132, cc=(9, 0)):
        self.facts = {
            "CLUSTER_LAUNCH": int(clusters),
            "COOPERATIVE_LAUNCH": int(cooperative),
            "MULTIPROCESSOR_COUNT": sms,
        }
        self.compute_capability = cc
        self.stream_priority_range = (0, -5)  # an H100's: lowest 0, highest -5

    def attribute(self, name):
        return self.facts[name]


class _ClusterFn(_Fn):
    """What check_launch reads beside check_against's: the kernel's clusters and residency."""

    def __init__(self, compiled=None, grid_sync=False, clusters_fit=4, per_sm=2, **context):
        super().__init__(max_threads=1024)
        self.compiled, self.grid_sync, self.clusters_fit, self.per_sm = (
            compiled,
            grid_sync,
            clusters_fit,
            per_sm,
        )
        self.state = type("S", (), {"context": _Context(**context)})()
        self.asked = []

    def compiled_cluster(self):
        return self.compiled

    def active_clusters(self, config, op):
        self.asked.append(("clusters", config.cluster, op))
        return self.clusters_fit

    def resident_blocks(self, config, op):
        self.asked.append(("resident", config.threads_per_block, config.shared_mem_bytes, op))
        return self.per_sm * self.state.context.facts["MULTIPROCESSOR_COUNT"]


def _check(config, fn):
    from tenferro.launch_config import check_launch

    check_launch(config, fn, "session.launch")


def test_a_plain_config_asks_the_driver_nothing_more():
    fn = _ClusterFn()
    _check(tf.LaunchConfig(1000, 256), fn)
    assert fn.asked == []


def test_a_cooperative_grid_is_refused_past_what_runs_at_once():
    fn = _ClusterFn(per_sm=2, sms=132)  # 264 blocks at once
    _check(tf.LaunchConfig(264, 256, cooperative=True), fn)  # all of them: accepted
    _check(tf.LaunchConfig((132, 2), 256, cooperative=True), fn)
    assert fn.asked[0] == ("resident", 256, 0, "session.launch")
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: cooperative grid=\(265, 1, "
        r"1\) has 265 blocks but at most 264 of "
        r"block=\(256, 1, 1\) with shared_mem_bytes=0 "
        r"run at once on this device",
    ):
        _check(tf.LaunchConfig(265, 256, cooperative=True), fn)
    with pytest.raises(
        tf.ValidationError,
        match=r"cooperative=True: this device cannot launch "
        r"cooperatively",
    ):
        _check(tf.LaunchConfig(1, 32, cooperative=True), _ClusterFn(cooperative=False))
    # Every dimension of the grid counts: 132 x 2 x 1 fits, 66 x 1 x 5 = 330 does not.
    with pytest.raises(tf.ValidationError, match=r"cooperative grid=\(66, 1, 5\) has 330 blocks"):
        _check(tf.LaunchConfig((66, 1, 5), 256, cooperative=True), fn)
    with pytest.raises(tf.ValidationError, match=r"cooperative grid=\(66, 5, 1\) has 330 blocks"):
        _check(tf.LaunchConfig((66, 5), 256, cooperative=True), fn)


def test_check_launch_names_the_callers_operation_in_the_function_limit_refusal():
    from tenferro.launch_config import check_launch

    fn = _ClusterFn()
    fn.max_threads_per_block = 256
    with pytest.raises(tf.ValidationError, match=r"^session\.bind: block=\(512, 1, 1\)"):
        check_launch(tf.LaunchConfig(1, 512), fn, "session.bind")
    check_launch(tf.LaunchConfig(1, 256), fn, "session.bind")  # the limit itself: accepted


def test_a_grid_sync_kernel_is_launched_cooperatively_only():
    fn = _ClusterFn(grid_sync=True)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: 'k' synchronizes the whole "
        r"grid; launch it with LaunchConfig\(\.\.\., "
        r"cooperative=True\)",
    ):
        _check(tf.LaunchConfig(4, 32), fn)
    assert fn.asked == []
    _check(tf.LaunchConfig(4, 32, cooperative=True), fn)


@pytest.mark.parametrize("size", [1, 8, 16])
def test_clusters_up_to_16_blocks_are_asked_of_the_driver(size):
    fn = _ClusterFn()
    _check(tf.LaunchConfig(size * 2, 64, cluster=size), fn)
    assert fn.asked == [("clusters", (size, 1, 1), "session.launch")]


def test_clusters_past_16_blocks_or_that_do_not_fit_are_refused():
    msg = (
        r"^session\.launch: clusters of {} blocks of block=\(64, 1, 1\) with "
        r"shared_mem_bytes=0 cannot run 'k' on this device"
    )
    with pytest.raises(tf.ValidationError, match=msg.format(32)):
        _check(tf.LaunchConfig((4, 8), 64, cluster=(4, 8)), _ClusterFn())
    with pytest.raises(tf.ValidationError, match=msg.format(17)):
        _check(tf.LaunchConfig(17, 64, cluster=17), _ClusterFn())
    full = _ClusterFn(clusters_fit=0)  # the driver says none fits (its shared memory, say)
    with pytest.raises(tf.ValidationError, match=msg.format(2)):
        _check(tf.LaunchConfig(2, 64, cluster=2), full)
    with pytest.raises(
        tf.ValidationError,
        match=r"cluster=\(2, 1, 1\) needs thread-block "
        r"clusters \(sm_90 or later\); this device is "
        r"sm_80",
    ):
        _check(tf.LaunchConfig(2, 64, cluster=2), _ClusterFn(clusters=False, cc=(8, 0)))


def test_a_kernels_compiled_clusters_bind_every_launch_of_it():
    fn = _ClusterFn(compiled=(2, 1, 1))
    _check(tf.LaunchConfig(4, 64), fn)  # no cluster given: the compiled one, the grid tiles
    _check(tf.LaunchConfig(4, 64, cluster=2), fn)  # the same cluster spelled out
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: grid=\(3, 1, 1\) is not a "
        r"whole number of the clusters \(2, 1, 1\) "
        r"that 'k' was compiled with",
    ):
        _check(tf.LaunchConfig(3, 64), fn)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: cluster=\(4, 1, 1\) but 'k' "
        r"was compiled with __cluster_dims__\(2, 1, 1\)",
    ):
        _check(tf.LaunchConfig(8, 64, cluster=4), fn)


@pytest.mark.parametrize("make", ["auto", "resident"])
def test_auto_and_resident_refuse_what_is_not_a_modules_function(make):
    class Kernel:  # a NumbaKernel, say: it has no limits of its own until specialized
        name = "k"

    for passed in (Kernel(), "k", None):
        with pytest.raises(
            tf.ValidationError,
            match=rf"^LaunchConfig\.{make}: function must be "
            rf"a Function of a module, got "
            rf"{type(passed).__name__}$",
        ):
            getattr(tf.LaunchConfig, make)(passed, 32)


# --- programmatic dependent launch and launch priority ------------------------------------------


def test_pdl_and_priority_make_an_extended_config_that_compares_pickles_and_says_so():
    import copy
    import pickle

    plain = tf.LaunchConfig(8, 64)
    pdl = tf.LaunchConfig(8, 64, pdl=True)
    urgent = tf.LaunchConfig(8, 64, priority=-5)
    assert not plain.extended and pdl.extended and urgent.extended
    assert (pdl.pdl, pdl.priority, urgent.pdl, urgent.priority) == (True, None, False, -5)
    assert tf.LaunchConfig(8, 64, priority=0).extended  # priority 0 is asked for, not absent
    assert pdl != plain and urgent != plain and pdl != urgent
    assert pdl == tf.LaunchConfig(8, 64, pdl=True) and hash(pdl) == hash(
        tf.LaunchConfig(8, 64, pdl=True)
    )
    assert tf.LaunchConfig(8, 64, pdl=False, priority=None) is plain  # a plain one, kept
    both = tf.LaunchConfig(8, 64, cluster=2, pdl=True, priority=-1)
    for again in (pickle.loads(pickle.dumps(both)), copy.copy(both)):
        assert again == both and again.launch_attributes == ((2, 1, 1), False, True, -1)
    assert repr(both).endswith("clusters, pdl=True, priority=-1)")


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"pdl": 1}, r"pdl=1 must be True or False"),
        ({"pdl": None}, r"pdl=None must be True or False"),
        ({"priority": True}, r"priority=True must be None or an int"),
        ({"priority": -1.0}, r"priority=-1\.0 must be None or an int"),
        ({"priority": 1 << 31}, r"priority=2147483648 must be None or an int"),
        ({"priority": -(1 << 31) - 1}, r"priority=-2147483649 must be None or an int"),
    ],
)
def test_a_config_refuses_a_pdl_or_priority_of_another_type(kwargs, msg):
    with pytest.raises(tf.ValidationError, match=r"^LaunchConfig: " + msg):
        tf.LaunchConfig(8, 64, **kwargs)
    tf.LaunchConfig(8, 64, priority=(1 << 31) - 1)  # the int32 ends are taken here, checked at
    tf.LaunchConfig(8, 64, priority=-(1 << 31))  # launch against the device's range


def test_a_priority_is_checked_against_the_devices_range_at_both_ends():
    fn = _ClusterFn()
    for p in (0, -5, -3):  # lowest, highest, between
        _check(tf.LaunchConfig(8, 64, priority=p), fn)
    for p in (1, -6):
        with pytest.raises(
            tf.ValidationError,
            match=rf"^session\.launch: priority={p} is out of this device's range: -5 \(the "
            r"highest\) to 0 \(the lowest\)$",
        ):
            _check(tf.LaunchConfig(8, 64, priority=p), fn)
    assert fn.asked == []


def test_pdl_is_refused_before_sm_90_and_taken_from_it():
    _check(tf.LaunchConfig(8, 64, pdl=True), _ClusterFn(cc=(9, 0)))
    _check(tf.LaunchConfig(8, 64, pdl=True), _ClusterFn(cc=(10, 0)))
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: pdl=True needs programmatic dependent launch \(sm_90 or "
        r"later\); this device is sm_89$",
    ):
        _check(tf.LaunchConfig(8, 64, pdl=True), _ClusterFn(cc=(8, 9)))


_attrs = st.tuples(
    st.sampled_from([None, 1, 2, (2, 1)]),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.integers(-6, 1)),
)


@settings(max_examples=200, deadline=None)
@given(_attrs, _attrs)
def test_configs_are_equal_exactly_when_their_launch_attributes_are_and_round_trip(a, b):
    import pickle

    def make(attrs):
        cluster, cooperative, pdl, priority = attrs
        return tf.LaunchConfig(
            4, 64, cluster=cluster, cooperative=cooperative, pdl=pdl, priority=priority
        )

    ca, cb = make(a), make(b)
    assert (ca == cb) == (ca.launch_attributes == cb.launch_attributes)
    if ca == cb:
        assert hash(ca) == hash(cb)
    assert ca.extended == (ca.launch_attributes != (None, False, False, None))
    again = pickle.loads(pickle.dumps(ca))
    assert again == ca and again.launch_attributes == ca.launch_attributes
