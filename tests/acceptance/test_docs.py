"""The deployment docs' examples name only what they define."""

from __future__ import annotations

import re
from pathlib import Path

DEPLOYMENT = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


def test_keda_redis_trigger_reads_only_what_the_example_defines() -> None:
    text = DEPLOYMENT.read_text(encoding="utf-8")
    env = set(re.findall(r"- name: ([A-Z_][A-Z0-9_]*)", text))
    from_env = re.findall(r"\w+FromEnv: ([A-Z_][A-Z0-9_]*)", text)
    undefined = [name for name in from_env if name not in env]
    assert not undefined, f"KEDA reads {undefined} from the container env, never defined"
    secret_keys = set(re.findall(r"^  (\w+): \S", text.split("kind: Secret", 1)[-1], re.M))
    for ref in re.findall(r"name: crawl-redis, key: (\w+)", text):
        assert ref in secret_keys, f"secret key {ref!r} is used but not in the example Secret"
