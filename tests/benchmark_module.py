"""Import a script of ``benchmarks/`` (not a package) as a module, for the tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as module ``NAME`` (registered in ``sys.modules``: dataclasses look their
    module up by name). ``benchmarks/`` goes on ``sys.path``, as when the script runs, so that it can import
    its sibling modules."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    path = folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
