"""The base of every typed message: one encode, one decode that checks types and bounds.

A message is a frozen dataclass whose fields are typed with what JSON can carry (int, float,
str, bool, enums, lists, tuples, string-keyed dicts, other messages, ``X | None``) plus Arrow
schemas (carried as base64 Arrow IPC). ``decode`` checks every field against its annotation and
its bounds, and a wrong field fails with a ``ProtocolError`` that names the message and the field
("WorkRequest.partitions[2]: expected an integer, got 'x'"), so a malformed request is refused at
the door instead of failing somewhere deep inside a device.

Bounds come from ``bounded(...)``; every list, dict and string has one (the defaults below), so
no message can make a process allocate without limit.
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import enum
import functools
import json
import math
import threading
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

import pyarrow as pa

from quarry.errors import ProtocolError
from quarry.protocol import frame

ITEMS_MAX_DEFAULT = 1_000_000  # list and dict entries
CHARS_MAX_DEFAULT = 16 << 20  # string characters (a header is at most 16 MiB anyway)
DEPTH_MAX = 32  # nesting of free-form JSON values (``Any`` fields)


def bounded(
    *,
    low: float | None = None,
    high: float | None = None,
    below: float | None = None,
    items_max: int | None = None,
    chars_max: int | None = None,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with bounds: numbers in [low, high] (or [low, below)), at most
    items_max entries, strings of at most chars_max characters."""
    metadata = {
        "low": low,
        "high": high,
        "below": below,
        "items_max": items_max,
        "chars_max": chars_max,
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Message:
    """A typed wire message. ``KIND`` names it in a frame; replies may leave it empty."""

    KIND: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return {name: _encode(getattr(self, name)) for name in _names(type(self))}

    @classmethod
    def from_json(cls, body: Any, where: str | None = None) -> Self:
        where = where or cls.__name__
        if not isinstance(body, Mapping):
            raise ProtocolError(f"{where}: expected an object, got {_show(body)}")
        plan = _plan(cls)
        if not body.keys() <= plan.known:
            unknown = sorted(set(body) - plan.known)
            raise ProtocolError(f"{where}: unknown field(s) {', '.join(unknown)}")
        values = {}
        for name, decoder, required in plan.decoders:
            if name not in body:
                if required:
                    raise ProtocolError(f"{where}.{name}: missing")
                continue
            values[name] = decoder(body[name], f"{where}.{name}")
        try:
            return cls(**values)
        except (AssertionError, ValueError, TypeError) as error:  # __post_init__ checks
            raise ProtocolError(f"{where}: {error}") from None

    # ---- as a frame (requests) and as bare JSON (replies, stream metadata) -----------------

    def encode(self, payload: bytes = b"") -> bytes:
        assert self.KIND, f"{type(self).__name__} has no KIND: it is not sent as a frame"
        return frame.encode(self.KIND, self.to_json(), payload)

    @classmethod
    def decode(cls, data: bytes) -> tuple[Self, bytes]:
        kind, header, payload = frame.decode(data)
        if kind != cls.KIND:
            raise ProtocolError(f"expected a {str(cls.KIND)!r} message, got {kind!r}")
        return cls.from_json(header), payload

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Self:
        try:
            body = json.loads(bytes(data))
        except (ValueError, UnicodeDecodeError) as error:
            raise ProtocolError(f"{cls.__name__}: not JSON ({error})") from None
        return cls.from_json(body)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How to decode one message class: its fields' hints and bounds, worked out once."""

    known: frozenset[str]  # field names, and the frame's own keys
    decoders: tuple[tuple[str, Decoder, bool], ...]  # name, its decoder, required


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    """A message class's field names, in order (``dataclasses.fields`` works them out anew
    on every call: a device encodes a message for every chunk it streams)."""
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _plan(cls: type) -> _Plan:
    hints = typing.get_type_hints(cls)
    decoders = tuple(
        (
            f.name,
            # only the bounds set, in a plain dict: read for every field of every message
            _decoder(hints[f.name], {k: v for k, v in f.metadata.items() if v is not None}),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )
    return _Plan(frozenset({f[0] for f in decoders} | {"protocol", "kind"}), decoders)


# ---- encode -----------------------------------------------------------------------------------

_PLAIN = frozenset({int, float, str, bool, type(None)})


def _encode(value: Any) -> Any:
    if type(value) in _PLAIN:  # most values: nothing to take apart
        return value
    if isinstance(value, Message):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, pa.Schema):
        return _schema_text(value)
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


# ---- decode -----------------------------------------------------------------------------------

_SCALARS = (int, str, float, bool)
Decoder = Callable[[Any, str], Any]  # (the value, where it is) -> the value decoded


def _decoder(hint: Any, bounds: Mapping[str, Any]) -> Decoder:
    """``_decode`` for one field, its hint taken apart once: a device decodes a request and
    the host every message of every stream, and taking each hint apart for each value cost
    the host 0.1 ms a ``WorkDone``. What a value decodes to, and the errors, are
    ``_decode``'s: each fast path hands anything it does not take plainly to it."""
    origin = typing.get_origin(hint)
    if hint in _SCALARS:
        return _scalar_decoder(hint, bounds)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        present = [arg for arg in args if arg is not type(None)]
        if len(present) == 1 and len(args) == 2:
            return _optional_decoder(_decoder(present[0], bounds))
    elif origin in (list, tuple):
        args = typing.get_args(hint)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return _sequence_decoder(_decoder(args[0], bounds), origin, _items_max(bounds))
    elif isinstance(hint, type) and issubclass(hint, Message):
        return hint.from_json
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_decoder(hint)
    return lambda value, where: _decode(hint, value, where, bounds)


def _scalar_decoder(hint: type, bounds: Mapping[str, Any]) -> Decoder:
    slow = functools.partial(_decode_scalar, hint, bounds=bounds)
    if hint is str:
        chars_max = bounds.get("chars_max") or CHARS_MAX_DEFAULT

        def text(value: Any, where: str) -> Any:
            if type(value) is str and len(value) <= chars_max:
                return value
            return slow(value, where)

        return text
    if hint is bool:
        return lambda value, where: value if type(value) is bool else slow(value, where)
    low, high, below = bounds.get("low"), bounds.get("high"), bounds.get("below")

    def number(value: Any, where: str) -> Any:
        if (
            type(value) is hint
            and (hint is int or math.isfinite(value))
            and (low is None or value >= low)
            and (high is None or value <= high)
            and (below is None or value < below)
        ):
            return value
        return slow(value, where)

    return number


def _optional_decoder(inner: Decoder) -> Decoder:
    def optional(value: Any, where: str) -> Any:
        if value is None:
            return None
        try:
            return inner(value, where)
        except ProtocolError as error:  # worded as ``_decode_union`` words it
            raise ProtocolError(f"{where}: {str(error).removeprefix(f'{where}: ')}") from None

    return optional


def _sequence_decoder(inner: Decoder, origin: type, items_max: int) -> Decoder:
    def sequence(value: Any, where: str) -> Any:
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(f"{where}: expected a list, got {_show(value)}")
        if len(value) > items_max:
            raise ProtocolError(f"{where}: more than {items_max} entries ({len(value)})")
        items = [inner(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return tuple(items) if origin is tuple else items

    return sequence


def _enum_decoder(hint: type[enum.Enum]) -> Decoder:
    members = hint._value2member_map_

    def member(value: Any, where: str) -> Any:
        try:
            return members[value]
        except (KeyError, TypeError):
            return _decode_enum(hint, value, where)

    return member


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _decode(hint: Any, value: Any, where: str, bounds: Mapping[str, Any]) -> Any:
    if hint in _SCALARS:  # most fields: no need to take the hint apart
        return _decode_scalar(hint, value, where, bounds)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _decode_union(typing.get_args(hint), value, where, bounds)
    if hint is Any:
        _check_json(value, where, 0)
        return value
    if origin in (list, tuple):
        return _decode_sequence(hint, origin, value, where, bounds)
    if origin is dict:
        return _decode_dict(hint, value, where, bounds)
    if isinstance(hint, type):
        if issubclass(hint, Message):
            return hint.from_json(value, where)
        if issubclass(hint, enum.Enum):
            return _decode_enum(hint, value, where)
        if hint is pa.Schema:
            return _decode_schema(value, where)
        if hint in (bool, int, float, str):
            return _decode_scalar(hint, value, where, bounds)
    raise AssertionError(f"{where}: no decoder for {hint!r}")


def _decode_union(args: tuple, value: Any, where: str, bounds: Mapping[str, Any]) -> Any:
    if value is None:
        if type(None) in args:
            return None
        raise ProtocolError(f"{where}: must not be null")
    problems = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _decode(arg, value, where, bounds)
        except ProtocolError as error:
            problems.append(str(error).removeprefix(f"{where}: "))
    raise ProtocolError(f"{where}: {'; or '.join(problems)}")


def _decode_scalar(hint: type, value: Any, where: str, bounds: Mapping[str, Any]) -> Any:
    if hint is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected true or false, got {_show(value)}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a string, got {_show(value)}")
        chars_max = bounds.get("chars_max") or CHARS_MAX_DEFAULT
        if len(value) > chars_max:
            raise ProtocolError(f"{where}: longer than {chars_max} characters")
        return value
    kind = type(value)  # exact types first: most numbers on the wire are plain ints and floats
    if kind is int and hint is int or kind is float and hint is float:
        pass
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        kind_name = "an integer" if hint is int else "a number"
        raise ProtocolError(f"{where}: expected {kind_name}, got {_show(value)}")
    elif hint is int and not isinstance(value, int):
        if not (math.isfinite(value) and value == int(value)):
            raise ProtocolError(f"{where}: expected an integer, got {_show(value)}")
        value = int(value)
    if hint is float:
        value = float(value)
        if not math.isfinite(value):
            raise ProtocolError(f"{where}: must be finite, got {value}")
    if not bounds:  # no bounds given: nothing more to check
        return value
    low, high = bounds.get("low"), bounds.get("high")
    if low is not None and value < low:
        raise ProtocolError(f"{where}: must be at least {low}, got {value}")
    if high is not None and value > high:
        raise ProtocolError(f"{where}: must be at most {high}, got {value}")
    below = bounds.get("below")
    if below is not None and value >= below:
        raise ProtocolError(f"{where}: must be below {below}, got {value}")
    return value


def _decode_enum(hint: type[enum.Enum], value: Any, where: str) -> Any:
    try:
        return hint(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in hint)
        raise ProtocolError(f"{where}: {_show(value)} is not one of {choices}") from None


# Every partition summary, work request and fetch carries its dataset's schema: the same few
# schemas again and again, so their decoding is kept, keyed by the exact text (schemas are
# immutable; keying by the schema itself would not do: its equality ignores metadata).
SCHEMAS_CACHED_MAX = 1024


_texts: collections.OrderedDict[int, tuple[pa.Schema, str]] = collections.OrderedDict()
_texts_lock = threading.Lock()


def _schema_text(schema: pa.Schema) -> str:
    """A schema's text, remembered per schema object (held, so its id stays its own)."""
    with _texts_lock:
        held = _texts.get(id(schema))
        if held is not None and held[0] is schema:
            _texts.move_to_end(id(schema))
            return held[1]
    text = base64.b64encode(schema.serialize().to_pybytes()).decode()
    with _texts_lock:
        _texts[id(schema)] = (schema, text)
        while len(_texts) > SCHEMAS_CACHED_MAX:
            _texts.popitem(last=False)
    return text


@functools.lru_cache(maxsize=SCHEMAS_CACHED_MAX)
def _schema_of_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))


def _decode_schema(value: Any, where: str) -> pa.Schema:
    if not isinstance(value, str):
        raise ProtocolError(f"{where}: expected an Arrow schema (base64 IPC), got {_show(value)}")
    try:
        return _schema_of_text(value)
    except (binascii.Error, pa.ArrowException, OSError, ValueError) as error:
        raise ProtocolError(f"{where}: not an Arrow schema ({error})") from None


def _items_max(bounds: Mapping[str, Any]) -> int:
    return bounds.get("items_max") or ITEMS_MAX_DEFAULT


def _decode_sequence(
    hint: Any, origin: type, value: Any, where: str, bounds: Mapping[str, Any]
) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ProtocolError(f"{where}: expected a list, got {_show(value)}")
    if len(value) > _items_max(bounds):
        raise ProtocolError(f"{where}: more than {_items_max(bounds)} entries ({len(value)})")
    args = typing.get_args(hint)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise ProtocolError(f"{where}: expected {len(args)} entries, got {len(value)}")
        return tuple(
            _decode(arg, item, f"{where}[{i}]", bounds)
            for i, (arg, item) in enumerate(zip(args, value, strict=True))
        )
    item_hint = args[0] if args else Any
    items = [_decode(item_hint, item, f"{where}[{i}]", bounds) for i, item in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _decode_dict(hint: Any, value: Any, where: str, bounds: Mapping[str, Any]) -> dict:
    if not isinstance(value, Mapping):
        raise ProtocolError(f"{where}: expected an object, got {_show(value)}")
    if len(value) > _items_max(bounds):
        raise ProtocolError(f"{where}: more than {_items_max(bounds)} entries ({len(value)})")
    args = typing.get_args(hint)
    value_hint = args[1] if len(args) == 2 else Any
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise ProtocolError(f"{where}: keys must be strings, got {_show(key)}")
        out[key] = _decode(value_hint, item, f"{where}[{key!r}]", bounds)
    return out


def _check_json(value: Any, where: str, depth: int) -> None:
    """A free-form value (application metadata, hints): plain JSON, bounded in depth."""
    if depth > DEPTH_MAX:
        raise ProtocolError(f"{where}: nested deeper than {DEPTH_MAX}")
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_json(item, where, depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(f"{where}: keys must be strings, got {_show(key)}")
            _check_json(item, where, depth + 1)
        return
    raise ProtocolError(f"{where}: not a JSON value: {_show(value)}")
