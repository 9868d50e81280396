"""The output folder of ``sao-eval``: the files a run writes there, and a check, made before anything
starts, that every one of them can be written (a folder given as ``--output`` that is a file, lies
under a file or on a read-only or virtual file system, or holds a folder where a file goes, fails
at once with one line, instead of after the model has run)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import EvalError
from .swe_outputs import PREDICTIONS, PREDS, REPORT, REPORTS, TRAJS

TRAJECTORIES = "trajectories.jsonl"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"
RUN = "run.json"
FILES = (TRAJECTORIES, RESULTS, SUMMARY, RUN, "vllm.log", PREDICTIONS, PREDS, REPORT)
FOLDERS = (REPORTS, TRAJS)  # SWE: one grading report and one trajectory file per episode


def check_output(folder: Path) -> None:
    """Raise :class:`EvalError` unless ``folder`` (existing or not) can receive every output file.
    Creates nothing that stays: writability is tried with a probe file that is removed at once."""
    if folder.is_symlink() and not folder.exists():
        raise EvalError(f"--output {folder}: a link to nothing ({os.readlink(folder)}); choose another folder")
    if not folder.exists():
        parent = next(p for p in folder.absolute().parents if p.exists())  # the root exists
        if not parent.is_dir():
            raise EvalError(f"--output {folder}: {parent} is a file, not a folder; choose another --output")
        _probe(folder, parent)
        return
    if not folder.is_dir():
        raise EvalError(f"--output {folder}: is a file, not a folder; choose another --output")
    _probe(folder, folder)
    for name in FILES:
        path = folder / name
        if path.exists() and not path.is_file():
            raise EvalError(f"--output {folder}: {name} is not a regular file (a folder?); move it away or "
                            "choose another --output")
        if path.is_file():
            try:
                with path.open("a"):  # opened for appending and closed: nothing written
                    pass
            except OSError as exc:
                raise EvalError(f"--output {folder}: {name} cannot be written ({exc.strerror or exc})") from exc
    for name in FOLDERS:
        if (folder / name).exists() and not (folder / name).is_dir():
            raise EvalError(f"--output {folder}: {name} must be a folder; move it away or choose another --output")


def _probe(folder: Path, where: Path) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".sao-eval-write-check-")
    except OSError as exc:
        raise EvalError(f"--output {folder}: cannot create files in {where} ({exc.strerror or exc}); "
                        "choose another --output") from exc
    os.close(fd)
    os.unlink(probe)
