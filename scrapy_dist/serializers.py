"""Request <-> bytes.

Requests travel through Redis as ``request.to_dict(spider=spider)`` (callbacks and
errbacks by method name) encoded by a serializer. The default is JSON made bytes-safe:
``bytes`` become ``{"$b": <latin-1 text>}``, and a few Python types JSON lacks are
tagged the same way, so a request comes back equal to what went in. Pickle is available
only when ``SCHEDULER_SERIALIZER`` asks for it: unpickling data from a Redis that
someone else can write to runs their code.
"""

from __future__ import annotations

import json
import logging
import pickle
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from scrapy import Request as _Request
from scrapy.utils.misc import load_object
from scrapy.utils.request import request_from_dict

from scrapy_dist.exceptions import ConfigurationError, SerializationError

if TYPE_CHECKING:
    from scrapy import Request, Spider

logger = logging.getLogger(__name__)

#: Tag of an encoded ``bytes`` value.
BYTES = "$b"
#: Tag of a tuple.
TUPLE = "$t"
#: Tag of a set or frozenset.
SET = "$s"
#: Tag of a dict whose keys are not all plain strings (e.g. headers), as key/value pairs.
PAIRS = "$d"
_TAGS = frozenset((BYTES, TUPLE, SET, PAIRS))
#: Marks a callback whose name must be found by Scrapy's slower lookup.
_UNKNOWN = object()


@runtime_checkable
class Serializer(Protocol):
    """Turns the dict form of a request into bytes and back."""

    def dumps(self, obj: dict[str, Any], /) -> bytes: ...

    def loads(self, data: bytes, /) -> dict[str, Any]: ...


def _encode(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, bytes):
        return {BYTES: obj.decode("latin-1")}
    if isinstance(obj, list):
        return [_encode(v) for v in obj]
    if isinstance(obj, tuple):
        return {TUPLE: [_encode(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {SET: [_encode(v) for v in obj]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: _encode(v) for k, v in obj.items()}
        return {PAIRS: [[_encode(k), _encode(v)] for k, v in obj.items()]}
    raise TypeError(f"{type(obj).__name__} object {obj!r:.80} is not JSON serializable")


def _decode_hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        ((tag, value),) = obj.items()
        if tag in _TAGS:
            if tag == BYTES:
                return value.encode("latin-1")
            if tag == TUPLE:
                return tuple(value)
            if tag == SET:
                return set(value)
            return {_hashable(k): v for k, v in value}
    return obj


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


class JsonSerializer:
    """Bytes-safe JSON; the default and the only safe choice for a shared Redis."""

    def dumps(self, obj: dict[str, Any], /) -> bytes:
        """Encode ``obj``.

        Raises:
            SerializationError: ``obj`` holds a value JSON cannot carry (an arbitrary
                object in ``meta``, say); the message names it.
        """
        try:
            return json.dumps(
                _encode(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=True
            ).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as e:
            raise SerializationError(str(e)) from e

    def loads(self, data: bytes, /) -> dict[str, Any]:
        """Decode what :meth:`dumps` produced.

        Raises:
            SerializationError: ``data`` is not a JSON object.
        """
        try:
            obj = json.loads(data, object_hook=_decode_hook)
        except (ValueError, TypeError) as e:
            raise SerializationError(f"not a serialized request: {e}") from e
        if not isinstance(obj, dict):
            raise SerializationError(f"not a serialized request: {type(obj).__name__}")
        return obj


class PickleSerializer:
    """Pickle (protocol 4). Unsafe unless only trusted parties can write to Redis."""

    def dumps(self, obj: dict[str, Any], /) -> bytes:
        """Pickle ``obj``.

        Raises:
            SerializationError: ``obj`` cannot be pickled.
        """
        try:
            return pickle.dumps(obj, protocol=4)
        except (pickle.PicklingError, AttributeError, TypeError, RecursionError) as e:
            raise SerializationError(str(e)) from e

    def loads(self, data: bytes, /) -> dict[str, Any]:
        """Unpickle ``data``.

        Raises:
            SerializationError: ``data`` is not a pickled dict.
        """
        try:
            obj = pickle.loads(data)
        except Exception as e:
            raise SerializationError(f"not a pickled request: {e}") from e
        if not isinstance(obj, dict):
            raise SerializationError(f"not a pickled request: {type(obj).__name__}")
        return obj


#: Short names accepted by ``SCHEDULER_SERIALIZER``.
NAMED: dict[str, type[Serializer]] = {"json": JsonSerializer, "pickle": PickleSerializer}


def load_serializer(spec: Any) -> Serializer:
    """Resolve ``SCHEDULER_SERIALIZER``: a short name, an import path or an object.

    A class is instantiated; a module or instance must have ``dumps`` and ``loads``
    (scrapy-redis's ``picklecompat`` style). Choosing pickle logs a warning.

    Raises:
        ConfigurationError: the value names nothing usable.
    """
    obj = NAMED.get(spec, spec) if isinstance(spec, str) else spec
    if isinstance(obj, str):
        obj = _import(obj)
    if isinstance(obj, type):
        obj = obj()
    if not (callable(getattr(obj, "dumps", None)) and callable(getattr(obj, "loads", None))):
        raise ConfigurationError(
            f"SCHEDULER_SERIALIZER {spec!r} has no dumps()/loads(); use 'json', 'pickle' "
            "or an object that has both"
        )
    if isinstance(obj, PickleSerializer) or "pickle" in getattr(obj, "__name__", ""):
        logger.warning(
            "SCHEDULER_SERIALIZER uses pickle: anyone who can write to this Redis can run "
            "code in every worker. Use the default JSON serializer unless Redis is private."
        )
    return obj  # type: ignore[no-any-return]


def _import(path: str) -> Any:
    """Import a module path (scrapy-redis's ``"scrapy_redis.picklecompat"``) or an object path."""
    try:
        return import_module(path)
    except ImportError:
        pass
    try:
        return load_object(path)
    except (ImportError, NameError, ValueError) as e:
        raise ConfigurationError(f"SCHEDULER_SERIALIZER {path!r} cannot be imported: {e}") from e


class RequestCodec:
    """Converts requests of one spider to bytes and back with a serializer."""

    def __init__(self, serializer: Serializer, spider: Spider) -> None:
        self.serializer = serializer
        self.spider = spider

    def encode(self, request: Request) -> bytes:
        """Return the bytes of ``request``.

        Raises:
            SerializationError: the request cannot be stored (a callback that is not a
                spider method, an object in ``meta`` the serializer cannot carry...).
        """
        try:
            data = self._to_dict(request)
        except ValueError as e:
            raise SerializationError(str(e)) from e
        return self.serializer.dumps(data)

    def _to_dict(self, request: Request) -> dict[str, Any]:
        """``request.to_dict(spider=...)``, with the callback names found directly.

        Scrapy finds a callback's name by listing every member of the spider, per
        request; a bound method of the spider names itself. Anything else goes through
        Scrapy's own lookup (and its error for a callback that is not a spider method).
        """
        callback = self._method_name(request.callback)
        errback = self._method_name(request.errback)
        if callback is _UNKNOWN or errback is _UNKNOWN:
            return request.to_dict(spider=self.spider)
        data: dict[str, Any] = {
            "url": request.url,
            "callback": callback,
            "errback": errback,
            "headers": dict(request.headers),
        }
        for attr in request.attributes:
            data.setdefault(attr, getattr(request, attr))
        cls = type(request)
        if cls is not _Request:
            data["_class"] = f"{cls.__module__}.{cls.__name__}"
        return data

    def _method_name(self, func: Any) -> Any:
        if func is None or isinstance(func, str):
            return func
        name = getattr(func, "__name__", None)
        if name and getattr(func, "__self__", None) is self.spider:
            bound = getattr(self.spider, name, None)
            if getattr(bound, "__func__", None) is getattr(func, "__func__", _UNKNOWN):
                return name
        return _UNKNOWN

    def decode(self, data: bytes) -> Request:
        """Rebuild a request from :meth:`encode`'s output.

        Raises:
            SerializationError: ``data`` is corrupt or names a callback the spider lacks.
        """
        obj = self.serializer.loads(data)
        try:
            return request_from_dict(obj, spider=self.spider)
        except (KeyError, TypeError, ValueError, AttributeError, ImportError) as e:
            raise SerializationError(f"cannot rebuild request: {e}") from e
