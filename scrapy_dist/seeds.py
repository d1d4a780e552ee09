"""Seeds: what users push to ``<spider>:start_urls``, validated and turned into requests.

A seed is either a plain ``http(s)`` URL or a JSON object::

    {"url": "https://example.com/api",       # required
     "method": "POST",                        # default: GET, or POST with a body
     "headers": {"X-Token": "t"},             # values: string or list of strings
     "cookies": {"session": "s"},
     "body": "raw text" | "json": {...} | "formdata": {"page": "1"},   # at most one
     "meta": {...}, "cb_kwargs": {...}, "priority": 10,
     "callback": "parse_item", "errback": "on_error",   # spider method names
     "dont_filter": false}

``formdata`` is urlencoded into the body for POST and into the query string for GET;
``json`` becomes a JSON body.

A seed is input, not code: ``callback`` and ``errback`` name only public methods of
the user's spider (:mod:`scrapy_dist.callbacks`); ``meta`` may not hold the keys that
change where or how a request connects (:data:`CONNECTION_META`) or Scrapy's private
``_`` keys unless ``SEED_ALLOWED_META`` lists them; ``priority`` stays within
:data:`PRIORITY_MAX`, the integers a queue score stores exactly; and any parse error
(deep nesting included) rejects that seed alone. The same rules serve
:class:`~scrapy_dist.spiders.RedisSpider` and the ``scrapy-dist push`` command, so what
the CLI accepts a worker accepts.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.http import FormRequest, JsonRequest

from scrapy_dist import callbacks
from scrapy_dist.exceptions import InvalidSeed
from scrapy_dist.keys import expect_type, key_type
from scrapy_dist.serializers import PRIORITY_MAX

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    import redis
    from redis.client import Pipeline

logger = logging.getLogger(__name__)

#: URL schemes a seed may use.
SCHEMES = frozenset(("http", "https"))
#: Fields that each set the request body; a seed may use one.
BODY_FIELDS = ("body", "json", "formdata")
#: ``meta`` keys that change where or how a request connects (proxy and its
#: credentials, local address, download slot and its concurrency/delay, timeouts and
#: size limits, robots.txt): refused in seeds unless ``SEED_ALLOWED_META`` lists them.
#: Keys starting with ``_`` (Scrapy's and middlewares' private state) are refused too.
CONNECTION_META = frozenset(
    (
        "proxy",
        "dont_proxy",
        "bindaddress",
        "download_slot",
        "download_timeout",
        "download_maxsize",
        "download_warnsize",
        "download_fail_on_dataloss",
        "dont_obey_robotstxt",
    )
)


@dataclass(frozen=True)
class Seed:
    """A validated seed; see the module docstring for the meaning of each field."""

    url: str
    method: str | None = None
    headers: dict[str, str | list[str]] = field(default_factory=dict)
    cookies: dict[str, str] | list[dict[str, Any]] = field(default_factory=dict)
    body: str | None = None
    #: ``(value,)`` when the seed has a ``json`` field (its value may be ``null``).
    json: tuple[Any] | None = None
    formdata: dict[str, str | list[str]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    cb_kwargs: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    callback: str | None = None
    errback: str | None = None
    #: ``None``: the seed does not say (the spider applies ``REDIS_START_URLS_DONT_FILTER``).
    dont_filter: bool | None = None


def _check_url(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidSeed("'url' must be a non-empty string")
    url: str = value.strip()
    if url.split() != [url]:  # any whitespace inside
        raise InvalidSeed(f"URL {url!r:.200} contains whitespace")
    parts = urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise InvalidSeed(f"URL {url!r:.200} must start with http:// or https://")
    if not parts.netloc:
        raise InvalidSeed(f"URL {url!r:.200} has no host")
    return url


def _str_map(name: str, value: Any, *, lists: bool) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidSeed(f"{name!r} must be an object")
    for k, v in value.items():
        ok = isinstance(v, str) or (
            lists and isinstance(v, list) and all(isinstance(i, str) for i in v)
        )
        if not ok:
            kind = "a string or a list of strings" if lists else "a string"
            raise InvalidSeed(f"{name}[{k!r}] must be {kind}")
    return value


def _method(value: Any) -> str:
    if not isinstance(value, str) or not value.isalpha():
        raise InvalidSeed("'method' must be an HTTP method name such as 'POST'")
    return value.upper()


def _cookies(value: Any) -> Any:
    if isinstance(value, list):
        if not all(isinstance(c, dict) and "name" in c and "value" in c for c in value):
            raise InvalidSeed("'cookies' as a list must hold objects with 'name' and 'value'")
        return value
    return _str_map("cookies", value, lists=False)


def _body(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidSeed("'body' must be a string (use 'json' for a JSON body)")
    return value


def _object(name: str) -> Callable[[Any], dict[str, Any]]:
    def check(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise InvalidSeed(f"{name!r} must be an object")
        return value

    return check


def _priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSeed("'priority' must be an integer")
    if not -PRIORITY_MAX <= value <= PRIORITY_MAX:
        raise InvalidSeed(
            f"'priority' must be between -2**53 and 2**53 (a {value.bit_length()}-bit integer)"
        )
    return value


def check_meta(meta: dict[str, Any], allowed: Collection[str] = ()) -> None:
    """Refuse ``meta`` keys that change where or how a request connects.

    Raises:
        InvalidSeed: a key of :data:`CONNECTION_META`, or a private ``_`` key, that
            ``allowed`` (``SEED_ALLOWED_META``) does not list.
    """
    refused = sorted(
        k
        for k in meta
        if (k in CONNECTION_META or not isinstance(k, str) or k.startswith("_"))
        and k not in allowed
    )
    if refused:
        names = ", ".join(repr(k)[:60] for k in refused)
        raise InvalidSeed(
            f"meta key(s) {names} would change where or how the worker connects; "
            "list them in SEED_ALLOWED_META to allow them in seeds"
        )


def _spider_method_name(name: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.isidentifier():
            raise InvalidSeed(f"{name!r} must be the name of a spider method")
        if value.startswith("_"):
            raise InvalidSeed(f"{name} {value!r} is private: seeds may name only public methods")
        return value

    return check


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidSeed("'dont_filter' must be true or false")
    return value


#: Validator of each JSON seed field: raw JSON value -> the value :class:`Seed` keeps.
_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "url": _check_url,
    "method": _method,
    "headers": lambda v: _str_map("headers", v, lists=True),
    "cookies": _cookies,
    "body": _body,
    "json": lambda v: (v,),
    "formdata": lambda v: _str_map("formdata", v, lists=True),
    "meta": _object("meta"),
    "cb_kwargs": _object("cb_kwargs"),
    "priority": _priority,
    "callback": _spider_method_name("callback"),
    "errback": _spider_method_name("errback"),
    "dont_filter": _flag,
}
#: Fields a JSON seed may have.
FIELDS = frozenset(_VALIDATORS)


def _from_object(obj: dict[str, Any], extra_as_formdata: bool = True) -> Seed:
    unknown = sorted(set(obj) - FIELDS)
    if unknown and extra_as_formdata and not any(f in obj for f in BODY_FIELDS):
        # scrapy-redis's schema: {"url", "method", "meta", ...}, every other key is form
        # data (in the query string for its default GET)
        formdata = {k: obj[k] for k in unknown}
        obj = {k: v for k, v in obj.items() if k in FIELDS}
        obj["formdata"] = formdata
        obj.setdefault("method", "GET")
        unknown = []
    if unknown:
        names = ", ".join(map(repr, unknown))
        raise InvalidSeed(f"unknown field(s) {names}; allowed: {', '.join(sorted(FIELDS))}")
    if "url" not in obj:
        raise InvalidSeed("JSON seed has no 'url'")
    bodies = [f for f in BODY_FIELDS if f in obj]
    if len(bodies) > 1:
        raise InvalidSeed(f"use only one of {', '.join(bodies)}")
    return Seed(**{name: _VALIDATORS[name](value) for name, value in obj.items()})


def parse_seed(
    data: bytes | str,
    encoding: str = "utf-8",
    *,
    allowed_meta: Collection[str] = (),
    extra_as_formdata: bool = True,
) -> Seed:
    """Validate raw seed data.

    With ``extra_as_formdata`` (``REDIS_START_URLS_EXTRA_FORMDATA``), a JSON seed's
    unknown fields are form data, as in scrapy-redis; without, they make it invalid.

    Args:
        data: the raw seed.
        encoding: ``REDIS_ENCODING``.
        allowed_meta: ``SEED_ALLOWED_META``, connection ``meta`` keys allowed anyway.
        extra_as_formdata: ``REDIS_START_URLS_EXTRA_FORMDATA``.

    Raises:
        InvalidSeed: the data is not a URL or a valid JSON seed; the message says why.
    """
    try:
        seed = _parse(data, encoding, extra_as_formdata)
    except RecursionError as e:
        raise InvalidSeed("seed is nested too deeply") from e
    check_meta(seed.meta, allowed_meta)
    return seed


def _parse(data: bytes | str, encoding: str, extra_as_formdata: bool = True) -> Seed:
    if isinstance(data, bytes):
        try:
            data = data.decode(encoding)
        except UnicodeDecodeError as e:
            raise InvalidSeed(f"seed is not valid {encoding}: {e}") from e
    text = data.strip()
    if not text:
        raise InvalidSeed("seed is empty")
    if text[0] in '{["':
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise InvalidSeed(f"seed is not valid JSON: {e}") from e
        if not isinstance(obj, dict):
            raise InvalidSeed(f"a JSON seed must be an object, not {type(obj).__name__}")
        return _from_object(obj, extra_as_formdata)
    return Seed(url=_check_url(text))


def _spider_method(spider: object, name: str | None, field_name: str) -> Callable[..., Any] | None:
    if name is None:
        return None
    reason = callbacks.refusal(spider, name, public_only=True)
    if reason is not None:
        raise InvalidSeed(f"{field_name} {reason}")
    return getattr(spider, name)  # type: ignore[no-any-return]


def check_callbacks(seed: Seed, spider: object) -> None:
    """Make sure the seed's callback and errback are public methods of the user's
    ``spider`` (instance or class; see :mod:`scrapy_dist.callbacks`).

    Raises:
        InvalidSeed: one of them is missing or not allowed.
    """
    _spider_method(spider, seed.callback, "callback")
    _spider_method(spider, seed.errback, "errback")


def request_from_seed(seed: Seed, spider: object) -> Request:
    """Build the request a seed describes, with callbacks bound to ``spider``.

    Raises:
        InvalidSeed: a callback is missing or Scrapy rejects the request.
    """
    common: dict[str, Any] = {
        "headers": seed.headers or None,
        "cookies": seed.cookies or None,
        "meta": seed.meta or None,
        "cb_kwargs": seed.cb_kwargs or None,
        "priority": seed.priority,
        "dont_filter": bool(seed.dont_filter),
        "callback": _spider_method(spider, seed.callback, "callback"),
        "errback": _spider_method(spider, seed.errback, "errback"),
    }
    try:
        if seed.formdata is not None:
            return FormRequest(
                seed.url, method=seed.method or "POST", formdata=seed.formdata, **common
            )
        if seed.json is not None:
            return JsonRequest(seed.url, method=seed.method or "POST", data=seed.json[0], **common)
        if seed.body is not None:
            return Request(seed.url, method=seed.method or "POST", body=seed.body, **common)
        return Request(seed.url, method=seed.method or "GET", **common)
    except (TypeError, ValueError) as e:
        raise InvalidSeed(f"Scrapy rejected the request: {e}") from e


class SeedQueue:
    """The seeds key of a crawl, read and written according to its mode.

    Args:
        client: the crawl's Redis client.
        key: the seeds key.
        kind: ``"list"`` (``LPOP``, scrapy-redis's order), ``"set"`` (``SPOP``) or
            ``"zset"`` (``ZPOPMAX``: highest score first).
    """

    KINDS = ("list", "set", "zset")
    #: Per mode: the command that takes seeds from the head (``lua/reserve.lua`` runs it
    #: to lease them, :meth:`pop` to pop them), and the one that puts a seed back at the
    #: head (a lease handed back, failed or expired; ``lua/_leases.lua``).
    COMMANDS: ClassVar[dict[str, tuple[str, str]]] = {
        "list": ("lpop", "lpush"),
        "set": ("spop", "sadd"),
        "zset": ("zpopmax", "zadd"),
    }

    def __init__(self, client: redis.Redis, key: str, kind: str = "list") -> None:
        if kind not in self.KINDS:
            raise ValueError(f"seed queue kind must be one of {self.KINDS}, not {kind!r}")
        self.client = client
        self.key = key
        self.kind = kind
        #: The command that takes seeds (lowercase), see :data:`COMMANDS`.
        self.take: str
        #: The command that puts a seed back (lowercase), see :data:`COMMANDS`.
        self.put_back: str
        self.take, self.put_back = self.COMMANDS[kind]

    def pop(self, count: int) -> list[bytes]:
        """Remove and return up to ``count`` seeds in one command (:attr:`take`)."""
        if self.kind == "set":
            return cast("list[bytes]", self.client.spop(self.key, count)) or []
        if self.kind == "zset":
            popped = cast("list[tuple[bytes, float]]", self.client.zpopmax(self.key, count))
            return [member for member, _ in popped]
        return cast("list[bytes] | None", self.client.lpop(self.key, count)) or []

    def push(
        self, seeds: Sequence[bytes | str], score: float = 0.0, pipe: Pipeline | None = None
    ) -> None:
        """Add seeds (``score`` is used by the zset mode)."""
        if not seeds:
            return
        target = pipe or self.client
        if self.kind == "set":
            target.sadd(self.key, *seeds)
        elif self.kind == "zset":
            mapping: dict[Any, float] = dict.fromkeys(seeds, score)
            target.zadd(self.key, mapping)
        else:
            target.rpush(self.key, *seeds)

    def __bool__(self) -> bool:
        """Always true: ``len()`` is a Redis round trip, never a truth test."""
        return True

    def __len__(self) -> int:
        if self.kind == "set":
            return int(self.client.scard(self.key))
        if self.kind == "zset":
            return int(self.client.zcard(self.key))
        return int(self.client.llen(self.key))

    def check_type(self) -> None:
        """Make sure the key, if it exists, matches the configured mode.

        Raises:
            ConfigurationError: it holds another type; the message says which setting fits.
        """
        hints = {
            "set": "set REDIS_START_URLS_AS_SET = True",
            "zset": "set REDIS_START_URLS_AS_ZSET = True",
            "list": "unset REDIS_START_URLS_AS_SET and REDIS_START_URLS_AS_ZSET",
        }
        expect_type(
            self.key,
            key_type(self.client, self.key),
            self.kind,
            lambda actual: (
                f"seeds key {self.key!r} holds a {actual}, but this crawl reads a "
                f"{self.kind}: {hints.get(actual, 'delete the key')}"
            ),
        )


#: Keys one look for a misspelled seeds key examines, at most (a single ``SCAN``).
HINT_SCAN_COUNT = 1000
#: How alike (``difflib`` ratio) another crawl's name must be to count as a misspelling.
HINT_SIMILARITY = 0.75


def similar_seed_keys(client: redis.Redis, key: str, count: int = HINT_SCAN_COUNT) -> list[str]:
    """Name keys that look like ``key`` misspelled: same last part (``start_urls``), a
    crawl name that is alike or differs only by a job suffix. One ``SCAN`` call with
    ``MATCH`` and ``COUNT``, so a large database is only sampled (this is a hint).

    Returns:
        Up to five key names, sorted.
    """
    crawl, sep, suffix = key.rpartition(":")
    if not sep:
        return []
    pattern = "*:" + "".join(f"[{c}]" if c in "*?[]\\" else c for c in suffix)
    _, found = cast("tuple[int, list[bytes]]", client.scan(0, match=pattern, count=count))
    similar = set()
    for raw in found:
        name = raw.decode("utf-8", "replace")
        other = name[: -len(suffix) - 1]
        if name == key or not other:
            continue
        alike = difflib.SequenceMatcher(None, crawl, other).ratio() >= HINT_SIMILARITY
        if alike or other.startswith(crawl + ":") or crawl.startswith(other + ":"):
            similar.add(name)
    return sorted(similar)[:5]
