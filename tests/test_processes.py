"""tenferro in processes: what importing does and does not do, and a fork after import.

The driver cannot be used in a child forked after the parent initialised it, so importing
tenferro must not initialise it: a program may import tenferro, then fork workers (a torch
DataLoader does), and each of them may still use CUDA.
"""

import os
import subprocess
import sys
import textwrap

import pytest

CHECK_IMPORT = textwrap.dedent(
    """
    import os, sys
    from cuda.bindings import driver as cu

    asked = []
    real_init = cu.cuInit
    cu.cuInit = lambda flags: asked.append(flags) or real_init(flags)

    import tenferro as tf
    import tenferro.kernels
    from tenferro import _driver

    SRC = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }'
    assert tf.compile_cuda(SRC, cache=False).signatures["k"]  # NVRTC: no driver needed
    print("after import and compile, cuInit calls:", len(asked))
    pid = os.fork()
    if pid == 0:  # the child compiles too, then leaves without running atexit handlers
        ok = bool(tf.compile_cuda(SRC, cache=False).signatures["k"]) and not asked
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    print("child exit status:", os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_importing_and_compiling_leave_the_driver_alone_so_a_fork_after_import_is_safe():
    out = subprocess.run(
        [sys.executable, "-c", CHECK_IMPORT], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "after import and compile, cuInit calls: 0",
        "child exit status: 0",
    ]


def test_the_check_sees_an_import_that_initialises_the_driver():
    # The same check, with an import that does initialise it: the count shows it.
    planted = CHECK_IMPORT.replace(
        "from tenferro import _driver\n",
        "from tenferro import _driver\ntry:\n    _driver.ensure_init('test')\n"
        "except tf.RuntimeStateError:  # no driver here: cuInit was still called\n    pass\n",
        1,
    )
    out = subprocess.run(
        [sys.executable, "-c", planted], capture_output=True, text=True, timeout=180
    )
    assert "after import and compile, cuInit calls: 1" in out.stdout.splitlines()
