"""Benchmark rows from a local file, a URL, or the Hugging Face hub.

A *source* is one of:

* a local path ending in ``.jsonl``, ``.json``, ``.csv`` or ``.parquet``;
* an ``http(s)://`` URL to such a file (read with pandas);
* a Hugging Face hub dataset id such as ``ByteDance-Seed/BeyondAIME`` (read with ``datasets``).

Rows come back as plain dicts. :func:`require_fields` checks the fields a benchmark needs and
fails on the first bad row with a message naming the source, the row (1-based, header excluded)
and the field, because a benchmark with a silently skipped (or silently converted) row reports a
wrong score.
"""

from __future__ import annotations

import json
import math
import numbers
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import DatasetError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def load_rows(source: str | Path, *, split: str = "test") -> list[dict[str, Any]]:
    """Read every row of ``source`` (see the module docstring). ``split`` applies to hub ids."""
    text = str(source)
    path = Path(text).expanduser()
    if path.exists():
        return _read_file(path)
    if text.startswith(("http://", "https://")):
        return _read_url(text)
    if path.suffix.lower() in SUFFIXES or text.startswith((".", "/", "~")):
        raise DatasetError(f"{text}: no such file")
    return _read_hub(text, split)


def require_fields(rows: Iterable[dict[str, Any]], fields: Iterable[str], *, source: str) -> None:
    """Fail on the first row where one of ``fields`` is missing, null/NaN or blank, or is not text or a
    number (a list, an object or a bool would be graded as its printed form)."""
    fields = tuple(fields)
    for i, row in enumerate(rows, start=1):
        for field in fields:
            value = row.get(field)
            if is_blank(value):
                state = "missing" if field not in row else "empty"
            elif isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
                state = f"a {type(value).__name__}, not text or a number"
            else:
                continue
            raise DatasetError(
                f"{source}: row {i}: field {field!r} is {state}"
                f" (row starts {json.dumps(_preview(row), ensure_ascii=False)[:160]})"
            )


def is_blank(value: Any) -> bool:
    """None, NaN, or a string of whitespace: a field that is there in name only."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _preview(row: dict[str, Any]) -> dict[str, str]:
    return {k: str(v)[:40] for k, v in list(row.items())[:3]}


def _read_file(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            return _read_jsonl(path)
        if suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):  # {"data": [...]} or {"rows": [...]}
                lists = [v for v in data.values() if isinstance(v, list)]
                data = lists[0] if len(lists) == 1 else data
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise DatasetError(f"{path}: expected a JSON list of objects")
            return data
        if suffix == ".csv":
            return _read_csv(path)
        if suffix == ".parquet":
            import pandas as pd

            return pd.read_parquet(path).to_dict(orient="records")
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parser error becomes a DatasetError naming the file
        raise DatasetError(f"{path}: cannot read ({type(exc).__name__}: {str(exc).strip()})") from exc
    raise DatasetError(f"{path}: unsupported file type {suffix!r}; use one of {', '.join(SUFFIXES)}")


def _read_csv(source: str | Path) -> list[dict[str, Any]]:
    """Every row as text. A row with more fields than the header is refused: pandas would take its
    first fields for an index (or drop its last ones), and every column after them would shift."""
    import pandas as pd

    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)  # "loss of data": a row longer than the header
        try:
            frame = pd.read_csv(source, dtype=str, keep_default_na=False, index_col=False)
        except pd.errors.ParserWarning as exc:
            raise DatasetError(f"{source}: a row has more fields than the header (a field with an unquoted "
                               "comma?)") from exc
    return frame.to_dict(orient="records")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}: line {lineno} is not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: line {lineno} is not a JSON object")
            rows.append(row)
    return rows


def _read_url(url: str) -> list[dict[str, Any]]:
    import pandas as pd

    suffix = Path(url.split("?", 1)[0]).suffix.lower()
    try:
        if suffix == ".csv":
            return _read_csv(url)
        if suffix == ".parquet":
            frame = pd.read_parquet(url)
        elif suffix in (".jsonl", ".json"):
            frame = pd.read_json(url, lines=suffix == ".jsonl", dtype=False)
        else:
            raise DatasetError(f"{url}: unsupported file type {suffix!r}; use one of {', '.join(SUFFIXES)}")
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(
            f"{url}: cannot download ({type(exc).__name__}: {exc}). Without network access, pass a local copy with --data PATH."
        ) from exc
    return frame.to_dict(orient="records")


def _read_hub(dataset_id: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency
        raise DatasetError("loading from the Hugging Face hub needs the `datasets` package") from exc
    try:
        ds = datasets.load_dataset(dataset_id, split=split)
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(
            f"{dataset_id} (split {split!r}): cannot load from the Hugging Face hub ({type(exc).__name__}: {exc})."
            " Without network access, pass a local copy with --data PATH (jsonl, json, csv or parquet)."
        ) from exc
    return [dict(r) for r in ds]
