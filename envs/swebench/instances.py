"""SWE-bench instances: the schema, the checks of a row, and loading (with a cache)."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.hints import did_you_mean

from ..datasets import is_blank, load_rows
from ..errors import DatasetError

HUB_SOURCES = {
    "verified": "princeton-nlp/SWE-bench_Verified",
    "lite": "princeton-nlp/SWE-bench_Lite",
    "full": "princeton-nlp/SWE-bench",
}
HARNESS_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
                  "FAIL_TO_PASS", "PASS_TO_PASS", "version", "environment_setup_commit")
LOCAL_SPEC_FIELDS = ("test_cmd", "log_parser")


@dataclass(frozen=True)
class SWEInstance:
    """One SWE-bench task. ``row`` keeps the source row (swebench's script builders read it)."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    version: str
    environment_setup_commit: str
    test_cmd: str | None = None
    log_parser: str | None = None
    image: str | None = None
    row: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def known_to_swebench(self) -> bool:
        """swebench's specs know this repository and version (its eval script and parser apply)."""
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

        return self.version in MAP_REPO_VERSION_TO_SPECS.get(self.repo, {})

    def swebench_row(self) -> dict[str, Any]:
        """The row as swebench's functions expect it (normalised fields over the source row)."""
        return {**self.row, "instance_id": self.instance_id, "repo": self.repo, "base_commit": self.base_commit,
                "patch": self.patch, "test_patch": self.test_patch, "version": self.version,
                "environment_setup_commit": self.environment_setup_commit,
                "FAIL_TO_PASS": list(self.fail_to_pass), "PASS_TO_PASS": list(self.pass_to_pass)}


def _test_list(value: Any, where: str, name: str) -> tuple[str, ...]:
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: {name} is not a JSON list ({exc.msg})") from exc
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise DatasetError(f"{where}: {name} must be a list of test ids (or a JSON string of one)")
    return tuple(value)


def _version(value: Any) -> str:
    # Hub rows hold strings ("3.0", "0.12"); a float from a lossy copy is kept as Python prints it.
    return value.strip() if isinstance(value, str) else str(value)


def log_parser_names() -> list[str]:
    """The names of swebench's log parsers (``parse_log_*`` in ``swebench.harness.log_parsers``)."""
    return sorted(_log_parsers())


@functools.lru_cache(maxsize=1)
def _log_parsers() -> dict[str, Any]:
    import importlib
    import inspect
    import pkgutil

    import swebench.harness.log_parsers as pkg

    found: dict[str, Any] = {}
    for module in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{module.name}")
        found.update({n: f for n, f in vars(mod).items() if n.startswith("parse_log") and inspect.isfunction(f)})
    return found


def instances_from_rows(rows: Sequence[Mapping[str, Any]], *, source: str) -> list[SWEInstance]:
    """Check and convert rows; a broken row raises :class:`DatasetError` naming the source and row."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    if not rows:
        raise DatasetError(f"{source}: no rows")
    incomplete = [(i, [f for f in HARNESS_FIELDS if is_blank(r.get(f))]) for i, r in enumerate(rows, start=1)]
    incomplete = [(i, missing) for i, missing in incomplete if missing]
    if incomplete:
        i, missing = incomplete[0]
        iid = rows[i - 1].get("instance_id")
        more = (f"; {len(incomplete) - 1} more of the {len(rows)} rows lack harness fields too"
                if len(incomplete) > 1 else "")
        raise DatasetError(
            f"{source}: row {i}{f' (instance_id {iid!r})' if iid else ''}: missing "
            f"{', '.join(repr(f) for f in missing)}{more}. Grading needs every one of "
            f"{', '.join(HARNESS_FIELDS)}; a copy with prompts and gold patches only cannot be graded. Load the "
            f"full dataset (e.g. {HUB_SOURCES['verified']} from the Hugging Face hub) or a complete local copy.")
    parsers = _log_parsers()
    instances: list[SWEInstance] = []
    seen: set[str] = set()
    for i, r in enumerate(rows, start=1):
        iid = str(r["instance_id"])
        where = f"{source}: row {i} (instance_id {iid!r})"
        if iid in seen:
            raise DatasetError(f"{where}: duplicate instance_id")
        seen.add(iid)
        f2p = _test_list(r["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
        if not f2p:
            raise DatasetError(f"{where}: FAIL_TO_PASS is empty; an instance needs at least one test it fixes")
        version = _version(r["version"])
        repo = str(r["repo"])
        opt = {k: (None if is_blank(r.get(k)) else str(r[k])) for k in ("test_cmd", "log_parser", "image")}
        known = version in MAP_REPO_VERSION_TO_SPECS.get(repo, {})
        if not known:
            missing = [f for f in LOCAL_SPEC_FIELDS if opt[f] is None]
            if missing:
                raise DatasetError(
                    f"{where}: swebench's specs do not know repo {repo!r} version {version!r}, so the row must "
                    f"say how to run and read its tests: missing {', '.join(repr(f) for f in missing)} (e.g. "
                    f"test_cmd 'python3 -m pytest -rA', log_parser 'parse_log_pytest')")
        if opt["log_parser"] is not None and opt["log_parser"] not in parsers:
            raise DatasetError(f"{where}: unknown log_parser {opt['log_parser']!r}."
                               f"{did_you_mean(opt['log_parser'], list(parsers))} Known: {', '.join(sorted(parsers))}")
        instances.append(SWEInstance(
            instance_id=iid, repo=repo, base_commit=str(r["base_commit"]).strip(),
            problem_statement=str(r["problem_statement"]), patch=str(r["patch"]), test_patch=str(r["test_patch"]),
            fail_to_pass=f2p, pass_to_pass=_test_list(r["PASS_TO_PASS"], where, "PASS_TO_PASS"), version=version,
            environment_setup_commit=str(r["environment_setup_commit"]), row=dict(r), **opt))
    return instances


def load_instances(source: str | os.PathLike, *, split: str = "test") -> list[SWEInstance]:
    """Instances from a hub dataset id or a local jsonl/json/parquet/csv file (see the package docstring)."""
    return list(_cached_instances(str(source), split, _mtime(str(source))))


def _mtime(source: str) -> float:
    path = Path(source).expanduser()
    return path.stat().st_mtime if path.exists() else 0.0


@functools.lru_cache(maxsize=8)
def _cached_instances(source: str, split: str, _stamp: float) -> tuple[SWEInstance, ...]:
    return tuple(instances_from_rows(load_rows(source, split=split), source=source))

