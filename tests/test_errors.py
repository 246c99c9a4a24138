"""The exception hierarchy and the shared refusals (tenferro.errors)."""

import tenferro as tf
from tenferro import errors


def test_every_error_is_a_tenferro_error_and_the_builtin_it_stands_for():
    assert issubclass(tf.ValidationError, ValueError)
    assert issubclass(tf.RuntimeStateError, RuntimeError)
    assert issubclass(tf.KernelFault, tf.BackendError)
    for cls in (
        tf.ValidationError,
        tf.RuntimeStateError,
        tf.BackendError,
        tf.CompileError,
        tf.KernelFault,
    ):
        assert issubclass(cls, tf.TenferroError)


def test_a_wrong_device_names_the_operation_and_both_devices():
    exc = errors.wrong_device("session.tensor", 1, 0)
    assert type(exc) is tf.ValidationError
    assert str(exc) == "session.tensor: x lives on device 1, this session is on device 0"


def test_a_negated_view_names_the_operation_and_the_way_out():
    exc = errors.negated_view("session.tensor")
    assert type(exc) is tf.ValidationError
    assert str(exc).startswith("session.tensor: x is a negated view (torch's neg bit")
    assert str(exc).endswith("pass x.resolve_neg()")


def test_driver_errors_carry_the_result_and_the_launches_only_when_given():
    plain = tf.BackendError("cuX failed")
    assert (str(plain), plain.result_name, plain.result_code) == ("cuX failed", "", 0)
    fault = tf.KernelFault("session.synchronize: illegal address")
    assert (fault.result_name, fault.result_code, fault.launches) == ("", 0, ())
    fault = tf.KernelFault("m", "CUDA_ERROR_ILLEGAL_ADDRESS", 700, ("axpy", "scale"))
    assert (fault.result_name, fault.result_code, fault.launches) == (
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        700,
        ("axpy", "scale"),
    )


def test_a_compile_error_adds_the_log_on_its_own_lines_only_when_there_is_one():
    bare = tf.CompileError("module.compile: NVRTC failed")
    assert str(bare) == "module.compile: NVRTC failed" and bare.log == ""
    logged = tf.CompileError("module.compile: NVRTC failed", "k.cu(3): error: x undefined")
    assert str(logged) == "module.compile: NVRTC failed\nk.cu(3): error: x undefined"
    assert logged.log == "k.cu(3): error: x undefined"
