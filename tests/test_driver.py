import pytest

import tenferro as tf
from tenferro import _driver
from tenferro._driver import fast_launch, modules, results


def _has_driver() -> bool:
    try:
        _driver.ensure_init()
    except tf.RuntimeStateError:
        return False
    return True


@pytest.mark.skipif(_has_driver(), reason="a CUDA driver is present; this checks its absence")
def test_no_driver_is_a_clear_runtime_state_error():
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"session: (no CUDA driver|the CUDA driver "
        r"found no GPU)",
    ):
        _driver.ensure_init("session")
    with pytest.raises(tf.RuntimeStateError, match=r"session: "):
        _driver.PrimaryContext.get(0)
    assert _driver.driver_version() == 0


def test_nvrtc_works_without_a_driver():
    major, minor = _driver.nvrtc_version()
    assert major >= 12 and 0 <= minor < 100
    # NVRTC compiles without a driver: PTX of its own ISA for the architecture asked.
    ptx = tf.compile_cuda(
        'extern "C" __global__ void k(int* p) { *p = 1; }', arch="compute_90", target="ptx"
    ).ptx
    assert ".target sm_90" in ptx and ".entry k(" in ptx


@pytest.mark.gpu
def test_both_ways_of_waiting_for_a_stream_work_and_report_the_driver_result(session):
    import numpy as np

    waits = [fast_launch._bindings_wait]
    njit_wait = fast_launch._make_njit_wait()
    assert njit_wait is not None  # numba and libcuda are here: the fast one is built
    waits.append(njit_wait)
    ev = _driver.event_create()
    try:
        for wait in waits:
            assert wait(session.stream, 1, ev) == 0
            err = wait(session.stream, 1, 0)  # a NULL event: the driver refuses it
            assert results.result_name(err).startswith("CUDA_ERROR_INVALID")
    finally:
        _driver.event_destroy(ev)
    with pytest.raises(
        tf.BackendError,
        match=r"^session\.test: the driver returned "
        r"CUDA_ERROR_INVALID",
    ):
        _driver.wait_for_stream(session.stream, 1, 0, "session.test")
    assert np.isfinite(session.download(session.upload(np.ones(3)))).all()  # still usable


def test_launches_use_the_bindings_until_the_process_is_hot_then_the_fast_launcher(
    fresh_fast_calls, monkeypatch
):
    built = []

    def fast(record):
        built.append(record)
        return 0

    monkeypatch.setattr(fast_launch, "_make_njit_launcher", lambda: fast)
    monkeypatch.setattr(fast_launch, "_make_njit_wait", lambda: None)
    record = _driver.LaunchRecord(0x1234, (2, 1, 1, 32, 1, 1, 64), 0x99, 0x5000)
    launch = _driver.launcher()
    assert launch is not fast
    for _ in range(3):  # HOT_CALLS: the third starts the build
        assert launch(record.address) == 0
    sent = fresh_fast_calls
    assert len(sent) == 3 and int(sent[0][0]) == 0x1234 and int(sent[0][8]) == 0x99
    assert sent[0][1:8] == (2, 1, 1, 32, 1, 1, 64) and sent[0][9:] == (0x5000, 0)
    _driver.build_fast_calls(wait=True)
    assert _driver.launcher() is fast
    assert launch(record.address) == 0  # a launcher kept from before hands over
    assert built == [record.address] and len(sent) == 3


def test_no_fast_calls_are_built_when_switched_off(fresh_fast_calls, monkeypatch):
    monkeypatch.setenv("TENFERRO_FAST_LAUNCH", "0")
    monkeypatch.setattr(fast_launch, "_make_njit_launcher", lambda: pytest.fail("built"))
    record = _driver.LaunchRecord(0x1, (1, 1, 1, 1, 1, 1, 0), 0x2, 0x3)
    for _ in range(5):
        assert _driver.launcher()(record.address) == 0
    assert fast_launch._build_thread is None and _driver.build_fast_calls() is False
    assert len(fresh_fast_calls) == 5


def test_a_record_gone_leaves_a_newer_one_at_its_address():
    a = _driver.LaunchRecord(0x10, (1, 1, 1, 1, 1, 1, 0), 0x2, 0x3)
    address = a.address
    assert address in fast_launch._record_calls
    del a
    assert address not in fast_launch._record_calls


def _pathfinder_answers(monkeypatch, answers):
    """cuda.pathfinder's header lookup, answering from ``answers`` (a missing name raises)."""
    import cuda.pathfinder

    def find(name):
        if name not in answers:
            raise RuntimeError(f"no such header library {name!r}")
        return answers[name]

    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_header_directory", find)


def test_cccl_headers_are_found_where_pathfinder_puts_them(monkeypatch, tmp_path):
    """A CCCL wheel installed apart from the toolkit headers (another site directory) is used."""
    (tmp_path / "toolkit").mkdir()
    (tmp_path / "elsewhere" / "cccl").mkdir(parents=True)
    _pathfinder_answers(
        monkeypatch,
        {"cudart": str(tmp_path / "toolkit"), "cccl": str(tmp_path / "elsewhere" / "cccl")},
    )
    assert _driver.cuda_include_dirs() == [
        str(tmp_path / "toolkit"),
        str(tmp_path / "elsewhere" / "cccl"),
    ]


def test_cccl_beside_the_toolkit_headers_is_used_when_pathfinder_knows_no_cccl(
    monkeypatch, tmp_path
):
    _pathfinder_answers(monkeypatch, {"cudart": str(tmp_path)})
    assert _driver.cuda_include_dirs() == [str(tmp_path)]  # no cccl anywhere: the toolkit alone
    (tmp_path / "cccl").mkdir()
    assert _driver.cuda_include_dirs() == [str(tmp_path), str(tmp_path / "cccl")]


def test_an_extended_record_launches_through_cuLaunchKernelEx_with_its_attributes(monkeypatch):
    from cuda.bindings import driver as cu

    seen = []
    monkeypatch.setattr(
        cu,
        "cuLaunchKernelEx",
        lambda config, f, params, extra: (
            seen.append((config, int(f), params, extra)) or (cu.CUresult.CUDA_SUCCESS,)
        ),
    )
    rec = _driver.ExtendedLaunchRecord(
        0x1234, (4, 2, 1, 64, 2, 1, 512), 0x99, 0xABC0, ((2, 2, 1), True, False, None)
    )
    assert _driver.launcher(True)(rec.address) == 0
    ((config, f, params, extra),) = seen
    assert (f, params, extra) == (0x1234, 0xABC0, 0)
    assert (
        config.gridDimX,
        config.gridDimY,
        config.gridDimZ,
        config.blockDimX,
        config.blockDimY,
        config.blockDimZ,
        config.sharedMemBytes,
    ) == (4, 2, 1, 64, 2, 1, 512)
    assert int(config.hStream) == 0x99 and config.numAttrs == 2
    cluster, coop = config.attrs
    assert cluster.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z) == (
        2,
        2,
        1,
    )
    assert coop.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    assert coop.value.cooperative == 1
    with pytest.raises(KeyError):  # the plain launchers never take an extended record
        _driver.launcher(False)(rec.address)
    only_coop = _driver.ExtendedLaunchRecord(
        1, (1, 1, 1, 32, 1, 1, 0), 0, 0, (None, True, False, None)
    )
    _driver.launcher(True)(only_coop.address)
    assert seen[-1][0].numAttrs == 1
    address = rec.address
    del rec
    with pytest.raises(KeyError):  # a record gone takes its call with it
        _driver.launcher(True)(address)


@pytest.mark.parametrize(
    ("attributes", "kind"),
    [
        ((None, False, False, None), "LaunchRecord"),
        (((2, 1, 1), False, False, None), "ExtendedLaunchRecord"),
        ((None, True, False, None), "ExtendedLaunchRecord"),
        (((1, 1, 1), True, False, None), "ExtendedLaunchRecord"),
        ((None, False, True, None), "ExtendedLaunchRecord"),
        ((None, False, False, 0), "ExtendedLaunchRecord"),  # priority 0 is a priority
    ],
)
def test_a_launch_record_is_extended_exactly_where_an_attribute_is_set(attributes, kind):
    rec = _driver.launch_record(0x1, (2, 1, 1, 32, 1, 1, 0), 0x2, 0x3, attributes)
    assert type(rec).__name__ == kind


def test_the_extended_launch_config_carries_each_attribute_asked_for():
    from cuda.bindings import driver as cu

    from tenferro._driver.fast_launch import launch_config

    ids = cu.CUlaunchAttributeID
    config = launch_config((4, 1, 1, 64, 1, 1, 128), 0x2, ((2, 1, 1), True, True, -3))
    got = {a.id: a for a in config.attrs[: config.numAttrs]}
    assert set(got) == {
        ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
        ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        ids.CU_LAUNCH_ATTRIBUTE_PRIORITY,
    }
    pdl = got[ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
    assert pdl.value.programmaticStreamSerializationAllowed == 1
    assert got[ids.CU_LAUNCH_ATTRIBUTE_PRIORITY].value.priority == -3
    assert (config.gridDimX, config.blockDimX, config.sharedMemBytes) == (4, 64, 128)
    plain = launch_config((4, 1, 1, 64, 1, 1, 0), 0x2, (None, False, False, None))
    assert plain.numAttrs == 0


class _ParamInfoDriver:
    """cuda.bindings' driver as far as `func_param_layout` asks it: params of 8, 4, 4 bytes."""

    CUresult = type(
        "CUresult", (), {"CUDA_ERROR_INVALID_VALUE": 1, "CUDA_ERROR_NOT_SUPPORTED": 801}
    )
    LAYOUT = ((0, 8), (8, 4), (12, 4))

    def __init__(self, count):
        self.count, self.asked = count, []

    def CUfunction(self, f):
        return f

    def cuFuncGetParamCount(self, f):
        if self.count == "missing":
            raise RuntimeError('Function "cuFuncGetParamCount" not found')
        return self.count

    def cuFuncGetParamInfo(self, f, i):
        self.asked.append(i)
        return (0, *self.LAYOUT[i]) if i < len(self.LAYOUT) else (1,)


@pytest.mark.parametrize("count", [(0, 3), (801,), "missing"])
def test_a_functions_parameter_layout_is_asked_only_for_parameters_it_has(monkeypatch, count):
    fake = _ParamInfoDriver(count)
    monkeypatch.setattr(modules, "cu", fake)
    assert _driver.func_param_layout(0x77) == list(_ParamInfoDriver.LAYOUT)
    # with the count, no index past the last (a failing call compute-sanitizer reports)
    assert fake.asked == ([0, 1, 2] if count == (0, 3) else [0, 1, 2, 3])


@pytest.mark.gpu
def test_the_driver_gives_a_kernels_parameter_layout(session):
    from _sources import AXPY

    fn = session.compile(AXPY).function("axpy")  # (float*, const float*, float, unsigned)
    assert _driver.func_param_layout(fn.handle) == [(0, 8), (8, 8), (16, 4), (20, 4)]
    try:
        has_count = not results.cu.cuFuncGetParamCount(results.cu.CUfunction(fn.handle))[0]
    except Exception:  # a driver without it: the probe is the way
        has_count = False
    print(f"cuFuncGetParamCount available: {has_count}")


def test_peer_access_is_asked_once_a_pair_and_enabled_on_the_peers_context(monkeypatch):
    from _stand_ins import TwoDevices
    from cuda.bindings import driver as cu

    devices = TwoDevices(monkeypatch)
    c0, c1 = devices.contexts
    op = "session.copy_peer"
    assert _driver.enable_peer_access(c0, c0, op) is True and devices.asked == []  # one device
    assert _driver.enable_peer_access(c0, c1, op) is True
    assert devices.asked == [("can", 0xD0, 0xD1), ("enable", 0xC1, 0)]
    assert _driver.enable_peer_access(c0, c1, op) is True and len(devices.asked) == 2  # kept
    devices.asked.clear()
    # the other way is a pair of its own; enabled already (by another library) is enabled
    devices.enable_result = cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
    assert _driver.enable_peer_access(c1, c0, op) is True
    assert devices.asked == [("can", 0xD1, 0xD0), ("enable", 0xC0, 0)]


def test_peer_access_the_hardware_lacks_is_false_and_a_refusal_names_the_operation(monkeypatch):
    from _stand_ins import TwoDevices
    from cuda.bindings import driver as cu

    devices = TwoDevices(monkeypatch)
    c0, c1 = devices.contexts
    op = "session.copy_peer"
    devices.peers = set()  # the driver stages the copies
    assert _driver.enable_peer_access(c0, c1, op) is False
    assert _driver.enable_peer_access(c0, c1, op) is False
    assert devices.asked == [("can", 0xD0, 0xD1)] * 2  # not kept: asked each time
    devices.asked.clear()
    devices.peers = {(0xD0, 0xD1)}
    devices.enable_result = cu.CUresult.CUDA_ERROR_TOO_MANY_PEERS
    with pytest.raises(
        tf.BackendError,
        match=r"^session\.copy_peer: the driver returned "
        r"CUDA_ERROR_TOO_MANY_PEERS$",
    ):
        _driver.enable_peer_access(c0, c1, op)
    devices.enable_result = cu.CUresult.CUDA_SUCCESS
    assert _driver.enable_peer_access(c0, c1, op) is True  # a refusal is not kept either
    assert devices.asked == [("can", 0xD0, 0xD1), ("enable", 0xC1, 0)] * 2


@pytest.mark.parametrize("name", ["NOT_AN_ATTRIBUTE", "max_grid_dim_x", "", 3])
def test_an_unknown_device_attribute_is_refused_by_name(monkeypatch, name):
    from _stand_ins import TwoDevices
    from cuda.bindings import driver as cu

    devices = TwoDevices(monkeypatch)
    asked = []

    monkeypatch.setattr(cu, "cuDeviceGetAttribute", lambda a, d: asked.append(a) or (0, 1))
    with pytest.raises(tf.ValidationError, match=r"^context\.attribute: name=.* is not a CU_"):
        devices.contexts[0].attribute(name)
    assert asked == []  # the driver was not asked


def test_a_known_device_attribute_is_asked_once(monkeypatch):
    from _stand_ins import TwoDevices
    from cuda.bindings import driver as cu

    devices = TwoDevices(monkeypatch)
    asked = []
    ok = cu.CUresult.CUDA_SUCCESS
    monkeypatch.setattr(cu, "cuDeviceGetAttribute", lambda a, d: asked.append(a) or (ok, 1024))
    ctx = devices.contexts[0]
    assert ctx.attribute("MAX_THREADS_PER_BLOCK") == 1024
    assert ctx.attribute("MAX_THREADS_PER_BLOCK") == 1024
    assert asked == [cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK]


def test_a_free_without_a_stream_synchronizes_then_gives_the_bytes_back_to_their_pool(monkeypatch):
    # cuMemFree on pool memory neither waits for the work using it nor returns it to the
    # pool (the pool counts it used for good): a free after the session's stream is gone
    # synchronizes the context and frees into the pool on the legacy stream.
    from cuda.bindings import driver as cu

    from tenferro._driver import memory

    ok, calls = cu.CUresult.CUDA_SUCCESS, []

    class _Cu:
        CUdeviceptr, CUstream, CU_STREAM_LEGACY = cu.CUdeviceptr, cu.CUstream, cu.CU_STREAM_LEGACY

        def cuCtxSynchronize(self):
            calls.append("synchronize")
            return (ok,)

        def cuMemFreeAsync(self, ptr, stream):
            calls.append(("free async", int(ptr), int(stream)))
            return (ok,)

        def cuMemFree(self, ptr):
            calls.append(("free", int(ptr)))
            return (ok,)

    monkeypatch.setattr(memory, "cu", _Cu())
    _driver.mem_free(0x7000)
    assert calls == ["synchronize", ("free async", 0x7000, int(cu.CU_STREAM_LEGACY))]
    calls.clear()
    _driver.mem_free_async(0x8000, 5)  # the session's own stream, while it exists
    assert calls == [("free async", 0x8000, 5)]
