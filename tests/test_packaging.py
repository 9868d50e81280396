"""pyproject.toml lists sao's packages by hand (one namespace, `sao.*`, over the top-level folders through
`package-dir`). An editable install finds a folder the list misses anyway, and a wheel silently leaves it
out: so the list must name exactly the folders that hold Python or configuration. Its console scripts and
vLLM plug-in entry points name module paths, which must import to callables, and the installed metadata
must say what pyproject.toml says (vLLM loads its plug-ins from the metadata)."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def package_folders() -> set[str]:
    """Each folder under a `package-dir` root that holds Python (modules or an __init__.py) or YAML (the
    conf groups), as its dotted package name."""
    found = set()
    for package, folder in SETUPTOOLS["package-dir"].items():
        top = ROOT / folder
        for path in [top, *top.rglob("*")]:
            if not path.is_dir() or "__pycache__" in path.parts or any(p.startswith(".") for p in path.parts):
                continue
            if any(path.glob("*.py")) or any(path.glob("*.yaml")):
                found.add(".".join([package, *path.relative_to(top).parts]))
    return found


def entry_points() -> dict[tuple[str, str], str]:
    """(group, name) -> "module:attr", as pyproject.toml declares them."""
    project = PYPROJECT["project"]
    declared = {("console_scripts", name): target for name, target in project["scripts"].items()}
    for group, targets in project.get("entry-points", {}).items():
        declared |= {(group, name): target for name, target in targets.items()}
    return declared


def test_the_package_list_names_every_folder_and_only_those():
    listed, on_disk = set(SETUPTOOLS["packages"]), package_folders()
    assert len(SETUPTOOLS["packages"]) == len(listed), "pyproject.toml lists a package twice"
    assert not on_disk - listed, f"folders missing from pyproject.toml's packages (a wheel would lose them): " \
                                 f"{sorted(on_disk - listed)}"
    assert not listed - on_disk, f"pyproject.toml lists packages that have no folder: {sorted(listed - on_disk)}"


def test_every_python_package_has_an_init():
    """A folder of modules without __init__.py is a namespace package: its surface would name nothing."""
    roots = {package: ROOT / folder for package, folder in SETUPTOOLS["package-dir"].items()}
    missing = []
    for package in SETUPTOOLS["packages"]:
        top = next(p for p in sorted(roots, key=len, reverse=True) if package == p or package.startswith(p + "."))
        folder = roots[top].joinpath(*package[len(top):].strip(".").split(".")) if package != top else roots[top]
        if any(folder.glob("*.py")) and not (folder / "__init__.py").is_file():
            missing.append(package)
    assert not missing, f"packages without __init__.py: {missing}"


@pytest.mark.parametrize("key", sorted(entry_points()), ids=lambda key: f"{key[0]}:{key[1]}")
def test_each_entry_point_names_an_importable_callable(key):
    target = entry_points()[key]
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    assert callable(obj), f"{key[1]} = {target!r} is not callable"


def test_the_installed_entry_points_are_pyprojects():
    """A venv installed before an entry point moved still names the old path, which vLLM would try to
    load in every process it starts: run `bash scripts/setup` (or `pip install -e .`) again."""
    dist = distribution("sao")
    installed = {(e.group, e.name): e.value for e in dist.entry_points}
    assert installed == entry_points(), "the installed sao's entry points are stale: reinstall it (scripts/setup)"
