"""The ``%%cuda`` cell magic, through IPython's own shell: its line, its output, its compile
errors (no GPU needed), and a cell compiled into an open session (GPU)."""

import numpy as np
import pytest

import tenferro as tf
from tenferro.jupyter import CudaCell, parse_line

IPython = pytest.importorskip("IPython", reason="the magic's tests need IPython (test extra)")

KERNELS = r"""
#ifndef SCALE
#define SCALE 1
#endif
extern "C" __global__ void scale(float* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= SCALE;
}
template <typename T> __global__ void fill(T* y, T v, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}
"""


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "tenferro")
    for name in [k for k, v in ip.user_ns.items() if isinstance(v, tf.Session)]:
        del ip.user_ns[name]
    yield ip
    for name in ("mod", "cuda_module", "s", "t"):
        ip.user_ns.pop(name, None)


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("", CudaCell()),
        ("mod", CudaCell(name="mod")),
        (
            "mod -D SCALE=3 -DDEBUG -D N=4 -std=c++17",
            CudaCell(name="mod", options=("-DSCALE=3", "-DDEBUG", "-DN=4", "-std=c++17")),
        ),
        (
            "-e 'fill<float>' --expr \"fill<double>\" mod -s s --arch sm_90a",
            CudaCell(
                name="mod",
                session="s",
                name_expressions=("fill<float>", "fill<double>"),
                arch="sm_90a",
            ),
        ),
        ("--session s2 -std=c++20", CudaCell(session="s2", options=("-std=c++20",))),
        ("--arch sm_80 mod", CudaCell(name="mod", arch="sm_80")),  # the arch takes one token
        ("-D X=a=b", CudaCell(options=("-DX=a=b",))),  # the macro's name ends at the first '='
    ],
)
def test_the_magic_line_is_read(line, want):
    assert parse_line(line) == want


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("mod other", r"'other' is a second name; the line binds one \('mod'\)"),
        ("2mod", r"the name to bind '2mod' is not a Python identifier"),
        ("mod -s", r"-s needs a value"),
        ("mod --session 's t'", r"--session 's t' is not a Python identifier"),
        ("mod -D 1X=2", r"-D macro '1X' is not a Python identifier"),
        ("mod -D", r"-D needs a value"),
        ("mod -std=c++98", r"-std=c\+\+98 is not a standard NVRTC takes; one of -std=c\+\+11, "),
        ("mod -O3", r"unknown option '-O3'; the line takes a name"),
        ("mod -e", r"-e needs a value"),
        ("mod --arch", r"--arch needs a value"),
        ("mod 'unclosed", r"the line does not read \(No closing quotation\)"),
    ],
)
def test_a_bad_magic_line_is_refused_naming_the_argument(line, message):
    with pytest.raises(tf.ValidationError, match=rf"^%%cuda: {message}"):
        parse_line(line)


def test_without_a_session_the_cell_compiles_and_lists_its_kernels(shell, capsys):
    shell.run_cell_magic("cuda", "mod -D SCALE=3 -e 'fill<float>'", KERNELS)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "mod: 2 kernel(s), compiled for sm_90; no open session to load it into",
        "  fill<float>(float* y, float v, unsigned int n)",
        "  scale(float* y, unsigned int n)",
    ]
    mod = shell.user_ns["mod"]
    assert isinstance(mod, tf.CompiledCuda) and mod.arch == "sm_90"
    assert "0f40400000" in mod.ptx  # y[i] *= 3.0f: the -D reached NVRTC
    shell.run_cell_magic("cuda", "mod", KERNELS)
    assert "0f40400000" not in shell.user_ns["mod"].ptx


def test_a_cell_with_variables_lists_them_after_its_kernels(shell, capsys):
    shell.run_cell_magic(
        "cuda",
        "mod",
        "__constant__ float bias[2];\n__device__ int hits;\n"
        'extern "C" __global__ void k(float* y) { y[0] = bias[0] + hits; }',
    )
    assert capsys.readouterr().out.splitlines() == [
        "mod: 1 kernel(s), compiled for sm_90; no open session to load it into",
        "  k(float* y)",
        "  and 2 variable(s):",
        "  __constant__ float bias[2]",
        "  __device__ int hits",
    ]


def test_a_compile_error_shows_the_log_with_the_cells_lines_and_no_traceback(shell, capsys):
    cell = 'extern "C" __global__ void k(float* y) {\n    y[0] = undefined_name;\n}\n'
    result = shell.run_cell(f"%%cuda broken\n{cell}")
    assert isinstance(result.error_in_exec, tf.CompileError)
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "CompileError: compile_cuda: NVRTC failed to compile 'cell.cu' for sm_90" in text
    assert 'line 2: error: identifier "undefined_name" is undefined' in text
    assert "y[0] = undefined_name;" in text  # the offending line, as NVRTC quotes it
    assert "Traceback" not in text and "jupyter.py" not in text
    assert "broken" not in shell.user_ns  # nothing is bound
    lines = str(result.error_in_exec).splitlines()  # the first line, then the log once
    assert lines[0] == "compile_cuda: NVRTC failed to compile 'cell.cu' for sm_90"
    assert sum("is undefined" in line for line in lines) == 1


def test_a_compile_errors_display_is_its_first_line_then_the_log_by_cell_line():
    from tenferro.jupyter import CellCompileError

    err = CellCompileError("compile_cuda: failed\nsecond\nthird", "cell.cu(3): error: x\n  y;")
    assert err._render_traceback_() == [
        "CompileError: compile_cuda: failed",
        "line 3: error: x",
        "  y;",
    ]


def test_loading_the_extension_registers_the_cuda_cell_magic(monkeypatch):
    from tenferro import jupyter

    registered, ran = [], []

    class Shell:  # what load_ipython_extension asks of IPython's shell
        def register_magic_function(self, f, magic_kind, magic_name):
            registered.append((f, magic_kind, magic_name))

    shell = Shell()
    jupyter.load_ipython_extension(shell)
    [(magic, kind, name)] = registered
    assert (kind, name) == ("cell", "cuda") and magic.__doc__ == jupyter.__doc__
    monkeypatch.setattr(jupyter, "run_cell", lambda *a: ran.append(a))
    magic("mod -D N=2", "cell text")
    assert ran == [(shell, "mod -D N=2", "cell text")]


def test_the_session_found_is_the_one_open_session_under_a_name_of_the_users(monkeypatch):
    from tenferro import jupyter

    class Stand:  # a session as the lookup sees it
        def __init__(self, is_open):
            self.is_open = is_open

    monkeypatch.setattr(jupyter, "Session", Stand)
    a, b, closed = Stand(True), Stand(True), Stand(False)
    # IPython's _, __ and _N hold outputs: a session shown there is not one more session
    assert jupyter._session({"a": a, "_": b, "_3": b, "c": closed}, None) is a
    assert jupyter._session({"a": a, "also_a": a}, None) is a  # one session, two names
    assert jupyter._session({"c": closed, "_": b}, None) is None
    with pytest.raises(
        tf.ValidationError,
        match=r"^%%cuda: the notebook has 2 open sessions "
        r"\(\['a', 'b'\]\); name one with --session",
    ):
        jupyter._session({"b": b, "a": a}, None)


def test_without_a_session_the_cell_compiles_for_the_arch_asked(shell, capsys):
    shell.run_cell_magic("cuda", "mod --arch sm_80", KERNELS)
    assert shell.user_ns["mod"].arch == "sm_80"
    assert capsys.readouterr().out.startswith("mod: 1 kernel(s), compiled for sm_80;")


def test_a_refused_line_shows_its_reason_alone_and_binds_nothing(shell, capsys):
    result = shell.run_cell("%%cuda mod -O3\n" + KERNELS)
    assert isinstance(result.error_in_exec, tf.ValidationError)
    shown = capsys.readouterr()
    assert (shown.out + shown.err).strip() == (
        "ValidationError: %%cuda: unknown option '-O3'; the line takes a name, -s/--session "
        "NAME, -D MACRO[=VALUE], -std=c++NN, -e/--expr NAME_EXPRESSION and --arch sm_NN"
    )
    assert "mod" not in shell.user_ns


def test_the_named_session_must_be_an_open_session(shell):
    shell.user_ns["t"] = 5
    for line, message in (
        ("mod --session s", r"--session s: the notebook has no variable 's'"),
        ("mod --session t", r"--session t: 't' is a int, not a tf.Session"),
    ):
        result = shell.run_cell(f"%%cuda {line}\n{KERNELS}")
        assert isinstance(result.error_in_exec, tf.ValidationError)
        assert f"%%cuda: {message.replace(chr(92), '')}" == str(result.error_in_exec)


@pytest.mark.gpu
def test_a_cell_compiles_into_the_open_session_once(shell, device, capsys, rng):
    capsys.readouterr()  # the rng fixture's seed line
    with tf.Session(device) as s:
        shell.user_ns["s"] = s
        shell.run_cell_magic("cuda", "mod -D SCALE=3", KERNELS)
        mod = shell.user_ns["mod"]
        assert isinstance(mod, tf.Module)
        assert capsys.readouterr().out.splitlines()[0] == (
            f"mod: 1 kernel(s), loaded into the session on device {device}"
        )
        shell.run_cell_magic("cuda", "mod -D SCALE=3", KERNELS)  # re-run: the same module
        assert shell.user_ns["mod"] is mod
        y0 = rng.standard_normal(1000).astype(np.float32)
        y = s.upload(y0)
        s.launch(mod.function("scale"), tf.LaunchConfig.flat(1000), [s.tensor_mut(y), 1000])
        np.testing.assert_array_equal(s.download(y), y0 * np.float32(3))
    result = shell.run_cell(f"%%cuda mod --session s\n{KERNELS}")
    assert str(result.error_in_exec) == "%%cuda: --session s: that session is closed"
