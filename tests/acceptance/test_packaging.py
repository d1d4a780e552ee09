"""The package as a user installs or bundles it: its Lua scripts travel with it, no warning."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import environment

import scrapy_dist

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(scrapy_dist.__file__).parent


def test_build_has_no_warning_and_holds_the_lua(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", ".*cache"),
    )
    # As pip builds it for a user: an isolated build with the newest setuptools.
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-v",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output[-3000:]
    assert "absent from" not in output, [line for line in output.splitlines() if "absent" in line]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = [name.rsplit("/", 1) for name in zipfile.ZipFile(wheel).namelist()]
    built_lua = {
        name for folder, name in names if folder == "scrapy_dist/lua" and name.endswith(".lua")
    }
    assert built_lua == {path.name for path in (PACKAGE / "lua").glob("*.lua")}
    # the page of scrapy-dist web is served from the package (machines may be offline)
    assets = ("html", "css", "js")
    built_static = {
        name
        for folder, name in names
        if folder == "scrapy_dist/web/static" and name.endswith(assets)
    }
    shipped = {p.name for p in (PACKAGE / "web" / "static").iterdir() if p.name.endswith(assets)}
    assert built_static == shipped


def test_a_zipped_copy_without_its_lua_says_how_to_fix_it(tmp_path: Path) -> None:
    """A copy of scrapy_dist zipped without its package data fails with one clear message."""
    archive = tmp_path / "bundle.egg"
    with zipfile.ZipFile(archive, "w") as bundle:
        for path in PACKAGE.rglob("*.py"):
            bundle.write(path, Path("scrapy_dist") / path.relative_to(PACKAGE))
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import scrapy_dist.lua_source as s; "
            "assert s.__file__.startswith(sys.argv[1]), s.__file__; s.source('enqueue')",
            str(archive),
        ],
        capture_output=True,
        text=True,
        env={**environment(), "PYTHONPATH": ""},
        check=False,
    )
    assert loaded.returncode != 0
    last = loaded.stderr.strip().splitlines()[-1]
    assert last.startswith("scrapy_dist.exceptions.ConfigurationError"), loaded.stderr
    assert "package_data" in last, last
    assert "enqueue.lua" in last, last


def test_a_zipped_copy_with_its_lua_loads_it(tmp_path: Path) -> None:
    archive = tmp_path / "bundle.egg"
    with zipfile.ZipFile(archive, "w") as bundle:
        for path in [*PACKAGE.rglob("*.py"), *PACKAGE.glob("lua/*.lua")]:
            bundle.write(path, Path("scrapy_dist") / path.relative_to(PACKAGE))
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import scrapy_dist.lua_source as s; "
            "assert s.__file__.startswith(sys.argv[1]), s.__file__; "
            "print(len(s.source('enqueue')))",
            str(archive),
        ],
        capture_output=True,
        text=True,
        env={**environment(), "PYTHONPATH": ""},
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert int(loaded.stdout) > 100
