"""The package's exceptions: one root, a few precise subclasses."""

from __future__ import annotations


class ScrapyDistError(Exception):
    """Root of every exception this package raises on purpose."""


class ConfigurationError(ScrapyDistError):
    """Settings that contradict each other or name something that cannot work."""


class SerializationError(ScrapyDistError, ValueError):
    """A request that cannot be turned into bytes, or bytes that are not a request."""


class RedisUnavailable(ScrapyDistError):
    """The Redis server named by the settings cannot be reached."""


class InvalidSeed(ScrapyDistError, ValueError):
    """A seed read from Redis (or given to the CLI) that cannot become a request."""


class StaleFilterView(ScrapyDistError):
    """A Bloom dupefilter call passed fewer stages than are open in Redis, so it wrote
    nothing; the backend refreshes its view (``script_keys()``) and the call is retried."""
