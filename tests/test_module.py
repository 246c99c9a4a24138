"""Loaded modules and their Functions (tenferro.module): loading, lookup, attributes, reprs."""

import numpy as np
import pytest
from _stand_ins import RecordsFaults

import tenferro as tf

SRC = r"""extern "C" __global__ void scale(float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= a;
}"""


SCALE = r"""
extern "C" __global__ void scale(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


@pytest.mark.gpu
def test_load_ptx_knows_its_signature_and_runs(session, rng):
    import re

    ptx = tf.compile_cuda(SCALE, arch="sm_90", target="ptx").ptx
    # NVRTC 13.5 writes PTX ISA 9.5, newer than driver 580 loads: a clear error naming both.
    if re.search(r"\.version 9\.[5-9]", ptx):
        with pytest.raises(
            tf.BackendError,
            match=r"session\.load_ptx: the PTX is ISA version "
            r"9\.\d, newer than this driver \(CUDA 1",
        ):
            session.load_ptx(ptx)
        ptx = re.sub(r"\.version \d+\.\d+", ".version 9.0", ptx)
    fn = session.load_ptx(ptx).function("scale")
    assert [p.kind for p in fn.signature.params] == ["ptr_or_int64", "ptr_or_int64", "float", "int"]
    x0 = rng.standard_normal(777).astype(np.float32)
    y = session.upload(np.full(777, np.nan, np.float32))
    session.launch(
        fn,
        tf.LaunchConfig.flat(777, 128),
        [session.tensor_mut(y), session.tensor(session.upload(x0)), 1.5, 777],
    )
    np.testing.assert_allclose(session.download(y), 1.5 * x0.astype(np.float64), rtol=1e-6)
    with pytest.raises(tf.ValidationError, match=r"session\.launch: args\[2\] expects f32"):
        session.launch(
            fn,
            tf.LaunchConfig.flat(777),
            [session.tensor_mut(y), session.tensor(y), tf.f64(1.5), 777],
        )


@pytest.mark.gpu
def test_load_cubin_takes_sizes_from_the_driver(session, rng):
    major, minor = session.context.compute_capability
    cubin = tf.compile_cuda(SCALE, arch=f"sm_{major}{minor}").image
    fn = session.load_cubin(cubin).function("scale")
    assert [p.size for p in fn.signature.params] == [8, 8, 4, 4]
    x0 = rng.standard_normal(300).astype(np.float32)
    y = session.upload(np.full(300, np.nan, np.float32))
    session.launch(
        fn,
        tf.LaunchConfig.flat(300),
        [session.tensor_mut(y), session.tensor(session.upload(x0)), tf.f32(-2.0), tf.u32(300)],
    )
    np.testing.assert_allclose(session.download(y), -2.0 * x0.astype(np.float64), rtol=1e-6)
    with pytest.raises(tf.ValidationError, match=r"session\.launch: kernel 'scale' takes 4"):
        session.launch(fn, tf.LaunchConfig.flat(300), [session.tensor_mut(y)])
    with pytest.raises(tf.ValidationError, match=r"session\.load_cubin: image must be bytes"):
        session.load_cubin("scale.cubin")


@pytest.mark.gpu
def test_module_function_refuses_a_name_that_is_not_a_str(session):
    m = session.compile(SRC)
    for bad in (["scale"], 3, None):
        with pytest.raises(
            tf.ValidationError,
            match=rf"module\.function: name must be str, got "
            rf"{type(bad).__name__} ",
        ):
            m.function(bad)
    assert m.function("scale").name == "scale"


@pytest.mark.gpu
def test_session_compile_keeps_the_log_on_the_module(session):
    m = session.compile("#warning tenferro-module-warning\n" + SRC)
    assert "tenferro-module-warning" in m.compile_log
    assert session.compile(SRC).compile_log == ""
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.load_ptx: text has a NUL character at "
        r"offset 3",
    ):
        session.load_ptx("abc\0def")
    with pytest.raises(tf.ValidationError, match=r"session\.load_ptx: the text has no \.entry"):
        session.load_ptx(SRC)


@pytest.mark.gpu
def test_session_compile_names_itself_in_a_compile_error_and_a_refusal(session):
    with pytest.raises(tf.CompileError, match=r"^session\.compile: NVRTC failed to compile") as e:
        session.compile('extern "C" __global__ void k(float* y) { y[0] = nope; }')
    assert 'identifier "nope" is undefined' in e.value.log
    with pytest.raises(tf.ValidationError, match=r"^session\.compile: options must be strings"):
        session.compile(SRC, options=[3])


@pytest.mark.gpu
def test_session_compile_refuses_another_architecture(session):
    major, minor = session.context.compute_capability
    other = "sm_80" if (major, minor) != (8, 0) else "sm_90"
    with pytest.raises(
        tf.ValidationError,
        match=rf"session\.compile: arch='{other}' is not this device's "
        rf"architecture \(sm_{major}{minor}, ",
    ):
        session.compile('extern "C" __global__ void f() {}', arch=other)


def test_a_function_reads_as_its_c_declaration():
    from tenferro.module import Function

    r = tf.compile_cuda(
        'extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) {}',
        cache=False,
    )

    class Shown:  # what repr reads of a Function, without a GPU to load one
        name, signature = "axpy", r.signatures["axpy"]

    assert (
        Function.__repr__(Shown())
        == "Function(axpy(float* y, const float* x, float a, unsigned int n))"
    )


@pytest.mark.gpu
def test_a_cpp_kernel_file_launches_by_its_kernels_own_names(session, rng):
    from _sources import CPP_KERNELS

    mod = session.compile(CPP_KERNELS)
    rows, cols = 37, 200
    x0 = rng.standard_normal((rows, cols)).astype(np.float32)
    w0, b0 = (
        rng.standard_normal(cols).astype(np.float32),
        rng.standard_normal(cols).astype(np.float32),
    )
    out = session.upload(np.full((rows, cols), np.nan, np.float32))
    mean, rstd = (session.upload(np.full(rows, np.nan, np.float32)) for _ in range(2))
    x, w, b = session.upload(x0), session.upload(w0), session.upload(b0)
    ln = mod.function("layernorm_forward")
    warps = 4  # rows a block: one warp a row
    cfg = tf.LaunchConfig((rows + warps - 1) // warps, 32 * warps)
    session.launch(
        ln,
        cfg,
        [
            session.tensor_mut(out),
            session.tensor_mut(mean),
            session.tensor_mut(rstd),
            session.tensor(x),
            session.tensor(w),
            session.tensor(b),
            rows,
            cols,
        ],
    )
    xd = x0.astype(np.float64)
    m = xd.mean(axis=1)
    s = 1.0 / np.sqrt(((xd - m[:, None]) ** 2).mean(axis=1) + 1e-5)
    want = (xd - m[:, None]) * s[:, None] * w0 + b0
    np.testing.assert_allclose(session.download(out), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(session.download(mean), m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(session.download(rstd), s, rtol=1e-4)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[4\] 'weight' is "
        r"float64, the kernel takes const float\*$",
    ):
        session.launch(
            ln,
            cfg,
            [
                session.tensor_mut(out),
                session.tensor_mut(mean),
                session.tensor_mut(rstd),
                session.tensor(x),
                session.tensor(session.upload(w0.astype(np.float64))),
                session.tensor(b),
                rows,
                cols,
            ],
        )
    with pytest.raises(
        tf.ValidationError,
        match=r"^module\.function: 'scale_rows' is "
        r"overloaded; .*scale_rows\(double\*, ",
    ):
        mod.function("scale_rows")
    sd = rng.standard_normal(rows)
    xd_dev = session.upload(xd)
    scale = mod.function("scale_rows(double*, const double*, int, int)")
    session.launch(
        scale,
        tf.LaunchConfig(((cols + 127) // 128, rows), 128),
        [session.tensor_mut(xd_dev), session.tensor(session.upload(sd)), rows, cols],
    )
    np.testing.assert_array_equal(session.download(xd_dev), xd * sd[:, None])
    add_bias = mod.function("add_bias")
    assert mod.function("ops::add_bias").name == add_bias.name == "_ZN3ops8add_biasEPfPKfmm"
    session.launch(
        add_bias,
        tf.LaunchConfig.flat(rows * cols, 256),
        [session.tensor_mut(x), session.tensor(b), rows * cols, cols],
    )
    np.testing.assert_allclose(session.download(x), x0.astype(np.float64) + b0, rtol=1e-6)


@pytest.mark.gpu
def test_a_kernel_file_on_disk_with_library_headers_runs(session, rng, tmp_path, monkeypatch):
    # As written for nvcc: <cstdint>, <cmath>, <algorithm>, std:: names, and a header of its
    # own beside it; s.compile takes the file's Path.
    import pathlib

    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "common.cuh").write_text("#pragma once\nconstexpr float kCap = 2.5f;\n")
    kernel = tmp_path / "root_clamp.cu"
    kernel.write_text(
        '#include <cstdint>\n#include <cmath>\n#include <algorithm>\n#include "common.cuh"\n'
        'extern "C" __global__ void root_clamp(float* y, const float* x, std::size_t n,\n'
        "                                      std::int64_t offset) {\n"
        "    const std::size_t i = blockIdx.x * (std::size_t)blockDim.x + threadIdx.x;\n"
        "    if (i < n) y[i] = std::min(std::sqrt(std::abs(x[i])), kCap) + (float)offset;\n"
        "}\n"
    )
    fn = session.compile(pathlib.Path(kernel)).function("root_clamp")
    assert repr(fn) == (
        "Function(root_clamp(float* y, const float* x, unsigned long n, long long offset))"
    )
    n = 1000
    x0 = rng.standard_normal(n).astype(np.float32) * 4
    y = session.upload(np.full(n, np.nan, np.float32))
    session.launch(
        fn,
        tf.LaunchConfig.flat(n, 128),
        [session.tensor_mut(y), session.tensor(session.upload(x0)), tf.u64(n), tf.i64(-3)],
    )
    want = np.minimum(np.sqrt(np.abs(x0.astype(np.float64))), 2.5) - 3
    np.testing.assert_allclose(session.download(y), want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_module_and_bound_launch_read_as_their_kernels(session):
    mod = session.compile(SRC)
    assert repr(mod) == "Module(cubin; 1 kernel(s): scale(float* y, float a, unsigned int n))"
    fn = mod.function("scale")
    assert repr(fn) == "Function(scale(float* y, float a, unsigned int n))"
    y = session.alloc_zeros(8, np.float32)
    bound = session.bind(fn, tf.LaunchConfig.flat(8), [session.tensor_mut(y), 1.0, 8])
    assert repr(bound) == (
        "BoundLaunch(scale, LaunchConfig(grid=(1, 1, 1), block=(256, 1, 1), shared_mem_bytes=0))"
    )


def _refusing_loader(result_name, given=None):
    def module_load_data(image, op):
        if given is not None:
            given.append(image)
        raise tf.BackendError(f"{op}: cuModuleLoadData failed: {result_name}", result_name, 222)

    return module_load_data


@pytest.mark.parametrize(
    ("version_line", "said", "driver", "cuda"),
    [
        (".version 9.1", "9.1", 12080, "12.8"),
        ("  .version 10.12", "10.12", 13000, "13.0"),
        ("// no version here", "unknown", 12020, "12.2"),
    ],
)
def test_ptx_newer_than_the_driver_names_both_versions_and_the_way_out(
    monkeypatch, version_line, said, driver, cuda
):
    from tenferro import module as module_part

    given = []
    monkeypatch.setattr(
        module_part._driver,
        "module_load_data",
        _refusing_loader("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", given),
    )
    monkeypatch.setattr(module_part._driver, "driver_version", lambda: driver)
    # A byte that is not UTF-8 (in a comment) does not stop the version from being read.
    image = f"// \xff\n{version_line}\n.target sm_90\n".encode("latin-1") + b"\0"
    with pytest.raises(tf.BackendError) as info:
        module_part.Module(object(), image, "ptx", {}, op="session.load_ptx")
    assert given == [image]
    assert str(info.value) == (
        f"session.load_ptx: the PTX is ISA version {said}, newer than this driver (CUDA {cuda}) "
        "can load; compile to CUBIN for the device (the default of s.compile) or lower the PTX "
        ".version"
    )
    assert (info.value.result_name, info.value.result_code) == (
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        222,
    )
    with pytest.raises(tf.BackendError, match=r"^session\.load_module: the PTX is ISA"):
        module_part.Module(object(), image, "ptx", {})  # the operation a caller names by default


@pytest.mark.parametrize(
    ("kind", "result_name"),
    [
        ("cubin", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),  # a CUBIN has no PTX version to name
        ("ptx", "CUDA_ERROR_INVALID_IMAGE"),
    ],
)
def test_other_load_refusals_pass_through_as_the_driver_said(monkeypatch, kind, result_name):
    from tenferro import module as module_part

    monkeypatch.setattr(module_part._driver, "module_load_data", _refusing_loader(result_name))
    with pytest.raises(tf.BackendError) as info:
        module_part.Module(object(), b".version 9.1\n\0", kind, {}, op="session.load_ptx")
    assert str(info.value) == f"session.load_ptx: cuModuleLoadData failed: {result_name}"


def test_a_loaded_module_keeps_what_it_was_given(monkeypatch):
    from tenferro import module as module_part

    monkeypatch.setattr(module_part._driver, "module_load_data", lambda image, op: 0xBEEF)
    session, sigs = object(), {"k": tf.compile_cuda(SRC, arch="sm_90").signatures["scale"]}
    m = module_part.Module(session, b"img", "cubin", sigs, compile_log="warning: x")
    assert (
        m.state,
        m.handle,
        m.kind,
        m.signatures,
        m.lowered_names,
        m.compile_log,
        m.variables,
    ) == (session, 0xBEEF, "cubin", sigs, {}, "warning: x", {})
    variables = {"t": object()}
    named = module_part.Module(
        session, b"img", "ptx", sigs, {"f<1>": "_Z1fILi1EEvv"}, variables=variables
    )
    assert (named.lowered_names, named.compile_log) == ({"f<1>": "_Z1fILi1EEvv"}, "")
    assert named.variables is variables


# --- a Function's attributes and occupancy, through a stand-in driver --------------------------

_FUNC_ATTRIBUTES = {
    "NUM_REGS": 40,
    "LOCAL_SIZE_BYTES": 16,
    "SHARED_SIZE_BYTES": 1024,
    "CONST_SIZE_BYTES": 8,
    "MAX_THREADS_PER_BLOCK": 768,
    "PTX_VERSION": 87,
    "BINARY_VERSION": 90,
    "REQUIRED_CLUSTER_WIDTH": 0,  # no __cluster_dims__
    "REQUIRED_CLUSTER_HEIGHT": 0,
    "REQUIRED_CLUSTER_DEPTH": 0,
}


class _Context:
    compute_capability = (9, 0)

    def attribute(self, name):
        return {
            "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 227 * 1024,
            "MAX_THREADS_PER_MULTIPROCESSOR": 2048,
            "MAX_REGISTERS_PER_BLOCK": 65536,
            "CLUSTER_LAUNCH": 1,
        }[name]


class _Session(RecordsFaults):
    context = _Context()
    stream = 0x5

    def __init__(self):
        self.used, self.caches, self.faults = [], [], []
        self.liveness = self

    def add_cache(self, cache):
        self.caches.append(cache)

    def check_use(self, op):
        self.used.append(op)


@pytest.fixture
def scale_fn(monkeypatch):
    """The Function of SRC's `scale` in a stand-in session, and what the driver was asked."""
    from tenferro import module as module_part

    asked = []
    d = module_part._driver
    monkeypatch.setattr(
        d, "func_attribute", lambda handle, name: _FUNC_ATTRIBUTES[name] if handle == 0x77 else -1
    )
    monkeypatch.setattr(
        d,
        "occupancy_blocks",
        lambda handle, threads, smem, op: asked.append((handle, threads, smem, op)) or 3,
    )
    monkeypatch.setattr(
        d,
        "func_set_max_dynamic_shared",
        lambda handle, n, op: asked.append(("raise", handle, n, op)),
    )
    monkeypatch.setattr(
        d,
        "max_active_clusters",
        lambda handle, dims, cluster, stream, op: (
            asked.append(("clusters", handle, dims, cluster, stream, op)) or 33
        ),
    )
    mod = type("M", (), {"state": _Session()})()
    fn = module_part.Function(
        mod, "scale", 0x77, tf.compile_cuda(SRC, arch="sm_90").signatures["scale"]
    )
    return fn, asked


def test_a_function_starts_with_its_limits_and_no_config_checked(scale_fn):
    from tenferro.args import ParamBlock

    fn, _ = scale_fn
    assert (fn.module.state, fn.name, fn.handle) == (fn.state, "scale", 0x77)
    assert fn.signature.declaration() == "scale(float* y, float a, unsigned int n)"
    assert type(fn.param_block) is ParamBlock and fn.state.caches == [fn.param_block]
    assert (
        fn.max_threads_per_block,
        fn.static_shared_bytes,
        fn.dynamic_shared_limit,
        fn.device_shared_optin,
    ) == (768, 1024, 48 * 1024 - 1024, 227 * 1024)
    assert fn.checked_configs == set() and (fn.record, fn.record_address) == (None, 0)
    assert fn.last_config is not None and not isinstance(fn.last_config, tf.LaunchConfig)


def test_a_function_takes_a_parameter_block_it_is_given(monkeypatch):
    from tenferro import module as module_part
    from tenferro.args import ParamBlock

    monkeypatch.setattr(module_part._driver, "func_attribute", lambda handle, name: 1)
    sig = tf.compile_cuda(SRC, arch="sm_90").signatures["scale"]
    block = ParamBlock(sig)
    mod = type("M", (), {"state": _Session()})()
    assert module_part.Function(mod, "scale", 1, sig, block).param_block is block


def test_a_module_finds_each_function_once(monkeypatch):
    from tenferro import module as module_part

    d = module_part._driver
    looked_up = []
    monkeypatch.setattr(d, "module_load_data", lambda image, op: 0xBEEF)
    monkeypatch.setattr(
        d, "module_get_function", lambda module, name: looked_up.append((module, name)) or 0x77
    )
    monkeypatch.setattr(d, "func_attribute", lambda handle, name: _FUNC_ATTRIBUTES[name])
    m = module_part.Module(
        _Session(), b"img", "cubin", tf.compile_cuda(SRC, arch="sm_90").signatures
    )
    fn = m.function("scale")
    assert m.function("scale") is fn and looked_up == [(0xBEEF, "scale")]


def test_a_name_the_module_lacks_asks_the_driver_for_no_function(monkeypatch):
    # A failing cuModuleGetFunction is an API error under compute-sanitizer: ask only for
    # names the module has (the driver's list where the compiler gave none).
    from tenferro import module as module_part

    d = module_part._driver
    looked_up = []
    monkeypatch.setattr(d, "module_load_data", lambda image, op: 0xBEEF)
    monkeypatch.setattr(
        d, "module_get_function", lambda module, name: looked_up.append(name) or 0x77
    )
    monkeypatch.setattr(d, "module_function_names", lambda module: ["_Z5scalePff"])
    monkeypatch.setattr(d, "func_attribute", lambda handle, name: _FUNC_ATTRIBUTES[name])
    monkeypatch.setattr(d, "func_param_layout", lambda handle: [(0, 8), (8, 4)])
    m = module_part.Module(_Session(), b"img", "cubin", {})
    with pytest.raises(
        tf.ValidationError,
        match=r"^module\.function: no kernel named 'nope' "
        r"in this module; it has \['scale'\]$",
    ):
        m.function("nope")
    assert looked_up == []
    assert m.function("scale").name == "_Z5scalePff"  # the C++ name, found among the names
    assert looked_up == ["_Z5scalePff"]


def test_a_functions_attributes_are_the_drivers(scale_fn):
    scale_fn, _ = scale_fn
    a = scale_fn.attributes
    assert a == tf.module.KernelAttributes(
        registers=40,
        local_bytes=16,
        static_shared_bytes=1024,
        const_bytes=8,
        max_threads_per_block=768,
        ptx_version=87,
        binary_version=90,
    )
    assert scale_fn.state.used == ["function.attributes"]


@pytest.mark.parametrize(
    ("block", "threads", "warps"),
    [(256, 256, 24), ((16, 16), 256, 24), (100, 100, 12), (768, 768, 72), (1, 1, 3)],
)
def test_occupancy_asks_the_driver_for_the_blocks_threads(scale_fn, block, threads, warps):
    scale_fn, asked = scale_fn
    occ = scale_fn.occupancy(block)
    assert asked == [(0x77, threads, 0, "function.occupancy")]
    assert (
        occ.blocks_per_multiprocessor,
        occ.threads_per_block,
        occ.max_threads_per_multiprocessor,
    ) == (3, threads, 2048)
    assert (occ.warps_per_multiprocessor, occ.fraction) == (warps, warps / 64)
    assert scale_fn.state.used == ["function.occupancy"]


def test_occupancy_with_shared_memory_opts_in_as_a_launch_does(scale_fn):
    scale_fn, asked = scale_fn
    most = 227 * 1024 - 1024  # beside the 1 KiB static
    scale_fn.occupancy(32, 48 * 1024 - 1024)  # within the default: nothing raised
    scale_fn.occupancy(32, most)
    assert scale_fn.dynamic_shared_limit == most
    assert asked == [
        (0x77, 32, 48 * 1024 - 1024, "function.occupancy"),
        ("raise", 0x77, most, "session.launch"),
        (0x77, 32, most, "function.occupancy"),
    ]


def test_max_active_clusters_asks_the_driver_after_the_launch_checks(scale_fn):
    scale_fn, asked = scale_fn
    most = 227 * 1024 - 1024  # beside the 1 KiB static: opted in first, as a launch does
    config = tf.LaunchConfig(4, 256, most, cluster=2)
    assert scale_fn.max_active_clusters(config) == 33
    assert asked == [
        ("raise", 0x77, most, "session.launch"),
        ("clusters", 0x77, config.dims, (2, 1, 1), 0x5, "function.max_active_clusters"),
    ]
    assert scale_fn.state.used == ["function.max_active_clusters"]


@pytest.mark.parametrize(
    ("config", "msg"),
    [
        (4, r"config must be a LaunchConfig, got int"),
        (
            tf.LaunchConfig(4, 256),
            r"config=LaunchConfig\(grid=\(4, 1, 1\), block=\(256, 1, 1\), shared_mem_bytes=0\) "
            r"has no cluster; give LaunchConfig\(\.\.\., cluster=\.\.\.\)",
        ),
        (
            tf.LaunchConfig(2, 769, cluster=2),
            r"block=\(769, 1, 1\) has 769 threads but 'scale' allows at most 768",
        ),
        (
            tf.LaunchConfig(2, 32, 227 * 1024 - 1023, cluster=2),
            r"shared_mem_bytes=231425 exceeds what 'scale' can have",
        ),
    ],
)
def test_max_active_clusters_refusals_ask_the_driver_nothing(scale_fn, config, msg):
    scale_fn, asked = scale_fn
    with pytest.raises(tf.ValidationError, match=r"^function\.max_active_clusters: " + msg):
        scale_fn.max_active_clusters(config)
    assert asked == [] and scale_fn.dynamic_shared_limit == 48 * 1024 - 1024


@pytest.mark.parametrize(("blocks", "asked"), [(16, True), (32, False)])
def test_max_active_clusters_takes_clusters_up_to_16_blocks(scale_fn, monkeypatch, blocks, asked):
    from tenferro import module as module_part

    scale_fn, calls = scale_fn
    monkeypatch.setattr(module_part._driver, "func_set_attribute", lambda *a: calls.append(a))
    config = tf.LaunchConfig(blocks, 32, cluster=blocks)
    if asked:  # past 8 blocks (the portable size) the kernel is opted in first
        assert scale_fn.max_active_clusters(config) == 33
        assert calls[0] == (
            0x77,
            "NON_PORTABLE_CLUSTER_SIZE_ALLOWED",
            1,
            "function.max_active_clusters",
        )
        return
    with pytest.raises(
        tf.ValidationError,
        match=r"^function\.max_active_clusters: clusters of 32 blocks of block=\(32, 1, 1\) "
        r"with shared_mem_bytes=0 cannot run 'scale' on this device",
    ):
        scale_fn.max_active_clusters(config)
    assert calls == []


def test_max_active_clusters_refuses_a_device_without_clusters(scale_fn, monkeypatch):
    scale_fn, asked = scale_fn
    monkeypatch.setattr(scale_fn.state.context, "compute_capability", (8, 0))
    monkeypatch.setattr(
        scale_fn.state.context, "attribute", lambda name: 0 if name == "CLUSTER_LAUNCH" else 1
    )
    with pytest.raises(
        tf.ValidationError,
        match=r"^function\.max_active_clusters: cluster=\(2, 1, 1\) needs thread-block "
        r"clusters \(sm_90 or later\); this device is sm_80",
    ):
        scale_fn.max_active_clusters(tf.LaunchConfig(2, 32, cluster=2))
    assert asked == []


def test_max_active_clusters_refuses_a_cluster_other_than_the_compiled_one(scale_fn, monkeypatch):
    from tenferro import module as module_part

    scale_fn, asked = scale_fn
    dims = {"REQUIRED_CLUSTER_WIDTH": 2, "REQUIRED_CLUSTER_HEIGHT": 1, "REQUIRED_CLUSTER_DEPTH": 1}
    monkeypatch.setattr(
        module_part._driver, "func_attribute", lambda handle, name: dims.get(name, 0)
    )
    with pytest.raises(
        tf.ValidationError,
        match=r"^function\.max_active_clusters: cluster=\(4, 1, 1\) but 'scale' was "
        r"compiled with __cluster_dims__\(2, 1, 1\); give that cluster or none",
    ):
        scale_fn.max_active_clusters(tf.LaunchConfig(4, 32, cluster=4))
    assert scale_fn.max_active_clusters(tf.LaunchConfig(4, 32, cluster=2)) == 33
    assert [a[0] for a in asked] == ["clusters"]


@pytest.mark.parametrize(
    ("block", "smem", "msg"),
    [
        (
            769,
            0,
            r"block=\(769, 1, 1\) has 769 threads but 'scale' allows at most 768: its "
            r"__launch_bounds__ \(or PTX \.maxntid\) caps a block at 768 threads$",
        ),
        (0, 0, r"block=0: every dimension must be >= 1"),
        ((1, 1, 65), 0, r"block=\(1, 1, 65\) exceeds the per-dimension limit"),
        (
            32,
            227 * 1024 - 1023,
            r"shared_mem_bytes=231425 exceeds what 'scale' can have on this "
            r"device \(231424 bytes dynamic beside 1024 static\)",
        ),
        (32, -1, r"shared_mem_bytes=-1 must be an int from 0"),
    ],
)
def test_occupancy_refusals_are_a_launchs_and_ask_the_driver_nothing(scale_fn, block, smem, msg):
    scale_fn, asked = scale_fn
    with pytest.raises(tf.ValidationError, match=r"^function\.occupancy: " + msg):
        scale_fn.occupancy(block, smem)
    assert asked == [] and scale_fn.dynamic_shared_limit == 48 * 1024 - 1024


def test_auto_chooses_for_a_function_with_no_shared_memory_by_default(scale_fn):
    fn, asked = scale_fn  # the driver answers 3 blocks for any size: the largest block wins
    config = tf.LaunchConfig.auto(fn, 10_000)
    assert (config.grid, config.block, config.shared_mem_bytes) == ((14, 1, 1), (768, 1, 1), 0)
    assert asked[0] == (0x77, 768, 0, "function.occupancy")


def _faulted(*args):
    raise tf.KernelFault(
        f"{args[-1] if isinstance(args[-1], str) else 'cuFuncGetAttribute'}: "
        "the device reported CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        700,
    )


@pytest.mark.parametrize(
    ("driver_call", "ask"),
    [
        ("func_attribute", lambda fn: fn.attributes),
        ("occupancy_blocks", lambda fn: fn.occupancy(64)),
    ],
)
def test_a_fault_a_function_query_sees_stops_the_session(scale_fn, monkeypatch, driver_call, ask):
    from tenferro import module as module_part

    fn, _ = scale_fn
    monkeypatch.setattr(module_part._driver, driver_call, lambda *a: _faulted(*a))
    with pytest.raises(
        tf.KernelFault,
        match=r"CUDA_ERROR_ILLEGAL_ADDRESS; last launches: "
        r"\['k'\]$",
    ):
        ask(fn)
    assert len(fn.state.faults) == 1


def test_a_fault_the_function_lookup_sees_stops_the_session(monkeypatch):
    from tenferro import module as module_part

    d = module_part._driver
    monkeypatch.setattr(d, "module_load_data", lambda image, op: 0xBEEF)
    monkeypatch.setattr(
        d, "module_get_function", lambda module, name: _faulted("cuModuleGetFunction")
    )
    monkeypatch.setattr(
        d, "module_function_names", lambda module: _faulted("cuModuleEnumerateFunctions")
    )
    m = module_part.Module(_Session(), b"img", "cubin", {})
    with pytest.raises(
        tf.KernelFault,
        match=r"^cuModuleEnumerateFunctions: the device "
        r"reported CUDA_ERROR_ILLEGAL_ADDRESS; last "
        r"launches",
    ):
        m.function("scale")  # the module's names are read before the driver is asked for one
    with pytest.raises(tf.KernelFault, match=r"^cuModuleEnumerateFunctions: the device "):
        m.function_names  # noqa: B018 (a property that asks the driver)
    monkeypatch.setattr(d, "module_function_names", lambda module: ["scale"])
    with pytest.raises(
        tf.KernelFault,
        match=r"^cuModuleGetFunction: the device reported "
        r"CUDA_ERROR_ILLEGAL_ADDRESS; last launches",
    ):
        m.function("scale")
    assert len(m.state.faults) == 3
    monkeypatch.setattr(d, "module_get_function", lambda module, name: None)
    monkeypatch.setattr(d, "module_function_names", lambda module: [])
    with pytest.raises(tf.ValidationError, match=r"^module\.function: no kernel named 'scale'"):
        m.function("scale")  # nothing was kept from the failed lookup


def test_an_equal_config_keeps_the_functions_launch_record(monkeypatch):
    import types

    from tenferro import launch_config, module

    made = []

    def record(*args):
        made.append(args)
        return types.SimpleNamespace(address=len(made))

    monkeypatch.setattr(module._driver, "launch_record", record)
    fn = object.__new__(module.Function)
    fn.handle, fn.param_block = 0x10, types.SimpleNamespace(address=0x20)
    fn.record_config = fn.last_config = module._NO_CONFIG
    a = tf.LaunchConfig(8, 64)
    launch_config._made.clear()
    b = tf.LaunchConfig(8, 64)  # equal, another object
    fn.use_config(a, 7)
    fn.use_config(b, 7)
    assert len(made) == 1 and fn.record_address == 1
    assert fn.last_config is b and fn.record_config is b  # the fast path compares with b
    fn.use_config(tf.LaunchConfig(8, 128), 7)  # another config: another record
    assert len(made) == 2 and fn.record_address == 2
    coop = tf.LaunchConfig(8, 64, cooperative=True)
    fn.use_config(coop, 7)
    fn.use_config(tf.LaunchConfig(8, 64, cooperative=True), 7)
    assert len(made) == 3 and fn.last_config is module._NO_CONFIG  # never the fast path


@pytest.mark.parametrize(
    ("registers", "reason"),
    [
        (85, r"it uses 85 registers a thread \(allocated as 88\), 70400 for the block's 25 "),
        (96, r"it uses 96 registers a thread, 76800 for the block's 25 "),
    ],
)
def test_a_block_past_the_devices_registers_names_them_with_the_numbers(
    scale_fn, monkeypatch, registers, reason
):
    from tenferro import module as module_part
    from tenferro.launch_config import check_against

    fn, asked = scale_fn
    attributes = dict(_FUNC_ATTRIBUTES, NUM_REGS=registers)
    monkeypatch.setattr(module_part._driver, "func_attribute", lambda h, name: attributes[name])
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: block=\(769, 1, 1\) has 769 threads but 'scale' allows at "
        r"most 768: " + reason + r"warps, past the 65536 a block has on this device$",
    ):
        check_against(tf.LaunchConfig(1, 769), fn, "session.launch")
    check_against(tf.LaunchConfig(1, 768), fn, "session.launch")  # the limit itself is taken
    assert asked == [] and fn.dynamic_shared_limit == 48 * 1024 - 1024
