"""CUDA C compilation (tenferro.compiler): NVRTC, the disk cache, C types, refusals; no GPU."""

import os

import pytest

import tenferro as tf
from tenferro import _driver, compiler

SRC = r"""extern "C" __global__ void scale(float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= a;
}"""


def test_compile_cubin_without_gpu():
    r = tf.compile_cuda(SRC, arch="sm_90")
    assert r.target == "cubin" and r.image[:4] == b"\x7fELF"
    assert ".entry scale" in r.ptx
    assert [p.kind for p in r.signatures["scale"].params] == ["ptr", "float", "int"]


def test_compile_ptx_target():
    r = tf.compile_cuda(SRC, arch="compute_90", target="ptx")
    assert r.image.endswith(b"\0") and b".target sm_90" in r.image


def test_second_compile_hits_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "c2"))
    before = tf.cache_stats()
    first = tf.compile_cuda(SRC + "\n// unique 1")
    second = tf.compile_cuda(SRC + "\n// unique 1")
    after = tf.cache_stats()
    assert not first.from_cache and second.from_cache
    assert after["misses"] - before["misses"] == 1 and after["hits"] - before["hits"] == 1
    assert first.image == second.image
    assert list((tmp_path / "c2").glob("*.tfmod"))
    # a different option is a different key
    third = tf.compile_cuda(SRC + "\n// unique 1", options=["-lineinfo"])
    assert not third.from_cache


def test_corrupt_cache_entry_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "c3"))
    tf.compile_cuda(SRC)
    (entry,) = (tmp_path / "c3").glob("*.tfmod")
    entry.write_text("{not json")
    again = tf.compile_cuda(SRC)
    assert not again.from_cache and again.image[:4] == b"\x7fELF"


def test_failed_compile_carries_the_log():
    with pytest.raises(tf.CompileError) as info:
        tf.compile_cuda('extern "C" __global__ void bad(float* y) { y[0] = undefined_name; }')
    assert "compile_cuda: NVRTC failed" in str(info.value)
    assert "undefined_name" in info.value.log and "undefined_name" in str(info.value)


def test_name_expressions_are_lowered():
    src = "template<typename T> __global__ void fill(T* y, T v) { y[0] = v; }"
    r = tf.compile_cuda(src, name_expressions=["fill<float>"])
    low = r.lowered_names["fill<float>"]
    assert low.startswith("_Z") and low in r.signatures


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"target": "fatbin"}, r"compile_cuda: target='fatbin'"),
        ({"arch": "hopper"}, r"compile_cuda: arch='hopper'"),
        ({"arch": "compute_90"}, r"compile_cuda: target='cubin' needs a real architecture"),
        ({"options": ["-arch=sm_80"]}, r"compile_cuda: options=.*give the architecture as arch="),
        ({"options": [3]}, r"compile_cuda: options must be strings"),
        (
            {"name_expressions": [5]},
            r"compile_cuda: name_expressions=\[5\]: each must be a "
            r"non-empty str, got 5",
        ),
        ({"name_expressions": 5}, r"compile_cuda: name_expressions=5 must be a str or a list"),
        ({"name_expressions": [""]}, r"compile_cuda: name_expressions=\[''\]: each must be"),
        ({"name": 5}, r"compile_cuda: name=5 must be a non-empty str"),
        ({"name": ""}, r"compile_cuda: name='' must be a non-empty str"),
    ],
)
def test_compile_refusals(kwargs, pattern):
    with pytest.raises(tf.ValidationError, match=pattern):
        tf.compile_cuda(SRC, **kwargs)


def test_source_must_be_str():
    with pytest.raises(tf.ValidationError, match=r"compile_cuda: source must be str"):
        tf.compile_cuda(b"bytes")


def test_source_nul_and_unencodable_characters_are_refused():
    cut = SRC + "\0" + 'extern "C" __global__ void lost(float* y) { y[0] = 1; }'
    with pytest.raises(
        tf.ValidationError,
        match=rf"compile_cuda: source has a NUL character at "
        rf"offset {len(SRC)}; NVRTC would compile only",
    ):
        tf.compile_cuda(cut)
    with pytest.raises(
        tf.ValidationError,
        match=r"compile_cuda: source cannot be encoded as "
        r"UTF-8 at offset 3 \('\\ud800'",
    ):
        tf.compile_cuda("// \ud800\n" + SRC)
    # Non-ASCII text that does encode (a comment in another script) compiles.
    assert "scale" in tf.compile_cuda("// é ü 中\n" + SRC).signatures


def test_cccl_headers_compile():
    src = r"""#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda/std/complex>
namespace cg = cooperative_groups;
extern "C" __global__ void warp_sum(float* out, const float* x) {
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    cuda::std::complex<float> z(x[threadIdx.x], 0.0f);
    float s = cg::reduce(warp, z.real(), cg::plus<float>());
    if (warp.thread_rank() == 0) out[0] = s;
}"""
    r = tf.compile_cuda(src, arch="sm_90")
    assert [p.kind for p in r.signatures["warp_sum"].params] == ["ptr", "ptr"]
    assert r.variables == {}  # CCCL's hundreds of static members are not the source's


# Device headers that compile with no option (README, "Modules"): CCCL's cooperative groups,
# libcu++ and CUB's block and warp primitives, the toolkit's own, and <mma.h> (WMMA).
DEVICE_HEADERS = [
    "cooperative_groups.h",
    "cooperative_groups/reduce.h",
    "cooperative_groups/scan.h",
    "cooperative_groups/memcpy_async.h",
    "cuda/std/complex",
    "cuda/std/atomic",
    "cuda/std/limits",
    "cuda/std/type_traits",
    "cuda/std/cmath",
    "cuda/std/array",
    "cuda/std/span",
    "cuda/std/mdspan",
    "cuda/atomic",
    "cuda/barrier",
    "cuda/pipeline",
    "cuda/ptx",
    "cub/block/block_reduce.cuh",
    "cub/block/block_scan.cuh",
    "cub/block/block_load.cuh",
    "cub/block/block_radix_sort.cuh",
    "cub/warp/warp_reduce.cuh",
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cuda_fp8.h",
    "cuda_pipeline.h",
    "math_constants.h",
    "mma.h",
]


def _has_crt_headers():
    return any(os.path.isfile(os.path.join(d, "crt", "mma.h")) for d in _driver.cuda_include_dirs())


# The install's own: the cu13 extra brings the toolkit's crt/ headers, which <mma.h> includes.
needs_crt = pytest.mark.skipif(
    not _has_crt_headers(), reason="the CUDA toolkit's crt/ headers are not installed here"
)


@pytest.mark.parametrize(
    "header", [pytest.param(h, marks=needs_crt) if h == "mma.h" else h for h in DEVICE_HEADERS]
)
def test_device_headers_compile_with_no_option(header):
    tf.compile_cuda(
        f'#include <{header}>\nextern "C" __global__ void k(float* y) {{ *y = 1; }}\n', cache=False
    )


@needs_crt
def test_wmma_from_mma_h_compiles_with_its_c_signature():
    src = r"""#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void wmma16(float* c, const __half* a, const __half* b) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}"""
    r = tf.compile_cuda(src, cache=False)
    assert "wmma.mma.sync" in r.ptx
    assert repr(r.signatures["wmma16"]) == (
        "Signature(wmma16(float* c, const __half* a, const __half* b), from cuda)"
    )


def test_a_host_side_header_is_a_compile_error_with_the_log():
    # CUB's device-wide algorithms launch from the host: NVRTC compiles device code only.
    with pytest.raises(tf.CompileError, match=r"compile_cuda: NVRTC failed to compile") as info:
        tf.compile_cuda("#include <cub/device/device_reduce.cuh>\n", cache=False)
    log = info.value.log  # where it stops differs by CCCL version: in CUB's or thrust's files
    assert "error" in log and ("cub/" in log or "thrust/" in log)


def test_successful_compile_keeps_its_warnings(tmp_path, monkeypatch):
    warned = tf.compile_cuda("#warning tenferro-test-warning\n" + SRC)
    assert "tenferro-test-warning" in warned.log and not warned.from_cache
    cached = tf.compile_cuda("#warning tenferro-test-warning\n" + SRC)
    assert cached.from_cache and "tenferro-test-warning" in cached.log
    assert "warning" not in tf.compile_cuda(SRC).log


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: {**e, "image_hex": "zz" + e["image_hex"][2:]},  # not hex
        lambda e: {**e, "ptx": 5},  # a field of the wrong type
        lambda e: {**e, "lowered": {"a": 1}},
        lambda e: {k: v for k, v in e.items() if k != "key"},  # no key
        lambda e: {**e, "key": "0" * 64},  # another key
    ],
)
def test_cache_entries_that_do_not_check_are_recompiled_and_overwritten(
    tmp_path, monkeypatch, damage
):
    import json

    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "c4"))
    good = tf.compile_cuda(SRC)
    (path,) = (tmp_path / "c4").glob("*.tfmod")
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    again = tf.compile_cuda(SRC)
    assert not again.from_cache and again.image == good.image
    third = tf.compile_cuda(SRC)  # the recompile overwrote the bad entry
    assert third.from_cache and third.image == good.image


def test_cache_entry_of_another_source_is_not_loaded(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "c5"))
    other = SRC.replace("scale", "other")
    tf.compile_cuda(SRC)
    tf.compile_cuda(other)
    a, b = sorted((tmp_path / "c5").glob("*.tfmod"))
    b.write_text(a.read_text())  # b's file now holds a's entry (with a's key)
    for src in (SRC, other):
        r = tf.compile_cuda(src)
        name = "scale" if src is SRC else "other"
        assert list(r.signatures) == [name], (r.from_cache, list(r.signatures))
    assert json.loads(b.read_text())["key"] == b.stem


def test_nvrtc_writes_only_into_fresh_writable_buffers(monkeypatch):
    # Regression: NVRTC once wrote its empty log's NUL into the buffer ``b" " * 1``, which is
    # the shared b" " constant itself; on Python 3.12 that turned spaces into NULs process-wide
    # (torch then failed to import). Every buffer NVRTC fills must be a fresh bytearray.
    from cuda.bindings import nvrtc

    seen = []
    for name in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
        real = getattr(nvrtc, name)

        def spy(prog, buf, _real=real, _name=name):
            seen.append((_name, type(buf)))
            return _real(prog, buf)

        monkeypatch.setattr(nvrtc, name, spy)
    tf.compile_cuda('extern "C" __global__ void k() {}', arch="sm_90", cache=False)
    # The kernel's compile, then the probe of its C parameter types (no CUBIN asked).
    assert (
        sorted(set(seen))
        == [
            ("nvrtcGetCUBIN", bytearray),
            ("nvrtcGetPTX", bytearray),
            ("nvrtcGetProgramLog", bytearray),
        ]
        and len(seen) == 5
    )
    assert " ".join(["a", "b"]) == "a b"


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"options": ["--gpu-architecture=sm_80"]}, r"options=.*give the architecture as arch="),
        (
            {"name_expressions": ["fill\0<float>"]},
            r"name_expressions=.*: each must be a non-empty "
            r"str",
        ),
        ({"name": "a\0.cu"}, r"name='a\\x00\.cu' must be a non-empty str"),
        ({"arch": 90}, r"arch=90 must look like 'sm_90'"),
        ({"arch": None}, r"arch=None must look like 'sm_90'"),
    ],
)
def test_compile_refusals_of_spellings_that_slip_past_a_first_check(kwargs, pattern):
    with pytest.raises(tf.ValidationError, match=r"^compile_cuda: " + pattern):
        tf.compile_cuda(SRC, **kwargs)


def test_a_nul_anywhere_is_found_from_the_first():
    with pytest.raises(
        tf.ValidationError,
        match=r"^compile_cuda: source has a NUL character at "
        r"offset 0;",
    ):
        tf.compile_cuda("\0" + SRC)
    with pytest.raises(tf.ValidationError, match=r"at offset 5;"):
        tf.compile_cuda("// ab\0" + SRC + "\0")


def test_a_compile_from_the_cache_is_the_compile_it_stored(tmp_path, monkeypatch):
    # A cache directory that does not exist yet (two levels deep) is made; what comes back
    # from it is the same image, target, architecture and signatures, and no temporary file
    # is left beside the entry.
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "deep" / "cache"))
    src = SRC + "\n// cache round trip"
    fresh = tf.compile_cuda(src, arch="sm_90")
    hit = tf.compile_cuda(src, arch="sm_90")
    assert (fresh.from_cache, hit.from_cache) == (False, True)
    for field in ("image", "ptx", "target", "arch", "lowered_names"):
        assert getattr(hit, field) == getattr(fresh, field), field
    assert hit.arch == "sm_90" and hit.image[:4] == b"\x7fELF"
    assert hit.signatures["scale"] == fresh.signatures["scale"]
    files = sorted(p.name for p in (tmp_path / "deep" / "cache").iterdir())
    assert len(files) == 1 and files[0].endswith(".tfmod") and not files[0].startswith(".tmp")
    ptx_fresh = tf.compile_cuda(src, arch="compute_90", target="ptx")
    ptx_hit = tf.compile_cuda(src, arch="compute_90", target="ptx")
    assert ptx_hit.from_cache and ptx_hit.image == ptx_fresh.image and ptx_hit.target == "ptx"


def test_the_cache_defaults_to_the_users_cache_directory(tmp_path, monkeypatch):
    from tenferro import compiler

    monkeypatch.delenv("TENFERRO_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compiler.cache_dir() == tmp_path / ".cache" / "tenferro"
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "mine"))
    assert compiler.cache_dir() == tmp_path / "mine"


def test_a_compile_error_names_the_file_nvrtc_was_given():
    bad = 'extern "C" __global__ void bad(float* y) { y[0] = nope; }'
    with pytest.raises(tf.CompileError) as info:
        tf.compile_cuda(bad)
    assert "tenferro.cu(" in info.value.log
    with pytest.raises(tf.CompileError) as info:
        tf.compile_cuda(bad, name="mine.cu")
    assert "mine.cu(" in info.value.log


def test_compiled_cuda_reads_as_its_kernels_not_its_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path))
    src = SRC + "\ntemplate <typename T> __global__ void fill(T* y, T v) { *y = v; }\n"
    first = tf.compile_cuda(src, name_expressions=["fill<double>"])
    kernels = "scale(float* y, float a, unsigned int n); fill<double>(double* y, double v)"
    assert repr(first) == (
        f"CompiledCuda(cubin for sm_90, {len(first.image)} bytes; 2 kernel(s): {kernels})"
    )
    again = tf.compile_cuda(src, name_expressions=["fill<double>"])
    assert repr(again) == (
        f"CompiledCuda(cubin for sm_90, {len(first.image)} bytes, from the "
        f"cache; 2 kernel(s): {kernels})"
    )


def test_compiled_cuda_shows_its_kernels_as_a_table_in_notebooks():
    r = tf.compile_cuda(
        'extern "C" __global__ void k(float* y, unsigned n) {}\n'
        "template <class T> __global__ void f(T* y) {}\n"
        "template __global__ void f<int>(int*);\n"
        'extern "C" __global__ void e() {}\n',
        cache=False,
    )
    assert r._repr_html_() == (
        f"<b>CompiledCuda: cubin for sm_90, {len(r.image)} bytes</b><table><tr><th>kernel</th>"
        "<th>parameters</th></tr>"
        "<tr><td><code>e</code></td><td><code>(none)</code></td></tr>"
        "<tr><td><code>f&lt;int&gt;</code></td><td><code>int* y</code></td></tr>"
        "<tr><td><code>k</code></td><td><code>float* y, unsigned int n</code></td></tr></table>"
    )


def test_a_compile_from_the_cache_says_so_in_its_table(tmp_path, monkeypatch):
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path))
    src = 'extern "C" __global__ void k(float* y) {}\n'
    assert ", from the cache" not in tf.compile_cuda(src)._repr_html_()
    assert tf.compile_cuda(src)._repr_html_().startswith("<b>CompiledCuda: cubin for sm_90, ")
    assert ", from the cache</b>" in tf.compile_cuda(src)._repr_html_()


def test_a_cache_entry_is_written_beside_itself_and_renamed_into_place(tmp_path, monkeypatch):
    # A rename is atomic only within one file system: the temporary file sits in the cache
    # directory, named so that no reader takes it for an entry (.tmp-*.tfmod).
    import os
    from pathlib import Path

    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path))
    renames = []
    real = os.replace
    monkeypatch.setattr(
        os, "replace", lambda src, dst: (renames.append((src, dst)), real(src, dst))[1]
    )
    tf.compile_cuda(SRC + "\n// renamed into place")
    [(src, dst)] = renames
    src, dst = Path(src), Path(dst)
    assert src.parent == dst.parent == tmp_path
    assert src.name.startswith(".tmp-") and src.name.endswith(".tfmod")
    assert dst.name.endswith(".tfmod") and not dst.name.startswith(".")


def test_an_interrupt_while_a_cache_entry_is_written_leaves_no_file_behind(tmp_path, monkeypatch):
    # Ctrl-C at any line of the write: no temporary file stays in the cache directory, no
    # half entry is read, and the next compile writes the entry whole.
    from _stand_ins import finishes_despite_interrupt_at

    from tenferro import compiler

    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path))
    source = SRC + "\n// interrupted while cached"
    interrupted = 0
    for n in range(1, 50):
        for entry in tmp_path.iterdir():
            entry.unlink()
        finished = finishes_despite_interrupt_at(
            n,
            lambda code: code is compiler._write_cache.__code__,
            lambda: tf.compile_cuda(source),
        )
        names = sorted(p.name for p in tmp_path.iterdir())
        assert not [name for name in names if name.startswith(".tmp-")], (n, names)
        assert tf.compile_cuda(source).signatures["scale"]  # whole, from the cache or compiled
        [entry] = tmp_path.iterdir()
        assert compiler.compile_cuda(source).from_cache and entry.suffix == ".tfmod"
        if finished:
            break
        interrupted += 1
    assert finished and interrupted >= 3


def test_a_source_without_kernels_compiles_to_no_signatures():
    r = tf.compile_cuda("__device__ int twice(int x) { return 2 * x; }\n", cache=False)
    assert r.signatures == {} and r.image[:4] == b"\x7fELF"


def test_a_source_that_is_not_text_is_refused_naming_its_type():
    with pytest.raises(tf.ValidationError, match=r"^compile_cuda: source must be str, got bytes$"):
        tf.compile_cuda(SRC.encode())


def test_overloads_share_a_name_in_the_table_and_keep_a_row_each():
    r = tf.compile_cuda(
        "__global__ void scale(float* y, float a) {}\n"
        "__global__ void scale(double* y, double a) {}\n",
        cache=False,
    )
    table = r._repr_html_()
    assert table.count("<td><code>scale</code></td>") == 2
    assert "<code>float* y, float a</code>" in table and "<code>double* y, double a</code>" in table


# --- the C-type probe beside the kernels' compile -----------------------------------------------


def _recorded_compiles(monkeypatch):
    """Each NVRTC compile: (thread name, its name expressions), in the order they began."""
    import threading

    from tenferro import compiler as compiler_part

    real, seen = compiler_part._driver.nvrtc_compile, []

    def recording(source, name, options, exprs, cubin):
        seen.append((threading.current_thread().name, [e.decode() for e in exprs]))
        return real(source, name, options, exprs, cubin)

    monkeypatch.setattr(compiler_part._driver, "nvrtc_compile", recording)
    return seen


KERNEL_PAIR = r"""
extern "C" __global__ void scale(float* y, float a, unsigned n) { y[threadIdx.x % n] *= a; }
extern "C" __global__ __launch_bounds__(128) void shift(double* y, double b) { y[0] += b; }
"""


def test_the_c_type_probe_runs_beside_the_kernels_compile(monkeypatch):
    seen = _recorded_compiles(monkeypatch)
    r = tf.compile_cuda(KERNEL_PAIR, arch="sm_90")
    assert sorted(seen) == sorted(
        [
            ("MainThread", []),
            (
                "tenferro-c-type-probe",
                [
                    "__tenferro_c_types_of<decltype(&scale)>",
                    "__tenferro_c_types_of<decltype(&shift)>",
                ],
            ),
        ]
    )
    assert r.signatures["scale"].declaration() == "scale(float* y, float a, unsigned int n)"
    assert r.signatures["shift"].declaration() == "shift(double* y, double b)"


def test_a_wrong_guess_from_the_text_is_probed_again_on_ptxs_entries(monkeypatch):
    seen = _recorded_compiles(monkeypatch)
    src = KERNEL_PAIR + '#if 0\nextern "C" __global__ void gone(int* p) {}\n#endif\n'
    r = tf.compile_cuda(src, arch="sm_90")
    probes = [exprs for thread, exprs in seen if exprs]
    assert len(seen) == 3 and len(probes) == 2  # the early probe named `gone`, which fails
    assert any("__tenferro_c_types_of<decltype(&gone)>" in p for p in probes)
    assert r.signatures["shift"].declaration() == "shift(double* y, double b)"
    assert "gone" not in r.signatures


def test_a_kernel_made_by_a_macro_is_probed_after_the_compile(monkeypatch):
    seen = _recorded_compiles(monkeypatch)
    src = '#define KERNEL extern "C" __global__\nKERNEL void ones(float* p) { *p = 1; }\n'
    r = tf.compile_cuda(src, arch="sm_90")
    assert [thread for thread, _ in seen] == ["MainThread", "MainThread"]  # no guess to start
    assert r.signatures["ones"].params[0].c_type.spell() == "float*"


def _first_line(exc):
    return str(exc.value).splitlines()[0]


_STD_HEADERS = sorted(h for h in os.listdir(compiler.STD_HEADERS_DIR) if not h.startswith("_"))


@pytest.mark.parametrize("header", _STD_HEADERS)
def test_each_c_and_cpp_library_header_nvrtc_lacks_compiles(header):
    assert len(_STD_HEADERS) == 22  # every file of the folder is a header given here
    tf.compile_cuda(
        f'#include <{header}>\nextern "C" __global__ void k(float* y) {{}}\n', cache=False
    )
    if not header.endswith(".h"):  # as with nvcc's library: std::size_t from any of them
        tf.compile_cuda(
            f'#include <{header}>\nextern "C" __global__ void k(float* y, '
            f"std::size_t n, std::ptrdiff_t d) {{}}\n",
            cache=False,
        )


def test_a_kernel_file_as_people_write_it_compiles_and_its_types_are_known():
    src = r"""
#include <cstdint>
#include <cmath>
#include <limits>
#include <algorithm>
#include <cuda/std/type_traits>
#include <cstdio>
#include <cassert>
#include <stdint.h>
#include <math.h>
#include <float.h>
template <typename T>
__global__ void clamp_root(T* y, const T* x, std::int64_t n) {
    static_assert(cuda::std::is_floating_point<T>::value, "floats only");
    const std::int64_t i = blockIdx.x * (std::int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = std::min(std::sqrt(std::abs(x[i])), std::numeric_limits<T>::max());
}
template __global__ void clamp_root<float>(float*, const float*, std::int64_t);
extern "C" __global__ void tally(uint32_t* out, const std::uint8_t* flags, int64_t n) {
    assert(n >= 0);
    if (threadIdx.x == 0 && n < 0) printf("%lld\n", (long long)n);
    out[0] = flags[0] + (uint32_t)sqrtf(FLT_MIN);
}
"""
    got = tf.compile_cuda(src, name_expressions=["clamp_root<float>"], cache=False)
    by_name = {name.split("(")[0]: sig for name, sig in got.signatures.items()}
    assert [p.c_type.spell() for p in by_name["tally"].params] == [
        "unsigned int*",
        "const unsigned char*",
        "long long",
    ]  # what the launch checks
    clamp = got.signatures[got.lowered_names["clamp_root<float>"]]
    assert [p.c_type.spell() for p in clamp.params] == ["float*", "const float*", "long long"]


def test_algorithm_gives_the_standards_min_max_and_clamp():
    # Checked by the compiler itself: a wrong answer is a static_assert that fails.
    src = r"""#include <algorithm>
#include <cstdint>
struct Greater { __host__ __device__ constexpr bool operator()(int a, int b) const {
    return a > b; } };
static_assert(std::min(3, 5) == 3 && std::max(3, 5) == 5 && std::min(4, 4) == 4, "");
static_assert(std::min(3, 5, Greater{}) == 5 && std::max(3, 5, Greater{}) == 3, "");
static_assert(std::clamp(-7, 0, 4) == 0 && std::clamp(2, 0, 4) == 2 &&
              std::clamp(9, 0, 4) == 4 && std::clamp(0, 0, 4) == 0 && std::clamp(4, 0, 4) == 4, "");
static_assert(std::clamp(2, 4, 0, Greater{}) == 2 && std::clamp(9, 4, 0, Greater{}) == 4, "");
extern "C" __global__ void k(float* y, std::int64_t n) {
    y[0] = std::min(y[1], 2.f) + std::max(y[2], 1.f) + std::clamp(y[3], 0.f, 1.f) +
           (float)std::max<std::int64_t>(n, 3);
}"""
    assert tf.compile_cuda(src, cache=False).image


def test_cfloat_gives_the_limits_of_float_and_double():
    # Each macro against libcu++'s numeric_limits, checked by the compiler (a static_assert).
    src = r"""#include <cfloat>
#include <cuda/std/limits>
using F = cuda::std::numeric_limits<float>;
using D = cuda::std::numeric_limits<double>;
static_assert(FLT_MAX == F::max() && FLT_MIN == F::min() && FLT_EPSILON == F::epsilon() &&
              FLT_TRUE_MIN == F::denorm_min(), "");
static_assert(DBL_MAX == D::max() && DBL_MIN == D::min() && DBL_EPSILON == D::epsilon() &&
              DBL_TRUE_MIN == D::denorm_min(), "");
static_assert(FLT_MANT_DIG == F::digits && DBL_MANT_DIG == D::digits &&
              FLT_DIG == F::digits10 && DBL_DIG == D::digits10 && FLT_RADIX == F::radix, "");
static_assert(FLT_MIN_EXP == F::min_exponent && FLT_MAX_EXP == F::max_exponent &&
              DBL_MIN_EXP == D::min_exponent && DBL_MAX_EXP == D::max_exponent, "");
static_assert(FLT_MIN_10_EXP == F::min_exponent10 && FLT_MAX_10_EXP == F::max_exponent10 &&
              DBL_MIN_10_EXP == D::min_exponent10 && DBL_MAX_10_EXP == D::max_exponent10, "");
static_assert(FLT_DECIMAL_DIG == F::max_digits10 && DBL_DECIMAL_DIG == D::max_digits10, "");
"""
    tf.compile_cuda(src, target="ptx", arch="compute_90", cache=False)


def test_cmath_gives_what_glibcs_gives_a_kernel_file_for_nvcc():
    # The functions in std, and the macros: INFINITY, NAN, HUGE_VAL(F) and M_PI and the rest.
    src = r"""#include <cmath>
#include <cfloat>
static_assert(M_PI == 3.14159265358979323846 && M_PI_2 == M_PI / 2 && M_PI_4 == M_PI / 4, "");
static_assert(M_E > 2.718281828 && M_E < 2.718281829 && M_SQRT2 * M_SQRT2 > 1.9999999, "");
static_assert(M_LN2 > 0.6931471805 && M_LN2 < 0.6931471806 && M_1_PI * M_PI > 0.9999999, "");
constexpr float kInf = INFINITY;
static_assert(kInf > FLT_MAX && HUGE_VALF == kInf && HUGE_VAL > DBL_MAX, "");
constexpr float kNan = NAN;
static_assert(!(kNan == kNan), "");
extern "C" __global__ void k(float* y, double d) {
    const float x = y[0];
    y[1] = std::nextafter(x, 1.f) + std::fdim(x, 1.f) + std::scalbn(x, 2) + std::logb(x) +
           (float)std::ilogb(x) + std::fma(x, x, x) + std::hypot(x, x) + std::erf(x) +
           std::copysign(x, -1.f) + (float)(std::isnan(d) || std::isinf(x));
    int q;
    y[2] = std::remquo(x, 2.f, &q) + (float)std::nan("") + (float)M_PI;
}"""
    assert tf.compile_cuda(src, cache=False).image


def test_cstdlib_and_cstring_give_what_device_code_has_of_them():
    src = r"""#include <cstdlib>
#include <cstring>
#include <stdlib.h>
#include <string.h>
static_assert(EXIT_SUCCESS == 0 && EXIT_FAILURE == 1, "");
extern "C" __global__ void k(float* y, int n) {
    float* p = static_cast<float*>(std::malloc(4 * sizeof(float)));  // the device heap
    std::memcpy(p, y, 4 * sizeof(float));
    std::memset(p, 0, sizeof(float));
    y[0] = p[1] + std::abs(n) + std::labs(n) + std::llabs(n) + abs(-2);
    std::free(p);
}"""
    sig = tf.compile_cuda(src, cache=False).signatures["k"]
    assert [p.c_type.spell() for p in sig.params] == ["float*", "int"]


def test_using_namespace_std_keeps_the_built_in_math_unambiguous():
    # std::sqrt is the built-in ::sqrt, not a second function an unqualified call could pick.
    src = (
        "#include <cmath>\n#include <algorithm>\n#include <cstdint>\nusing namespace std;\n"
        'extern "C" __global__ void k(float* y, int64_t n) {\n'
        "    y[0] = sqrt(y[0]) + max(y[1], 2.f) + abs(y[2]) + fmaxf(y[3], 1.f) + n; }"
    )
    assert tf.compile_cuda(src, cache=False).image


def test_a_users_own_folder_is_searched_before_the_library_headers(tmp_path):
    (tmp_path / "cstdint").write_text("#pragma once\n#define MY_CSTDINT 1\n")
    src = "#include <cstdint>\n#ifndef MY_CSTDINT\n#error not the user's\n#endif\n"
    tf.compile_cuda(src, options=[f"-I{tmp_path}"], cache=False)


@pytest.mark.parametrize("header", ["cuComplex.h", "cuda_fp16.h"])
def test_a_users_own_folder_is_searched_before_the_toolkits_headers(tmp_path, header):
    src = f"#include <{header}>\n#ifndef MY_HEADER\n#error not the user's\n#endif\n"
    with pytest.raises(tf.CompileError):  # the toolkit has the header: without -I, its own
        tf.compile_cuda(src, cache=False)
    (tmp_path / header).write_text("#pragma once\n#define MY_HEADER 1\n")
    tf.compile_cuda(src, options=[f"-I{tmp_path}"], cache=False)


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (
            "crt/absent.h",
            "<crt/absent.h> is one of the CUDA toolkit's crt/ headers, not installed "
            'here: pip install "cuda-toolkit[crt]==13.*" (CUDA 13)',
        ),
        ("vector", "<vector> is a host C/C++ library header, which device code cannot use"),
        (
            "type_traits",
            "<type_traits> is a host C++ library header; include "
            "<cuda/std/type_traits> and write cuda::std:: where the source writes std::",
        ),
        (
            "myheader.cuh",
            "it could not open 'myheader.cuh'; give the folder that holds it with "
            "options=['-I/path/to/folder']",
        ),
    ],
)
def test_other_missing_headers_are_named_with_what_to_do(header, says):
    with pytest.raises(tf.CompileError) as info:
        tf.compile_cuda(f'#include "{header}"\n', cache=False)
    assert says in _first_line(info) and header in info.value.log
    assert "included by" not in _first_line(info)  # the source itself includes it


_FOR_NVCC = r"""#include <cstdio>
#include <cuda_runtime.h>
__global__ void scale(float* y, float a, int n) { int i = threadIdx.x; if (i < n) y[i] *= a; }
int main() {
    float* d;
    cudaMalloc(&d, 4 * 256);
    scale<<<1, 256>>>(d, 2.f, 256);
    printf("done\\n");
}
"""


def test_host_code_is_named_where_it_is(tmp_path):
    # A file written for nvcc: its main is host code, line 4; a header with host functions
    # (cuda.h, the driver API's) is not for kernel files at all.
    with pytest.raises(tf.CompileError) as info:
        tf.compile_cuda(_FOR_NVCC, cache=False)
    assert _first_line(info) == (
        "compile_cuda: NVRTC failed to compile 'tenferro.cu' for sm_90: line 4 is a host "
        "function, and NVRTC compiles device code only: mark a helper the kernels call "
        "__device__, and keep host code (main, cudaMalloc, <<<...>>>) inside #ifndef "
        "__CUDACC_RTC__ ... #endif"
    )
    with pytest.raises(tf.CompileError) as info:  # named as the session's call that asked
        tf.compile_cuda(_FOR_NVCC, cache=False, _op="session.compile")
    assert _first_line(info).startswith("session.compile: NVRTC failed to compile 'tenferro.cu'")
    guarded = _FOR_NVCC.replace("int main", "#ifndef __CUDACC_RTC__\nint main", 1) + "#endif\n"
    assert tf.compile_cuda(guarded, cache=False).signatures  # as the hint says: it compiles
    with pytest.raises(tf.CompileError) as info:  # misplaced __global__ comes first: no hint
        tf.compile_cuda('__global__ extern "C" void k(float* y) {}\n', cache=False)
    assert _first_line(info) == "compile_cuda: NVRTC failed to compile 'tenferro.cu' for sm_90"
    assert "host function" in info.value.log  # NVRTC's second error, which follows the first
    with pytest.raises(
        tf.CompileError,
        match=r"^compile_cuda: NVRTC failed to compile "
        r"'tenferro\.cu' for sm_90: cuda\.h declares host "
        r"functions \(line \d+\), which NVRTC does not "
        r"compile; a kernel file cannot include it",
    ):
        tf.compile_cuda("#include <cuda.h>\n", cache=False)


def test_a_header_missing_from_a_header_names_the_header_that_wants_it(tmp_path):
    (tmp_path / "mine.cuh").write_text('// two lines down\n#include "gone.cuh"\n')
    kernel = tmp_path / "k.cu"
    kernel.write_text('#include "mine.cuh"\n')
    with pytest.raises(tf.CompileError) as info:
        tf.compile_cuda(kernel, cache=False)
    assert _first_line(info).endswith(
        ": it could not open 'gone.cuh', included by mine.cuh(2); "
        "give the folder that holds it with "
        "options=['-I/path/to/folder']"
    )
    (tmp_path / "mine.cuh").write_text("#include <utility>\n")
    with pytest.raises(tf.CompileError) as info:
        tf.compile_cuda(kernel, cache=False)
    assert (
        "<utility>, included by mine.cuh(1), is a host C++ library header; include "
        "<cuda/std/utility>" in _first_line(info)
    )


def test_an_error_that_is_not_a_missing_header_gets_no_header_hint():
    with pytest.raises(tf.CompileError) as info:
        tf.compile_cuda('extern "C" __global__ void k(float* y) { y[0] = nope; }', cache=False)
    assert _first_line(info) == "compile_cuda: NVRTC failed to compile 'tenferro.cu' for sm_90"


@pytest.mark.parametrize(
    "form", [["-I{}"], ["--include-path={}"], ["-I", "{}"], ["--include-path", "{}"]]
)
def test_an_edited_header_of_the_users_folders_is_compiled_again(tmp_path, monkeypatch, form):
    # The cache key holds each included file of the user's folders: an edit two includes deep
    # compiles again instead of giving back the kernel of the old header.
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    inc = tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    (inc / "outer.cuh").write_text('#include "sub/inner.cuh"\n')
    (inc / "sub" / "inner.cuh").write_text('#include "value.cuh"\n')  # beside inner.cuh
    (inc / "sub" / "value.cuh").write_text("#define V 1111\n")
    src = (
        '#include <outer.cuh>\n#if 0\n#include "nowhere.cuh"\n#endif\n'
        'extern "C" __global__ void k(int* y) { y[0] = V; }\n'
    )

    def compiled():
        options = [o.format(inc) for o in form]
        return tf.compile_cuda(src, options=options, target="ptx", arch="compute_90")

    first = compiled()
    assert not first.from_cache and "1111" in first.ptx
    assert compiled().from_cache  # nothing changed: the cache serves
    (inc / "sub" / "value.cuh").write_text("#define V 2222\n")
    again = compiled()
    assert not again.from_cache and "2222" in again.ptx and "1111" not in again.ptx
    assert compiled().from_cache


def test_the_header_key_follows_each_include_as_nvrtc_finds_it(tmp_path, monkeypatch):
    # What NVRTC reads keys the cache, and only that: a header found in the second -I folder,
    # one under a folder whose name holds '=', one with a byte that is not UTF-8; an angle
    # include searches the -I folders, never its includer's folder.
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    first, second, odd = tmp_path / "first", tmp_path / "second", tmp_path / "x=y"
    for d in (first, second, odd / "sub"):
        d.mkdir(parents=True)
    (second / "two.cuh").write_text("#define TWO 1111\n")
    (odd / "three.cuh").write_bytes(b"// caf\xe9, not UTF-8\n#define THREE 3333\n")
    (odd / "sub" / "four.cuh").write_text("#include <v.cuh>\n")
    (odd / "v.cuh").write_text("#define V 5555\n")  # what <v.cuh> in sub/four.cuh opens
    (odd / "sub" / "v.cuh").write_text("#define V 6666\n")  # beside it, not searched
    src = (
        '#include <two.cuh>\n#include "three.cuh"\n#include "sub/four.cuh"\n'
        'extern "C" __global__ void k(int* y) { y[0] = TWO; y[1] = THREE; y[2] = V; }\n'
    )
    options = [f"-I{first}", "-I", str(second), f"--include-path={odd}"]

    def compiled():
        return tf.compile_cuda(src, options=options, target="ptx", arch="compute_90")

    got = compiled()
    assert not got.from_cache and all(v in got.ptx for v in ("1111", "3333", "5555"))
    (odd / "sub" / "v.cuh").write_text("#define V 7777\n")  # NVRTC does not read it
    assert compiled().from_cache
    for path, old, new in (
        (second / "two.cuh", b"1111", b"2222"),
        (odd / "three.cuh", b"3333", b"4444"),
        (odd / "v.cuh", b"5555", b"8888"),
    ):
        path.write_bytes(path.read_bytes().replace(old, new))
        again = compiled()
        assert not again.from_cache and new.decode() in again.ptx, path.name


def test_a_last_include_option_with_no_folder_is_left_to_nvrtc(tmp_path, monkeypatch):
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    src = 'extern "C" __global__ void k(int* y) { y[0] = 1; }\n'
    for options in (["-I"], ["--include-path"]):  # NVRTC takes these as they are
        assert tf.compile_cuda(src, options=options, target="ptx", arch="compute_90").ptx


def test_a_compile_that_stores_nothing_reads_no_headers(tmp_path, monkeypatch):
    # cache=False keeps no entry, so the headers that would key it are not read
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "v.cuh").write_text("#define V 7\n")
    src = '#include "v.cuh"\nextern "C" __global__ void k(int* y) { y[0] = V; }\n'
    scanned = []
    real = compiler._user_headers
    monkeypatch.setattr(compiler, "_user_headers", lambda *a: scanned.append(a) or real(*a))
    got = tf.compile_cuda(
        src, options=[f"-I{tmp_path}"], target="ptx", arch="compute_90", cache=False
    )
    assert "7" in got.ptx and scanned == [] and not (tmp_path / "cache").exists()
    tf.compile_cuda(src, options=[f"-I{tmp_path}"], target="ptx", arch="compute_90")
    assert len(scanned) == 1  # the cached compile keys on them


def test_a_source_without_include_folders_reads_no_files(monkeypatch):
    opened = []
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a))
    assert compiler._user_headers('#include "x.cuh"\n#include <cuda/std/cstdint>\n', []) == []
    assert opened == []


def test_a_kernel_file_compiles_under_its_name_with_its_folder_searched(tmp_path, monkeypatch):
    import pathlib

    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "common.cuh").write_text("#define SCALE 3.5f\n")
    kernel = tmp_path / "scale.cu"
    kernel.write_text(
        "// café, in UTF-8: read as it is\n"
        '#include "common.cuh"\n#include <cstdint>\n'
        'extern "C" __global__ void scale(float* y, std::int64_t n) {\n'
        "    if (threadIdx.x < n) y[threadIdx.x] *= SCALE; }\n",
        encoding="utf-8",
    )
    got = tf.compile_cuda(pathlib.Path(kernel), target="ptx", arch="compute_90")
    assert [p.c_type.spell() for p in got.signatures["scale"].params] == ["float*", "long long"]
    assert "0f40600000" in got.ptx  # 3.5f, from the header beside the file
    (tmp_path / "common.cuh").write_text("#define SCALE 4.5f\n")  # the header edited
    again = tf.compile_cuda(kernel, target="ptx", arch="compute_90")
    assert not again.from_cache and "0f40900000" in again.ptx
    kernel.write_text('extern "C" __global__ void scale(float* y) {\n    y[0] = nope; }\n')
    with pytest.raises(tf.CompileError, match=r"NVRTC failed to compile 'scale\.cu'") as info:
        tf.compile_cuda(kernel)
    assert 'scale.cu(2): error: identifier "nope" is undefined' in info.value.log


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: d / "missing.cu", r"source='.*missing\.cu' does not exist"),
        (
            lambda d: (d / "folder.cu").mkdir() or d / "folder.cu",
            r"source='.*folder\.cu' cannot be read: Is a directory",
        ),
        (
            lambda d: (d / "latin1.cu").write_bytes(b"// caf\xe9\n") and d / "latin1.cu",
            r"source='.*latin1\.cu' is not UTF-8 text \(byte 6: invalid continuation byte\)",
        ),
    ],
)
def test_a_kernel_file_that_cannot_be_read_is_refused(tmp_path, monkeypatch, make, says):
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(tmp_path / "cache"))
    path = make(tmp_path)
    with pytest.raises(tf.ValidationError, match=rf"^compile_cuda: {says}$"):
        tf.compile_cuda(path)
    assert not (tmp_path / "cache").exists()  # nothing compiled, nothing cached


def test_a_str_source_is_text_even_where_it_names_a_file(tmp_path):
    kernel = tmp_path / "k.cu"
    kernel.write_text('extern "C" __global__ void k(float* y) {}\n')
    with pytest.raises(tf.CompileError):  # compiled as the text "/tmp/.../k.cu"
        tf.compile_cuda(str(kernel), cache=False)


def test_compiles_and_cache_hits_are_logged_and_an_unwritable_cache_warns(
    caplog, tmp_path, monkeypatch
):
    import logging

    src = 'extern "C" __global__ void logged(float* y) { y[threadIdx.x] = 1.0f; }'
    with caplog.at_level(logging.DEBUG, logger="tenferro.compiler"):
        tf.compile_cuda(src)
        tf.compile_cuda(src)
    messages = [r.getMessage() for r in caplog.records if r.name == "tenferro.compiler"]
    assert len(messages) == 2
    assert messages[0].startswith("compiled ") and " for sm_90 with NVRTC " in messages[0]
    assert messages[1].startswith("compile cache hit: ") and messages[1].endswith(".tfmod)")
    blocked = tmp_path / "not a directory"
    blocked.write_text("")  # the cache directory cannot be made under a file
    monkeypatch.setenv("TENFERRO_CACHE_DIR", str(blocked / "cache"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tenferro.compiler"):
        tf.compile_cuda(src)  # compiles all the same
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "compile cache could not be written" in warned[0].getMessage()
