import unittest.mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tenferro as tf
from tenferro import compiler
from tenferro.signature import BYTES, FLOAT, INT, PTR, PTR_OR_INT, parse_ptx

SRC = r"""
#include <cuda_fp16.h>
struct P { float a; int b; double c; };
extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void mixed(long long q, double d, char c, short s, __half h, P p,
                                 int* out) {
    out[0] = q + d + c + s + __half2float(h) + p.a + p.b + p.c;
}
"""


def test_parse_ptx_from_nvrtc_gives_every_entry():
    sigs = parse_ptx(tf.compile_cuda(SRC, target="ptx", arch="compute_90").ptx)
    assert set(sigs) == {"axpy", "mixed"}
    axpy = sigs["axpy"]
    assert [p.kind for p in axpy.params] == [PTR_OR_INT, PTR_OR_INT, FLOAT, INT]
    assert [p.size for p in axpy.params] == [8, 8, 4, 4]
    mixed = sigs["mixed"]
    assert [p.kind for p in mixed.params] == [PTR_OR_INT, FLOAT, INT, INT, BYTES, BYTES, PTR_OR_INT]
    assert [p.size for p in mixed.params] == [8, 8, 1, 2, 2, 16, 8]
    assert mixed.params[5].align == 8


def test_source_refines_pointers_and_signedness():
    sigs = tf.compile_cuda(SRC).signatures
    axpy, mixed = sigs["axpy"], sigs["mixed"]
    assert axpy.origin == "cuda"
    assert [p.kind for p in axpy.params] == [PTR, PTR, FLOAT, INT]
    assert axpy.params[3].scalar.name == "u32"
    assert [p.kind for p in mixed.params][:5] == [INT, FLOAT, INT, INT, FLOAT]
    assert mixed.params[0].scalar.name == "i64"
    assert mixed.params[4].scalar.name == "f16"
    assert mixed.params[5].kind == BYTES  # a struct stays raw bytes
    assert mixed.params[6].kind == PTR


def test_parse_hand_written_ptx_with_ptr_annotation_and_arrays():
    ptx = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(
    .param .u64 .ptr .global .align 16 k_param_0,
    .param .s32 k_param_1,
    .param .align 4 .b8 k_param_2[12],
    .param .f64 k_param_3
)
{ ret; }
.visible .entry empty()
{ ret; }
"""
    sigs = parse_ptx(ptx)
    assert [p.kind for p in sigs["k"].params] == [PTR, INT, BYTES, FLOAT]
    assert sigs["k"].params[2].size == 12 and sigs["k"].params[2].align == 4
    assert sigs["empty"].params == ()


def test_unknown_ptx_type_is_refused_not_guessed():
    with pytest.raises(tf.ValidationError, match=r"parse_ptx.*\.pred"):
        parse_ptx(".visible .entry k(.param .pred k_param_0) { ret; }")


def test_ptx_without_an_entry_is_refused_naming_the_caller():
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.load_ptx: the text has no \.entry "
        r"\(no kernel to launch\).* this starts "
        r"'extern \"C\" __global__",
    ):
        parse_ptx('extern "C" __global__ void k() {}', "session.load_ptx")
    with pytest.raises(tf.ValidationError, match=r"signature\.parse_ptx: the text has no \.entry"):
        parse_ptx(".version 8.0\n.target sm_90\n.address_size 64\n")
    # A source of device functions only compiles: compile_cuda asks for no entry.
    assert parse_ptx(".version 8.0\n.target sm_90\n", require_entry=False) == {}
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.load_ptx: entry 'k' has a parameter "
        r"of PTX type \.pred",
    ):
        parse_ptx(".visible .entry k(.param .pred k_param_0) { ret; }", "session.load_ptx")


_PTX_TYPES = {
    ".u8": (INT, 1),
    ".s8": (INT, 1),
    ".u16": (INT, 2),
    ".s16": (INT, 2),
    ".u32": (INT, 4),
    ".s32": (INT, 4),
    ".b32": (INT, 4),
    ".u64": (PTR_OR_INT, 8),
    ".s64": (PTR_OR_INT, 8),
    ".b64": (PTR_OR_INT, 8),
    ".f32": (FLOAT, 4),
    ".f64": (FLOAT, 8),
}
_idents = st.from_regex(r"[A-Za-z_][A-Za-z0-9_$]{0,20}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(_idents, st.lists(st.sampled_from(sorted(_PTX_TYPES)), max_size=8)),
        min_size=1,
        max_size=4,
        unique_by=lambda e: e[0],
    ),
    st.sampled_from([" ", "\n", "\n\t", "  \n  "]),
)
def test_ptx_entries_parse_to_their_parameter_lists(entries, sep):
    text = ".version 8.0\n.target sm_90\n.address_size 64\n"
    for name, types in entries:
        params = f",{sep}".join(f".param {t} {name}_param_{i}" for i, t in enumerate(types))
        text += f".visible .entry {name}({sep}{params}{sep})\n{{\n\tret;\n}}\n"
    sigs = parse_ptx(text, "session.load_ptx")
    assert list(sigs) == [name for name, _ in entries]
    for name, types in entries:
        got = [(p.kind, p.size, p.name) for p in sigs[name].params]
        assert got == [(*_PTX_TYPES[t], f"{name}_param_{i}") for i, t in enumerate(types)]


# --- the C declaration reader on generated kernels, compiled by NVRTC (no GPU) -------------------

_C_SCALARS = {
    "float": ("float", "f32"),
    "double": ("float", "f64"),
    "int": ("int", "i32"),
    "unsigned": ("int", "u32"),
    "unsigned int": ("int", "u32"),
    "long long": ("int", "i64"),
    "unsigned long long": ("int", "u64"),
    "short": ("int", "i16"),
    "unsigned char": ("int", "u8"),
    "size_t": ("int", "u64"),
    "int64_t": ("int", "i64"),
    "uint32_t": ("int", "u32"),
}
_C_POINTEES = ["float", "const float", "double", "const int", "unsigned char"]
_COMMENTS = ["", " /* in, out */", " // a, b (c)\n", " /* (x, y) */", " // ,\n"]


@st.composite
def kernel_params(draw):
    n = draw(st.integers(0, 6))
    params = []
    for i in range(n):
        if draw(st.booleans()):
            ctype = draw(st.sampled_from(sorted(_C_SCALARS)))
            want = _C_SCALARS[ctype]
        else:
            ctype = draw(st.sampled_from(_C_POINTEES)) + draw(
                st.sampled_from(["*", "* __restrict__"])
            )
            want = ("ptr", None)
        params.append((ctype, f"p{i}", draw(st.sampled_from(_COMMENTS)), want))
    return params


@settings(max_examples=25, deadline=None)
@given(kernel_params())
def test_c_declarations_refine_the_ptx_even_with_comments_in_the_list(params):
    # Where the C-type probe cannot name the kernel (inside a namespace it is not told of),
    # the declaration reader is what refines the PTX.
    decl = ",".join(f"{c} {name}{comment}" for c, name, comment, _ in params)
    src = (
        "typedef long long int64_t;\ntypedef unsigned int uint32_t;\n"
        f'namespace inner {{ extern "C" __global__ void k({decl}) {{}} }}\n'
    )
    with unittest.mock.patch.object(compiler, "qualified_kernel_names", lambda source: {}):
        sig = tf.compile_cuda(src, arch="compute_90", target="ptx", cache=False).signatures["k"]
    assert sig.origin == "cuda" or not params
    assert all(p.c_type is None for p in sig.params)
    got = [(p.kind, p.scalar.name if p.scalar is not None else None) for p in sig.params]
    assert got == [want for *_, want in params], src


def test_a_signature_reads_as_a_parameter_list():
    from tenferro.dtypes import by_name
    from tenferro.signature import FLOAT, PTR, Param, Signature

    sig = Signature(
        "k",
        (
            Param(PTR, 8, 8, name="out", writes=True),
            Param(PTR, 8, 8, name="x", writes=False),
            Param(PTR, 8, 8),
            Param(FLOAT, 4, 4, by_name("f32"), "a"),
        ),
        "numba",
    )
    assert repr(sig) == (
        "Signature(k(pointer out (written), pointer x (read), pointer, f32 a), from numba)"
    )
    assert repr(sig.params[3]) == "<f32 a>"
    r = tf.compile_cuda(
        'extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) {}'
    )
    assert repr(r.signatures["axpy"]) == (
        "Signature(axpy(float* y, const float* x, float a, unsigned int n), from cuda)"
    )


def test_compiled_kernels_know_each_parameters_c_type_from_the_compiler():
    from tenferro.mangling import CType

    src = r"""
#include <cuda_fp16.h>
struct S { int a; float b; };
extern "C" __global__ void c_kernel(float* y, const float* /* , a comma */ x, __half h,
                                    const S* s, unsigned long long n) {}
extern "C" __global__ void no_params() {}
namespace ns { template<typename T> __global__ void cpp(T* o, const T* i, int n) {} }
"""
    r = tf.compile_cuda(src, name_expressions=["ns::cpp<double>"], cache=False)
    c = r.signatures["c_kernel"]
    assert [p.c_type.spell() for p in c.params] == [
        "float*",
        "const float*",
        "__half",
        "const S*",
        "unsigned long long",
    ]
    assert c.params[1].c_type.pointee.is_const
    assert c.params[0].c_type.pointee == CType("builtin", "float")
    assert r.signatures["no_params"].params == ()
    cpp = r.signatures[r.lowered_names["ns::cpp<double>"]]
    assert [p.c_type.spell() for p in cpp.params] == ["double*", "const double*", "int"]
    # What PTX says is kept: the kinds and sizes the launch checks read.
    assert [p.kind for p in c.params] == ["ptr", "ptr", "float", "ptr", "int"]


def test_extern_c_kernels_in_namespaces_know_their_c_types():
    # The probe names each with its namespaces, so its pointers are checked by dtype.
    src = (
        'extern "C" __global__ void top(float* y, int n) {}\n'
        'namespace ops { extern "C" __global__ void inner(double* y, const float* x) {} }\n'
        "namespace a { namespace b { struct S { int v; };\n"
        '  extern "C" __global__ void deep(short* y, const S* s) {} } }\n'
        'namespace c::d { extern "C" __global__ void cpp17(unsigned char* y) {} }\n'
        'namespace e { inline namespace v1 { extern "C" __global__ void inl(long long* y) {} '
        "} }\n"
    )
    sigs = tf.compile_cuda(src, cache=False).signatures
    assert {k: [p.c_type.spell() for p in sig.params] for k, sig in sigs.items()} == {
        "top": ["float*", "int"],
        "inner": ["double*", "const float*"],
        "deep": ["short*", "const a::b::S*"],
        "cpp17": ["unsigned char*"],
        "inl": ["long long*"],
    }
    from tenferro.args import ParamBlock
    from tenferro.dtypes import by_name

    # what a launch checks a span against: float64 for y, float32 for x
    assert ParamBlock(sigs["inner"]).elements == (
        frozenset({by_name("f64")}),
        frozenset({by_name("f32")}),
    )


def test_a_kernel_the_probe_cannot_name_keeps_what_ptx_says_alone():
    # A macro declares one in a namespace the text does not show: &k does not resolve at the
    # end of the source, so it keeps PTX's view, and it alone: the others are probed apart.
    src = (
        '#define IN_NS(name) namespace hidden { extern "C" __global__ void name(float* y, '
        'int n) {} }\nIN_NS(k)\nextern "C" __global__ void seen(float* y) {}\n'
    )
    r = tf.compile_cuda(src, cache=False)
    assert [p.c_type for p in r.signatures["k"].params] == [None, None]
    assert [p.kind for p in r.signatures["k"].params] == ["ptr_or_int64", "int"]
    assert [p.c_type.spell() for p in r.signatures["seen"].params] == ["float*"]


def test_kernels_are_named_with_the_namespaces_the_text_puts_them_in():
    from tenferro.signature import qualified_kernel_names

    src = r"""extern "C" __global__ void top(float* y) { if (y) { y[0] = 1; } }
namespace ops {
  #  define OPENS {
#define CONTINUED(x) \
    {
// namespace fake { extern "C" __global__ void commented(int*) {}
extern "C" __global__ void __launch_bounds__(128) inner(const char* s) { printf("{", '{'); }
namespace { __global__ void in_unnamed(int* y) {} }
}
namespace a::b { namespace c { __global__ void deep(int* y) {} } }
namespace e::inline v2 { __global__ void versioned(int* y) {} }
__global__ void after(float* y) {}
"""
    assert qualified_kernel_names(src) == {
        "inner": "ops::inner",
        "in_unnamed": "ops::in_unnamed",
        "deep": "a::b::c::deep",
        "versioned": "e::v2::versioned",
    }
    assert qualified_kernel_names("}}} __global__ void k(int* y) {}") == {}  # stray braces


@pytest.mark.parametrize(
    ("decl", "name"),
    [
        ("float* y", "y"),
        ("const float* __restrict__ x", "x"),
        ("unsigned n", "n"),
        ("int n = 4", "n"),
        ("float v[4]", "v"),
        ("const S* p", "p"),
        ("S s", "s"),
        ("ns::P p", "p"),
        ("const float* const* pp", "pp"),
        ("__half h", "h"),
        ("unsigned", ""),
        ("float*", ""),
        ("ns::P", ""),
        ("unsigned long long", ""),
        ("const float*", ""),
        ("int32_t", ""),
        ("const uint64_t", ""),
        ("int x = a == b", "x"),
        ("volatile unsigned", ""),
    ],
)
def test_a_parameters_name_is_read_from_its_declaration(decl, name):
    from tenferro.signature import _decl_name

    assert _decl_name(decl) == name


@pytest.mark.parametrize(
    ("decl", "kind", "scalar"),
    [
        ("int n", "int", "i32"),
        ("unsigned   int\n n", "int", "u32"),
        ("const unsigned int n", "int", "u32"),
        ("unsigned long int x", "int", "u64"),
        ("long long int q", "int", "i64"),
        ("volatile unsigned short s", "int", "u16"),
        ("double __restrict__ d", "float", "f64"),
        ("const __half h", "float", "f16"),
        ("size_t m", "int", "u64"),
    ],
)
def test_the_declaration_reader_takes_scalars_by_their_c_names(decl, kind, scalar):
    from tenferro.signature import _c_param

    p = _c_param(decl)
    size = {"i32": 4, "u32": 4, "u64": 8, "i64": 8, "u16": 2, "f64": 8, "f16": 2}[scalar]
    assert (p.kind, p.size, p.align, p.scalar.name) == (kind, size, size, scalar)


@pytest.mark.parametrize("decl", ["float* p", "const float * __restrict__ p", "S** pp", "void*"])
def test_the_declaration_reader_takes_any_star_as_a_pointer(decl):
    from tenferro.signature import _c_param

    p = _c_param(decl)
    assert (p.kind, p.size, p.align, p.scalar) == ("ptr", 8, 8, None)


@pytest.mark.parametrize("decl", ["int", "S s", "Vec<float, 4> v", "unsigned __int128 x", ""])
def test_the_declaration_reader_leaves_what_it_cannot_read(decl):
    from tenferro.signature import _c_param

    assert _c_param(decl) is None


def test_declared_names_reach_the_signature_and_unnamed_ones_have_none():
    src = (
        'extern "C" __global__ void k(float* out, /* a, b */ const float* in, int /*unused*/,\n'
        "                             unsigned long long count = 7) {}"
    )
    r = tf.compile_cuda(src, cache=False)
    assert [p.name for p in r.signatures["k"].params] == ["out", "in", "", "count"]


# (declaration, the C type the compiler reports, the name read from the declaration)
DECLARATIONS = [
    ("bool b", "bool", "b"),
    ("char c", "char", "c"),
    ("signed char sc", "signed char", "sc"),
    ("unsigned char uc", "unsigned char", "uc"),
    ("short s", "short", "s"),
    ("unsigned short us", "unsigned short", "us"),
    ("int i", "int", "i"),
    ("unsigned u", "unsigned int", "u"),
    ("long l", "long", "l"),
    ("unsigned long ul", "unsigned long", "ul"),
    ("size_t sz", "unsigned long", "sz"),
    ("long long ll", "long long", "ll"),
    ("unsigned long long ull", "unsigned long long", "ull"),
    ("float f", "float", "f"),
    ("double d", "double", "d"),
    ("__half h", "__half", "h"),
    ("__nv_bfloat16 bh", "__nv_bfloat16", "bh"),
    ("float2 f2", "float2", "f2"),
    ("int4 i4", "int4", "i4"),
    ("S st", "S", "st"),
    ("const S* sp", "const S*", "sp"),
    ("float* y", "float*", "y"),
    ("const float* x", "const float*", "x"),
    ("const double* __restrict__ r", "const double*", "r"),
    ("int** pp", "int**", "pp"),
    ("const float* const* cpp", "const float* const*", "cpp"),
    ("void* v", "void*", "v"),
    ("const void* cv", "const void*", "cv"),
    ("unsigned char* bytes", "unsigned char*", "bytes"),
    ("const __half* hp", "const __half*", "hp"),
    ("float4* f4p", "float4*", "f4p"),
    ("/* a comment, with a comma */ int after_comment", "int", "after_comment"),
    ("int /* unnamed */", "int", ""),
    ("int last = 3", "int", "last"),
]


def test_a_table_of_declarations_reads_back_as_written():
    params = ",\n    ".join(d for d, _, _ in DECLARATIONS)
    src = (
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
        "struct S { int a; float b; };\n"
        f'extern "C" __global__ void k(\n    {params}) {{}}\n'
    )
    sig = tf.compile_cuda(src, cache=False).signatures["k"]
    got = [(p.c_type.spell(), p.name) for p in sig.params]
    assert got == [(c, n) for _, c, n in DECLARATIONS]
    assert len(DECLARATIONS) >= 30


def test_a_macro_in_the_parameter_list_keeps_the_compilers_types():
    src = (
        "#define PTR(T, name) T* name\n"
        'extern "C" __global__ void m(PTR(float, y), const int n) {}\n'
    )
    sig = tf.compile_cuda(src, cache=False).signatures["m"]
    assert [p.c_type.spell() for p in sig.params] == ["float*", "int"]
    from tenferro.signature import INT, PTR

    assert [p.kind for p in sig.params] == [PTR, INT]  # the compiler settles PTX's .u64


VECTORS = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
struct P { int a; };
template <typename T, int N> struct Vec { T v[N]; };
extern "C" __global__ void v(float2* f2, const float4* f4, double2* d2, const int2* i2,
                             uint4* u4, ulonglong2* ull2, __half2* h2, __nv_bfloat162* b2,
                             short4* s4, P* p, float** pp, Vec<float, 4>* vec, void* raw,
                             const unsigned char* bytes, const signed char* sbytes,
                             unsigned long long n, __half h, bool flag, P byval, char c) {}
"""


def test_each_pointer_takes_the_dtypes_its_element_type_is_made_of():
    from tenferro.signature import element_types

    sig = tf.compile_cuda(VECTORS).signatures["v"]
    got = {
        p.name: (
            None
            if element_types(p.c_type) is None
            else sorted(t.name for t in element_types(p.c_type))
        )
        for p in sig.params
        if p.kind == "ptr"
    }
    assert got == {
        "f2": ["c64", "f32"],
        "f4": ["f32"],
        "d2": ["c128", "f64"],
        "i2": ["i32"],
        "u4": ["u32"],
        "ull2": ["u64"],
        "h2": ["f16"],
        "b2": ["bf16"],
        "s4": ["i16"],
        "p": None,
        "pp": None,
        "vec": None,
        "raw": None,
        "bytes": None,
        "sbytes": ["i8"],
    }


def test_the_c_type_settles_each_parameters_kind_and_scalar():
    sig = tf.compile_cuda(VECTORS).signatures["v"]
    by_name = {p.name: p for p in sig.params}
    assert (by_name["n"].kind, by_name["n"].scalar.name) == ("int", "u64")  # PTX: .u64
    assert (by_name["h"].kind, by_name["h"].scalar.name) == ("float", "f16")  # PTX: .b8[2]
    assert (by_name["flag"].kind, by_name["flag"].scalar.name) == ("int", "bool")
    assert (by_name["c"].kind, by_name["c"].scalar.name) == ("int", "i8")
    assert (by_name["byval"].kind, by_name["byval"].scalar) == ("bytes", None)
    assert by_name["raw"].kind == "ptr" and by_name["vec"].kind == "ptr"


@pytest.mark.parametrize(
    ("entry", "name"),
    [
        ("axpy", "axpy"),
        ("_Z4fillIfEvPT_S0_", "fill<float>"),
        ("_Z2tkIfLi4EEvPT_", "tk<float, 4>"),
        ("_ZN2ns6kernelEPKfm", "ns::kernel"),
        ("_Z3badQQ", "_Z3badQQ"),
    ],
)
def test_a_kernel_is_shown_by_the_name_its_source_gives_it(entry, name):
    from tenferro.signature import display_name

    assert display_name(entry) == name


def test_ptx_parameters_read_with_their_names_arrays_and_half_floats():
    sigs = parse_ptx(
        ".visible .entry k(.param .f32 k_a[3], .param .u64 k_b[2], "
        ".param .f16 k_h, .param .b8 k_s[5])\n{ ret; }"
    )
    k = sigs["k"]
    assert (k.name, k.origin) == ("k", "ptx")
    assert [(p.name, p.kind, p.size, p.align) for p in k.params] == [
        ("k_a", BYTES, 12, 4),
        ("k_b", BYTES, 16, 8),
        ("k_h", FLOAT, 2, 2),
        ("k_s", BYTES, 5, 1),
    ]
    assert k.params[2].scalar.name == "f16"


def test_a_text_without_entries_is_quoted_from_its_first_character():
    text = "\n\n   // forty characters of a comment, and then some more text"
    with pytest.raises(tf.ValidationError) as info:
        parse_ptx(text, "op")
    assert str(info.value).endswith(f"this starts {text.lstrip()[:40]!r}")


@pytest.mark.parametrize(
    ("param", "text"),
    [
        ("u32", "32-bit int"),
        ("s8", "8-bit int"),
        ("f64", "f64"),
        ("u64", "pointer or 64-bit integer"),
    ],
)
def test_a_ptx_parameter_describes_itself_in_refusals(param, text):
    sig = parse_ptx(f".visible .entry k(.param .{param} k_p)\n{{ ret; }}")["k"]
    assert sig.params[0].describe() == text


def test_a_cubins_parameters_are_aligned_as_the_driver_laid_them_out():
    from tenferro.signature import OPAQUE, from_driver_layout

    layout = [(0, 8), (8, 4), (12, 4), (16, 16), (32, 2), (34, 1), (36, 12), (48, 8), (64, 32)]
    sig = from_driver_layout("k", layout)
    assert (sig.name, sig.origin) == ("k", "driver")
    assert [(p.kind, p.size, p.align) for p in sig.params] == [
        (OPAQUE, 8, 8),
        (OPAQUE, 4, 4),
        (OPAQUE, 4, 4),
        (OPAQUE, 16, 16),
        (OPAQUE, 2, 2),
        (OPAQUE, 1, 1),
        (OPAQUE, 12, 4),
        (OPAQUE, 8, 8),
        (OPAQUE, 32, 16),
    ]


@pytest.mark.parametrize(
    ("arglist", "parts"),
    [
        ("int a, float b", ["int a", " float b"]),
        ("Vec<float, 4> v, int n", ["Vec<float, 4> v", " int n"]),
        (
            "A<B<c, d>, e> x, int (*f)(int, int), int y[3], S s = {1, 2}",
            ["A<B<c, d>, e> x", " int (*f)(int, int)", " int y[3]", " S s = {1, 2}"],
        ),
        ("", [""]),
        ("XVec a, int n", ["XVec a", " int n"]),  # a letter is never a bracket
    ],
)
def test_a_parameter_list_splits_at_its_top_level_commas(arglist, parts):
    from tenferro.signature import _split_params

    assert _split_params(arglist) == parts


def test_a_probe_that_names_no_function_pointer_leaves_that_kernel_alone():
    from tenferro.signature import with_c_types

    sigs = parse_ptx(
        ".visible .entry c(.param .u64 c_param_0)\n{ ret; }\n"
        ".visible .entry _Zq(.param .u64 q_param_0)\n{ ret; }\n"
        ".visible .entry a(.param .u64 a_param_0)\n{ ret; }\n"
        ".visible .entry b(.param .u64 b_param_0)\n{ ret; }"
    )
    probes = {
        "a": "_Z21__tenferro_c_types_ofIiEvv",  # T = int: not a pointer to a kernel
        "b": "_Z21__tenferro_c_types_ofIPFvPfEEvv",
    }  # T = void (*)(float*)
    out = with_c_types(sigs, probes)  # c has no probe, _Zq does not read: the rest still are
    assert out["a"] == sigs["a"] and out["c"] == sigs["c"] and out["_Zq"] == sigs["_Zq"]
    assert [(p.kind, p.c_type.spell(), p.name) for p in out["b"].params] == [("ptr", "float*", "")]


@pytest.mark.parametrize(
    ("src", "want"),
    [
        ('namespace n { extern "C" __global__ void k(void) {} }', []),
        ('namespace n { extern "C" __global__ void k() {} }', []),
        (
            'namespace n { extern "C" __global__ void k(float*, int n) {} }',  # unnamed: no name
            [("", "ptr", 8, None), ("n", "int", 4, "i32")],
        ),
        (
            "#include <cuda_fp16.h>\n"
            'namespace n { extern "C" __global__ void k(__half h, unsigned m, '
            "float* p, long long q, double d) {} }",
            [
                ("h", "float", 2, "f16"),
                ("m", "int", 4, "u32"),
                ("p", "ptr", 8, None),
                ("q", "int", 8, "i64"),
                ("d", "float", 8, "f64"),
            ],
        ),
    ],
)
def test_the_declaration_reader_types_what_the_probe_cannot_name(src, want, monkeypatch):
    # Where the probe is not told the namespace, &k does not resolve: the text's declaration
    # is all there is, __half (a .b8 array in PTX) included.
    monkeypatch.setattr(compiler, "qualified_kernel_names", lambda source: {})
    sig = tf.compile_cuda(src, cache=False).signatures["k"]
    assert all(p.c_type is None for p in sig.params)
    assert sig.origin == "cuda"  # read from the declaration, () and (void) alike
    assert [
        (p.name, p.kind, p.size, p.scalar.name if p.scalar else None) for p in sig.params
    ] == want


def test_comments_become_spaces_and_literals_stay():
    from tenferro.signature import _without_comments

    assert _without_comments("a /* x, y */ b // c, d\n\"e // f\" '/'") == "a   b  \n\"e // f\" '/'"


def test_a_kernel_in_nested_namespaces_takes_its_parameter_names():
    r = tf.compile_cuda(
        "namespace a { namespace b {\n__global__ void k(float* y, int n) { y[0] = n; } } }",
        arch="sm_90",
    )
    ((entry, sig),) = r.signatures.items()
    assert entry == "_ZN1a1b1kEPfi" and [p.name for p in sig.params] == ["y", "n"]


def test_a_cpp_kernel_declared_through_a_macro_keeps_the_compilers_types():
    r = tf.compile_cuda(
        "#define KERNEL(name) __global__ void name(float* y, int n)\nKERNEL(k) { y[0] = n; }",
        arch="sm_90",
    )
    ((entry, sig),) = r.signatures.items()
    assert entry == "_Z1kPfi"
    assert [(p.c_type.spell(), p.name) for p in sig.params] == [("float*", ""), ("int", "")]
