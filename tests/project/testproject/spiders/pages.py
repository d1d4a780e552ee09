"""A spider for the end-to-end tests: follows every link of the local test site."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from scrapy_dist.spiders import RedisSpider

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response, TextResponse


class PagesSpider(RedisSpider):
    """Crawls ``/page/<i>`` links; ``-a fail_on=/page/3,/page/9`` makes those callbacks raise."""

    name = "pages"

    def __init__(self, *args: Any, fail_on: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail_on = {path for path in fail_on.split(",") if path}

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        path = "/" + response.url.split("/", 3)[3]
        if path in self.fail_on:
            raise ValueError(f"poison page {path}")
        yield {"url": response.url}
        # the site's pages are HTML: Scrapy gives a TextResponse, which has css=
        yield from cast("TextResponse", response).follow_all(css="a", callback=self.parse)
