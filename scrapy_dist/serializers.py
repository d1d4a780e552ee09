"""Request <-> bytes.

Requests travel through Redis as ``request.to_dict(spider=spider)`` (callbacks and
errbacks by method name) encoded by a serializer. The default is JSON made bytes-safe:
``bytes`` become ``{"$b": <latin-1 text>}``, and the Python types spiders put in
``meta`` and ``cb_kwargs`` that JSON lacks are tagged the same way (tuples, sets, dates
and times, ``Decimal``, and items: :class:`scrapy.Item`, dataclass and attrs instances),
so a request comes back equal to what went in. An item is rebuilt only as a class the
worker has already loaded (looked up in ``sys.modules``, never imported) and without
running its ``__init__`` (a dataclass or attrs instance gets its fields set); a
``scrapy.Item`` is built empty and given its fields.

Entries are compact (issue 15: a queued request is mostly its URL). :class:`RequestCodec`
leaves out every attribute still at its class's default and writes ASCII headers and
bodies as text; :class:`JsonSerializer` writes the top-level fields under short names
(:data:`SHORT`), keeping ``url``, so a plain link is ``{"url":"https://...","cb":"parse"}``,
still JSON and readable with ``redis-cli``. Decoding accepts both that and the long-named
form earlier versions wrote (every field, long names), so entries queued by an older
worker keep working. Older workers cannot read short names: during a rolling upgrade set
``SCHEDULER_SERIALIZER = "json-long"`` until every worker runs this version. Pickle is available
only when ``SCHEDULER_SERIALIZER`` asks for it: unpickling data from a Redis that
someone else can write to runs their code.

A queue entry is input, not code (:class:`RequestPolicy`): it is rebuilt only as a
request class on an allowlist (Scrapy's own plus ``SCHEDULER_REQUEST_CLASSES``; the
``_class`` it names is looked up, never imported), with a URL scheme of
``SCHEDULER_URL_SCHEMES`` (``http``/``https``: a ``file://`` entry is never read),
callbacks that are the spider's own methods (:mod:`scrapy_dist.callbacks`) and a
priority a queue score stores exactly. The same checks run when a request is encoded,
so a spider learns at once that a request could not come back. ``meta`` is not
filtered here: the crawl's own requests carry ``download_slot`` (Scrapy sets it on
every request it downloads, and retries keep it) and proxies; whoever may write the
queue key may set them, so protect that key as the workers' settings.

Over 600 lines on purpose: a stored request's format is one contract, the tags, short
names, class aliases and the policy checked both when encoding and when decoding, and
each decoder (queue entries, seeds, dead letters) reads all of it.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import pickle
import sys
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from scrapy import Item, Request
from scrapy.http import FormRequest, JsonRequest, XmlRpcRequest
from scrapy.utils.misc import load_object

from scrapy_dist import callbacks
from scrapy_dist.exceptions import ConfigurationError, SerializationError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Spider


logger = logging.getLogger(__name__)

#: Tag of an encoded ``bytes`` value.
BYTES = "$b"
#: Tag of a tuple.
TUPLE = "$t"
#: Tag of a set or frozenset.
SET = "$s"
#: Tag of a dict whose keys are not all plain strings (e.g. headers), as key/value pairs.
PAIRS = "$d"
#: Tag of a ``datetime.datetime`` (ISO 8601, with its offset if it has one).
DATETIME = "$dt"
#: Tag of a ``datetime.date``.
DATE = "$da"
#: Tag of a ``datetime.time``.
TIME = "$tm"
#: Tag of a ``datetime.timedelta``, as ``[days, seconds, microseconds]``.
TIMEDELTA = "$td"
#: Tag of a ``decimal.Decimal``, as its text.
DECIMAL = "$n"
#: Tag of an item: ``[class path, {field: value}]`` (a ``scrapy.Item``, a dataclass or an
#: attrs instance).
ITEM = "$i"
_TAGS = frozenset((BYTES, TUPLE, SET, PAIRS, DATETIME, DATE, TIME, TIMEDELTA, DECIMAL, ITEM))
#: Marks a callback whose name must be found by Scrapy's slower lookup.
_UNKNOWN = object()

#: Top-level field -> the short name :class:`JsonSerializer` writes it under (``url`` and
#: attributes of other request classes keep their names). A top-level key that is itself
#: a short name, or starts with :data:`ESCAPE`, is written with :data:`ESCAPE` before it.
SHORT: dict[str, str] = {
    "callback": "cb",
    "errback": "eb",
    "method": "m",
    "headers": "h",
    "body": "b",
    "cookies": "ck",
    "meta": "mt",
    "encoding": "e",
    "flags": "f",
    "cb_kwargs": "kw",
    "priority": "p",
    "dont_filter": "df",
    "_class": "cl",
}
#: Short name -> field.
LONG: dict[str, str] = {short: long for long, short in SHORT.items()}
#: Prefix of a top-level key that would otherwise read as a short name.
ESCAPE = "~"
#: ``_class`` values written by their class name alone (Scrapy's own request classes).
CLASS_ALIASES: dict[str, str] = {
    "scrapy.http.request.form.FormRequest": "FormRequest",
    "scrapy.http.request.json_request.JsonRequest": "JsonRequest",
    "scrapy.http.request.rpc.XmlRpcRequest": "XmlRpcRequest",
}
_CLASS_PATHS: dict[str, str] = {alias: path for path, alias in CLASS_ALIASES.items()}


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
    return _encode_tagged(obj)


def _encode_tagged(obj: Any) -> Any:
    """A value JSON lacks, tagged (:data:`_TAGS`).

    Raises:
        TypeError: a value of no type the tags carry.
    """
    if isinstance(obj, datetime.datetime):  # (before date: a datetime is a date)
        return {DATETIME: obj.isoformat()}
    if isinstance(obj, datetime.date):
        return {DATE: obj.isoformat()}
    if isinstance(obj, datetime.time):
        return {TIME: obj.isoformat()}
    if isinstance(obj, datetime.timedelta):
        return {TIMEDELTA: [obj.days, obj.seconds, obj.microseconds]}
    if isinstance(obj, Decimal):
        return {DECIMAL: str(obj)}
    fields = _item_fields(obj)
    if fields is not None:
        cls = type(obj)
        path = f"{cls.__module__}.{cls.__qualname__}"
        return {ITEM: [path, {k: _encode(v) for k, v in fields.items()}]}
    raise TypeError(f"{type(obj).__name__} object {obj!r:.80} is not JSON serializable")


def _item_fields(obj: Any) -> dict[str, Any] | None:
    """The fields of an item (:class:`scrapy.Item`: those set; a dataclass or attrs
    instance: every field), or ``None`` if ``obj`` is none of them. A class defined
    inside a function cannot be found again by its path: not an item here."""
    cls = type(obj)
    if "<locals>" in cls.__qualname__ or isinstance(obj, type):
        return None
    if isinstance(obj, Item):
        return dict(obj)
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    attributes = getattr(cls, "__attrs_attrs__", None)
    if attributes is not None:
        return {a.name: getattr(obj, a.name) for a in attributes}
    return None


def loaded_class(path: str) -> type | None:
    """The class ``path`` (``module.QualName``) names if its module is already loaded in
    this process, else ``None``: nothing is imported."""
    module_name, _, qualname = path.rpartition(".")
    module = sys.modules.get(module_name)
    obj: Any = module
    # a nested class's path: its module is a prefix, its qualname has dots
    while module is None and module_name:
        module_name, _, outer = module_name.rpartition(".")
        module = sys.modules.get(module_name)
        qualname = f"{outer}.{qualname}"
        obj = module
    if module is None:
        return None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) else None


def _rebuild_item(value: Any) -> Any:
    """The item ``[class path, fields]`` stands for, as its class is loaded here.

    Raises:
        ValueError: not such a pair, a class not loaded, not an item class, or a field
            it does not have.
    """
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)):
        raise ValueError("an item must be [class path, fields]")
    path, fields = value
    if not isinstance(fields, dict):
        raise ValueError(f"the fields of item {path!r:.120} must be an object")
    cls = loaded_class(path)
    if cls is None:
        raise ValueError(
            f"{path!r:.120} is not an item class loaded in this worker (nothing is "
            "imported from a queue entry)"
        )
    if issubclass(cls, Item):
        try:
            item = cls()
            for name, v in fields.items():
                item[name] = v  # KeyError for a field the class does not declare
        except Exception as e:  # the item class's own error: this entry alone fails
            raise ValueError(f"cannot rebuild item {path!r:.120}: {e!r:.200}") from e
        return item
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
    elif getattr(cls, "__attrs_attrs__", None) is not None:
        names = {a.name for a in getattr(cls, "__attrs_attrs__")}  # noqa: B009
    else:
        raise ValueError(f"{path!r:.120} is not an item class")
    unknown = set(fields) - names
    if unknown:
        raise ValueError(f"item class {path!r:.120} has no field {sorted(unknown)[0]!r:.60}")
    obj = object.__new__(cls)
    for name, v in fields.items():
        object.__setattr__(obj, name, v)  # (a frozen class's too; __init__ is not run)
    return obj


def _decode_tagged(tag: str, value: Any) -> Any:
    """The value of a tagged object (:data:`_TAGS`).

    Raises:
        ValueError, TypeError: the value does not fit its tag.
    """
    if tag == BYTES:
        return value.encode("latin-1")
    if tag == TUPLE:
        return tuple(value)
    if tag == SET:
        return set(value)
    if tag == PAIRS:
        return {_hashable(k): v for k, v in value}
    if tag == DATETIME:
        return datetime.datetime.fromisoformat(value)
    if tag == DATE:
        return datetime.date.fromisoformat(value)
    if tag == TIME:
        return datetime.time.fromisoformat(value)
    if tag == TIMEDELTA:
        days, seconds, micros = value
        return datetime.timedelta(days=days, seconds=seconds, microseconds=micros)
    if tag == DECIMAL:
        if not isinstance(value, str):
            raise TypeError("a Decimal must be text")
        try:
            return Decimal(value)
        except InvalidOperation as e:
            raise ValueError(f"not a Decimal: {value!r:.60}") from e
    return _rebuild_item(value)


def _decode_hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        ((tag, value),) = obj.items()
        if tag in _TAGS:
            return _decode_tagged(tag, value)
    return obj


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


class JsonSerializer:
    """Bytes-safe JSON with short field names; the default and the only safe choice for
    a shared Redis.

    Args:
        short_names: write top-level fields under their :data:`SHORT` names (default).
            ``False`` writes the long names, which workers older than the compact
            encoding can read (``SCHEDULER_SERIALIZER = "json-long"``).

    :meth:`loads` reads both forms whatever ``short_names`` says.
    """

    def __init__(self, short_names: bool = True) -> None:
        self.short_names = short_names
        #: What ``json.dumps`` builds per call for these options, built once.
        self._encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True)

    def dumps(self, obj: dict[str, Any], /) -> bytes:
        """Encode ``obj``.

        Raises:
            SerializationError: ``obj`` holds a value JSON cannot carry (an arbitrary
                object in ``meta``, say); the message names it.
        """
        obj = shorten(obj, short_names=self.short_names)
        try:
            return self._encoder.encode(_encode(obj)).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as e:
            raise SerializationError(str(e)) from e

    def loads(self, data: bytes, /) -> dict[str, Any]:
        """Decode what :meth:`dumps` produced, in either form, into long field names.

        Raises:
            SerializationError: ``data`` is not a JSON object, or names one field twice
                (a short and a long name).
        """
        try:
            obj = json.loads(data, object_hook=_decode_hook)
        except RecursionError as e:
            raise SerializationError("not a serialized request: nested too deeply") from e
        except (ValueError, TypeError, AttributeError) as e:
            raise SerializationError(f"not a serialized request: {e}") from e
        if not isinstance(obj, dict):
            raise SerializationError(f"not a serialized request: {type(obj).__name__}")
        return lengthen(obj)


def shorten(obj: dict[str, Any], *, short_names: bool = True) -> dict[str, Any]:
    """The top-level keys of ``obj`` under their short names (:data:`SHORT`); the
    ``_class`` of a Scrapy request class by its name alone. With ``short_names=False``
    only a key that reads as a short name is changed (escaped)."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key in SHORT and short_names:
            alias = CLASS_ALIASES.get(value) if key == "_class" and isinstance(value, str) else None
            out[SHORT[key]] = value if alias is None else alias
        elif key in LONG or (isinstance(key, str) and key.startswith(ESCAPE)):
            out[ESCAPE + key] = value
        else:
            out[key] = value
    return out


def lengthen(obj: dict[str, Any]) -> dict[str, Any]:
    """Undo :func:`shorten`. A dict with a ``method`` key is in the long form (every
    version that wrote long names wrote ``method``): its short-looking keys are left
    as they are, only escaped keys are restored.

    Raises:
        SerializationError: one field under two names (``cb`` and ``callback``...).
    """
    long_form = "method" in obj
    if long_form and not any(key.startswith(ESCAPE) for key in obj):
        return obj
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = key
        if key.startswith(ESCAPE):
            name = key[len(ESCAPE) :]
        elif key in LONG and not long_form:
            name = LONG[key]
            if name == "_class" and isinstance(value, str):
                value = _CLASS_PATHS.get(value, value)  # noqa: PLW2901
        if name in out:
            raise SerializationError(f"not a serialized request: field {name!r:.60} given twice")
        out[name] = value
    return out


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
NAMED: dict[str, Callable[[], Serializer]] = {
    "json": JsonSerializer,
    "json-long": functools.partial(JsonSerializer, short_names=False),
    "pickle": PickleSerializer,
}


def load_serializer(spec: Any) -> Serializer:
    """Resolve ``SCHEDULER_SERIALIZER``: a short name (``"json"``, ``"json-long"``,
    ``"pickle"``), an import path or an object.

    A class is instantiated; a module or instance must have ``dumps`` and ``loads``
    (scrapy-redis's ``picklecompat`` style). Choosing pickle logs a warning.

    Raises:
        ConfigurationError: the value names nothing usable.
    """
    if isinstance(spec, str) and spec in NAMED:
        return _warn_if_pickle(NAMED[spec]())
    obj = spec
    if isinstance(obj, str):
        obj = _import(obj)
    if isinstance(obj, type):
        obj = obj()
    if not (callable(getattr(obj, "dumps", None)) and callable(getattr(obj, "loads", None))):
        raise ConfigurationError(
            f"SCHEDULER_SERIALIZER {spec!r} has no dumps()/loads(); use 'json', 'pickle' "
            "or an object that has both"
        )
    return _warn_if_pickle(obj)


def _warn_if_pickle(obj: Any) -> Serializer:
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


#: Scrapy's own request classes: a queue entry may always be rebuilt as one of them.
BUILTIN_REQUEST_CLASSES: tuple[type[Request], ...] = (
    Request,
    FormRequest,
    JsonRequest,
    XmlRpcRequest,
)
#: Largest priority magnitude: a queue score is a double, exact up to 2**53.
PRIORITY_MAX = 2**53


def class_path(cls: type) -> str:
    """The ``_class`` name Scrapy's ``Request.to_dict`` writes for ``cls``."""
    return f"{cls.__module__}.{cls.__name__}"


@dataclass(frozen=True)
class RequestPolicy:
    """What a queue entry may decode into.

    Args:
        classes: ``_class`` name -> request class allowed.
        schemes: URL schemes allowed (lower case).
    """

    classes: dict[str, type[Request]] = field(
        default_factory=lambda: {class_path(c): c for c in BUILTIN_REQUEST_CLASSES}
    )
    schemes: frozenset[str] = frozenset(("http", "https"))

    @classmethod
    def build(cls, extra_classes: Iterable[Any] = (), schemes: Iterable[str] = ()) -> RequestPolicy:
        """Scrapy's request classes plus ``extra_classes`` (classes or import paths).

        Raises:
            ConfigurationError: an extra class cannot be imported or is not a request class.
        """
        classes = {class_path(c): c for c in BUILTIN_REQUEST_CLASSES}
        for spec in extra_classes:
            try:
                obj = load_object(spec) if isinstance(spec, str) else spec
            except (ImportError, NameError, ValueError, AttributeError) as e:
                raise ConfigurationError(
                    f"SCHEDULER_REQUEST_CLASSES: {spec!r} cannot be imported: {e}"
                ) from e
            if not (isinstance(obj, type) and issubclass(obj, Request)):
                raise ConfigurationError(
                    f"SCHEDULER_REQUEST_CLASSES: {spec!r} is not a scrapy.Request subclass"
                )
            classes[class_path(obj)] = obj
            if isinstance(spec, str):
                classes[spec] = obj
        allowed = frozenset(s.lower() for s in schemes) or frozenset(("http", "https"))
        return cls(classes, allowed)

    def check_url(self, url: Any) -> None:
        """Refuse a URL whose scheme is not allowed.

        Raises:
            SerializationError: not a string, or a scheme not allowed.
        """
        if not isinstance(url, str):
            raise SerializationError(f"'url' must be a string, not {type(url).__name__}")
        scheme = urlsplit(url).scheme.lower()
        if scheme not in self.schemes:
            raise SerializationError(
                f"URL scheme {scheme!r:.40} is not allowed ({url!r:.120}); "
                f"allowed: {', '.join(sorted(self.schemes))} (SCHEDULER_URL_SCHEMES)"
            )

    def request_class(self, name: Any) -> type[Request]:
        """The request class a ``_class`` name stands for (looked up, never imported).

        Raises:
            SerializationError: ``name`` is not an allowed request class.
        """
        if name is None:
            return Request
        cls = self.classes.get(name) if isinstance(name, str) else None
        if cls is None:
            raise SerializationError(
                f"request class {name!r:.120} is not allowed: only Scrapy's request classes "
                "and those listed in SCHEDULER_REQUEST_CLASSES (nothing is imported)"
            )
        return cls


def check_priority(value: Any) -> None:
    """Refuse a priority a queue score cannot store exactly.

    Raises:
        SerializationError: not an integer, or beyond 2**53 either way.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise SerializationError(f"'priority' must be an integer, not {type(value).__name__}")
    if not -PRIORITY_MAX <= value <= PRIORITY_MAX:
        raise SerializationError(
            f"'priority' (a {value.bit_length()}-bit integer) is outside -2**53..2**53, "
            "what a queue score stores exactly"
        )


#: URL of the requests :func:`class_defaults` builds to read a class's defaults.
_PROBE_URL = "http://defaults.invalid/"
_DEFAULTS: dict[type, dict[str, Any]] = {}


def _fields(request: Request) -> dict[str, Any]:
    data: dict[str, Any] = {
        "callback": request.callback,
        "errback": request.errback,
        "headers": dict(request.headers),
    }
    for attr in request.attributes:
        if attr != "url":
            data.setdefault(attr, getattr(request, attr))
    return data


def class_defaults(cls: type[Request]) -> dict[str, Any]:
    """The attributes a ``cls(url)`` has, as ``to_dict`` writes them: what a queue entry
    may leave out, since rebuilding the request without them gives them back.

    Read from two requests built with a URL alone; an attribute that differs between
    the two (a timestamp, a counter) is not a default. A class that cannot be built
    from a URL alone has no defaults (its entries carry every attribute). Cached per
    class.
    """
    cached = _DEFAULTS.get(cls)
    if cached is not None:
        return cached
    try:
        first, second = _fields(cls(_PROBE_URL)), _fields(cls(_PROBE_URL))
    except Exception:  # a custom class with required arguments: nothing is left out
        defaults: dict[str, Any] = {}
    else:
        defaults = {
            name: value
            for name, value in first.items()
            if name in second and type(second[name]) is type(value) and second[name] == value
        }
    _DEFAULTS[cls] = defaults
    return defaults


def _compact(data: dict[str, Any], request: Request) -> dict[str, Any]:
    """``data`` (a ``to_dict``) without the attributes at ``type(request)``'s defaults,
    with headers and body as text where the request's encoding turns that text back
    into the same bytes (ASCII, in practice): ``"h":{"Accept":"text/html"}``, not
    tagged bytes. ``url`` and ``_class`` always stay."""
    defaults = class_defaults(type(request))
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name in defaults and name not in ("url", "_class"):
            default = defaults[name]
            if type(value) is type(default) and value == default:
                continue
        out[name] = value
    encoding = request.encoding
    if isinstance(out.get("body"), bytes):
        out["body"] = _as_text(out["body"], encoding)
    headers = out.get("headers")
    if isinstance(headers, dict) and headers:
        out["headers"] = _text_headers(headers, encoding)
    return out


def _as_text(value: bytes, encoding: str) -> str | bytes:
    """``value`` as text if it is ASCII and ``encoding`` gives the same bytes back."""
    try:
        text = value.decode("ascii")
        if text.encode(encoding) == value:
            return text
    except (UnicodeError, LookupError):
        pass
    return value


def _text_headers(headers: dict[Any, Any], encoding: str) -> dict[Any, Any]:
    """Headers ``{b"Name": [b"v", ...]}`` as ``{"Name": "v"}`` (one value) or
    ``{"Name": ["v", "w"]}``, when every name and value is text (:func:`_as_text`);
    else unchanged."""
    out: dict[Any, Any] = {}
    for name, values in headers.items():
        key = _as_text(name, encoding) if isinstance(name, bytes) else name
        if not isinstance(key, str) or key.startswith("$") or not isinstance(values, list):
            return headers
        texts = [_as_text(v, encoding) if isinstance(v, bytes) else v for v in values]
        if not all(isinstance(t, str) for t in texts):
            return headers
        out[key] = texts[0] if len(texts) == 1 else texts
    return out


class RequestCodec:
    """Converts requests of one spider to bytes and back with a serializer.

    Args:
        serializer: turns request dicts into bytes and back.
        spider: the spider whose methods callbacks name.
        policy: what a queue entry may decode into (default: Scrapy's request
            classes, ``http``/``https``).
    """

    def __init__(
        self, serializer: Serializer, spider: Spider, policy: RequestPolicy | None = None
    ) -> None:
        self.serializer = serializer
        self.spider = spider
        self.policy = policy or RequestPolicy()
        #: Callback names :func:`callbacks.refusal` allowed for this spider (a rule
        #: read from its class, which a crawl does not change): checked once each.
        self._allowed: set[str] = set()

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
        self._check(data)
        return self.serializer.dumps(data)

    def _check(self, data: dict[str, Any]) -> None:
        """The checks :meth:`decode` makes, so a request that could not come back from
        the queue is refused when it is stored.

        Raises:
            SerializationError: a class, URL scheme, callback or priority not allowed.
        """
        self.policy.request_class(data.get("_class"))
        self.policy.check_url(data.get("url"))
        check_priority(data.get("priority", 0))
        for name in ("callback", "errback"):
            value = data.get(name)
            if value and not (isinstance(value, str) and value in self._allowed):
                reason = callbacks.refusal(self.spider, value, public_only=False)
                if reason is not None:
                    raise SerializationError(f"{name} {reason}")
                self._allowed.add(value)

    def _to_dict(self, request: Request) -> dict[str, Any]:
        """``request.to_dict(spider=...)`` without the attributes at their class's
        defaults (:func:`class_defaults`), with the callback names found directly and
        ASCII headers and body as text (:func:`_compact`).

        Scrapy finds a callback's name by listing every member of the spider, per
        request; a bound method of the spider names itself. Anything else goes through
        Scrapy's own lookup (and its error for a callback that is not a spider method).
        """
        callback = self._method_name(request.callback)
        errback = self._method_name(request.errback)
        if callback is _UNKNOWN or errback is _UNKNOWN:
            return _compact(request.to_dict(spider=self.spider), request)
        data: dict[str, Any] = {
            "url": request.url,
            "callback": callback,
            "errback": errback,
            "headers": dict(request.headers),
        }
        for attr in request.attributes:
            data.setdefault(attr, getattr(request, attr))
        cls = type(request)
        if cls is not Request:
            data["_class"] = f"{cls.__module__}.{cls.__name__}"
        return _compact(data, request)

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

        Only what :class:`RequestPolicy` allows is rebuilt; nothing the entry names is
        imported, and callbacks resolve to the spider's own methods only.

        Raises:
            SerializationError: ``data`` is corrupt, or names a class, URL scheme,
                callback or priority that is not allowed; the message says which.
        """
        try:
            obj = self.serializer.loads(data)
        except SerializationError:
            raise
        except Exception as e:  # a custom serializer's own error: this entry alone fails
            raise SerializationError(f"not a serialized request: {e!r:.200}") from e
        if not isinstance(obj, dict):
            raise SerializationError(f"not a serialized request: {type(obj).__name__}")
        self._check(obj)
        cls = self.policy.request_class(obj.get("_class"))
        try:
            kwargs = {key: value for key, value in obj.items() if key in cls.attributes}
            for name in ("callback", "errback"):
                if obj.get(name):  # allowed by _check above
                    kwargs[name] = callbacks.bound(self.spider, obj[name])
            request = cls(**kwargs)
        except RecursionError as e:
            raise SerializationError("cannot rebuild request: nested too deeply") from e
        except Exception as e:  # whatever the request class raises: this entry alone fails
            raise SerializationError(f"cannot rebuild request: {e}") from e
        self.policy.check_url(request.url)
        return request
