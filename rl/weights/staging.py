"""Weight folders to other nodes through Ray's object store (``cluster.weights=object_store``).

The learner publishes each version as a folder (``weights/v{k}``, :class:`~sao.rl.weights.sync.WeightPublisher`)
on its own disk. A replica on another node cannot read it, so the folder's files travel as one
object: :class:`ObjectStoreStager` puts a folder once (the first replica that loads it), and every
replica's actor gets the same reference; Ray copies the object to each node that needs it once.
The actor writes it into a node-local folder (:func:`write_folder`, atomic) and the engine reloads
from there; older local versions are pruned (:func:`prune`). The managed engine's starting model
(``RUN_DIR/engine_model``) travels the same way.

The files are shipped as uint8 numpy arrays: Ray hands them to the reader without a copy (zero-copy
from the node's shared memory), and the writer streams them to disk.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class FolderFiles:
    """A folder's regular files (no subfolders): ``name`` (the folder's own name, ``v000003``) and
    ``files`` (file name -> its bytes as a 1-D uint8 array)."""

    name: str
    files: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.files.values())


def read_folder(folder: Path) -> FolderFiles:
    """Every regular file directly in ``folder`` (a weight version or the engine's model folder)."""
    folder = Path(folder)
    files = {p.name: np.fromfile(p, dtype=np.uint8) for p in sorted(folder.iterdir()) if p.is_file()}
    if not files:
        raise FileNotFoundError(f"no files to ship in {folder}")
    return FolderFiles(folder.name, files)


def write_folder(staged: FolderFiles, root: Path) -> Path:
    """Write ``staged`` as ``root/<name>`` (through a temporary folder renamed into place, so a reader
    never sees half a version; an existing folder of that name is replaced). Returns the folder."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / staged.name
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{staged.name}-", dir=root))
    try:
        for name, data in staged.files.items():
            with open(tmp / name, "wb") as fh:
                fh.write(memoryview(data))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def prune(root: Path, keep: int, *, prefix: str = "v") -> list[Path]:
    """Delete all but the newest ``keep`` folders named ``prefix...`` under ``root`` (names sort by
    version: ``v000012`` after ``v000011``); returns what was deleted."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix))
    gone = found[:-keep] if keep > 0 else found
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


class ObjectStoreStager:
    """Puts each folder into Ray's object store once and hands out its reference (module doc).

    Keeps the newest ``keep`` version folders' references (older ones are dropped, and Ray frees
    them once no replica holds them; a replica that asks for a dropped one again gets it put again)
    plus every folder put with ``pin=True`` (the engine's starting model, needed by each restart).
    Thread-safe: replicas load from worker threads.
    """

    def __init__(self, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, not {keep}")
        self.keep = keep
        self._refs: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._pinned: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.puts = 0  # objects put (one per version when every replica loads it), for metrics and tests
        self.bytes_put = 0

    def ref(self, folder: Path, *, pin: bool = False) -> Any:
        """The object reference of ``folder``'s files (put on the first call for this folder and
        modification time: a version rewritten by a resumed run is put again)."""
        import ray

        folder = Path(folder).resolve()
        key = (str(folder), folder.stat().st_mtime_ns)
        with self._lock:
            if pin and str(folder) in self._pinned:
                return self._pinned[str(folder)]
            if key in self._refs:
                self._refs.move_to_end(key)
                return self._refs[key]
            staged = read_folder(folder)
            ref = ray.put(staged)
            self.puts += 1
            self.bytes_put += staged.nbytes
            del staged  # the object store holds it now
            if pin:
                self._pinned[str(folder)] = ref
                return ref
            self._refs[key] = ref
            while len(self._refs) > self.keep:
                self._refs.popitem(last=False)
            return ref

    def clear(self) -> None:
        with self._lock:
            self._refs.clear()
            self._pinned.clear()
