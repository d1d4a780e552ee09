"""The package's exceptions: one root, a few precise subclasses."""

from __future__ import annotations

import re

#: How Redis 6.2 wraps an error raised by a script's ``redis.call()``: "Error running
#: script (call to f_<sha>): @user_script:<line>: [@user_script: <line>: -]<error>".
#: Redis 7 passes the error through, its origin appended.
_SCRIPT_WRAPPER = re.compile(
    r"^Error running script \(call to f_[0-9a-f]+\): @user_script:\d+: (?:@user_script: \d+: )?-?"
)


def redis_error_text(error: BaseException) -> str:
    """The text of a Redis error as the server's own error starts (``OOM ...``,
    ``WRONGTYPE ...``): without redis-py's pipeline prefix ("Command # 1 (...) of
    pipeline caused error: ") or Redis 6.2's wrapper of an error raised inside a script,
    so that its first word is the error code on every supported server."""
    message = str(error).rsplit("caused error: ", 1)[-1]
    return _SCRIPT_WRAPPER.sub("", message, count=1)


class ScrapyDistError(Exception):
    """Root of every exception this package raises on purpose."""


class ConfigurationError(ScrapyDistError):
    """Settings that contradict each other or name something that cannot work."""


class InvalidSpiderAttribute(ConfigurationError, ValueError):
    """A Redis spider attribute (``redis_key``, ``redis_batch_size``...) that cannot be
    used; a ``ValueError``, as scrapy-redis's ``setup_redis`` raises."""


class SerializationError(ScrapyDistError, ValueError):
    """A request that cannot be turned into bytes, or bytes that are not a request."""


class RedisUnavailable(ScrapyDistError):
    """The Redis server named by the settings cannot be reached."""


class InvalidSeed(ScrapyDistError, ValueError):
    """A seed read from Redis (or given to the CLI) that cannot become a request."""


class StaleFilterView(ScrapyDistError):
    """A Bloom dupefilter call passed fewer stages than are open in Redis, so it wrote
    nothing; the backend refreshes its view (``script_keys()``) and the call is retried."""
