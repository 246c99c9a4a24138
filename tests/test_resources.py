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


def test_the_cache_is_bounded_least_recently_used_first():
    from tenferro.resources import ResourceCache

    made = []

    def maker(k):
        return lambda: made.append(k) or f"value-{k}"

    c = ResourceCache(limit=3)
    for k in "abc":
        assert c.get(k, maker(k), str, "op") == f"value-{k}"
    assert len(c) == 3  # the limit itself is kept
    c.get("a", maker("a"), str, "op")  # a hit: a becomes the most recent
    c.get("d", maker("d"), str, "op")  # one past the limit: b, the least recent, goes
    assert len(c) == 3 and made == ["a", "b", "c", "d"]
    c.get("b", maker("b"), str, "op")
    c.get("a", maker("a"), str, "op")
    assert made == ["a", "b", "c", "d", "b"]  # b was made again, a was still there


@pytest.mark.parametrize("limit", [0, -1, 1.5, "2"])
def test_the_cache_refuses_a_bad_limit(limit):
    from tenferro.resources import ResourceCache

    with pytest.raises(tf.ValidationError, match=rf"ResourceCache: limit={limit!r} must be an "
                                                 r"int >= 1"):
        ResourceCache(limit=limit)
    assert ResourceCache(limit=1).limit == 1
