"""Finding a kernel by the name its source gives it: extern "C" names, C++ names read from
mangled entries, overloads and templates (no GPU needed)."""

import pytest
from _sources import CPP_KERNELS

import tenferro as tf
from tenferro.entries import candidates, find_entry

# Mangled entries as NVRTC writes them, with the names a user would look them up by.
TABLE = [
    (
        "_Z9layernormPfPKfS1_ii",
        ["layernorm", "::layernorm", "layernorm(float*, const float*, const float*, int, int)"],
    ),
    (
        "_ZN2ns6kernelEPKfm",
        ["kernel", "ns::kernel", " ns :: kernel ", "ns::kernel(const float*, unsigned long)"],
    ),
    ("_ZN5outer5inner1kEPKdy", ["k", "inner::k", "outer::inner::k"]),
    ("_Z5scalePff", ["scale(float*, float)", "scale(float *,float)"]),
    ("_Z5scalePdd", ["scale(double*, double)"]),
    ("_Z4fillIfEvPT_S0_", ["fill<float>", "fill< float >", "fill<float>(float*, float)"]),
    ("_Z4fillIdEvPT_S0_", ["fill<double>"]),
    ("_Z2tkIfLi4EEvPT_", ["tk<float, 4>", "tk<float,4>"]),
]
ENTRIES = [e for e, _ in TABLE] + ["axpy", "_Z3badQQ"]  # extern "C", and one that won't read


@pytest.mark.parametrize(("entry", "name"), [(e, n) for e, names in TABLE for n in names])
def test_each_kernel_is_found_by_the_names_its_source_gives_it(entry, name):
    assert find_entry(name, ENTRIES, {}, "module.function") == entry


def test_entries_and_name_expressions_come_first():
    assert find_entry("axpy", ENTRIES, {}, "op") == "axpy"
    assert find_entry("_Z5scalePff", ENTRIES, {}, "op") == "_Z5scalePff"
    assert (
        find_entry("fill<float>", ENTRIES, {"fill<float>": "_Z4fillIdEvPT_S0_"}, "op")
        == "_Z4fillIdEvPT_S0_"
    )  # what the compile said the expression lowered to


@pytest.mark.parametrize(
    "name", ["nope", "layer", "norm", "ns::k", "other::kernel", "fill<int>", "scale(int*, int)", ""]
)
def test_a_name_no_kernel_has_finds_nothing(name):
    assert find_entry(name, ENTRIES, {}, "op") is None


@pytest.mark.parametrize(
    ("name", "what", "listed", "example"),
    [
        (
            "scale",
            "overloaded",
            "scale(double*, double); scale(float*, float)",
            "scale(double*, double)",
        ),
        (
            "fill",
            "a template",
            "fill<double>(double*, double); fill<float>(float*, float)",
            "fill<double>",
        ),
        ("tk", "a template", "tk<float, 4>(float*)", "tk<float, 4>"),  # one instance: still asked
    ],
)
def test_an_overloaded_or_templated_name_lists_its_kernels(name, what, listed, example):
    with pytest.raises(tf.ValidationError) as info:
        find_entry(name, ENTRIES, {}, "module.function")
    assert str(info.value) == (
        f"module.function: {name!r} is {what}; the kernels of this module called so are: "
        f"{listed}. Pass one as written there (module.function({example!r})) or as a name "
        f"expression given to compile"
    )


def test_candidates_read_unsigned_long_size_t_and_const_pointers():
    [(entry, d)] = candidates("kernel", ENTRIES)
    assert entry == "_ZN2ns6kernelEPKfm"
    assert [p.spell() for p in d.params] == ["const float*", "unsigned long"]
    [(_, d)] = candidates("k", ENTRIES)
    assert [p.spell() for p in d.params] == ["const double*", "unsigned long long"]


def test_a_cpp_kernel_file_compiles_unchanged_with_c_types_and_names():
    r = tf.compile_cuda(CPP_KERNELS, cache=False)
    entries = list(r.signatures)
    ln = r.signatures[find_entry("layernorm_forward", entries, {}, "op")]
    assert repr(ln) == (
        "Signature(layernorm_forward(float* out, float* mean, float* rstd, const float* inp, "
        "const float* weight, const float* bias, int N, int C), from cuda)"
    )
    bias = r.signatures[find_entry("add_bias", entries, {}, "op")]
    assert repr(bias) == (
        "Signature(ops::add_bias(float* y, const float* b, unsigned long n, "
        "unsigned long cols), from cuda)"
    )
    # Overloads whose declarations agree on the names get them too.
    for spelled in (
        "scale_rows(float*, const float*, int, int)",
        "scale_rows(double*, const double*, int, int)",
    ):
        sig = r.signatures[find_entry(spelled, entries, {}, "op")]
        assert [p.name for p in sig.params] == ["x", "s", "rows", "cols"]


def test_a_float64_weight_for_a_cpp_kernels_const_float_is_refused():
    from tenferro.args import ParamBlock
    from tenferro.dtypes import by_name

    r = tf.compile_cuda(CPP_KERNELS)
    sig = r.signatures[find_entry("layernorm_forward", list(r.signatures), {}, "op")]
    f32, f64 = by_name("f32"), by_name("f64")

    def span(cls, ptr, t=f32):
        return cls(ptr, (8,), (t.itemsize,), t, 0, None, None)

    args = [
        span(tf.TensorMut, 0x1000),
        span(tf.TensorMut, 0x2000),
        span(tf.TensorMut, 0x3000),
        span(tf.TensorRef, 0x4000),
        span(tf.TensorRef, 0x5000),
        span(tf.TensorRef, 0x6000),
        tf.i32(2),
        tf.i32(4),
    ]
    ParamBlock(sig).pack(args, None, "session.launch")
    args[4] = span(tf.TensorRef, 0x5000, f64)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[4\] 'weight' is "
        r"float64, the kernel takes const float\*$",
    ):
        ParamBlock(sig).pack(args, None, "session.launch")


def test_candidates_skip_unreadable_entries_anywhere_and_sort_by_spelling():
    entries = ["axpy", "_Z3badQQ", "_Z5scalePai", "_Z5scalePbi"]  # the skipped ones first
    found = candidates("scale", entries)
    # Sorted as the C signatures read, not as the mangled names do (Pai before Pbi).
    assert [(e, d.spell()) for e, d in found] == [
        ("_Z5scalePbi", "scale(bool*, int)"),
        ("_Z5scalePai", "scale(signed char*, int)"),
    ]
