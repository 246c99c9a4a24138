"""The Itanium demangler (tenferro.mangling) against what NVRTC lowers kernel names to."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tenferro as tf
from tenferro.mangling import CType, demangle

HEADER = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
struct S { int a; float b; };
namespace ns { struct P { double x; }; }
template<typename T, int N> struct Vec { T v[N]; };
"""

# (C declaration, how the demangler spells it): the element types a kernel takes.
BASES = [
    ("float", "float"),
    ("double", "double"),
    ("int", "int"),
    ("unsigned", "unsigned int"),
    ("long long", "long long"),
    ("unsigned long long", "unsigned long long"),
    ("short", "short"),
    ("unsigned short", "unsigned short"),
    ("char", "char"),
    ("signed char", "signed char"),
    ("unsigned char", "unsigned char"),
    ("bool", "bool"),
    ("__half", "__half"),
    ("__nv_bfloat16", "__nv_bfloat16"),
    ("S", "S"),
    ("ns::P", "ns::P"),
    ("Vec<float, 4>", "Vec<float, 4>"),
]


@st.composite
def params(draw):
    c, spelled = draw(st.sampled_from(BASES))
    shape = draw(
        st.sampled_from(
            ["value", "ptr", "const ptr", "ptr ptr", "const ptr const ptr", "const value"]
        )
    )
    decl, want = {
        "value": (c, spelled),
        "const value": (f"const {c}", spelled),  # a by-value parameter's const is not mangled
        "ptr": (f"{c}*", f"{spelled}*"),
        "const ptr": (f"const {c}*", f"const {spelled}*"),
        "ptr ptr": (f"{c}**", f"{spelled}**"),
        "const ptr const ptr": (f"const {c}* const*", f"const {spelled}* const*"),
    }[shape]
    return decl, want


@settings(max_examples=25, deadline=None)
@given(st.lists(params(), min_size=1, max_size=6), st.booleans(), st.booleans())
def test_kernels_of_any_parameter_list_demangle_to_their_declarations(ps, in_namespace, restrict):
    decls = ", ".join(
        f"{d}{' __restrict__' if restrict and d.endswith('*') else ''} p{i}"
        for i, (d, _) in enumerate(ps)
    )
    body = f"__global__ void kern({decls}) {{}}"
    src = HEADER + (f"namespace outer {{ {body} }}" if in_namespace else body)
    expr = "outer::kern" if in_namespace else "kern"
    lowered = tf.compile_cuda(src, name_expressions=[expr], cache=False).lowered_names[expr]
    d = demangle(lowered)
    assert d.name == expr and d.template_args == ()
    assert [p.spell() for p in d.params] == [w for _, w in ps], lowered


@pytest.mark.parametrize(
    ("targ", "spelled"),
    [
        ("float", "float"),
        ("__half", "__half"),
        ("S", "S"),
        ("ns::P", "ns::P"),
        ("Vec<double, 2>", "Vec<double, 2>"),
    ],
)
def test_template_kernels_demangle_with_their_arguments(targ, spelled):
    src = (
        HEADER
        + r"""
template<typename T, int N> __global__ void tk(T* y, const T* x, T v, int n) {}
namespace ns { template<typename T> __global__ void scale(T* y, T a) {} }
"""
    )
    exprs = [f"tk<{targ}, 7>", f"ns::scale<{targ}>"]
    r = tf.compile_cuda(src, name_expressions=exprs, cache=False)
    tk = demangle(r.lowered_names[exprs[0]])
    assert tk.spell() == f"tk<{spelled}, 7>({spelled}*, const {spelled}*, {spelled}, int)"
    scale = demangle(r.lowered_names[exprs[1]])
    assert scale.spell() == f"ns::scale<{spelled}>({spelled}*, {spelled})"


def test_what_a_launch_check_reads_of_a_parameter():
    d = demangle("_Z2k1PfPKffj")  # k1(float* y, const float* x, float a, unsigned n)
    y, x, a, n = d.params
    assert y.pointee == CType("builtin", "float") and not y.pointee.is_const
    assert x.pointee.is_const and x.pointee.unqualified() == CType("builtin", "float")
    assert a.pointee is None and n.spell() == "unsigned int"
    assert demangle("_Z1kv").params == ()  # no parameters
    assert demangle("_Z4fillIfEvPT_S0_").spell() == "fill<float>(float*, float)"
    big = "_Z25layernorm_forward_kernel3PfS_S_PKfS1_S1_ii"
    assert demangle(big).spell() == (
        "layernorm_forward_kernel3(float*, float*, float*, "
        "const float*, const float*, const float*, int, int)"
    )


@pytest.mark.parametrize(
    "bad",
    [
        "axpy",
        "_Z",
        "_Z3ab",
        "_Z2k1Pq",
        "_Z2k1S3_",
        "_Z4fillIf",
        "_Z4fillIfEvT1_",
        "_ZN2ns",
        "_Z1kP",
        "_Z1kPK",
        "_Z1kA4_",
        "_Z1kA4f",
        "_Z1kA_f",
    ],
)
def test_what_is_not_read_is_a_value_error_naming_the_name(bad):
    with pytest.raises(ValueError, match=rf"^cannot demangle '{bad}' at offset \d+: "):
        demangle(bad)


@pytest.mark.parametrize(
    ("mangled", "spelled"),
    [
        ("_Z1fIPA256_fEvv", "float[256]"),
        ("_Z1fIPA4_A8_dEvv", "double[4][8]"),
        ("_Z1fIPA3_KiEvv", "const int[3]"),
        ("_Z1fIPA2_N2ns1PEEvv", "ns::P[2]"),
        ("_Z1fIPA1_6__halfEvv", "__half[1]"),
    ],
)
def test_arrays_read_as_their_element_and_extents(mangled, spelled):
    pointee = demangle(mangled).template_args[0].pointee
    assert pointee.kind == "array" and pointee.spell() == spelled


# Names written by hand from the Itanium ABI (each checked with binutils' c++filt): the parts
# of the grammar NVRTC's kernels seldom use, and how each is spelled and typed.
@pytest.mark.parametrize(
    ("mangled", "spelled"),
    [
        ("_Z1fDhi", "f(half, int)"),  # a two-letter builtin before another parameter
        ("_Z1fDF16_", "f(_Float16)"),
        ("_Z1fPVf", "f(volatile float*)"),
        ("_Z1fPrf", "f(float*)"),  # restrict is no part of a kernel's ABI: dropped
        ("_Z1fPKVf", "f(const volatile float*)"),
        ("_Z1fPrKf", "f(const float*)"),
        ("_Z1fPKfS_", "f(const float*, const float)"),  # S_: the qualified type, a candidate
        ("_Z1fPKfS0_", "f(const float*, const float*)"),
        ("_Z1fRf", "f(float*)"),
        ("_Z1fOf", "f(float*)"),  # references pass as pointers
        ("_Z1f3VecIfES_IiE", "f(Vec<float>, Vec<int>)"),  # a substituted template name
        ("_Z1fPFYviE", "f(void(int)*)"),
        ("_Z1fPFviE", "f(void(int)*)"),  # Y: extern "C"
        (
            "_Z1fPiPfPdPcPhPsPtPjPlPmPxPySA_",  # SA_: candidate 11, base 36
            "f(int*, float*, double*, char*, unsigned char*, short*, unsigned short*, "
            "unsigned int*, long*, unsigned long*, long long*, unsigned long long*, "
            "unsigned long long*)",
        ),
        (
            "_Z1fIiiiiiiiiiiifdEvT10_",
            "f<int, int, int, int, int, int, int, int, int, int, int, float, double>(float)",
        ),  # T10_: template parameter 11, base 10
        ("_ZNK1S1fEv", "S::f()"),  # a const member function's K
        # Each kind of type is a substitution candidate once read:
        ("_Z1fRfS_", "f(float*, float*)"),
        ("_Z1fPFviES_", "f(void(int)*, void(int))"),
        ("_Z1f3VecIfES0_", "f(Vec<float>, Vec<float>)"),
        ("_Z1f3VecIfES_IiES1_", "f(Vec<float>, Vec<int>, Vec<int>)"),
        ("_Z1fN2ns3VecIfEE", "f(ns::Vec<float>)"),
        ("_Z1fPFvifE", "f(void(int, float)*)"),
        ("_Z1fN2ns3VecIfiEE", "f(ns::Vec<float, int>)"),
        ("_Z4fillIfEvS_", "fill<float>(fill)"),  # a template function's own name: candidate 0
        ("_Z1kPf.constprop.0", "k(float*)"),  # a clone suffix is no part of the type
    ],
)
def test_hand_mangled_names_of_the_rest_of_the_grammar(mangled, spelled):
    assert demangle(mangled).spell() == spelled


def test_each_type_read_has_its_kind():
    assert demangle("_Z1fDhDF16_").params == (
        CType("builtin", "half"),
        CType("builtin", "_Float16"),
    )
    vf, vi = demangle("_Z1f3VecIfES_IiE").params
    assert vf == CType("class", "Vec", args=(CType("builtin", "float"),))
    assert vi == CType("class", "Vec", args=(CType("builtin", "int"),))
    assert demangle("_Z1fN2ns1PES0_").params[1] == CType("class", "ns::P")  # the whole name
    assert demangle("_ZN2ns1fEv").template_args == ()
    assert demangle("_Z4fillIfEvS_").params == (CType("class", "fill"),)


def test_each_part_of_a_name_has_its_kind():
    nested, _, array = demangle("_Z1fN2ns1PEPA4_fS1_").params
    assert (nested.kind, nested.spell()) == ("class", "ns::P")
    assert (array.kind, array.spell()) == ("array", "float[4]")  # S1_: the array, a candidate
    volatile = demangle("_Z1fPVf").params[0].pointee
    assert volatile.kind == "volatile" and not volatile.is_const
    assert volatile.unqualified() == CType("builtin", "float")
    assert demangle("_Z1fPFviE").params[0].pointee.kind == "function"


@pytest.mark.parametrize(
    ("mangled", "value"),
    [
        ("_Z1fILi3EEvv", "3"),
        ("_Z1fILin3EEvv", "-3"),
        ("_Z1fILb1EEvv", "true"),
        ("_Z1fILb0EEvv", "false"),
    ],
)
def test_literal_template_arguments_read_as_their_values(mangled, value):
    (arg,) = demangle(mangled).template_args
    assert arg == CType("value", value)


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        ("_Z1kP", "a type was cut off"),
        ("_Z1kA4f", "an array extent without its '_'"),
        ("_Z1fPfS0_", "substitution 1 of 1"),  # the first index past the candidates
        ("_Z1fIfEvT0_", "template parameter 1 of 1"),
        ("_Z1fPfS1", "a substitution index was expected"),  # the index runs to the end
        ("_Z1fPfT_", "template parameter 0 of 0"),
        ("_Z4fillIf", "unterminated template arguments"),
        ("_ZN2ns", "an unterminated nested name"),
        ("_Z1fILi3", "an unterminated literal"),
        ("axpy", "not a mangled name"),
        ("_Zx", "a length was expected"),
        ("_Z3ab", "a name runs past the end"),
        ("_Z2k1Pq", "type code 'q' is not read here"),
        ("_Z1fX", "type code 'X' is not read here"),
        ("_Z1fIfEvT", "a template parameter index was expected"),
        ("_Z1fPFvi", "an unterminated function type"),
    ],
)
def test_each_refusal_says_what_it_found(bad, what):
    with pytest.raises(ValueError, match=rf"^cannot demangle '{bad}' at offset \d+: {what}$"):
        demangle(bad)


def test_the_last_substitution_and_template_parameter_are_read():
    assert demangle("_Z1fPfS_").params[1].spell() == "float*"  # index 0 of 1 candidate
    assert demangle("_Z1fIfEvT_").params[0].spell() == "float"
