import pytest

import tenferro as tf

SRC = r'''extern "C" __global__ void scale(float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= a;
}'''


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


@pytest.mark.parametrize("kwargs,pattern", [
    ({"target": "fatbin"}, r"compile_cuda: target='fatbin'"),
    ({"arch": "hopper"}, r"compile_cuda: arch='hopper'"),
    ({"arch": "compute_90"}, r"compile_cuda: target='cubin' needs a real architecture"),
    ({"options": ["-arch=sm_80"]}, r"compile_cuda: options=.*give the architecture as arch="),
    ({"options": [3]}, r"compile_cuda: options must be strings"),
])
def test_compile_refusals(kwargs, pattern):
    with pytest.raises(tf.ValidationError, match=pattern):
        tf.compile_cuda(SRC, **kwargs)


def test_source_must_be_str():
    with pytest.raises(tf.ValidationError, match=r"compile_cuda: source must be str"):
        tf.compile_cuda(b"bytes")
