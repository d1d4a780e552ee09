"""``scrapy-dist`` as a user runs it: in the project, outside it, from a script, as an ACL user."""

from __future__ import annotations

import secrets
import subprocess
import sys
from typing import TYPE_CHECKING

import redis
from conftest import environment

import scrapy_dist

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import Project


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy-dist ARGS`` in ``cwd``, stdin not a terminal."""
    return subprocess.run(
        [sys.executable, "-m", "scrapy_dist", *args],
        cwd=cwd,
        env=environment(),
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_destructive_commands_without_a_terminal_refuse_with_1(project: Project) -> None:
    """docs/cli.md: a reset or purge refused without --yes (no terminal) exits 1."""
    project.add_settings(f'REDIS_URL = "{project.redis_url}"\n')
    with project.client() as client:
        client.rpush("books:dead", '{"kind": "seed", "reason": "r", "data": "ftp://x"}')
        client.rpush("books:start_urls", project.page(0))
    reset = project.cli("reset", "books")
    assert reset.returncode == 1, reset.stderr
    assert "--yes" in reset.stderr
    purge = project.cli("dead", "purge", "books")
    assert purge.returncode == 1, purge.stderr
    with project.client() as client:
        assert client.llen("books:dead") == 1
        assert client.llen("books:start_urls") == 1


def test_version_and_help(tmp_path: Path) -> None:
    version = run(tmp_path, "--version")
    assert version.returncode == 0, version.stderr
    assert f"scrapy-dist {scrapy_dist.__version__}" in version.stdout
    helped = run(tmp_path, "--help")
    assert helped.returncode == 0
    assert "docs/" not in helped.stdout  # an installed package has no docs directory
    assert "COMMAND --help" in helped.stdout


def test_outside_a_project_it_says_which_redis(tmp_path: Path) -> None:
    """Outside a project the defaults point at localhost:6379: the user is told so."""
    dry = run(tmp_path, "push", "books", "https://example.com/", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "not inside a Scrapy project" in dry.stderr
    assert "redis://localhost:6379/0" in dry.stderr


def test_outside_a_project_with_a_redis_url_no_warning(tmp_path: Path, redis_url: str) -> None:
    given = run(
        tmp_path, "push", "books", "https://example.com/", "--dry-run", "--redis-url", redis_url
    )
    assert given.returncode == 0, given.stderr
    assert "warning" not in given.stderr


def test_push_for_a_spider_that_is_not_a_redis_spider(project: Project) -> None:
    project.add_settings(f'REDIS_URL = "{project.redis_url}"\n')
    project.write(
        "books/spiders/plain.py",
        "import scrapy\n\n\nclass PlainSpider(scrapy.Spider):\n    name = 'plain'\n",
    )
    pushed = project.cli("push", "plain", project.page(0))
    assert pushed.returncode == 0, pushed.stderr
    assert "not a Redis spider" in pushed.stderr
    assert "plain:start_urls" in pushed.stderr
    ok = project.cli("push", "books", project.page(0))
    assert "not a Redis spider" not in ok.stderr


def test_jobs_as_an_acl_user_allowed_some_crawls(project: Project, redis_url: str) -> None:
    """Crawls the user may not read are listed as such, not with a garbled type message."""
    user, password = f"reader{secrets.token_hex(3)}", secrets.token_hex(8)
    with project.client() as client:
        client.hset("open:progress", "done", 3)
        client.hset("closed:progress", "done", 4)
        client.acl_setuser(
            user, enabled=True, passwords=[f"+{password}"], keys=["open:*"], commands=["+@all"]
        )
    try:
        base = project.redis_url.split("//", 1)[1]
        url = f"redis://{user}:{password}@{base}"
        jobs = run(project.root.parent, "jobs", "--redis-url", url)
        assert jobs.returncode == 0, jobs.stderr
        lines = {line.split()[0]: line for line in jobs.stdout.splitlines()[1:]}
        assert "no permission" in lines["closed"], jobs.stdout
        assert "holds a" not in jobs.stdout
        assert "no permission" not in lines["open"], jobs.stdout
    finally:
        with redis.Redis.from_url(redis_url) as admin:
            admin.acl_deluser(user)


def test_status_of_an_idle_crawl_says_why_it_is_not_finished(project: Project) -> None:
    project.add_settings(f'REDIS_URL = "{project.redis_url}"\n')
    with project.client() as client:
        client.hset("books:progress", "done", 5)
    status = project.cli("status", "books")
    assert status.returncode == 0, status.stderr
    assert "[idle]" in status.stdout
    assert "CLOSE_WHEN_CRAWL_DONE" in status.stdout
