"""The documents name only what exists.

README.md, CONTRIBUTING.md and docs/*.md name files (``scrapy_dist/keys.py``,
``lua/reserve.lua``), dotted names (``scrapy_dist.parents.ParentLinks``), settings
(``SCHEDULER_PERSIST``) and sections of each other (``docs/migration.md#queues``); each
must exist, so a rename in the code fails here rather than in a reader's hands.
docs/architecture.md must also name every module and every Lua library of the package.
CHANGES.md is history (it names what was removed), so it is not read here.

Text only: nothing is crawled and no Redis is needed.
"""

from __future__ import annotations

import importlib
import inspect
import re
from functools import cache
from pathlib import Path

import pytest
from scrapy.settings import default_settings as scrapy_defaults

from scrapy_dist import default_settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DEPLOYMENT = ROOT / "docs" / "deployment.md"
#: The documents checked: what a user or a contributor reads.
DOCUMENTS = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

#: A file or directory of the repository, as the documents name one:
#: ``scrapy_dist/keys.py``, ``scrapy_dist/filters/``, ``tests/test_cli.py``, ``docs/cli.md``.
_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:scrapy_dist|tests|benchmarks|example|scripts|docs)/[\w./-]*\w/?)(?![\w<])"
)
#: A Lua script named by its place in ``scrapy_dist/``: ``lua/reserve.lua``, ``_fence.lua``
#: (not the package ``scrapy_dist.lua``).
_LUA = re.compile(r"(?<![\w/.])(?!scrapy_dist\.)((?:lua/)?_?\w+\.lua)\b")
#: A dotted name of the package: ``scrapy_dist.parents.ParentLinks``.
_DOTTED = re.compile(r"\bscrapy_dist(?:\.\w+)+")
#: An inline code span (which may go on over a line break).
_CODE = re.compile(r"`([^`]+)`")
#: A name in a code span that looks like a setting: ``SCHEDULER_PERSIST = True``,
#: ``-s REDIS_URL=...``, ``CONCURRENT_REQUESTS + 2 * SCHEDULER_PREFETCH`` (not a dotted
#: name's last part, nor a call).
_SETTING = re.compile(r"(?<![\w.$])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?![\w.(])")
#: A fenced code block (indented too, in a list item).
_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.MULTILINE | re.DOTALL)
#: A link to a document of the repository: ``[text](docs/cli.md#exit-codes)``.
_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)\s]*)\)")

#: Names in code spans that look like settings but are not settings of a crawl, each
#: with the reason the documents name it.
#: Scrapy settings that Scrapy 2.13, the oldest claimed, reads with a default in its code
#: rather than in its ``default_settings`` (later versions list them there).
SCRAPY_READS_WITHOUT_DEFAULT = frozenset({"DOWNLOAD_SLOTS", "DUPEFILTER_DEBUG"})
#: Scrapy settings newer than 2.13 that the docs name as such.
SCRAPY_NEWER = frozenset({"DOWNLOAD_DELAY_JITTER"})

NOT_SETTINGS = {
    "REDIS_SERVER": "environment variable: the redis-server binary of the tests and the demo",
    "SCRAPY_DIST_TEST_REDIS_URL": "environment variable: a Redis of the test session",
    "STATS_KEY": "scrapy-redis's setting, which scrapy_dist does not read (docs/migration.md)",
    "DEMO_ARGS": "make variable of the demo",
    "SERVERS_WORKERS": "make variable of the test suite on other servers",
    "LUA_CONSTANTS": "Python constant of scrapy_dist.frontier.wire",
    "ENTRY_ID_LEN": "Python constant of scrapy_dist.frontier.wire",
    "WORKER_ID_PATTERN": "Python constant of scrapy_dist.frontier.wire",
    "KNOWN_FAILURES": "Python constant of scripts/compat.py",
    "DUPEFILTER_STALE": "the refusal a dupefilter script answers (lua/_filters.lua)",
    "SCRAPY_DIST_WEB_AUTH": "environment variable: basic auth of scrapy-dist web",
    "SCRAPY_DIST_WEB_TOKEN": "environment variable: the action token of scrapy-dist web",
}


def prose(path: Path) -> str:
    """The document without its fenced code blocks (shell sessions, YAML, settings files)."""
    return _FENCE.sub("", path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a document's headings (a repeated one also as ``<slug>-<n>``)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", prose(path), re.MULTILINE):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


@cache
def known_settings() -> frozenset[str]:
    """The settings scrapy_dist reads, and Scrapy's own (those a Scrapy version
    deprecated, which its ``default_settings`` serves with a warning, included)."""
    names = {name for module in (default_settings, scrapy_defaults) for name in vars(module)}
    names |= set(re.findall(r"\bname == \"([A-Z_]+)\"", inspect.getsource(scrapy_defaults)))
    names |= SCRAPY_READS_WITHOUT_DEFAULT | SCRAPY_NEWER
    return frozenset(name for name in names if name.isupper())


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package, or an attribute of one (a class
    attribute, a property, or an attribute the class sets on its instances)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if hasattr(target, attr):
                target = getattr(target, attr)
            elif inspect.isclass(target) and re.search(
                rf"\bself\.{attr}\b(?::[^=\n]+)?\s*=", inspect.getsource(target)
            ):
                return attr == parts[-1]  # an instance attribute: nothing below it to check
            else:
                return False
        return True
    return False


def test_the_documents_checked_exist() -> None:
    assert README.exists()
    assert len(DOCUMENTS) > 5, DOCUMENTS


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_files_named_exist(path: Path) -> None:
    text = prose(path)
    paths = {p.rstrip(".") for p in _REPO_PATH.findall(text)}
    paths |= {f"scrapy_dist/lua/{n.removeprefix('lua/')}" for n in _LUA.findall(text)}
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{path.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_dotted_names_import(path: Path) -> None:
    names = {name.rstrip(".") for name in _DOTTED.findall(prose(path))}
    missing = sorted(name for name in names if not resolves(name))
    assert not missing, f"{path.name} names what does not import: {missing}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_settings_named_exist(path: Path) -> None:
    named = {name for span in _CODE.findall(prose(path)) for name in _SETTING.findall(span)}
    unknown = sorted(named - known_settings() - NOT_SETTINGS.keys())
    assert not unknown, (
        f"{path.name} names settings that neither scrapy_dist nor Scrapy has: {unknown} "
        "(scrapy_dist/default_settings.py has every setting scrapy_dist reads)"
    )


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_links_lead_to_a_file_and_a_heading(path: Path) -> None:
    broken = []
    for link in _LINK.findall(prose(path)):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{link} (no such heading in {file.name})")
    assert not broken, f"{path.name} has broken links: {broken}"


def test_every_setting_is_in_the_settings_reference() -> None:
    reference = prose(ROOT / "docs" / "settings.md")
    spans = set(_CODE.findall(reference))
    missing = sorted(
        name for name in vars(default_settings) if name.isupper() and name not in spans
    )
    assert not missing, f"docs/settings.md does not list {missing}"


def test_architecture_names_every_module_and_lua_library() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    package = ROOT / "scrapy_dist"
    modules = [
        f"scrapy_dist/{p.name}"
        for p in package.glob("*.py")
        if p.name not in {"__init__.py", "__main__.py"}
    ]
    packages = [
        f"scrapy_dist/{p.name}/"
        for p in package.iterdir()
        if (p / "__init__.py").exists() and p.name != "lua"
    ]
    libraries = [p.name for p in (package / "lua").glob("_*.lua")]
    missing = sorted(name for name in [*modules, *packages, *libraries] if name not in text)
    assert len(libraries) >= 8, libraries
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_readme_stays_short() -> None:
    """A newcomer reads it in five minutes; the rest is in docs/."""
    assert len(README.read_bytes()) <= 12_500


def test_keda_redis_trigger_reads_only_what_the_example_defines() -> None:
    """docs/deployment.md's KEDA example reads only the variables and secret it defines."""
    text = DEPLOYMENT.read_text(encoding="utf-8")
    env = set(re.findall(r"- name: ([A-Z_][A-Z0-9_]*)", text))
    from_env = re.findall(r"\w+FromEnv: ([A-Z_][A-Z0-9_]*)", text)
    undefined = [name for name in from_env if name not in env]
    assert not undefined, f"KEDA reads {undefined} from the container env, never defined"
    secret_keys = set(re.findall(r"^  (\w+): \S", text.split("kind: Secret", 1)[-1], re.M))
    for ref in re.findall(r"name: crawl-redis, key: (\w+)", text):
        assert ref in secret_keys, f"secret key {ref!r} is used but not in the example Secret"
