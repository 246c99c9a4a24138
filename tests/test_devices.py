"""Device selection and sessions on several devices (run here on as many GPUs as there are)."""

import threading

import numpy as np
import pytest

import tenferro as tf


def test_is_available_says_whether_a_device_is_seen_and_never_raises(monkeypatch):
    from tenferro import _driver

    def no_driver(op="x"):
        raise tf.RuntimeStateError(f"{op}: no CUDA driver on this machine")

    monkeypatch.setattr(_driver, "ensure_init", lambda op="x": None)
    for count, available in ((0, False), (1, True), (8, True)):  # the first seen device counts
        monkeypatch.setattr(_driver, "device_count", lambda count=count: count)
        assert tf.is_available() is available
    monkeypatch.setattr(_driver, "ensure_init", no_driver)
    assert tf.is_available() is False

    def broken():
        raise OSError("libcuda.so: cannot open shared object file")

    monkeypatch.setattr(_driver, "ensure_init", lambda op="x": None)
    monkeypatch.setattr(_driver, "device_count", broken)
    assert tf.is_available() is False


@pytest.mark.gpu
def test_is_available_on_a_gpu_machine(device):
    assert tf.is_available() is True


def test_local_device_refuses_bad_values(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(
        tf.ValidationError,
        match=r"tenferro\.local_device: LOCAL_RANK='one' is "
        r"not an integer",
    ):
        tf.local_device()
    monkeypatch.setenv("LOCAL_RANK", "-1")
    with pytest.raises(
        tf.ValidationError,
        match=r"tenferro\.local_device: LOCAL_RANK=-1 must "
        r"be >= 0",
    ):
        tf.local_device()


def test_local_device_takes_0_to_the_last_device_seen(monkeypatch):
    from tenferro import devices

    monkeypatch.setattr(devices, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert tf.local_device() == 0 and tf.local_device(default=1) == 1  # no launcher
    for rank in (0, 1):  # the first and the last device this process sees
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        assert tf.local_device() == rank
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"^tenferro\.local_device: LOCAL_RANK=2 but "
        r"this process sees 2 device\(s\) "
        r"\(CUDA_VISIBLE_DEVICES=4,5\)$",
    ):
        tf.local_device()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(tf.RuntimeStateError, match=r"\(CUDA_VISIBLE_DEVICES=unset\)$"):
        tf.local_device()
    monkeypatch.setenv("RANK_ON_NODE", "1")  # another launcher's variable
    assert tf.local_device(env="RANK_ON_NODE") == 1


@pytest.mark.gpu
def test_local_device_follows_the_launcher(device, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert tf.local_device() == 0
    count = tf.device_count()
    monkeypatch.setenv("LOCAL_RANK", str(count - 1))
    assert tf.local_device() == count - 1
    monkeypatch.setenv("LOCAL_RANK", str(count))
    with pytest.raises(
        tf.RuntimeStateError,
        match=rf"LOCAL_RANK={count} but this process sees "
        rf"{count} device",
    ):
        tf.local_device()


@pytest.mark.gpu
def test_sessions_in_threads_each_on_a_device(device, rng):
    """One session a thread, one thread a device (all on device 0 with one GPU)."""
    count = tf.device_count()
    devices = [i % count for i in range(max(2, count))]
    data = [rng.standard_normal(4097) for _ in devices]
    results, errors = {}, []

    def work(i, dev):
        try:
            with tf.Session(device=dev) as s:
                y = s.upload(data[i])
                from tenferro import kernels as k

                k.axpy(s, y, s.upload(data[i]), 2.0)
                results[i] = s.download(y)
        except Exception as exc:  # reported below, with the thread's device
            errors.append((dev, exc))

    threads = [threading.Thread(target=work, args=(i, d)) for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(len(devices)):
        np.testing.assert_allclose(results[i], 3.0 * data[i], rtol=1e-15)


@pytest.mark.gpu
def test_copy_peer_between_sessions_bit_for_bit(device, rng):
    count = tf.device_count()
    src_dev, dst_dev = 0, (1 if count > 1 else 0)
    a = rng.standard_normal((123, 77))
    with tf.Session(device=src_dev) as s0:
        src = s0.upload(a)
        other = tf.Session(device=dst_dev)
        # A session a thread: the destination session lives on its own thread.
        out, errors = {}, []

        def dst_side():
            try:
                with other as s1:
                    d = s1.alloc_output((123, 77), np.float64)
                    s1.copy_peer(d, src)
                    out["y"] = s1.download(d)
                    with pytest.raises(
                        tf.ValidationError,
                        match=r"session\.copy_peer: dst has "
                        r"8 bytes, src has 75768",
                    ):
                        s1.copy_peer(s1.alloc_output((1,), np.float64), src)
                    with pytest.raises(
                        tf.ValidationError,
                        match=r"session\.copy_peer: dst is "
                        r"f32, src is f64",
                    ):
                        s1.copy_peer(s1.alloc_output((123, 154), np.float32), src)
                    with pytest.raises(
                        tf.ValidationError,
                        match=r"session\.copy_peer: src must"
                        r" be a tf\.Tensor",
                    ):
                        s1.copy_peer(d, a)
                    with pytest.raises(
                        tf.ValidationError,
                        match=r"session\.copy_peer: src "
                        r"belongs to this session",
                    ):
                        s1.copy_peer(d, d)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=dst_side)
        t.start()
        t.join()
        assert not errors, errors
    assert out["y"].tobytes() == a.tobytes()
