from __future__ import annotations

import dataclasses
import datetime
import logging
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

import attrs
import pytest
from scrapy import Field, Item, Request, Spider
from scrapy.http import FormRequest, JsonRequest, XmlRpcRequest
from scrapy.utils.misc import build_from_crawler

from scrapy_dist.exceptions import ConfigurationError, SerializationError
from scrapy_dist.queue import PriorityQueue
from scrapy_dist.scheduler import Scheduler
from scrapy_dist.serializers import (
    JsonSerializer,
    PickleSerializer,
    RequestCodec,
    load_serializer,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from scrapy.crawler import Crawler
    from scrapy.http.request import CallbackT as Callback


class MySpider(Spider):
    name = "s"

    def parse_item(self, response: Any) -> None: ...

    def on_error(self, failure: Any) -> None: ...


def rich_request(spider: MySpider) -> Request:
    return Request(
        "https://example.com/a?b=1",
        method="PUT",
        body=b"\x00\xff binary \xc3\xa9",
        headers={"X-Bin": b"\xfe\x01", "Accept": ["a", "b"]},
        cookies={"c": "v"},
        meta={"depth": 2, "tags": ("a", 1), "seen": {1, 2}, "raw": b"\x80", "$odd": 1},
        cb_kwargs={"page": 3, "nested": {"b": [b"x", None, 1.5]}},
        priority=-7,
        dont_filter=True,
        callback=spider.parse_item,
        errback=spider.on_error,
        flags=["f"],
    )


def same(a: Request, b: Request) -> None:
    assert type(a) is type(b)
    for attr in (
        "url",
        "method",
        "body",
        "cookies",
        "meta",
        "cb_kwargs",
        "priority",
        "dont_filter",
        "flags",
        "callback",
        "errback",
    ):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert a.headers == b.headers


@pytest.mark.parametrize("serializer", [JsonSerializer(), PickleSerializer()])
@pytest.mark.parametrize(
    "make",
    [
        rich_request,
        lambda s: FormRequest("https://e.com/f", formdata={"q": "x y"}, callback=s.parse_item),
        lambda s: JsonRequest("https://e.com/j", data={"k": [1, 2]}),
        lambda s: Request("https://e.com/"),
    ],
)
def test_round_trip(serializer: Any, make: Any) -> None:
    spider = MySpider()
    codec = RequestCodec(serializer, spider)
    request = make(spider)
    same(codec.decode(codec.encode(request)), request)


def test_json_is_text_not_pickle() -> None:
    data = RequestCodec(JsonSerializer(), MySpider()).encode(Request("https://e.com/"))
    assert data.startswith(b"{")


def test_lambda_callback_is_unserializable() -> None:
    codec = RequestCodec(JsonSerializer(), MySpider())
    with pytest.raises(SerializationError) as info:
        codec.encode(Request("https://e.com/", callback=cast("Callback", lambda r: None)))
    assert isinstance(info.value, ValueError)
    assert info.value.__cause__ is not None


def test_object_in_meta_is_unserializable() -> None:
    codec = RequestCodec(JsonSerializer(), MySpider())
    with pytest.raises(SerializationError, match="object"):
        codec.encode(Request("https://e.com/", meta={"o": object()}))


class Product(Item):
    name = Field()
    price = Field()


@dataclasses.dataclass(frozen=True)
class Offer:
    seller: str
    when: datetime.date
    tags: tuple[str, ...] = ()
    checked: bool = dataclasses.field(init=False, default=False)

    def __post_init__(self) -> None:
        ran.append(self)


@attrs.define
class Review:
    stars: int
    text: str = ""


#: Offers whose __post_init__ ran (a rebuilt one must not run it).
ran: list[Offer] = []


def test_what_spiders_put_in_meta_and_cb_kwargs_round_trips() -> None:
    """An Item in meta (the most common pattern of a two-stage spider), dataclass and
    attrs items, dates and Decimal: each came back equal, of its own class, where the
    request was dead-lettered as unserializable before."""
    codec = RequestCodec(JsonSerializer(), MySpider())
    offer = Offer("shop", datetime.date(2026, 11, 29), ("new",))
    object.__setattr__(offer, "checked", True)
    ran.clear()
    meta = {
        "item": Product(name="Tea", price=Decimal("3.50")),
        "offers": [offer],
        "review": Review(5, "good"),
        "seen": datetime.datetime(2026, 11, 29, 7, 15, tzinfo=datetime.timezone.utc),
        "at": datetime.time(7, 15, 30),
        "age": datetime.timedelta(days=2, seconds=5),
    }
    request = Request("https://e.com/", meta=meta, cb_kwargs={"total": Decimal("-0.1")})
    back = codec.decode(codec.encode(request))
    assert back.meta == meta
    assert back.cb_kwargs == {"total": Decimal("-0.1")}
    assert type(back.meta["item"]) is Product
    assert back.meta["offers"][0].checked is True
    assert ran == []  # rebuilt without running __init__ or __post_init__
    assert type(back.meta["review"]) is Review


@pytest.mark.parametrize(
    ("tagged", "match"),
    [
        ('{"$i":["os.system",{}]}', "not an item class loaded"),
        ('{"$i":["subprocess.Popen",{"args":"x"}]}', "not an item class"),
        ('{"$i":["no.such.module.Item",{}]}', "not an item class loaded"),
        ('{"$i":["MODULE.Product",{"zz":1}]}', "does not support field"),
        ('{"$i":["MODULE.Offer",{"zz":1}]}', "has no field 'zz'"),
        ('{"$i":"MODULE.Product"}', "must be \\[class path"),
        ('{"$n":"not a number"}', "not a Decimal"),
        ('{"$dt":5}', "argument must be str"),
        ('{"$td":[1]}', "not enough values"),
    ],
)
def test_a_hostile_tagged_value_is_refused_and_nothing_is_imported(tagged: str, match: str) -> None:
    """Entries read from Redis are untrusted: an item names a class that is looked up
    among the classes loaded (never imported), and must be an item class."""
    import sys

    codec = RequestCodec(JsonSerializer(), MySpider())
    tagged = tagged.replace("MODULE", __name__)
    entry = b'{"url":"https://e.com/","mt":{"x":' + tagged.encode() + b"}}"
    with pytest.raises(SerializationError, match=match):
        codec.decode(entry)
    assert "no.such.module" not in sys.modules


def test_corrupt_payload() -> None:
    codec = RequestCodec(JsonSerializer(), MySpider())
    with pytest.raises(SerializationError):
        codec.decode(b"\x80not json")
    with pytest.raises(SerializationError):
        codec.decode(b"[1, 2]")


def test_unknown_callback_on_decode() -> None:
    data = RequestCodec(JsonSerializer(), MySpider()).encode(
        Request("https://e.com/", callback=MySpider().parse_item)
    )

    class Other(Spider):
        name = "o"

    with pytest.raises(SerializationError, match="parse_item"):
        RequestCodec(JsonSerializer(), Other()).decode(data)


def test_load_serializer(caplog: pytest.LogCaptureFixture) -> None:
    assert isinstance(load_serializer("json"), JsonSerializer)
    with caplog.at_level(logging.WARNING):
        assert isinstance(load_serializer("pickle"), PickleSerializer)
    assert "pickle" in caplog.text
    assert isinstance(load_serializer("scrapy_dist.serializers.JsonSerializer"), JsonSerializer)
    with pytest.raises(ConfigurationError):
        load_serializer("no.such.module")
    with pytest.raises(ConfigurationError, match="dumps"):
        load_serializer("logging")


# -- compact entries (issue 15) ---------------------------------------------------------

URL67 = "https://www.example.com/catalogue/category/books/page-00001234.html"
#: What a worker before the compact encoding wrote for ``Request(URL67, callback=parse_item)``.
LONG_FORM = (
    b'{"url":"' + URL67.encode() + b'","callback":"parse_item","errback":null,"headers":{},'
    b'"body":{"$b":""},"cookies":{},"meta":{},"encoding":"utf-8","flags":[],"cb_kwargs":{},'
    b'"dont_filter":false,"method":"GET","priority":0}'
)


class CustomRequest(Request):
    """A request class with its own attributes, two of them named like short names."""

    attributes = (*Request.attributes, "cb", "~x", "label")

    def __init__(self, *args: Any, cb: Any = None, label: str = "l", **kwargs: Any) -> None:
        self.cb, self.label = cb, label
        setattr(self, "~x", kwargs.pop("~x", 0))
        super().__init__(*args, **kwargs)


class NeedsToken(Request):
    """A request class that cannot be built from a URL alone (no defaults to leave out)."""

    attributes = (*Request.attributes, "token")

    def __init__(self, *args: Any, token: str, **kwargs: Any) -> None:
        self.token = token
        super().__init__(*args, **kwargs)


ATTRIBUTE_CASES: dict[str, Any] = {
    "method": {"method": "POST"},
    "headers_text": {"headers": {"Accept": ["a", "b"], "X-One": "1"}},
    "headers_bytes": {"headers": {"X-Bin": b"\xfe\x01", "X-Text": "v\xe9"}},
    "headers_dollar": {"headers": {"$b": "x"}},
    "body_text": {"body": b"a=1&b=2"},
    "body_bytes": {"body": b"\x00\xff\xc3\xa9"},
    "body_text_latin1": {"body": b"abc\xe9", "encoding": "latin-1"},
    "cookies": {"cookies": {"c": "v", "d": "w"}},
    "cookies_list": {"cookies": [{"name": "c", "value": "v", "domain": "e.com"}]},
    "meta": {"meta": {"depth": 2, "t": (1, "a"), "s": {1}, "raw": b"\x80", "$odd": 1}},
    "meta_short_keys": {"meta": {"cb": 1, "m": 2, "~": 3, "method": 4}},
    "flags": {"flags": ["a", "b"]},
    "cb_kwargs": {"cb_kwargs": {"page": 3, "nested": {"b": [b"x", None, 1.5]}}},
    "priority": {"priority": -(2**53)},
    "priority_pos": {"priority": 7},
    "dont_filter": {"dont_filter": True},
    "callback": {"callback": "parse_item"},
    "errback": {"errback": "on_error"},
    "callback_parse": {"callback": "parse"},
    "encoding": {"encoding": "latin-1"},
    "everything": {
        "method": "PUT",
        "headers": {"A": "b"},
        "body": b"x",
        "cookies": {"c": "v"},
        "meta": {"m": 1},
        "flags": ["f"],
        "cb_kwargs": {"k": 1},
        "priority": 1,
        "dont_filter": True,
        "callback": "parse_item",
        "errback": "on_error",
        "encoding": "cp1252",
    },
}


class FullSpider(MySpider):
    def parse(self, response: Any) -> None: ...


def _build(cls: type[Request], spider: Spider, kwargs: dict[str, Any]) -> Request:
    kwargs = dict(kwargs)
    for name in ("callback", "errback"):
        if name in kwargs:
            kwargs[name] = getattr(spider, kwargs[name])
    return cls(URL67, **kwargs)


def _all_attributes(request: Request) -> dict[str, Any]:
    data = {name: getattr(request, name) for name in request.attributes}
    data["headers"] = dict(request.headers)
    return data


@pytest.mark.parametrize(
    "serializer",
    [JsonSerializer(), JsonSerializer(short_names=False), PickleSerializer()],
    ids=["json", "json-long", "pickle"],
)
@pytest.mark.parametrize("cls", [Request, FormRequest, JsonRequest, XmlRpcRequest])
@pytest.mark.parametrize("case", sorted(ATTRIBUTE_CASES))
def test_every_attribute_round_trips(serializer: Any, cls: type[Request], case: str) -> None:
    spider = FullSpider()
    codec = RequestCodec(serializer, spider)
    request = _build(cls, spider, ATTRIBUTE_CASES[case])
    back = codec.decode(codec.encode(request))
    assert type(back) is cls
    assert _all_attributes(back) == _all_attributes(request)
    assert back.headers == request.headers
    assert back.body == request.body


@pytest.mark.parametrize(
    "make",
    [
        lambda: FormRequest(URL67, formdata={"q": "x y", "r": "é"}),
        lambda: JsonRequest(URL67, data={"k": [1, 2]}, dumps_kwargs={"indent": 2}),
        lambda: JsonRequest(URL67, headers={}),
        lambda: XmlRpcRequest(URL67, params=("a", 1), methodname="m"),
        lambda: CustomRequest(URL67, cb="x", label="other", priority=2, **{"~x": 5}),
        lambda: CustomRequest(URL67),
        lambda: CustomRequest(URL67, method="PUT", cb="y", **cast("dict[str, Any]", {"~x": 1})),
        lambda: NeedsToken(URL67, token="t"),
    ],
)
def test_special_classes_round_trip(make: Any) -> None:
    from scrapy_dist.serializers import RequestPolicy

    policy = RequestPolicy.build([CustomRequest, NeedsToken])
    for serializer in (JsonSerializer(), JsonSerializer(short_names=False)):
        codec = RequestCodec(serializer, FullSpider(), policy)
        request = make()
        back = codec.decode(codec.encode(request))
        assert type(back) is type(request)
        assert _all_attributes(back) == _all_attributes(request)


def test_a_plain_link_is_its_url_and_callback() -> None:
    spider = FullSpider()
    codec = RequestCodec(JsonSerializer(), spider)
    data = codec.encode(Request(URL67, callback=spider.parse_item))
    assert data == b'{"url":"' + URL67.encode() + b'","cb":"parse_item"}'
    assert len(data) <= 100
    assert codec.encode(Request(URL67)) == b'{"url":"' + URL67.encode() + b'"}'


def test_the_long_form_of_older_workers_is_read() -> None:
    spider = FullSpider()
    codec = RequestCodec(JsonSerializer(), spider)
    back = codec.decode(LONG_FORM)
    assert _all_attributes(back) == _all_attributes(Request(URL67, callback=spider.parse_item))


def _old_decode(data: bytes, spider: Spider) -> Request:
    """How a worker before the compact encoding rebuilt an entry (long names only)."""
    import json

    from scrapy_dist.serializers import _decode_hook

    obj = json.loads(data, object_hook=_decode_hook)
    kwargs = {k: v for k, v in obj.items() if k in Request.attributes}
    for name in ("callback", "errback"):
        if obj.get(name):
            kwargs[name] = getattr(spider, obj[name])
    return Request(**kwargs)


@pytest.mark.parametrize("case", sorted(ATTRIBUTE_CASES))
def test_json_long_is_read_by_older_workers(case: str) -> None:
    """During a rolling upgrade, ``json-long`` entries mean the same to an old worker."""
    spider = FullSpider()
    serializer = load_serializer("json-long")
    request = _build(Request, spider, ATTRIBUTE_CASES[case])
    back = _old_decode(RequestCodec(serializer, spider).encode(request), spider)
    assert _all_attributes(back) == _all_attributes(request)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (b'{"url":"https://e.com/","cb":"parse","callback":"parse"}', "twice"),
        (b'{"url":"https://e.com/","cb":"__init__"}', "__init__"),
        (b'{"url":"https://e.com/","eb":"_set_crawler"}', "_set_crawler"),
        (b'{"url":"https://e.com/","cl":"os.system"}', "not allowed"),
        (b'{"url":"https://e.com/","cl":["x"]}', "not allowed"),
        (b'{"url":"https://e.com/","cl":"XmlRpcRequestX"}', "not allowed"),
        (b'{"url":"file:///etc/passwd","cl":"FormRequest"}', "SCHEDULER_URL_SCHEMES"),
        (b'{"url":"https://e.com/","p":1' + b"0" * 40 + b"}", "priority"),
        (b'{"url":"https://e.com/","p":true}', "priority"),
        (b'{"url":"https://e.com/","h":7}', "cannot rebuild"),
        (b'{"cb":"parse"}', "url"),
    ],
)
def test_hostile_compact_entries_are_refused(entry: bytes, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        RequestCodec(JsonSerializer(), FullSpider()).decode(entry)


def test_class_aliases_name_scrapy_classes_only() -> None:
    from scrapy_dist.serializers import CLASS_ALIASES, class_path

    assert set(CLASS_ALIASES) == {class_path(c) for c in (FormRequest, JsonRequest, XmlRpcRequest)}


def test_long_names_that_read_as_short_ones_are_escaped() -> None:
    serializer = JsonSerializer()
    obj = {"url": "u", "cb": 1, "~x": 2, "callback": "c", "other": 3}
    data = serializer.dumps(obj)
    assert b'"~cb":1' in data
    assert b'"~~x":2' in data
    assert b'"cb":"c"' in data
    assert serializer.loads(data) == obj
    long = JsonSerializer(short_names=False)
    assert long.loads(long.dumps(obj)) == obj


@pytest.mark.parametrize("serializer", ["json", "json-long"])
def test_a_worker_reads_old_and_new_entries_from_one_queue(
    make_crawler: Callable[..., Crawler], client: redis.Redis, serializer: str
) -> None:
    """Entries an older worker queued (long form) and this one's come back alike."""
    crawler = make_crawler({"SCHEDULER_SERIALIZER": serializer}, spidercls=FullSpider)
    scheduler = build_from_crawler(Scheduler, crawler)
    spider = crawler.spider
    assert isinstance(spider, FullSpider)
    key = f"{spider.name}:requests"
    scheduler.open(spider)
    try:
        PriorityQueue(client, key, f"{spider.name}:seq").push([(LONG_FORM, 0.0, b"")])
        new = Request(URL67 + "?new", callback=spider.on_error, meta={"depth": 1}, priority=-1)
        assert scheduler.enqueue_request(new)
        first, second = scheduler.next_request(), scheduler.next_request()
        assert first is not None
        assert second is not None
        assert _all_attributes(first) == _all_attributes(Request(URL67, callback=spider.parse_item))
        assert _all_attributes(second) == _all_attributes(new)
        # the new entry, as leased (its lease record holds the entry as stored)
        records = [
            value
            for key in client.scan_iter(match=f"{spider.name}*")
            if client.type(key) == b"hash"
            for value in cast("list[bytes]", client.hvals(key))
            if b"?new" in value
        ]
        assert len(records) == 1
        if serializer == "json":
            assert records[0].endswith(
                b'{"url":"' + new.url.encode() + b'","cb":"on_error","mt":{"depth":1},"p":-1}'
            )
        else:
            assert b'"callback":"on_error"' in records[0]
    finally:
        scheduler.close("finished")
