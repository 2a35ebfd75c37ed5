"""Tensors out of a ``torch.save`` archive without unpickling it: a published Jacobian lens in the reference's own
file (``anthropics/jacobian-lens``, ``JacobianLens.save``: ``torch.save({"J": {layer: tensor}, "n_prompts": ...,
"source_layers": [...], "d_model": ...})``).

A ``torch.save`` file is a zip holding ``<name>/data.pkl`` (a pickle of the structure) and ``<name>/data/<key>``
(each storage's raw bytes). Unpickling it runs whatever callables the pickle names; ``torch.load(weights_only=True)``
narrows them but still unpickles. Here the pickle is only *parsed* (:func:`pickletools.genops` reads opcodes and
executes nothing) and interpreted by a small stack machine that knows plain containers, numbers, strings and
exactly two callables: ``torch._utils._rebuild_tensor_v2`` and ``collections.OrderedDict``, with the storage types
of the float and integer dtypes. Anything else — another global, an opcode outside the list — is refused by name,
so a file that would run code is never more than bytes read.
"""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path

import torch

from lens.errors import LensInputError

_STORAGES = {"FloatStorage": torch.float32, "HalfStorage": torch.float16, "BFloat16Storage": torch.bfloat16,
             "DoubleStorage": torch.float64, "LongStorage": torch.int64, "IntStorage": torch.int32,
             "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
             "BoolStorage": torch.bool}
_REBUILD = ("torch._utils", "_rebuild_tensor_v2")
_ORDERED = ("collections", "OrderedDict")
_MARK = object()


class _Global(tuple):
    pass


class _Storage:
    def __init__(self, key: str, dtype: torch.dtype):
        self.key, self.dtype = key, dtype


def is_torch_archive(path) -> bool:
    return zipfile.is_zipfile(path)


def read_torch_archive(path):
    """The object a ``torch.save`` archive holds, when it is built of containers, numbers, strings and tensors."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pkl) != 1:
                raise LensInputError(f"{path} is a zip but not a torch.save archive (no single data.pkl)")
            prefix = pkl[0][: -len("data.pkl")]
            order = z.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in names else "little"
            if order != "little":
                raise LensInputError(f"{path}: storages in {order}-endian byte order are not read")
            return _interpret(path, z.read(pkl[0]), lambda key: z.read(f"{prefix}data/{key}"))
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as exc:
        raise LensInputError(f"{path} is not a whole torch.save archive (truncated or damaged?): {exc}") from None


def _refuse(path, what: str):
    raise LensInputError(f"{path} holds {what}: only tensors in plain containers are read from a torch.save file "
                         "(it is parsed, never unpickled)")


# opcodes that push one plain value (from the opcode's argument)
_LITERALS = {
    "EMPTY_DICT": lambda a: {}, "EMPTY_LIST": lambda a: [], "EMPTY_TUPLE": lambda a: (), "NONE": lambda a: None,
    "NEWTRUE": lambda a: True, "NEWFALSE": lambda a: False,
    **dict.fromkeys(("BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"), int),
    **dict.fromkeys(("BINFLOAT", "FLOAT"), float),
    **dict.fromkeys(("BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE"), str),
}
# opcodes that build or fill a tuple, list or dict from the stack
_CONTAINER_OPS = ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST", "DICT", "APPEND", "APPENDS", "SETITEM", "SETITEMS")


def _pop_mark(stack: list, marks: list[int]) -> list:
    start = marks.pop()
    items = stack[start:]
    del stack[start:]
    return items


def _container_op(name: str, stack: list, marks: list[int]) -> None:
    """One of :data:`_CONTAINER_OPS` on the pickle machine's ``stack`` (``marks``: its MARK positions)."""
    if name == "TUPLE":
        stack.append(tuple(_pop_mark(stack, marks)))
    elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
        n = int(name[-1])
        items = tuple(stack[-n:])
        del stack[-n:]
        stack.append(items)
    elif name == "LIST":
        stack.append(list(_pop_mark(stack, marks)))
    elif name == "DICT":
        items = _pop_mark(stack, marks)
        stack.append(dict(zip(items[::2], items[1::2])))
    elif name == "APPEND":
        v = stack.pop()
        stack[-1].append(v)
    elif name == "APPENDS":
        items = _pop_mark(stack, marks)
        stack[-1].extend(items)
    elif name == "SETITEM":
        v, k = stack.pop(), stack.pop()
        stack[-1][k] = v
    else:  # SETITEMS
        items = _pop_mark(stack, marks)
        for k, v in zip(items[::2], items[1::2]):
            stack[-1][k] = v


def _interpret(path, data: bytes, storage_bytes):
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    cache: dict = {}

    def tensor(args):
        storage, offset, size, stride = args[:4]
        if not isinstance(storage, _Storage):
            _refuse(path, "a tensor rebuilt from something other than a storage")
        if storage.key not in cache:
            raw = bytearray(storage_bytes(storage.key))
            cache[storage.key] = torch.frombuffer(raw, dtype=storage.dtype) if raw else torch.empty(0, dtype=storage.dtype)
        return cache[storage.key].as_strided(tuple(size), tuple(stride), int(offset)).clone()

    try:
        ops = list(pickletools.genops(data))
    except Exception as exc:  # genops raises ValueError and others on a damaged stream
        raise LensInputError(f"{path}: its data.pkl is damaged ({exc})") from None
    for op, arg, _pos in ops:
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            break
        if name in _LITERALS:
            stack.append(_LITERALS[name](arg))
        elif name == "MARK":
            marks.append(len(stack))
        elif name in _CONTAINER_OPS:
            _container_op(name, stack, marks)
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo[arg])
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
            else:
                attr, module = stack.pop(), stack.pop()
            g = (module, attr)
            if g not in (_REBUILD, _ORDERED) and not (module == "torch" and attr in _STORAGES):
                _refuse(path, f"a reference to {module}.{attr}")
            stack.append(_Global(g))
        elif name == "BINPERSID":
            pid = stack.pop()
            if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], _Global)):
                _refuse(path, f"a persistent object {pid!r}")
            stack.append(_Storage(str(pid[2]), _STORAGES[pid[1][1]]))
        elif name == "REDUCE":
            args, fn = stack.pop(), stack.pop()
            if fn == _ORDERED and args == ():
                stack.append({})
            elif fn == _REBUILD:
                stack.append(tensor(args))
            else:
                _refuse(path, f"a call of {fn!r}")
        else:
            _refuse(path, f"the pickle opcode {name}")
    if len(stack) != 1:
        raise LensInputError(f"{path}: its data.pkl did not end with one object (damaged?)")
    return stack[0]
