"""Engram installs as one import package, engram_ledger, so an application with packages of its
own named like our folders (contracts, services, projections) imports both; the set-up's editable
install builds without setuptools' warnings, and a wheel carries the console's files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

from tests.support import ROOT

FOLDERS = ("contracts", "services", "projections")


def test_every_module_imports_beside_an_application_with_its_own_services_package(tmp_path: Path) -> None:
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(f"OWNER = 'the application: {folder}'\n")
    script = textwrap.dedent(
        """
        import importlib, pkgutil
        import engram_ledger.contracts, engram_ledger.services, engram_ledger.projections
        count = 0
        for root in (engram_ledger.contracts, engram_ledger.services, engram_ledger.projections):
            for module in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
                if not module.name.endswith(".__main__"):  # that one runs the CLI
                    importlib.import_module(module.name)
                    count += 1
        owners = [importlib.import_module(name).OWNER for name in ("contracts", "services", "projections")]
        print(count, *owners)
        """
    )
    # `python -c` puts the working directory first on sys.path, as an application's own entry
    # point does: its services/ comes before anything installed.
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    count, *owners = done.stdout.split(maxsplit=1)
    assert int(count) > 80
    assert owners == ["the application: contracts the application: services the application: projections\n"]


def test_the_distribution_is_engram_ledger_and_installs_only_that_import_name() -> None:
    dist = metadata.distribution("engram-ledger")
    assert dist.entry_points.select(group="console_scripts", name="engram")
    assert [ep.value for ep in dist.entry_points if ep.name == "engram"] == ["engram_ledger.services.cli:main"]


def test_no_file_in_the_repository_imports_the_folders_as_top_level_packages() -> None:
    old = re.compile(r"^\s*(from|import)\s+(contracts|services|projections)\b", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if ".venv" not in path.parts and old.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


# What a build reads: the packages' folders and the two files that describe the distribution.
BUILT_FROM = (*FOLDERS, "pyproject.toml", "setup.py", "README.md")
CONSOLE_FILES = ("services/console/templates", "services/console/static")


def _build(tmp_path: Path, hook: str) -> tuple[Path, str]:
    """Runs setuptools' PEP 517/660 ``hook`` (build_wheel, build_editable) on a copy of the
    repository's sources, with the setuptools installed here (no network), every warning shown.
    The wheel built and what the build printed on stderr."""
    source, out = tmp_path / "source", tmp_path / "dist"
    for name in BUILT_FROM:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    out.mkdir()
    script = f"from setuptools import build_meta; print(build_meta.{hook}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", script], cwd=source, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1], done.stderr


def test_the_editable_install_builds_without_a_packaging_warning(tmp_path: Path) -> None:
    _, printed = _build(tmp_path, "build_editable")
    # A folder of data inside a package that the configuration does not list as a package is
    # "absent from the packages configuration": three screens of warning in every set-up.
    assert "packages` configuration" not in printed, printed
    assert "SetuptoolsDeprecationWarning" not in printed, printed


def test_a_wheel_carries_every_file_of_the_console(tmp_path: Path) -> None:
    wheel, _ = _build(tmp_path, "build_wheel")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    files = sorted(p for folder in CONSOLE_FILES for p in (ROOT / folder).rglob("*") if p.is_file())
    assert len(files) > 10
    missing = [str(p.relative_to(ROOT)) for p in files if f"engram_ledger/{p.relative_to(ROOT)}" not in shipped]
    assert missing == []


def test_the_package_is_read_from_the_files_without_the_editable_hook() -> None:
    """engram_ledger/ holds a link to each top-level folder: mypy, an IDE or an import graph
    drawn from the files finds the package and its imports without the editable install."""
    for folder in ("contracts", "services", "projections"):
        link = ROOT / "engram_ledger" / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve()
    script = (
        "import sys\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import grimp\n"
        "g = grimp.build_graph('engram_ledger.contracts', 'engram_ledger.services', 'engram_ledger.projections', "
        "cache_dir=None)\n"
        "print(g.count_imports(), g.direct_import_exists(importer='engram_ledger.services.bus.client', "
        "imported='engram_ledger.contracts.channels'))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imports, client_reads_channels = done.stdout.split()
    assert int(imports) > 500 and client_reads_channels == "True"
