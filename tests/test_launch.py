import pytest

import tenferro as tf


def test_flat_covers_threads():
    c = tf.LaunchConfig.flat(1000, 256)
    assert c.grid == (4, 1, 1) and c.block == (256, 1, 1) and c.threads_per_block == 256
    assert tf.LaunchConfig((3, 2), (16, 16), 1024).grid == (3, 2, 1)


@pytest.mark.parametrize("grid,block,smem,pattern", [
    (0, 32, 0, r"LaunchConfig: grid=0: every dimension must be >= 1"),
    (1, (32, 0), 0, r"LaunchConfig: block=\(32, 0\)"),
    (1, 2048, 0, r"LaunchConfig: block=.*per-dimension limit"),
    (1, (64, 32), 0, r"LaunchConfig: block=\(64, 32, 1\) has 2048 threads; at most 1024"),
    (1, (1, 1, 65), 0, r"LaunchConfig: block=.*per-dimension limit"),
    ((1, 65536), 32, 0, r"LaunchConfig: grid=\(1, 65536, 1\) exceeds"),
    (1 << 31, 32, 0, r"LaunchConfig: grid=.*exceeds"),
    (1, 32, -1, r"LaunchConfig: shared_mem_bytes=-1"),
    (1.0, 32, 0, r"LaunchConfig: grid=1.0 must be an int"),
    ((1, 2, 3, 4), 32, 0, r"LaunchConfig: grid=\(1, 2, 3, 4\) must be"),
])
def test_geometry_refusals(grid, block, smem, pattern):
    with pytest.raises(tf.ValidationError, match=pattern):
        tf.LaunchConfig(grid, block, smem)


def test_flat_refuses_zero_threads():
    with pytest.raises(tf.ValidationError, match=r"LaunchConfig\.flat: threads=0"):
        tf.LaunchConfig.flat(0)


def test_config_is_immutable_and_hashable():
    c = tf.LaunchConfig.flat(10)
    with pytest.raises(AttributeError):
        c.grid = (2, 1, 1)
    assert {c: 1}[tf.LaunchConfig.flat(10)] == 1
