"""tenferro.resources: the session's bounded, typed cache."""

import pytest
from _sources import AXPY

import tenferro as tf


@pytest.mark.gpu
def test_resource_cache_makes_once_and_checks_kind(session):
    calls = []

    def init(s):
        calls.append(s)
        return s.compile(AXPY)

    m1 = session.resource("axpy", init, kind=tf.Module)
    m2 = session.resource("axpy", init, kind=tf.Module)
    assert m1 is m2 and calls == [session]
    with pytest.raises(tf.ValidationError, match=r"session\.resource: key='axpy' holds a Module"):
        session.resource("axpy", init, kind=dict)
    with pytest.raises(tf.ValidationError, match=r"session\.resource: init for key='n'"):
        session.resource("n", lambda s: 3, kind=str)
    with pytest.raises(tf.ValidationError, match=r"session\.resource: key=\[1\] must be hashable"):
        session.resource([1], init)
