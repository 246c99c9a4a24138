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

    with pytest.raises(
        tf.ValidationError,
        match=rf"ResourceCache: limit={limit!r} must be an "
        r"int >= 1",
    ):
        ResourceCache(limit=limit)
    assert ResourceCache(limit=1).limit == 1


def test_the_cache_checks_kinds_and_keys_without_a_session():
    from tenferro.resources import ResourceCache

    c = ResourceCache()
    assert c.limit == 256
    assert c.get("n", lambda: 3, None, "op") == 3
    assert c.get("n", lambda: 4, int, "op") == 3  # made without a kind: any kind may ask
    assert c.get("s", lambda: "x", str, "op") == "x"
    with pytest.raises(tf.ValidationError, match=r"^op: key='s' holds a str, asked as kind=int$"):
        c.get("s", lambda: 0, int, "op")
    with pytest.raises(
        tf.ValidationError,
        match=r"^op: init for key='t' returned int, expected "
        r"str$",
    ):
        c.get("t", lambda: 5, str, "op")
    assert "t" not in c._items and len(c) == 2  # a refused value is not kept
    with pytest.raises(tf.ValidationError, match=r"^op: kind=5 must be a type or None$"):
        c.get("u", lambda: 5, 5, "op")
    with pytest.raises(tf.ValidationError, match=r"^op: key=\[1\] must be hashable$"):
        c.get([1], lambda: 5, None, "op")
    assert len(c) == 2
