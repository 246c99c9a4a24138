"""tenferro kernels as torch operators (tenferro.torch): eager, torch.compile, CUDA graphs."""

import importlib.util
import subprocess
import sys
import threading

import numpy as np
import pytest

import tenferro as tf

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_importing_tenferro_never_imports_torch():
    code = (
        "import sys, tenferro, tenferro.kernels; "
        "assert 'torch' not in sys.modules, 'tenferro imported torch'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(HAS_TORCH, reason="torch is installed here: its absence cannot be shown")
def test_without_torch_the_module_says_what_to_install():
    with pytest.raises(ImportError, match=r"tenferro\.torch needs PyTorch \(pip install torch\)"):
        import tenferro.torch  # noqa: F401


SRC = r"""
extern "C" __global__ void axpy_sin(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + sinf(y[i]);
}
extern "C" __global__ void mul_sin(double* z, const double* x, const double* w, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = x[i] * sin(w[i]);
}
extern "C" __global__ void mul_sin_grad(double* gx, double* gw, const double* g,
                                        const double* x, const double* w, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { gx[i] = g[i] * sin(w[i]); gw[i] = g[i] * x[i] * cos(w[i]); }
}
"""

_OPS = {}
_BACKWARD_THREADS = []


def _ops():
    """The test operators, registered with torch once a process."""
    if _OPS:
        return _OPS
    import torch

    import tenferro.torch as tft

    def kernel(s, name):
        return s.resource("tests.torch", lambda s: s.compile(SRC)).function(name)

    @tft.op("tenferro_test::axpy_sin", mutates_args=("y",))
    def axpy_sin(s: tf.Session, y: torch.Tensor, x: torch.Tensor, a: float) -> None:
        n = y.numel()
        s.launch(
            kernel(s, "axpy_sin"),
            tf.LaunchConfig.flat(n),
            [s.tensor_mut(y), s.tensor(x), tf.f32(a), tf.u32(n)],
        )

    @tft.op("tenferro_test::mul_sin", mutates_args=())
    def mul_sin(s: tf.Session, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        z = torch.empty_like(x)
        n = x.numel()
        s.launch(
            kernel(s, "mul_sin"),
            tf.LaunchConfig.flat(n),
            [s.tensor_mut(z), s.tensor(x), s.tensor(w), tf.u32(n)],
        )
        return z

    @mul_sin.register_fake
    def _(x, w):
        return torch.empty_like(x)

    @tft.op("tenferro_test::mul_sin_grad", mutates_args=())
    def mul_sin_grad(
        s: tf.Session, g: torch.Tensor, x: torch.Tensor, w: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _BACKWARD_THREADS.append(threading.get_ident())
        gx, gw = torch.empty_like(x), torch.empty_like(w)
        n = x.numel()
        s.launch(
            kernel(s, "mul_sin_grad"),
            tf.LaunchConfig.flat(n),
            [s.tensor_mut(gx), s.tensor_mut(gw), s.tensor(g), s.tensor(x), s.tensor(w), tf.u32(n)],
        )
        return gx, gw

    @mul_sin_grad.register_fake
    def _(g, x, w):
        return torch.empty_like(x), torch.empty_like(w)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return tuple(mul_sin_grad(g.contiguous(), x, w))

    mul_sin.register_autograd(backward, setup_context=setup_context)
    _OPS.update(axpy_sin=axpy_sin, mul_sin=mul_sin)
    return _OPS


@pytest.fixture
def torch_cuda(device):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    torch.cuda.set_device(device)
    yield torch
    import tenferro.torch as tft

    torch.cuda.synchronize()
    tft.close_sessions()


def _inputs(torch, n, seed):
    """x and y of n random float32 on the GPU, and their values on the host."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, device="cuda", generator=gen)
    y = torch.randn(n, device="cuda", generator=gen)
    return x, y, x.cpu().numpy(), y.cpu().numpy()


def _axpy_sin_ref(y, x, a, times=1):
    y = y.astype(np.float64)
    for _ in range(times):
        y = a * x.astype(np.float64) + np.sin(y)
    return y


@pytest.mark.gpu
def test_a_fused_op_in_place_matches_float64_eager_and_compiled(torch_cuda):
    torch = torch_cuda
    axpy_sin = _ops()["axpy_sin"]
    x, y, x0, y0 = _inputs(torch, 100_003, 5)
    axpy_sin(y, x, 1.5)
    np.testing.assert_allclose(y.cpu().numpy(), _axpy_sin_ref(y0, x0, 1.5), rtol=1e-5, atol=1e-6)

    @torch.compile(fullgraph=True)
    def step(y, x):
        axpy_sin(y, x, 1.5)
        return y * 2.0  # torch's own op after ours: ordered on the same stream

    y.copy_(torch.from_numpy(y0).cuda())
    out = step(y, x)
    want = _axpy_sin_ref(y0, x0, 1.5)
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.cpu().numpy(), 2.0 * want, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_an_op_outside_a_capture_lets_its_inputs_go_once_the_stream_has_passed(torch_cuda):
    # Only inside torch's capture does the session keep an op's tensors until it closes (the
    # graph may replay them); outside, a synchronize lets them go.
    import weakref

    import tenferro.torch as tft

    torch = torch_cuda
    axpy_sin = _ops()["axpy_sin"]
    x, y, x0, y0 = _inputs(torch, 4096, 8)
    axpy_sin(y, x, 1.5)
    gone = weakref.ref(x)
    del x
    tft.session_for().synchronize()
    assert gone() is None, "the session kept an input of an op no graph captured"
    np.testing.assert_allclose(y.cpu().numpy(), _axpy_sin_ref(y0, x0, 1.5), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_a_fused_op_captured_in_a_torch_cuda_graph_replays_right(torch_cuda):
    torch = torch_cuda
    axpy_sin = _ops()["axpy_sin"]
    x, y, x0, y0 = _inputs(torch, 4096, 6)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as torch asks
        axpy_sin(y, x, 0.5)
    torch.cuda.current_stream().wait_stream(side)
    y.copy_(torch.from_numpy(y0).cuda())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):  # the warmed-up stream: its session compiled
        axpy_sin(y, x, 0.5)
    np.testing.assert_array_equal(y.cpu().numpy(), y0)  # captured, not run
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(
        y.cpu().numpy(), _axpy_sin_ref(y0, x0, 0.5, times=3), rtol=1e-5, atol=1e-6
    )


@pytest.mark.gpu
def test_an_op_with_a_backward_passes_gradcheck_on_torchs_autograd_thread(torch_cuda):
    torch = torch_cuda
    mul_sin = _ops()["mul_sin"]
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(64, device="cuda", dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(64, device="cuda", dtype=torch.float64, generator=gen, requires_grad=True)
    z = mul_sin(x, w)
    torch.testing.assert_close(z, x * torch.sin(w), rtol=1e-12, atol=1e-12)
    _BACKWARD_THREADS.clear()
    z.sum().backward()
    torch.testing.assert_close(x.grad, torch.sin(w).detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, (x * torch.cos(w)).detach(), rtol=1e-12, atol=1e-12)
    assert _BACKWARD_THREADS and _BACKWARD_THREADS[0] != threading.get_ident(), (
        "torch runs a CUDA backward on its own thread; the op made its session there"
    )
    assert torch.autograd.gradcheck(
        mul_sin, (x.detach().requires_grad_(), w.detach().requires_grad_())
    )
    compiled = torch.compile(lambda x, w: mul_sin(x, w).sin(), fullgraph=True)
    torch.testing.assert_close(compiled(x, w), torch.sin(x * torch.sin(w)), rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_an_op_keeps_every_check_of_a_launch(torch_cuda):
    torch = torch_cuda
    axpy_sin = _ops()["axpy_sin"]
    y = torch.zeros(256, device="cuda")
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[1\] 'x' is float64, "
        r"the kernel takes const float\*",
    ):
        axpy_sin(y, torch.zeros(256, device="cuda", dtype=torch.float64), 1.0)
    assert torch.count_nonzero(y).item() == 0


def test_op_refuses_a_name_without_a_namespace_and_a_function_without_the_session():
    pytest.importorskip("torch")
    import tenferro.torch as tft

    with pytest.raises(
        tf.ValidationError,
        match=r"tenferro\.torch\.op: name='axpy' must be "
        r"'namespace::name'",
    ):
        tft.op("axpy", mutates_args=())

    def f():
        pass

    with pytest.raises(
        tf.ValidationError,
        match=r"tenferro\.torch\.op: f must take the session "
        r"as its first parameter",
    ):
        tft.op("tenferro_test::f", mutates_args=())(f)
