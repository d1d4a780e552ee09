from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import pytest
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest

from scrapy_dist.exceptions import ConfigurationError, SerializationError
from scrapy_dist.serializers import (
    JsonSerializer,
    PickleSerializer,
    RequestCodec,
    load_serializer,
)

if TYPE_CHECKING:
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
