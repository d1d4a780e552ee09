"""Which spider methods a name read from Redis may call.

A seed or a queue entry names its callback and errback as text, and Scrapy would call
whatever attribute of the spider has that name (``"__init__"`` included) with the
response. Here a name resolves only to a method of the user's spider:

- never a dunder, and never an attribute that is not a method bound to the spider;
- never a member of the framework's own classes (``scrapy.Spider``, ``CrawlSpider``,
  ``SitemapSpider``, the Redis spiders...), even when the user's class overrides it
  (``start``, ``closed``, ``make_request_from_data``...), except ``parse``;
- for **seeds** (written by anyone who can push a URL), only public names;
- for **queue entries** (written by the crawl's own workers), private user methods too
  (``callback=self._parse_item`` is common), plus the framework's own rule callbacks
  (:data:`FRAMEWORK_CALLBACKS`), which ``CrawlSpider`` and ``SitemapSpider`` use.
"""

from __future__ import annotations

from typing import Any

#: Framework methods a spider's own requests name as callbacks (CrawlSpider's rules,
#: SitemapSpider's sitemaps): allowed in queue entries, never in seeds.
FRAMEWORK_CALLBACKS = frozenset(("_callback", "_errback", "_parse_sitemap", "_parse"))
#: The one framework method a seed may name.
PUBLIC_FRAMEWORK = frozenset(("parse",))
#: Packages whose classes are the framework, not the user's spider.
_FRAMEWORK_PACKAGES = ("scrapy", "scrapy_dist")


def _is_framework(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return cls is object or module.split(".", 1)[0] in _FRAMEWORK_PACKAGES


def refusal(spider: object, name: Any, *, public_only: bool) -> str | None:
    """Why ``name`` may not be used as a callback of ``spider`` (instance or class).

    Args:
        spider: the spider instance, or its class (the CLI checks seeds with the class).
        name: the name read from Redis.
        public_only: the seed rule (public names only); else the queue-entry rule.

    Returns:
        ``None`` if the name is allowed, else the reason (one sentence).
    """
    if not isinstance(name, str) or not name.isidentifier():
        return f"{name!r:.80} is not a method name"
    if name.startswith("__"):
        return f"{name!r} is a special method, not a callback"
    if public_only and name.startswith("_"):
        return f"{name!r} is private: seeds may name only public spider methods"
    cls = spider if isinstance(spider, type) else type(spider)
    owner = next((c for c in cls.__mro__ if name in vars(c)), None)
    if owner is None:
        owner_name = getattr(spider, "name", None) or cls.__name__
        return f"{name!r} is not a method of spider {owner_name!r}"
    if not callable(vars(owner)[name]) or isinstance(
        vars(owner)[name], (staticmethod, classmethod, type)
    ):
        return f"{name!r} is not a method of spider {cls.__name__!r}"
    allowed_framework = PUBLIC_FRAMEWORK if public_only else PUBLIC_FRAMEWORK | FRAMEWORK_CALLBACKS
    if name not in allowed_framework and any(
        _is_framework(c) and name in vars(c) for c in cls.__mro__
    ):
        return f"{name!r} belongs to the framework's spider API, not to the spider's own callbacks"
    return None


def resolve(spider: object, name: Any, *, public_only: bool) -> Any:
    """The bound method ``name`` of ``spider`` if the rule above allows it.

    Raises:
        ValueError: the name is refused (the message says why).
    """
    reason = refusal(spider, name, public_only=public_only)
    if reason is not None:
        raise ValueError(reason)
    return bound(spider, name)


def bound(spider: object, name: str) -> Any:
    """The attribute ``name`` of ``spider``, a name :func:`refusal` allowed: a method
    bound to the spider (to the class, for a class).

    Raises:
        ValueError: the attribute found is not a method bound to the spider (an
            instance attribute shadows it).
    """
    method = getattr(spider, name)
    if not isinstance(spider, type) and getattr(method, "__self__", None) is not spider:
        raise ValueError(f"{name!r} is not a method bound to the spider")
    return method
