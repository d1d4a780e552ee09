"""scrapy-redis's pickle serializer: ``SCHEDULER_SERIALIZER = "scrapy_dist.picklecompat"``.

Naming this module is the explicit opt-in to pickle (the scheduler logs a warning):
anyone who can write to the crawl's Redis can then run code in every worker. The
default serializer is JSON.
"""

from __future__ import annotations

import pickle
from typing import Any


def loads(s: bytes) -> Any:
    """Unpickle ``s`` (only ever data from a Redis nobody else can write to)."""
    return pickle.loads(s)


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` with the highest protocol."""
    return pickle.dumps(obj, protocol=-1)
