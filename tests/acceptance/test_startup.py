"""Start-up failures a user makes: one clear ERROR line, a non-zero exit, no traceback cascade."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from conftest import CLASSES_SETTINGS, DONE_SETTINGS

from scrapy_dist.testing import RedisServer, free_port

if TYPE_CHECKING:
    from collections.abc import Iterator

    from conftest import Project, Run

#: The README's classes and a self-ending crawl; each test adds its ``REDIS_URL``.
SETTINGS = CLASSES_SETTINGS + DONE_SETTINGS


@pytest.fixture(scope="module")
def password_server() -> Iterator[RedisServer]:
    """A redis-server that wants the password ``s3cret``."""
    with RedisServer() as server:
        with server.client() as client:
            client.config_set("requirepass", "s3cret")
        yield server


def one_clear_error(run: Run, project: Project, *words: str) -> str:
    """Check that ``run`` failed with one ERROR line naming ``words``, and nothing else.

    Returns:
        The ERROR line.
    """
    (code,) = project.wait([run], timeout=45)
    assert code != 0, f"{run.name} exited 0 after a start-up failure\n{run.tail()}"
    errors = run.errors()
    assert len(errors) == 1, f"{len(errors)} ERROR lines, not one:\n" + "\n".join(errors)
    for word in words:
        assert word.lower() in errors[0].lower(), f"{word!r} not in the ERROR line: {errors[0]}"
    assert run.tracebacks() == 0, f"a traceback cascade:\n{run.tail(80)}"
    return errors[0]


def test_unreachable_redis(project: Project) -> None:
    port = free_port()
    project.add_settings(SETTINGS + f'REDIS_URL = "redis://127.0.0.1:{port}/0"\n')
    (run,) = project.crawl(1, ready=False)
    one_clear_error(run, project, str(port), "REDIS_URL")


def test_wrong_password(project: Project, password_server: RedisServer) -> None:
    project.add_settings(
        SETTINGS + f'REDIS_URL = "redis://:wrong@127.0.0.1:{password_server.port}/0"\n'
    )
    (run,) = project.crawl(1, ready=False)
    one_clear_error(run, project, "REDIS_URL")


def test_seeds_key_of_wrong_type(project: Project) -> None:
    project.add_settings(SETTINGS + f'REDIS_URL = "{project.redis_url}"\n')
    with project.client() as client:
        client.set("books:start_urls", project.page(0))  # SET instead of LPUSH
    (run,) = project.crawl(1, ready=False)
    one_clear_error(run, project, "books:start_urls")


def test_misconfiguration(project: Project) -> None:
    project.add_settings(
        SETTINGS + f'REDIS_URL = "{project.redis_url}"\nSCHEDULER_LEASE_TIMEOUT = -5\n'
    )
    (run,) = project.crawl(1, ready=False)
    one_clear_error(run, project, "SCHEDULER_LEASE_TIMEOUT")


def test_a_redis_params_value_redis_py_refuses(project: Project) -> None:
    """``REDIS_PARAMS = {"socket_timeout": "abc"}`` failed at the first connect with a
    TypeError traceback that named neither the setting nor the key."""
    project.add_settings(
        SETTINGS + f'REDIS_URL = "{project.redis_url}"\n'
        'REDIS_PARAMS = {"socket_timeout": "abc"}\n'
    )
    (run,) = project.crawl(1, ready=False)
    one_clear_error(run, project, "REDIS_PARAMS['socket_timeout'] = 'abc'")


def test_a_database_the_server_does_not_have(project: Project) -> None:
    """A ``REDIS_URL`` database beyond the server's 16 was reported as "cannot reach
    Redis", though the server was running."""
    url = project.redis_url.rpartition("/")[0] + "/99"
    project.add_settings(SETTINGS + f'REDIS_URL = "{url}"\n')
    (run,) = project.crawl(1, ready=False)
    line = one_clear_error(run, project, "refused database 99", "REDIS_URL")
    assert "cannot reach" not in line
