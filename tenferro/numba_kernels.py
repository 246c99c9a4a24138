"""numba-cuda kernels compiled for a session's device and launched through the session's path.

numba compiles and links the kernel (its PTX or LTO-IR, ``link=`` files, its runtime helpers)
and loads it into the primary context, which is the session's context. tenferro then takes the
kernel's CUfunction and launches it itself, packing numba's argument layout into one
pre-allocated parameter block:

* an array is 5 + 2*ndim 64-bit slots: meminfo (0), parent (0), nitems, itemsize, data,
  shape[ndim], strides[ndim] in bytes;
* a scalar is its exact width (bool one byte, float16 its 16 bits, complex two floats).

Which arrays a kernel writes is read from numba's typed IR (`written_arrays`); a read-only
`TensorRef` passed there is refused. Detected: stores ``a[i] = v`` into the array or any view of
it (slices, ``.T``, ``reshape`` ...) and ``cuda.atomic.*`` on it. Not detected: stores made
inside called device functions, or through pointers the kernel makes itself.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _driver, dtypes
from .args import CTYPES_SIMPLE, KernelArg, ParamBlockBase, from_ctypes
from .dtypes import ScalarType
from .errors import ValidationError
from .signature import INT, OPAQUE, Param, Signature
from .spans import DeviceBytes, Span, TensorMut, TensorRef

if TYPE_CHECKING:  # module is imported where a Function is made (compile_for_session)
    from .module import Function

__all__ = ["NumbaKernel", "NumbaParamBlock", "numba_kernel", "numba_layout", "written_arrays"]

_SPAN_TYPES = (TensorRef, TensorMut, DeviceBytes)
_ARRAY, _SCALAR_ARG = 0, 1
_UNSET = object()  # no array packed in this place: the shortcut's identity test fails
_is = operator.is_


def _numba():
    from numba import cuda, types

    return cuda, types


def scalar_type_of(nb_type: Any, op: str) -> ScalarType:
    """The tenferro scalar type of a numba scalar type (int32, float16, boolean, complex64...)."""
    from numba.np import numpy_support

    try:
        return dtypes.from_numpy(numpy_support.as_dtype(nb_type), op)
    except Exception as exc:
        if isinstance(exc, ValidationError):
            raise
        raise ValidationError(f"{op}: numba type {nb_type} has no device scalar type") from None


def numba_layout(
    argtypes: tuple[Any, ...], name: str, op: str
) -> tuple[list[tuple[int, ScalarType, int, str, int]], Signature]:
    """Per argument, how it is packed; and the flat kernel parameter list numba emits.

    Refused: argument types tenferro does not pack (records, tuples, pointers, ...).
    """
    _, types = _numba()
    specs: list[tuple[int, ScalarType, int, str, int]] = []
    params: list[Param] = []
    for i, ty in enumerate(argtypes):
        if isinstance(ty, types.Array):
            t = scalar_type_of(ty.dtype, f"{op}: argument {i}")
            specs.append((_ARRAY, t, ty.ndim, ty.layout, len(params)))
            params.extend(
                Param(INT, 8, 8, dtypes.by_name("i64"), f"{i}.{f}") for f in _array_fields(ty.ndim)
            )
        elif isinstance(ty, (types.Integer, types.Float, types.Boolean, types.Complex)):
            t = scalar_type_of(ty, f"{op}: argument {i}")
            specs.append((_SCALAR_ARG, t, 0, "", len(params)))
            if t.kind == "complex":
                half = t.itemsize // 2
                params.extend(
                    Param(OPAQUE, half, half, None, f"{i}.{part}") for part in ("real", "imag")
                )
            else:
                params.append(Param(OPAQUE, t.itemsize, t.itemsize, t, str(i)))
        else:
            raise ValidationError(
                f"{op}: argument {i} of {name!r} has numba type {ty}; "
                "tenferro packs arrays and scalars only"
            )
    return specs, Signature(name, tuple(params), "numba")


def _array_fields(ndim: int) -> list[str]:
    return [
        "meminfo",
        "parent",
        "nitems",
        "itemsize",
        "data",
        *(f"shape{d}" for d in range(ndim)),
        *(f"stride{d}" for d in range(ndim)),
    ]


def written_arrays(type_annotation: Any, nargs: int) -> set[int]:
    """Indices of the array arguments numba's typed IR shows the kernel storing into."""
    from numba.cuda.core import ir

    _, types = _numba()
    typemap = type_annotation.typemap
    blocks = type_annotation.blocks
    alias: dict[str, int] = {}
    for blk in blocks.values():
        for st in blk.body:
            if (
                isinstance(st, ir.Assign)
                and isinstance(st.value, ir.Arg)
                and st.value.index < nargs
            ):
                alias[st.target.name] = st.value.index
    changed = True
    while changed:  # views of views: follow until nothing new
        changed = False
        for blk in blocks.values():
            for st in blk.body:
                if not isinstance(st, ir.Assign) or st.target.name in alias:
                    continue
                if not isinstance(typemap.get(st.target.name), types.Array):
                    continue
                src = _array_source(st.value, alias, ir)
                if src is not None:
                    alias[st.target.name] = src
                    changed = True
    writes: set[int] = set()
    for blk in blocks.values():
        for st in blk.body:
            if isinstance(st, (ir.SetItem, ir.StaticSetItem)) and st.target.name in alias:
                writes.add(alias[st.target.name])
            elif (
                isinstance(st, ir.Assign)
                and isinstance(st.value, ir.Expr)
                and st.value.op == "call"
                and st.value.args
            ):
                fty = str(typemap.get(st.value.func.name, ""))
                first = st.value.args[0]
                if "stubs.atomic" in fty and first.name in alias:
                    writes.add(alias[first.name])
    return writes


def _array_source(value: Any, alias: dict[str, int], ir: Any) -> int | None:
    """The argument an array-typed expression views, when it is made from one."""
    if isinstance(value, ir.Var):
        return alias.get(value.name)
    if not isinstance(value, ir.Expr):
        return None
    if value.op in ("getattr", "getitem", "static_getitem"):
        return alias.get(value.value.name)
    if value.op == "call":
        for v in (*value.args, value.func):
            if isinstance(v, ir.Var) and v.name in alias:
                return alias[v.name]
    if value.op == "cast":
        return alias.get(value.value.name)
    return None


class NumbaParamBlock(ParamBlockBase):
    """numba's argument layout in one buffer, with cuLaunchKernel's pointer array into it.

    `pack` is `ParamBlockBase.pack` (check every argument, write it in place, return the spans),
    with one shortcut: where the arrays are the very spans packed last and every scalar is a
    numpy scalar of its parameter's own type (``np.float32(x)`` made in the call), the
    scalars are written and nothing else runs.
    """

    __slots__ = (
        "_last_arrays",
        "_quick_pack",
        "name",
        "scalar_places",
        "specs",
        "structs",
        "takes_quickly",
        "writes",
    )
    name: str
    # Per argument: (kind, scalar type, ndim, numba layout, index of its first parameter).
    specs: list[tuple[int, ScalarType, int, str, int]]
    writes: frozenset[int]
    nparams: int  # set here, from the specs (ParamBlockBase declares it)
    last_args: tuple[Any, ...]  # set in pack too (ParamBlockBase declares it)
    structs: tuple[struct.Struct | None, ...]
    scalar_places: tuple[tuple[type, np.ndarray] | None, ...]
    _last_arrays: list[Any]
    takes_quickly: Callable[[list[Any] | tuple[Any, ...]], bool]
    _quick_pack: Callable[[list[Any] | tuple[Any, ...]], bool]
    what = "numba kernel"

    def __init__(
        self,
        name: str,
        specs: list[tuple[int, ScalarType, int, str, int]],
        sig: Signature,
        writes: Collection[int],
    ) -> None:
        super().__init__(sig)
        self.name = name
        self.specs = specs
        self.writes = frozenset(writes)
        self.nparams = len(specs)
        self.structs = tuple(
            struct.Struct(f"<{5 + 2 * s[2]}q") if s[0] == _ARRAY else None for s in specs
        )
        # Per argument: (the numpy scalar class whose own bytes are its packing, a one-element
        # numpy array of that type over its bytes) for a scalar, None for an array or a type
        # numpy has no scalar class for. Assigning a scalar of the array's type copies its bits.
        places = []
        for kind, t, _, _, first in specs:
            c = None if kind == _ARRAY else dtypes.numpy_scalar_class(t)
            places.append(
                None
                if c is None
                else (
                    c,
                    np.frombuffer(self._mv, dtype=t.numpy, count=1, offset=self.offsets[first]),
                )
            )
        self.scalar_places = tuple(places)
        self._last_arrays = [_UNSET] * sum(sp[0] == _ARRAY for sp in specs)
        self.takes_quickly, self._quick_pack = self._straight_line_checks()

    def _straight_line_checks(self) -> tuple[Any, Any]:
        """``(takes_quickly, quick_pack)`` unrolled for this kernel's arguments.

        ``takes_quickly(args)`` is True when args are the very arrays packed last and, where
        scalars go, numpy scalars of the parameters' own types: what changes is their bytes
        alone, and not the kernel's types. ``quick_pack(args)`` is the same test that also
        writes those scalars. A kernel with a scalar type numpy has no class for (bf16) has
        no shortcut: both are always False.
        """
        names = [f"a{i}" for i in range(self.nparams)]
        consts: dict[str, Any] = {"last": self._last_arrays}
        tests, writes, k = [], [], 0
        for i, place in enumerate(self.scalar_places):
            if self.specs[i][0] == _ARRAY:
                tests.append(f"a{i} is last[{k}]")
                k += 1
            elif place is None:
                tests.append("False")
            else:
                consts[f"C{i}"], consts[f"V{i}"] = place
                tests.insert(0, f"a{i}.__class__ is C{i}")
                writes.append(f"        V{i}[0] = a{i}")
        unpack = f"    {', '.join(names)}, = args" if names else "    pass"
        test = " and ".join(tests) or "True"
        doc = (
            '    """Generated for one signature by tenferro.numba_kernels.NumbaParamBlock.'
            '_straight_line_checks (its source is built there)."""'
        )
        lines = [
            "def takes_quickly(args):",
            doc,
            f"    if len(args) != {self.nparams}:",
            "        return False",
            unpack,
            f"    return {test}",
            "def quick_pack(args):",
            doc,
            f"    if len(args) != {self.nparams}:",
            "        return False",
            unpack,
            f"    if {test}:",
            *writes,
            "        return True",
            "    return False",
        ]
        exec(
            compile(
                "\n".join(lines),
                "<tenferro.numba_kernels.NumbaParamBlock._straight_line_checks>",
                "exec",
            ),
            consts,
        )
        return consts["takes_quickly"], consts["quick_pack"]

    def pack(self, args: list[Any] | tuple[Any, ...], state: Any, op: str) -> list[Span]:
        """`ParamBlockBase.pack`; new numpy scalars of their own types alone are just written."""
        if self._quick_pack(args):
            self.last_args = tuple(args)  # these scalars are now the ones packed
            return self.last_spans
        last = self._last_arrays
        last[:] = [_UNSET] * len(last)  # a refused pack may have written some places
        spans = super().pack(args, state, op)
        last[:] = [a for a, sp in zip(args, self.specs, strict=True) if sp[0] == _ARRAY]
        return spans

    pack_new = pack  # its shortcut is its own test

    def forget(self) -> None:
        """`ParamBlockBase.forget`, and the arrays the shortcut compares with."""
        super().forget()
        self._last_arrays[:] = [_UNSET] * len(self._last_arrays)

    def fresh(self) -> NumbaParamBlock:
        """A new, empty block for the same kernel (for a bound launch of its own)."""
        return NumbaParamBlock(self.name, self.specs, self.sig, self.writes)

    def pack_slot(self, i: int, a: Any, state: Any, op: str) -> Any:
        """Check and write argument ``i`` alone; return its span, or None for a scalar."""
        kind, t, ndim, layout, first = self.specs[i]
        off = self.offsets[first]
        if type(a) is KernelArg and a.span is not None:
            a = a.span
        if kind != _ARRAY:
            place = self.scalar_places[i]
            if place is not None and a.__class__ is place[0]:  # np.float32(x) for a float32
                place[1][0] = a
            else:
                data = _scalar_bytes(a, t, op, i, self.name)
                self._mv[off : off + len(data)] = data
            return None
        cls = type(a)
        if cls not in _SPAN_TYPES:
            raise ValidationError(
                f"{op}: args[{i}] of {self.name!r} is an array ({t.name}, {ndim}-d); "
                f"got {type(a).__name__}, expected s.tensor(x) or s.tensor_mut(x)"
            )
        if a.state is not state:
            raise ValidationError(f"{op}: args[{i}] is a {cls.__name__} of another session")
        if a.scalar_type is not t or len(a.shape) != ndim:
            raise ValidationError(
                f"{op}: args[{i}] of {self.name!r} expects a {ndim}-d {t.name} array, "
                f"got a {len(a.shape)}-d {a.scalar_type.name} span"
            )
        if (layout == "C" and not a.is_c_contiguous) or (layout == "F" and not a.is_f_contiguous):
            raise ValidationError(
                f"{op}: args[{i}] of {self.name!r} expects layout {layout!r}, got "
                f"strides={a.strides}; compile for layout 'A' ({t.name}[:, :]) to take "
                "strided views"
            )
        if cls is TensorRef and i in self.writes:
            raise ValidationError(
                f"{op}: args[{i}] is a read-only TensorRef but numba kernel "
                f"{self.name!r} stores into that array; use tensor_mut()"
            )
        self.structs[i].pack_into(  # type: ignore[union-attr]  # an array has its Struct
            self._mv, off, 0, 0, a.size, t.itemsize, a.ptr, *a.shape, *a.strides
        )
        return a


def _scalar_bytes(a: Any, t: ScalarType, op: str, i: int, name: str) -> bytes:
    where = f"{op}: args[{i}]"
    if type(a) is KernelArg:
        if a.scalar_type is not t:
            raise ValidationError(
                f"{where} of numba kernel {name!r} expects {t.name}, got {a.describe()}"
            )
        return a.data
    given = ""
    if isinstance(a, CTYPES_SIMPLE):  # c_int(5): the numpy scalar of its C type
        given = f"ctypes {type(a).__name__}"
        a = from_ctypes(a, where)
    if isinstance(a, np.generic):
        got = dtypes.from_numpy(a.dtype, where)
        if got is not t:
            raise ValidationError(
                f"{where} of numba kernel {name!r} expects {t.name}, got "
                f"{given or f'numpy {a.dtype}'} scalar"
            )
        return dtypes.pack_scalar(t, a.item(), where)
    if type(a) in (int, float, bool, complex):
        return dtypes.pack_scalar(t, a, where)  # the type is known here: range-checked into it
    raise ValidationError(
        f"{where} of numba kernel {name!r} expects a {t.name} scalar, got {type(a).__name__}"
    )


class _NumbaModule:
    """Holds a compiled numba kernel alive for its Functions; numba owns the loaded image."""

    __slots__ = ("__weakref__", "kernel", "state")
    state: Any
    kernel: Any

    def __init__(self, state: Any, kernel: Any) -> None:
        self.state = state
        self.kernel = kernel

    def unload(self) -> None:
        """Numba unloads its own modules; nothing to do."""


def _specialization_type(a: Any, op: str, i: int) -> Any:
    """The numba type an argument asks for, when the kernel has no explicit signature."""
    from numba import from_dtype as _from_dtype

    from_dtype: Any = _from_dtype  # numba's annotation names one numpy type only

    _, types = _numba()
    if type(a) is KernelArg and a.span is not None:
        a = a.span
    if type(a) in _SPAN_TYPES:
        t = a.scalar_type
        if t.numpy is None:
            raise ValidationError(f"{op}: args[{i}] is {t.name}, which numba has no type for")
        return types.Array(from_dtype(t.numpy), len(a.shape), "C" if a.is_c_contiguous else "A")
    if type(a) is KernelArg and a.scalar_type is not None:
        return from_dtype(a.scalar_type.numpy)
    if isinstance(a, CTYPES_SIMPLE):
        a = from_ctypes(a, f"{op}: args[{i}]")
    if isinstance(a, np.generic):
        return from_dtype(a.dtype)
    if type(a) in (int, float, bool, complex):
        raise ValidationError(
            f"{op}: args[{i}] is a bare Python {type(a).__name__}; a numba kernel without a "
            "signature specializes on argument types, so give it a type (tf.i64(n), "
            "tf.f32(x), np.float64(x)) or pass signature= to s.numba_kernel"
        )
    raise ValidationError(
        f"{op}: args[{i}] is {type(a).__name__}; expected a span or a typed scalar"
    )


def _quick_key(a: Any) -> Any:
    """What decides ``a``'s numba type (`_specialization_type`), or None where that is unsure.

    A span's scalar type, ndim and C-contiguity; a typed scalar's type; a numpy scalar's dtype.
    """
    cls = a.__class__
    if cls is KernelArg:
        if a.span is None:
            return a.scalar_type
        a = a.span
        cls = a.__class__
    if cls in _SPAN_TYPES:
        return a.scalar_type, len(a.shape), a.is_c_contiguous
    if isinstance(a, np.generic):
        return a.dtype
    return None


class NumbaKernel:
    """A numba kernel in a session: specialized on the launch's arguments, one per type key.

    ``s.numba_kernel(f)`` returns one; ``s.launch`` takes it where it takes a Function.
    """

    __slots__ = (
        "__weakref__",
        "_by_quick_key",
        "_last",
        "dispatcher",
        "name",
        "specializations",
        "state",
    )
    state: Any
    dispatcher: Any
    name: str
    specializations: dict[tuple[Any, ...], Function]  # numba argument types -> Function
    _by_quick_key: dict[tuple[Any, ...], Function]
    _last: tuple[tuple[Any, ...], Any]  # (the last arguments, their Function or None)

    @property
    def session(self) -> Any:
        """The `tenferro.Session` this kernel belongs to."""
        return self.state.session

    def __init__(self, state: Any, dispatcher: Any, name: str) -> None:
        self.state = state
        self.dispatcher = dispatcher
        self.name = name
        self.specializations = {}
        # The same Functions by a key read off the arguments without building numba types
        # (microseconds an argument): what a launch with new argument objects looks up.
        self._by_quick_key = {}
        self._last = ((), None)
        state.liveness.add_cache(self)

    def forget(self) -> None:
        """Drop the remembered last arguments (the session calls this when it synchronizes)."""
        self._last = ((), None)

    def known_function(self, args: list[Any] | tuple[Any, ...]) -> Function | None:
        """The Function already compiled for these arguments' types, or None (nothing checked).

        What a launch looks up first: the last arguments' Function (the same objects, or its
        arrays and new numpy scalars of its parameters' types), or one found by the quick key;
        anything else goes to `function_for` on the checked path.
        """
        prev, fn = self._last  # ((), None) until a Function is found
        if prev:
            if fn.param_block.takes_quickly(args) or (
                len(args) == len(prev) and all(map(_is, args, prev))
            ):
                return fn
        fn = self._by_quick_key.get(tuple(map(_quick_key, args)))
        if fn is not None:
            self._last = (tuple(args), fn)
        return fn

    def function_for(self, args: list[Any] | tuple[Any, ...], op: str) -> Function:
        """The compiled Function for these arguments' types (compiled once per type key).

        Args:
            args: The launch's arguments: spans (`TensorRef`, `TensorMut`, `DeviceBytes`,
                or `KernelArg.pointer`), typed scalars (``tf.f32(x)``) or numpy scalars; a
                bare Python number is refused, as its type is not known.
            op: The operation named in refusals (``"session.launch"``).

        Returns:
            The `Function` of this kernel's specialization to the arguments' dtypes, ndim
                and contiguity.

        Raises:
            ValidationError: The count differs from the kernel's parameters, an argument is
                a bare Python number, not a span or typed scalar, or of a dtype numba has no
                type for (bf16), or the specialization is refused (argument types tenferro
                does not pack, a kernel compiled per launch configuration). numba's own
                errors (a kernel it cannot type) propagate.
        """
        fn = self.known_function(args)
        if fn is not None:
            return fn
        code = getattr(getattr(self.dispatcher, "py_func", None), "__code__", None)
        if code is not None and len(args) != code.co_argcount:
            raise ValidationError(
                f"{op}: numba kernel {self.name!r} takes "
                f"{code.co_argcount} argument(s), got {len(args)}"
            )
        key = tuple(_specialization_type(a, op, i) for i, a in enumerate(args))
        fn = self.specializations.get(key)
        if fn is None:
            fn = self.specializations[key] = compile_for_session(
                self.state, self.dispatcher, key, self.name, op
            )
        quick = tuple(map(_quick_key, args))
        if None not in quick:  # each part decides its numba type: the same Function
            self._by_quick_key[quick] = fn
        self._last = (tuple(args), fn)
        return fn

    def __repr__(self) -> str:
        return f"NumbaKernel({self.name!r}, {len(self.specializations)} specialization(s))"


def as_dispatcher(f: Any, op: str) -> tuple[Any, str]:
    """A numba CUDA kernel dispatcher for ``f`` (a dispatcher, or a Python function to jit)."""
    cuda, _ = _numba()
    from numba import config

    if getattr(config, "ENABLE_CUDASIM", 0):  # set from the environment when numba loads
        raise ValidationError(
            f"{op}: numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): its kernels run on "
            "the CPU through numba's own launch, and tenferro launches compiled kernels on the "
            "device; unset NUMBA_ENABLE_CUDASIM in this process"
        )
    from numba.cuda.dispatcher import CUDADispatcher

    if isinstance(f, CUDADispatcher):
        if f.targetoptions.get("device"):
            raise ValidationError(
                f"{op}: {f.py_func.__name__!r} is a device function "
                "(device=True); launch a kernel that calls it"
            )
        if f.targetoptions.get("debug"):
            raise ValidationError(
                f"{op}: {f.py_func.__name__!r} is built with debug=True, whose "
                "exception flags need numba's own launcher"
            )
        return f, f.py_func.__name__
    if callable(f) and hasattr(f, "__code__"):
        return cuda.jit(f), f.__name__
    raise ValidationError(
        f"{op}: expected a Python function or a numba.cuda.jit kernel, got {type(f).__name__}"
    )


def compile_for_session(state: Any, dispatcher: Any, sig: Any, name: str, op: str) -> Function:
    """Compile ``dispatcher`` for ``sig`` (argument types or a signature string) in ``session``.

    A kernel that uses grid sync launches only with ``cooperative=True``. Refused: kernels
    whose code depends on the launch configuration.
    """
    from numba.cuda.core import sigutils

    from .module import Function

    cuda, _ = _numba()
    if isinstance(sig, tuple):
        argtypes = sig
    else:
        try:
            argtypes, _ret = sigutils.normalize_signature(sig)
        except Exception as exc:
            raise ValidationError(
                f"{op}: signature={sig!r} is not a numba signature: {exc}"
            ) from None
    with cuda.gpus[state.device]:  # numba's handle on the same primary context
        kern = dispatcher.compile(argtypes)
        kern.bind()
        cufunc = kern.library.get_cufunc()
    if getattr(kern, "launch_config_sensitive", False):
        raise ValidationError(
            f"{op}: numba kernel {name!r} is compiled per launch "
            "configuration; s.launch cannot launch it"
        )
    specs, psig = numba_layout(tuple(kern.signature.args), name, op)
    writes = written_arrays(kern.type_annotation, len(specs))
    param_block = NumbaParamBlock(name, specs, psig, writes)
    handle = _driver.kernel_function(int(cufunc.handle), op)
    return Function(
        _NumbaModule(state, kern), name, handle, psig, param_block, grid_sync=bool(kern.cooperative)
    )


def numba_kernel(st: Any, kernel: Any, signature: Any = None) -> NumbaKernel | Function:
    """A numba-cuda kernel for this session, launched by `launch` like any Function.

    ``kernel`` is a ``@cuda.jit`` dispatcher or a plain Python function. With a numba
    ``signature`` (``"void(float32[::1], float32[:], float32)"``) it compiles now and returns
    a Function; without one it returns a `NumbaKernel` that `launch` specializes on the
    arguments' dtypes, ndim and layout (compiled once per combination).
    """
    op = "session.numba_kernel"
    st.check_use(op)
    dispatcher, name = as_dispatcher(kernel, op)
    if signature is None:
        return NumbaKernel(st, dispatcher, name)
    return compile_for_session(st, dispatcher, signature, name, op)
