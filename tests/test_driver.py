import pytest

import tenferro as tf
from tenferro import _driver


def _has_driver() -> bool:
    try:
        _driver.ensure_init()
    except tf.RuntimeStateError:
        return False
    return True


@pytest.mark.skipif(_has_driver(), reason="a CUDA driver is present; this checks its absence")
def test_no_driver_is_a_clear_runtime_state_error():
    with pytest.raises(tf.RuntimeStateError, match=r"session: (no CUDA driver|the CUDA driver "
                                                   r"found no GPU)"):
        _driver.ensure_init("session")
    with pytest.raises(tf.RuntimeStateError, match=r"session: "):
        _driver.PrimaryContext.get(0)
    assert _driver.driver_version() == 0


def test_nvrtc_works_without_a_driver():
    major, minor = _driver.nvrtc_version()
    assert major >= 12 and 0 <= minor < 100
    # NVRTC compiles without a driver: PTX of its own ISA for the architecture asked.
    ptx = tf.compile_cuda('extern "C" __global__ void k(int* p) { *p = 1; }', arch="compute_90",
                          target="ptx").ptx
    assert ".target sm_90" in ptx and ".entry k(" in ptx


@pytest.mark.gpu
def test_both_ways_of_waiting_for_a_stream_work_and_report_the_driver_result(session):
    import numpy as np

    waits = [_driver._bindings_wait]
    njit_wait = _driver._make_njit_wait()
    assert njit_wait is not None  # numba and libcuda are here: the fast one is built
    waits.append(njit_wait)
    ev = _driver.event_create()
    try:
        for wait in waits:
            assert wait(session.stream_handle, 1, ev) == 0
            err = wait(session.stream_handle, 1, 0)  # a NULL event: the driver refuses it
            assert _driver.result_name(err).startswith("CUDA_ERROR_INVALID")
    finally:
        _driver.event_destroy(ev)
    with pytest.raises(tf.BackendError, match=r"^session\.test: the driver returned "
                                              r"CUDA_ERROR_INVALID"):
        _driver.wait_for_stream(session.stream_handle, 1, 0, "session.test")
    assert np.isfinite(session.download(session.upload(np.ones(3)))).all()  # still usable
