"""The exception hierarchy and the shared refusals (tenferro.errors)."""

import tenferro as tf
from tenferro import errors


def test_every_error_is_a_tenferro_error_and_the_builtin_it_stands_for():
    assert issubclass(tf.ValidationError, ValueError)
    assert issubclass(tf.RuntimeStateError, RuntimeError)
    assert issubclass(tf.KernelFault, tf.BackendError)
    for cls in (tf.ValidationError, tf.RuntimeStateError, tf.BackendError, tf.CompileError,
                tf.KernelFault):
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
