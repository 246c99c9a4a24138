"""Module variables (tenferro.variables): their C types from the compiler without a GPU, the
span `module.variable` makes through a stand-in driver, and on a GPU read, written and passed."""

import numpy as np
import pytest
from _stand_ins import RecordsFaults

import tenferro as tf
from tenferro import dtypes
from tenferro import variables as variables_part

VARIABLES = r"""
#include <cuda_fp16.h>
struct P { float a; int b; };
__device__ float table[256];
__constant__ double coeffs[4];
__device__ int counter;
__device__ float grid2[4][8];
__device__ __half hs[8];
__device__ float2 v2[3];
__device__ P pts[2];
__device__ float* where;
static __device__ unsigned hidden[2];
__device__ const long long big = 5;
namespace ns { __device__ unsigned flags[8]; }
namespace other { __device__ float flags[2]; }
namespace { __device__ int anon[3]; }
extern "C" __global__ void use(float* out) {
    unsigned i = threadIdx.x;
    out[i] = table[i] * coeffs[i % 4] + counter + grid2[1][2] + (float)hs[0] + v2[0].x
             + pts[0].a + *where + hidden[0] + big + ns::flags[1] + other::flags[0] + anon[0];
    printf("%d\n", 1);
}
"""


def _table(variables):
    return {
        v.c_name: (v.space, v.nbytes, v.scalar_type and v.scalar_type.name, v.shape, v.c_type)
        for v in variables.values()
    }


def test_each_variable_has_the_type_its_declaration_gives():
    r = tf.compile_cuda(VARIABLES, arch="sm_90")
    assert _table(r.variables) == {
        "table": ("global", 1024, "f32", (256,), "float[256]"),
        "coeffs": ("const", 32, "f64", (4,), "double[4]"),
        "counter": ("global", 4, "i32", (), "int"),
        "grid2": ("global", 128, "f32", (4, 8), "float[4][8]"),
        "hs": ("global", 16, "f16", (8,), "__half[8]"),
        "v2": ("global", 24, None, (24,), "float2[3]"),
        "pts": ("global", 16, None, (16,), "P[2]"),
        "where": ("global", 8, None, (8,), "float*"),
        "hidden": ("global", 8, "u32", (2,), "unsigned int[2]"),
        "big": ("global", 8, "i64", (), "const long long"),
        "ns::flags": ("global", 32, "u32", (8,), "unsigned int[8]"),
        "other::flags": ("global", 8, "f32", (2,), "float[2]"),
        "(anonymous namespace)::anon": ("global", 12, None, (12,), ""),  # no name reaches it
    }
    decls = {v.c_name: v.declaration() for v in r.variables.values()}
    assert decls["grid2"] == "__device__ float grid2[4][8]"
    assert decls["coeffs"] == "__constant__ double coeffs[4]"
    assert decls["big"] == "__device__ const long long big"
    assert (
        decls["(anonymous namespace)::anon"] == "__device__ (anonymous namespace)::anon (12 bytes)"
    )
    assert r.signatures["use"].declaration() == "use(float* out)"  # kernels keep their types


def test_variables_come_back_from_the_cache_as_they_were_compiled():
    first = tf.compile_cuda(VARIABLES, arch="sm_90")
    again = tf.compile_cuda(VARIABLES, arch="sm_90")
    assert again.from_cache and not first.from_cache
    assert again.variables == first.variables


def test_a_source_without_variables_has_none():
    r = tf.compile_cuda('extern "C" __global__ void k(float* y) { y[0] = 1.0f; }', arch="sm_90")
    assert r.variables == {}


PTX = r"""
.version 8.0
.target sm_90
.address_size 64
.global .texref tex;
.global .align 4 .f32 x;
.const .align 8 .f64 y[4];
.visible .global .align 4 .s32 z = 3;
.weak .global .align 2 .u16 w[5];
.global .align 1 .b8 $str[4] = {37, 100, 10};
.extern .global .align 4 .f32 elsewhere;
.global .align 8 .b64 handle;
.global .align 4 .b8 blob[12];
.visible .entry k(.param .u64 k_param_0)
{
    ld.global.f32 %f1, [x];
    ret;
}
"""


def test_ptx_says_what_it_can_of_each_variable_it_defines():
    assert _table(variables_part.ptx_variables(PTX)) == {
        "x": ("global", 4, "f32", (), ""),
        "y": ("const", 32, "f64", (4,), ""),
        "z": ("global", 4, "i32", (), ""),
        "w": ("global", 10, "u16", (5,), ""),
        "handle": ("global", 8, None, (8,), ""),
        "blob": ("global", 12, None, (12,), ""),
    }  # no $str, no .extern declaration, no texture reference


def test_a_c_type_that_does_not_agree_with_ptx_or_does_not_read_is_not_used():
    v = {
        "a": variables_part.Variable("a", "global", 8, None, (8,)),
        "b": variables_part.Variable("b", "global", 8, None, (8,)),
        "b2": variables_part.Variable("b2", "global", 4, None, (4,)),
    }
    probes = {
        "gone": "_Z1fv",  # a name the module lacks first: the others are still read
        "b2": "_Z29__tenferro_c_type_of_variableIiEvv",  # T = int: no pointer to read
        "b": "_Z29__tenferro_c_type_of_variableIPA4_",  # cut off: does not read
        "a": "_Z29__tenferro_c_type_of_variableIPA4_fEvv",
    }  # float[4]: 16 bytes, not 8
    out = variables_part.with_c_types(v, probes)
    assert out["a"] == variables_part.Variable("a", "global", 8, None, (8,), "float[4]")
    assert out["b"] == v["b"] and out["b2"] == v["b2"] and set(out) == {"a", "b", "b2"}


def test_only_names_the_end_of_the_source_can_reach_are_probed():
    v = variables_part.ptx_variables(  # one the probe cannot name first: the rest still are
        ".global .align 4 .b8 _ZN12_INTERNAL_ab17_GLOBAL__N__ab_x4anonE[12];\n"
        ".global .align 4 .b8 _ZN2ns5flagsE[32];\n.global .align 4 .f32 t;\n"
    )
    assert variables_part.probe_expressions(v) == {
        "_ZN2ns5flagsE": "__tenferro_c_type_of_variable<decltype(&ns::flags)>",
        "t": "__tenferro_c_type_of_variable<decltype(&t)>",
    }


# --- module.variable through a stand-in driver ------------------------------------------------


class _Session(RecordsFaults):
    device = 3

    def __init__(self):
        self.used, self.faults = [], []

    def check_use(self, op):
        self.used.append(op)


class _Module:
    """What module.variable reads of a Module."""

    handle = 0xAB

    def __init__(self, variables):
        self.state = _Session()
        self.variables = variables

    variable = variables_part.module_variable


@pytest.fixture
def compiled_variables():
    return tf.compile_cuda(VARIABLES, arch="sm_90").variables


class _Driver:
    """The stand-in driver: each variable of ``sizes`` at 0x10000 plus a multiple of 4096."""

    def __init__(self):
        self.sizes, self.asked = {}, []

    def module_get_global(self, handle, name, op):
        self.asked.append((handle, name, op))
        if name not in self.sizes:
            raise tf.BackendError(
                f"{op}: cuModuleGetGlobal failed: CUDA_ERROR_NOT_FOUND", "CUDA_ERROR_NOT_FOUND", 500
            )
        return 0x10000 + 4096 * sorted(self.sizes).index(name), self.sizes[name]


@pytest.fixture
def globals_at(monkeypatch):
    driver = _Driver()
    monkeypatch.setattr(variables_part._driver, "module_get_global", driver.module_get_global)
    return driver


def _sizes(variables):
    return {v.name: v.nbytes for v in variables.values()}


def test_a_typed_variable_is_a_writable_span_of_its_elements(compiled_variables, globals_at):
    globals_at.sizes = _sizes(compiled_variables)
    m = _Module(compiled_variables)
    grid = m.variable("grid2")
    assert type(grid) is tf.TensorMut and grid.owner is m and grid.state is m.state
    assert (grid.shape, grid.strides, grid.dtype, grid.nbytes) == ((4, 8), (32, 4), np.float32, 128)
    assert grid.ptr == 0x10000 + 4096 * sorted(globals_at.sizes).index("grid2")
    assert grid.device == 3
    assert m.variable("counter").shape == () and m.variable("big").dtype == np.int64
    assert globals_at.asked[0] == (0xAB, "grid2", "module.variable")
    assert m.state.used == ["module.variable"] * 3


@pytest.mark.parametrize("name", ["ns::flags", "::ns::flags", "_ZN2ns5flagsE"])
def test_a_namespaced_variable_is_found_by_its_qualified_or_entry_name(
    compiled_variables, globals_at, name
):
    globals_at.sizes = _sizes(compiled_variables)
    span = _Module(compiled_variables).variable(name)
    assert span.dtype == np.uint32 and span.shape == (8,)
    assert globals_at.asked[-1][1] == "_ZN2ns5flagsE"


def test_an_unqualified_name_that_two_namespaces_share_is_refused(compiled_variables, globals_at):
    globals_at.sizes = _sizes(compiled_variables)
    with pytest.raises(
        tf.ValidationError,
        match=r"^module\.variable: 'flags' names several variables of this "
        r"module: ns::flags, other::flags; give the qualified name$",
    ):
        _Module(compiled_variables).variable("flags")
    assert globals_at.asked == []
    assert _Module(compiled_variables).variable("anon").nbytes == 12  # the one there is


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("flags", "flags"),
        ("::flags", "flags"),  # the global one: its own name
        ("ns::flags", "_ZN2ns5flagsE"),  # exact, though x::ns::flags ends so too
        ("::ns::flags", "_ZN2ns5flagsE"),
        ("deep", "_ZN1a1b4deepE"),
        ("b::deep", "_ZN1a1b4deepE"),  # the end of a qualified name
    ],
)
def test_an_exact_name_wins_over_the_end_of_another(globals_at, name, entry):
    v = variables_part.ptx_variables(
        ".global .align 4 .f32 flags;\n.global .align 4 .u32 _ZN2ns5flagsE;\n"
        ".global .align 4 .u32 _ZN1x2ns5flagsE;\n.global .align 4 .u32 _ZN1a1b4deepE;\n"
    )
    globals_at.sizes = {e: 4 for e in v}
    _Module(v).variable(name)
    assert [e for _, e, _ in globals_at.asked] == [entry]


@pytest.mark.parametrize(
    ("name", "msg"),
    [
        ("::deep", r"'::deep' is not a variable of this module"),  # no global deep
        ("b", r"'b' is not a variable"),  # a namespace is not its end
    ],
)
def test_a_qualified_name_matches_whole_names_only(globals_at, name, msg):
    globals_at.sizes = {"_ZN1a1b4deepE": 4}
    with pytest.raises(tf.ValidationError, match=r"^module\.variable: " + msg):
        _Module(variables_part.ptx_variables(".global .align 4 .u32 _ZN1a1b4deepE;\n")).variable(
            name
        )


def test_a_missing_variable_lists_those_the_module_has(globals_at):
    globals_at.sizes = {"t": 4}
    m = _Module(variables_part.ptx_variables(".global .align 4 .f32 t;\n.const .align 4 .u32 u;\n"))
    with pytest.raises(
        tf.ValidationError,
        match=r"^module\.variable: 'tabel' is not a "
        r"variable of this module \(it has: t, u\)$",
    ):
        m.variable("tabel")
    bare = _Module({})
    with pytest.raises(tf.ValidationError, match=r"\(it has: none known\)$"):
        bare.variable("t2")


def test_a_fault_the_lookup_sees_stops_the_session_and_names_the_last_launches(monkeypatch):
    def faulted(handle, name, op):
        raise tf.KernelFault(
            f"{op}: the device reported CUDA_ERROR_ILLEGAL_ADDRESS",
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            700,
        )

    monkeypatch.setattr(variables_part._driver, "module_get_global", faulted)
    m = _Module({})
    with pytest.raises(
        tf.KernelFault,
        match=r"^module\.variable: the device reported "
        r"CUDA_ERROR_ILLEGAL_ADDRESS; last launches: "
        r"\['k'\]$",
    ):
        m.variable("t")
    assert len(m.state.faults) == 1


def test_other_driver_refusals_pass_through(monkeypatch):
    def refuse(handle, name, op):
        raise tf.BackendError(
            f"{op}: cuModuleGetGlobal failed: CUDA_ERROR_INVALID_HANDLE",
            "CUDA_ERROR_INVALID_HANDLE",
            400,
        )

    monkeypatch.setattr(variables_part._driver, "module_get_global", refuse)
    with pytest.raises(tf.BackendError, match=r"CUDA_ERROR_INVALID_HANDLE$"):
        _Module({}).variable("t")


def test_dtype_agrees_with_a_typed_variable_or_is_refused(compiled_variables, globals_at):
    globals_at.sizes = _sizes(compiled_variables)
    m = _Module(compiled_variables)
    assert m.variable("table", dtype=np.float32).shape == (256,)
    assert m.variable("table", dtype=dtypes.by_name("f32")).shape == (256,)
    with pytest.raises(
        tf.ValidationError,
        match=r"^module\.variable: dtype=i32 was asked but "
        r"'table' is float\[256\]$",
    ):
        m.variable("table", dtype=np.int32)
    for name in ("table", "v2"):  # typed or not, a dtype that is none is refused by name
        with pytest.raises(
            tf.ValidationError,
            match=r"^module\.variable: 'nope' is not a "
            r"dtype$",
        ):
            m.variable(name, dtype="nope")
    assert globals_at.asked[-1][1] == "table"  # a bad dtype is refused before the driver


def test_an_untyped_variable_is_bytes_or_the_elements_a_dtype_gives(compiled_variables, globals_at):
    globals_at.sizes = _sizes(compiled_variables)
    m = _Module(compiled_variables)
    raw = m.variable("v2")
    assert type(raw) is tf.DeviceBytes and raw.shape == (24,) and raw.owner is m
    assert (raw.strides, raw.device, raw.state) == ((1,), 3, m.state)
    as_f32 = m.variable("v2", dtype=np.float32)
    assert type(as_f32) is tf.TensorMut and as_f32.shape == (6,) and as_f32.strides == (4,)
    assert type(as_f32.shape[0]) is int and as_f32.nbytes == 24
    assert (as_f32.device, as_f32.owner, as_f32.state) == (3, m, m.state)
    assert m.variable("v2", dtype=np.float64).shape == (3,)  # 24 bytes: 3 doubles
    assert m.variable("pts", dtype=np.complex128).shape == (1,)  # 16 bytes: one element
    with pytest.raises(
        tf.ValidationError,
        match=r"^module\.variable: 'anon' has 12 bytes, "
        r"not a whole number of f64 elements$",
    ):
        m.variable("anon", dtype=np.float64)


def test_a_misaligned_untyped_variable_is_refused_for_wider_elements(globals_at, monkeypatch):
    monkeypatch.setattr(
        variables_part._driver, "module_get_global", lambda handle, name, op: (0x10004, 16)
    )
    m = _Module({})
    assert m.variable("b", dtype=np.float32).shape == (4,)
    with pytest.raises(
        tf.ValidationError,
        match=r"^module\.variable: 'b' is not aligned to 8 "
        r"bytes, as f64 elements must be$",
    ):
        m.variable("b", dtype=np.float64)


def test_a_driver_size_that_disagrees_with_the_declaration_is_an_error(
    compiled_variables, globals_at
):
    globals_at.sizes = {**_sizes(compiled_variables), "table": 1020}
    with pytest.raises(
        tf.BackendError,
        match=r"^module\.variable: the driver gives 'table' 1020 "
        r"bytes; its declaration __device__ float "
        r"table\[256\] has 1024$",
    ):
        _Module(compiled_variables).variable("table")


@pytest.mark.parametrize("bad", [5, None, b"table"])
def test_a_name_that_is_not_a_str_is_refused(bad):
    with pytest.raises(
        tf.ValidationError,
        match=rf"^module\.variable: name must be a str, got {type(bad).__name__}$",
    ):
        _Module({}).variable(bad)


# --- on a GPU ---------------------------------------------------------------------------------

GPU_VARIABLES = r"""
__device__ float table[1000];
__constant__ double coeffs[4];
__device__ unsigned long long hits;
namespace ns { __device__ int offsets[4]; }
extern "C" __global__ void apply(double* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = table[i] * coeffs[i % 4] + ns::offsets[i % 4];
        atomicAdd(&hits, 1ull);
    }
}
extern "C" __global__ void scale(float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= a;
}
"""


@pytest.mark.gpu
def test_variables_are_written_read_and_passed_like_any_span(session, rng):
    m = session.compile(GPU_VARIABLES)
    n = 1000
    table0 = rng.standard_normal(n).astype(np.float32)
    coeffs0 = rng.standard_normal(4)
    offsets0 = rng.integers(-50, 50, 4).astype(np.int32)
    table, coeffs, offsets, hits = (
        m.variable(x) for x in ("table", "coeffs", "ns::offsets", "hits")
    )
    assert (table.shape, coeffs.dtype, offsets.shape, hits.shape) == ((n,), np.float64, (4,), ())
    session.copy(table, session.upload(table0))
    session.copy(coeffs, session.upload(coeffs0))
    session.copy(offsets, session.upload(offsets0))
    session.copy(hits, session.upload(np.array(7, dtype=np.uint64)))
    out = session.upload(np.full(n, np.nan))
    session.launch(
        m.function("apply"), tf.LaunchConfig.flat(n, 128), [session.tensor_mut(out), tf.u32(n)]
    )
    idx = np.arange(n) % 4
    expected = table0.astype(np.float64) * coeffs0[idx] + offsets0[idx]
    np.testing.assert_allclose(session.download(out), expected, rtol=1e-12, atol=1e-12)
    assert int(session.download(hits)) == 7 + n
    session.launch(
        m.function("scale"),
        tf.LaunchConfig.flat(n, 256),
        [m.variable("table"), tf.f32(-2.0), tf.u32(n)],
    )  # passed as a pointer
    np.testing.assert_array_equal(session.download(table), table0 * np.float32(-2.0))
    with pytest.raises(
        tf.ValidationError,
        match=r"^module\.variable: 'tabel' is not a variable "
        r"of this module \(it has: coeffs, hits, "
        r"ns::offsets, table\)$",
    ):
        m.variable("tabel")
    with pytest.raises(tf.ValidationError, match=r"^session\.launch: args\[0\] 'y' is float64"):
        session.launch(
            m.function("scale"),
            tf.LaunchConfig.flat(n, 256),
            [m.variable("coeffs"), tf.f32(1.0), tf.u32(4)],
        )


def test_a_compile_result_lists_its_variables_after_its_kernels():
    r = tf.compile_cuda(
        "__device__ float t[4];\n__constant__ int k;\n"
        'extern "C" __global__ void f(float* y) { y[0] = t[0] + k; }',
        arch="sm_90",
    )
    assert repr(r).endswith(
        "1 kernel(s): f(float* y); 2 variable(s): __constant__ int k; __device__ float t[4])"
    )
    assert variables_part.listed({}) == ""


def test_the_math_librarys_tables_are_not_the_modules_variables_nor_spoil_their_types():
    r = tf.compile_cuda(
        "__device__ float table[4];\n"
        'extern "C" __global__ void k(float* y, double* z) '
        "{ y[0] = sinf(y[1]) + table[0]; z[0] = sin(z[1]); }",
        arch="sm_90",
    )
    assert "__cudart_sin_cos_coeffs" in r.ptx  # sinf's table is in the image, and not listed
    assert _table(r.variables) == {"table": ("global", 16, "f32", (4,), "float[4]")}


def test_a_variable_the_end_of_the_source_cannot_name_costs_only_its_own_type():
    # A macro defined after the declarations hides `hits` from the probe at the end.
    r = tf.compile_cuda(
        "__device__ float table[4];\n__device__ int hits;\n"
        'extern "C" __global__ void k(float* y) { y[0] = table[0] + hits; }\n'
        "#define hits not_declared_anywhere\n",
        arch="sm_90",
    )
    assert _table(r.variables) == {
        "table": ("global", 16, "f32", (4,), "float[4]"),
        "hits": ("global", 4, "u32", (), ""),
    }  # PTX's view: .u32


def test_with_its_source_only_the_variables_it_writes_are_the_modules():
    ptx = (
        ".global .align 4 .f32 mine;\n.global .align 4 .u32 _ZN2ns5flagsE;\n"
        ".global .align 1 .b8 _ZN4cuda3std3__45ignoreE[1];\n"
        ".global .align 1 .b8 _ZN4cuda3std3__417integral_constantIbLb0EE5valueE[1];\n"
        ".global .align 4 .f32 unwritten;\n"
    )
    source = "__device__ float mine; namespace ns { __device__ unsigned flags; } // ignore value"
    assert set(variables_part.ptx_variables(ptx, source)) == {"mine", "_ZN2ns5flagsE"}
    assert len(variables_part.ptx_variables(ptx)) == 5  # PTX loaded as is: every one
