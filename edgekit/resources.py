"""What edgekit ships inside its package: built-in recipes, the Ansible collection, the nightly
workflow, the results schema. One place that knows where they live, so an installed edgekit (a wheel,
pipx) works from any directory exactly as a checkout does."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def data_path(*parts: str) -> Path:
    """A file or directory under edgekit/data (installed as package data)."""
    return DATA.joinpath(*parts)


def builtin_recipes_dir() -> Path:
    return data_path("recipes")


def ansible_collection_dir() -> Path:
    """The fleet content: playbooks, roles and plugins, laid out as the `edgekit.fleet` collection."""
    return data_path("ansible")


def chat_templates_dir() -> Path:
    """The chat templates a recipe may name (``runtime.chat_template``): ``<name>.jinja``."""
    return data_path("chat_templates")


def ci_dir() -> Path:
    """The nightly on-device benchmark workflow and its actionlint config."""
    return data_path("ci")


def results_schema_file() -> Path:
    return data_path("results-schema.json")
