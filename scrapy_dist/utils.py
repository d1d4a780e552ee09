"""scrapy-redis's ``utils`` helpers, for code that imports them."""

from __future__ import annotations

import json
from typing import Any


class TextColor:
    """ANSI colour codes (scrapy-redis's name; scrapy_dist logs plain text)."""

    HEADER = "\033[95m"
    OKBLUE = "\033[94m"
    OKCYAN = "\033[96m"
    OKGREEN = "\033[92m"
    WARNING = "\033[93m"
    FAIL = "\033[91m"
    ENDC = "\033[0m"
    BOLD = "\033[1m"
    UNDERLINE = "\033[4m"


def bytes_to_str(s: Any, encoding: str = "utf-8") -> Any:
    """Return ``s`` decoded if it is bytes, else ``s`` unchanged."""
    if isinstance(s, bytes):
        return s.decode(encoding)
    return s


def is_dict(string_content: str | bytes) -> bool:
    """Whether ``string_content`` parses as JSON (scrapy-redis's name and meaning)."""
    try:
        json.loads(string_content)
    except ValueError:
        return False
    return True


def convert_bytes_to_str(data: Any, encoding: str = "utf-8") -> Any:
    """Decode bytes, and the bytes keys and values of a dict, to str."""
    if isinstance(data, bytes):
        return data.decode(encoding)
    if isinstance(data, dict):
        return {
            convert_bytes_to_str(k, encoding): convert_bytes_to_str(v, encoding)
            for k, v in data.items()
        }
    if isinstance(data, tuple):
        return tuple(convert_bytes_to_str(v, encoding) for v in data)
    return data
