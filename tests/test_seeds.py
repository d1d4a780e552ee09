from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from scrapy import Spider

from scrapy_dist.exceptions import InvalidSeed
from scrapy_dist.seeds import parse_seed, request_from_seed


class SeedSpider(Spider):
    name = "seeds"

    def parse_page(self, response: Any) -> None: ...

    def failed(self, failure: Any) -> None: ...


def request(data: Any) -> Any:
    raw = data if isinstance(data, (str, bytes)) else json.dumps(data)
    return request_from_seed(parse_seed(raw), SeedSpider())


def test_plain_url() -> None:
    r = request(b"  https://example.com/a?b=1\n")
    assert (r.url, r.method, r.body) == ("https://example.com/a?b=1", "GET", b"")


def test_json_get_with_everything() -> None:
    spider_request = request(
        {
            "url": "http://e.com/x",
            "headers": {"X-A": "1", "X-B": ["2", "3"]},
            "cookies": {"s": "v"},
            "meta": {"m": 1},
            "cb_kwargs": {"page": 2},
            "priority": 7,
            "callback": "parse_page",
            "errback": "failed",
            "dont_filter": True,
        }
    )
    assert spider_request.method == "GET"
    assert spider_request.headers.getlist("X-B") == [b"2", b"3"]
    assert spider_request.cookies == {"s": "v"}
    assert spider_request.meta["m"] == 1
    assert spider_request.cb_kwargs == {"page": 2}
    assert spider_request.priority == 7
    assert spider_request.callback.__name__ == "parse_page"
    assert spider_request.errback.__name__ == "failed"
    assert spider_request.dont_filter


def test_post_formdata() -> None:
    r = request(
        {"url": "https://e.com/api", "method": "POST", "formdata": {"page": "1", "q": "a b"}}
    )
    assert r.method == "POST"
    assert parse_qs(r.body.decode()) == {"page": ["1"], "q": ["a b"]}
    assert r.headers["Content-Type"] == b"application/x-www-form-urlencoded"


def test_formdata_defaults_to_post_and_get_uses_the_query() -> None:
    assert request({"url": "https://e.com/", "formdata": {"a": "1"}}).method == "POST"
    r = request({"url": "https://e.com/s", "method": "get", "formdata": {"a": ["1", "2"]}})
    assert r.method == "GET"
    assert r.body == b""
    assert parse_qs(urlsplit(r.url).query) == {"a": ["1", "2"]}


def test_json_body() -> None:
    r = request({"url": "https://e.com/j", "json": {"k": [1, None]}})
    assert r.method == "POST"
    assert json.loads(r.body) == {"k": [1, None]}
    assert r.headers["Content-Type"] == b"application/json"


def test_raw_body_and_method() -> None:
    r = request({"url": "https://e.com/b", "method": "PUT", "body": "raw é"})
    assert (r.method, r.body) == ("PUT", "raw é".encode())


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"\xff\xfe", "not valid utf-8"),
        ("not a url", "whitespace"),
        ("ftp://e.com/", "http"),
        ("https://", "no host"),
        ("example.com/page", "http"),
        ("{bad json", "not valid JSON"),
        ("[1, 2]", "object"),
        ('"https://e.com/"', "object"),
        ({"method": "GET"}, "no 'url'"),
        ({"url": 5}, "'url'"),
        ({"url": "https://e.com/", "callback": "nope"}, "nope"),
        ({"url": "https://e.com/", "errback": "nope"}, "nope"),
        ({"url": "https://e.com/", "callback": "not an identifier"}, "callback"),
        ({"url": "https://e.com/", "priority": "high"}, "priority"),
        ({"url": "https://e.com/", "priority": True}, "priority"),
        ({"url": "https://e.com/", "headers": {"a": 1}}, "headers"),
        ({"url": "https://e.com/", "formdata": ["a"]}, "formdata"),
        ({"url": "https://e.com/", "meta": []}, "meta"),
        ({"url": "https://e.com/", "body": {"a": 1}}, "body"),
        ({"url": "https://e.com/", "body": "x", "json": {}}, "only one"),
        ({"url": "https://e.com/", "dont_filter": "yes"}, "dont_filter"),
        ({"url": "https://e.com/", "method": "GET / HTTP"}, "method"),
        ({"url": "https://e.com/", "cookies": [{"name": "a"}]}, "cookies"),
        # scrapy-redis's schema: an unknown field is form data, which must be text
        ({"url": "https://e.com/", "form_data": {}}, "form_data"),
    ],
)
def test_invalid_seeds_say_why(data: Any, reason: str) -> None:
    with pytest.raises(InvalidSeed, match=reason):
        request(data)
