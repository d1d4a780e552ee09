"""The request encoding before the compact one (issue 15), for before/after figures.

``SCHEDULER_SERIALIZER = "benchproject.legacy.LongFormSerializer"`` makes a worker write
queue entries as every version before the compact encoding did: every attribute of
``Request.to_dict``, defaults included, under its long name, headers and body as tagged
bytes. Byte for byte the old form for plain ``Request`` objects (all this benchmark
queues); today's decoding reads it.
"""

from __future__ import annotations

from typing import Any

from scrapy import Request

from scrapy_dist.serializers import JsonSerializer


def _as_bytes(value: Any, encoding: str) -> Any:
    return value.encode(encoding) if isinstance(value, str) else value


class LongFormSerializer(JsonSerializer):
    """JSON with every ``Request`` attribute, as entries were before issue 15."""

    #: Field order of ``Request.to_dict``.
    ORDER = ("url", "callback", "errback", "headers", *Request.attributes)

    def __init__(self) -> None:
        super().__init__(short_names=False)

    def dumps(self, obj: dict[str, Any], /) -> bytes:
        probe = Request("http://defaults.invalid/")
        encoding = obj.get("encoding", probe.encoding)
        full: dict[str, Any] = {}
        for name in self.ORDER:
            if name in full:
                continue
            if name in obj:
                value = obj[name]
            elif name in ("callback", "errback"):
                value = None
            elif name == "headers":
                value = {}
            else:
                value = getattr(probe, name)
            if name == "body":
                value = _as_bytes(value, encoding)
            if name == "headers" and isinstance(value, dict):
                value = {
                    _as_bytes(k, encoding): [
                        _as_bytes(v, encoding) for v in (vs if isinstance(vs, list) else [vs])
                    ]
                    for k, vs in value.items()
                }
            full[name] = value
        for name, value in obj.items():
            full.setdefault(name, value)
        return super().dumps(full)
