"""fill, cast, axpy and a fused elementwise map over whole arrays (any length, any shape)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tenferro import CompileError, ValidationError, u64

from ._build import C_TYPES, check_session, function, grid_stride, plan, scalar_for, spans_1d

__all__ = ["axpy", "cast", "elementwise", "fill"]

_FILE = "elementwise.cu"
_FILL_TYPES = ("f32", "f64", "i32", "u32", "i64", "u8")
_CASTS = (
    ("f32", "f16"),
    ("f16", "f32"),
    ("f32", "bf16"),
    ("bf16", "f32"),
    ("f32", "f64"),
    ("f64", "f32"),
    ("i32", "f32"),
    ("f32", "i32"),
)
_AXPY_TYPES = ("f32", "f64")
_FILL = {t: f"fill<{C_TYPES[t]}>" for t in _FILL_TYPES}  # kernel names, made once
_CAST = {pair: f"cast<{C_TYPES[pair[0]]}, {C_TYPES[pair[1]]}>" for pair in _CASTS}
_AXPY = {t: f"axpy<{C_TYPES[t]}>" for t in _AXPY_TYPES}
_EXPRS = (*_FILL.values(), *_CAST.values(), *_AXPY.values())


def fill(s: Any, y: Any, value: Any) -> None:
    """Set every element of ``y`` to ``value`` (range-checked into y's dtype).

    Only enqueues, as every ready kernel does.

    Args:
        s: The open `tf.Session` to launch on.
        y: The array to fill, f32, f64, i32, u32, i64 or u8: a tf.Tensor or anything
            ``s.tensor_mut`` accepts.
        value: A Python or numpy number that ``y``'s dtype holds.

    Raises:
        ValidationError: ``s`` is not a Session, ``y`` is refused as a writable span or is
            of another dtype, or ``value`` is not a number or does not fit ``y``'s dtype.
        RuntimeStateError: The session is closed or used from another thread, or NVRTC is
            missing (a session's first call compiles the kernels).
        BackendError: The driver refused the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    op = "kernels.fill"
    check_session(s, op)
    ym = s.tensor_mut(y)
    t = ym.scalar_type
    if t.name not in _FILL_TYPES:
        raise ValidationError(f"{op}: y is {t.name}; fill takes {list(_FILL_TYPES)}")
    fn, config, n = plan(s, ("fill", ym.nbytes, t), lambda: _plan(s, _FILL[t.name], ym.size, 4))
    s.launch(fn, config, [ym, scalar_for(t, value, op, "value"), n])


def cast(s: Any, out: Any, x: Any) -> None:
    """``out[i] = x[i]`` converted to out's dtype, as numpy's astype converts.

    Narrowing to f16, bf16 or f32 rounds to nearest even; f32 to i32 truncates toward zero
    (C's conversion), as ``astype(np.int32)`` does for values in range.

    The conversions provided: f32 to and from f16, bf16, f64 and i32.
    Only enqueues.

    Args:
        s: The open `tf.Session` to launch on.
        out: The result, of ``x``'s element count: a tf.Tensor or anything ``s.tensor_mut``
            accepts.
        x: The source: a tf.Tensor or anything ``s.tensor`` accepts.

    Raises:
        ValidationError: ``s`` is not a Session, an array is refused as a span, the
            element counts differ, or the conversion is not provided.
        RuntimeStateError: The session is closed or used from another thread, or NVRTC is
            missing (a session's first call compiles the kernels).
        BackendError: The driver refused the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    op = "kernels.cast"
    check_session(s, op)
    om, xr = s.tensor_mut(out), s.tensor(x)
    spans_1d(op, om, xr, same_dtype=False)
    pair = (om.scalar_type.name, xr.scalar_type.name)
    if pair not in _CASTS:
        raise ValidationError(
            f"{op}: {pair[1]} -> {pair[0]} is not provided; casts: "
            f"{[f'{b}->{a}' for a, b in _CASTS]}"
        )
    width = 8 if 2 in (om.scalar_type.itemsize, xr.scalar_type.itemsize) else 4  # cast_width
    fn, config, n = plan(s, ("cast", om.size, pair), lambda: _plan(s, _CAST[pair], om.size, width))
    s.launch(fn, config, [om, xr, n])


def axpy(s: Any, y: Any, x: Any, a: Any) -> None:
    """``y = a * x + y`` elementwise; y and x of one dtype (f32 or f64) and one size.

    Only enqueues.

    Args:
        s: The open `tf.Session` to launch on.
        y: The array updated in place: a tf.Tensor or anything ``s.tensor_mut`` accepts.
        x: The array added: a tf.Tensor or anything ``s.tensor`` accepts.
        a: The factor, a Python or numpy number, as a scalar of ``y``'s dtype.

    Raises:
        ValidationError: ``s`` is not a Session, an array is refused as a span, the sizes
            or dtypes differ, the dtype is not f32 or f64, or ``a`` is not a number or does
            not fit the dtype.
        RuntimeStateError: The session is closed or used from another thread, or NVRTC is
            missing (a session's first call compiles the kernels).
        BackendError: The driver refused the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    op = "kernels.axpy"
    check_session(s, op)
    ym, xr = s.tensor_mut(y), s.tensor(x)
    spans_1d(op, ym, xr)
    t = ym.scalar_type
    if t.name not in _AXPY_TYPES:
        raise ValidationError(f"{op}: y is {t.name}; axpy takes {list(_AXPY_TYPES)}")
    fn, config, n = plan(s, ("axpy", ym.nbytes, t), lambda: _plan(s, _AXPY[t.name], ym.size, 4))
    s.launch(fn, config, [ym, xr, scalar_for(t, a, op, "a"), n])


def _plan(s: Any, name: str, size: int, per_thread: int) -> tuple:
    """(Function, config, u64 size) of the map ``name`` over ``size`` elements."""
    config = grid_stride(s, size, per_thread=per_thread, capped=False)
    return function(s, _FILE, name, _EXPRS), config, u64(size)


_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
# C number literals (2.0f, 1e-3, 0x1F, 10u), taken out before the names are read.
_NUMBER = re.compile(
    r"(?<![A-Za-z_0-9.])(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[fFlLuU]*"
)
_MATH = frozenset(
    """sin cos tan exp exp2 log log2 log10 sqrt rsqrt fabs fmin fmax pow tanh
    sinh cosh asin acos atan atan2 floor ceil round fma erf erfc cbrt hypot
    sinf cosf tanf expf exp2f logf log2f log10f sqrtf rsqrtf fabsf fminf fmaxf powf tanhf
    erff floorf ceilf fmaf min max""".split()
)
_C_TYPE_NAMES = frozenset("float double int unsigned long short char".split())  # casts
_RESERVED = _MATH | _C_TYPE_NAMES  # what an expression may name besides its operands


def elementwise(s: Any, expr: str, out: Any, **operands: Any) -> None:
    """``out[i] = expr`` in one fused kernel.

    Arrays in ``operands`` are read at ``i``, numbers are scalars of out's dtype. ``expr`` is a
    CUDA C expression over the operand names and math functions (``"a * x + sinf(y)"``); out
    and every array share a dtype (f32 or f64) and size.

    The kernel is generated, compiled by NVRTC once (disk-cached) and kept by the session. An
    unknown name is a ValidationError; an expression NVRTC rejects is a CompileError with its
    log. Only enqueues.

    Args:
        s: The open `tf.Session` to launch on.
        expr: The CUDA C expression of one element.
        out: The result, f32 or f64: a tf.Tensor or anything ``s.tensor_mut`` accepts.
        **operands: The names ``expr`` uses: arrays (anything ``s.tensor`` accepts) of
            ``out``'s dtype and size, or numbers (scalars of ``out``'s dtype).

    Raises:
        ValidationError: ``s`` is not a Session, ``expr`` is empty or not a str, ``out`` is
            not f32 or f64, ``expr`` names something that is neither an operand nor a known
            math function, an operand's name is not usable (one ending in ``_``, a math
            function's), an array is refused as a span or differs from ``out`` in size or
            dtype, or a number does not fit ``out``'s dtype.
        CompileError: NVRTC rejected ``expr``; the exception carries its log.
        RuntimeStateError: The session is closed or used from another thread, or NVRTC is
            missing.
        BackendError: The driver refused the load or the launch.
        KernelFault: A kernel fault has stopped the session.
    """
    op = "kernels.elementwise"
    check_session(s, op)
    if not isinstance(expr, str) or not expr.strip():
        raise ValidationError(f"{op}: expr must be a non-empty str, got {expr!r}")
    om = s.tensor_mut(out)
    t = om.scalar_type
    if t.name not in ("f32", "f64"):
        raise ValidationError(f"{op}: out is {t.name}; elementwise takes f32 or f64")
    names = sorted(operands)
    scalars = tuple(_is_scalar(operands[name]) for name in names)
    # The expression checked and its kernel found once for these names, kinds and type.
    fn = plan(
        s,
        ("elementwise", expr, t, tuple(names), scalars),
        lambda: _fused_function(s, op, expr, t, names, scalars),
    )
    args, arrays = [om], []
    for name, scalar in zip(names, scalars, strict=True):
        v = operands[name]
        if scalar:
            args.append(scalar_for(t, v, op, name))
        else:
            r = s.tensor(v)
            arrays.append(r)
            args.append(r)
    spans_1d(op, om, *arrays)
    args.append(u64(om.size))
    s.launch(fn, grid_stride(s, om.size, per_thread=4, capped=False), args)


def _fused_function(
    s: Any, op: str, expr: str, t: Any, names: list[str], scalars: tuple[bool, ...]
) -> Any:
    """The fused kernel of ``expr`` over the operands ``names`` (scalar or array), compiled."""
    for name in _IDENT.findall(_NUMBER.sub(" ", expr)):
        if name not in names and name not in _RESERVED:
            raise ValidationError(
                f"{op}: expr uses {name!r}, which is neither an operand "
                f"({names}) nor a known math function"
            )
    ctype = C_TYPES[t.name]
    params, array_names = [f"{ctype}* __restrict__ out_"], []
    for name, scalar in zip(names, scalars, strict=True):
        if name in _RESERVED or name.endswith("_") or not _IDENT.fullmatch(name):
            raise ValidationError(f"{op}: operand name {name!r} is not usable")
        if scalar:
            params.append(f"{ctype} {name}")
        else:
            array_names.append(name)
            params.append(f"const {ctype}* __restrict__ {name}_")
    params.append("unsigned long long n__")
    src = _fused_source(ctype, params, array_names, expr)
    try:
        mod = s.resource(("tenferro.kernels.elementwise", src), lambda ss: ss.compile(src))
    except CompileError as exc:
        raise CompileError(f"{op}: expr {expr!r} did not compile", exc.log) from None
    return mod.function("fused_map")


def _is_scalar(v: Any) -> bool:
    """A number, a numpy scalar or a 0-d host array; a device array (0-d too) is an array."""
    if isinstance(v, (int, float, np.generic)):
        return True
    if isinstance(v, np.ndarray):
        return v.ndim == 0
    cls = type(v)
    if hasattr(cls, "__cuda_array_interface__") or hasattr(cls, "__dlpack__"):
        return False  # on the device: read at element i, as the other arrays are
    return hasattr(v, "dtype") and getattr(v, "ndim", 1) == 0


def _fused_source(ctype: str, params: list[str], arrays: list[str], expr: str) -> str:
    """The fused kernel's CUDA C source.

    Four elements a thread by vector accesses where every array is aligned to four elements (as
    elementwise.cu does), one at a time otherwise and for the tail. Every name the kernel adds
    ends in ``__``: operand names never end in ``_``, so they cannot collide.
    """
    ptrs = ["out_"] + [f"{a}_" for a in arrays]
    aligned = " && ".join(f"((unsigned long long){p} % sizeof(P4__) == 0)" for p in ptrs)
    vec_loads = " ".join(
        f"const P4__ v{j}__ = reinterpret_cast<const P4__*>({a}_)[g__];"
        for j, a in enumerate(arrays)
    )
    vec_names = " ".join(f"const {ctype} {a} = v{j}__.v[q__];" for j, a in enumerate(arrays))
    loads = " ".join(f"const {ctype} {a} = {a}_[i__];" for a in arrays)
    return (
        f"struct alignas(4 * sizeof({ctype})) P4__ {{ {ctype} v[4]; }};\n"
        f'extern "C" __global__ void fused_map({", ".join(params)}) {{\n'
        "  const unsigned long long stride__ = (unsigned long long)gridDim.x * blockDim.x;\n"
        "  const unsigned long long tid__ = blockIdx.x * (unsigned long long)blockDim.x"
        " + threadIdx.x;\n"
        "  unsigned long long head__ = 0;\n"
        f"  if ({aligned}) {{\n"
        "    for (unsigned long long g__ = tid__; g__ < n__ / 4; g__ += stride__) {\n"
        f"      {vec_loads}\n      P4__ o__;\n"
        "#pragma unroll\n"
        f"      for (int q__ = 0; q__ < 4; ++q__) {{ {vec_names} "
        f"o__.v[q__] = ({ctype})({expr}); }}\n"
        "      reinterpret_cast<P4__*>(out_)[g__] = o__;\n    }\n"
        "    head__ = n__ / 4 * 4;\n  }\n"
        "  for (unsigned long long i__ = head__ + tid__; i__ < n__; i__ += stride__) {\n"
        f"    {loads}\n    out_[i__] = ({ctype})({expr});\n  }}\n}}\n"
    )
