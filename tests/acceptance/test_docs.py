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


ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: A file or directory of the repository, as the page names one: ``scrapy_dist/keys.py``,
#: ``scrapy_dist/filters/``, ``tests/test_cli.py``, ``docs/cli.md``.
_REPO_PATH = re.compile(r"\b((?:scrapy_dist|tests|benchmarks|example|scripts|docs)/[\w./-]*\w/?)")
#: A Lua script named by its place in ``scrapy_dist/``: ``lua/reserve.lua``, ``_fence.lua``.
_LUA = re.compile(r"(?<![\w/])((?:lua/)?_?\w+\.lua)\b")


def test_architecture_names_only_files_that_exist() -> None:
    """docs/architecture.md names modules, packages and scripts by path: each exists."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    paths = set(_REPO_PATH.findall(text))
    scripts = {name.removeprefix("lua/") for name in _LUA.findall(text)}
    assert len(paths) > 20, sorted(paths)  # the page names its modules
    paths |= {f"scrapy_dist/lua/{name}" for name in scripts}
    missing = sorted(path for path in paths if not (ROOT / path).exists())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
