"""Lists Engram's packages under its one import name (pyproject.toml maps each top-level folder
to engram_ledger.<folder>; the rest of the metadata lives there)."""

from setuptools import find_packages, setup

FOLDERS = ("contracts", "services", "projections")

setup(packages=[f"engram_ledger.{name}" for name in find_packages(include=[f"{folder}*" for folder in FOLDERS])])
