"""Lists Engram's packages under its one import name (pyproject.toml maps each top-level folder
to engram_ledger.<folder>; the rest of the metadata lives there)."""

from setuptools import find_packages, setup

FOLDERS = ("contracts", "services", "projections")
# Folders of files rather than modules (the console's pages and front end): setuptools takes any
# folder inside a package for a package, so each is listed as one, and pyproject.toml's
# package-data names the files it ships.
DATA_FOLDERS = ("services.console.templates", "services.console.static")

packages = [*find_packages(include=[f"{folder}*" for folder in FOLDERS]), *DATA_FOLDERS]
setup(packages=[f"engram_ledger.{name}" for name in packages])
