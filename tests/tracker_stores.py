"""Read back what the experiment trackers stored, with each one's own reader where it has one: TensorBoard's
event files (its ``EventAccumulator``), an offline W&B run (its ``.wandb`` transaction log, parsed below: wandb
0.31 ships no Python reader for it) and an MLflow store (``MlflowClient``). Shared by tests/test_trackers.py
and the contract test of ``sao-train logger=[tensorboard,wandb,mlflow]``."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar in the event files under ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def tensorboard_hparams(log_dir: Path) -> dict[str, Any]:
    """The hyperparameters of the HParams tab (``session_start_info``), as plain values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    out: dict[str, Any] = {}
    for content in acc.PluginTagToContent("hparams").values():
        data = HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            for key, value in data.session_start_info.hparams.items():
                out[key] = getattr(value, value.WhichOneof("kind"))
    return out


# ---- W&B: the .wandb file is a LevelDB-style log of protobuf Records ----------------------------------------

_BLOCK, _HEADER = 32768, 7  # LevelDB log blocks; each chunk: crc32 (4), length (2), type (1)


def _chunks(data: bytes) -> list[bytes]:
    """The records of a W&B transaction log: a 7-byte file header (":W&B", magic, version), then LevelDB
    log chunks (FULL = 1, FIRST = 2, MIDDLE = 3, LAST = 4) that never cross a 32 KiB block."""
    assert data[:4] == b":W&B", "not a W&B transaction log"
    records, pos, pending = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding
            pos += left
            continue
        body = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 1:
            records.append(body)
        elif kind == 2:
            pending = body
        elif kind == 3:
            pending += body
        elif kind == 4:
            records.append(pending + body)
    return records


def wandb_offline_run(wandb_dir: Path) -> dict[str, Any]:
    """The one offline run under ``wandb_dir`` (RUN_DIR/wandb): its name, config, history rows, and the tables
    it logged ({key: [(step, {"columns", "data"})]})."""
    from wandb.proto import wandb_internal_pb2 as pb

    runs = sorted(Path(wandb_dir).glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, f"expected one offline W&B run under {wandb_dir}, found {runs}"
    out: dict[str, Any] = {"name": None, "config": {}, "history": [], "tables": {}}
    for raw in _chunks(runs[0].read_bytes()):
        record = pb.Record.FromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["name"] = record.run.display_name
            out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:  # a logged dict (a table's reference) comes as nested keys
                *parents, leaf = list(item.nested_key) or [item.key]
                node = row
                for parent in parents:
                    node = node.setdefault(parent, {})
                node[leaf] = json.loads(item.value_json)
            out["history"].append(row)
    files = runs[0].parent / "files"
    for row in out["history"]:
        for key, value in row.items():
            if isinstance(value, dict) and value.get("_type") == "table-file":
                table = json.loads((files / value["path"]).read_text())
                out["tables"].setdefault(key, []).append((row["_step"], table))
    return out


def wandb_scalars(run: dict[str, Any]) -> dict[str, dict[int, float]]:
    """{key: {step: value}} of the numbers in a run's history (W&B's own ``_step``, ``_runtime`` left out)."""
    out: dict[str, dict[int, float]] = {}
    for row in run["history"]:
        for key, value in row.items():
            if not key.startswith("_") and isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault(key, {})[int(row["_step"])] = float(value)
    return out


def wandb_config_value(config: dict[str, Any], key: str) -> Any:
    """``algo.name`` of a W&B run's config (each top-level key holds its value, maybe as {"value": ...})."""
    node: Any = config
    for part in key.split("."):
        if isinstance(node, dict) and "value" in node and part not in node:
            node = node["value"]
        node = node[part]
    return node["value"] if isinstance(node, dict) and set(node) == {"value"} else node


# ---- MLflow ----------------------------------------------------------------------------------------------

def mlflow_run(tracking_uri: str, experiment: str = "sao") -> dict[str, Any]:
    """The one run of ``experiment`` in the store: its name, params and {metric: {step: value}}."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {tracking_uri}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, f"expected one run in {tracking_uri}, found {len(runs)}"
    run = runs[0]
    metrics = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
               for key in run.data.metrics}
    return {"name": run.info.run_name, "status": run.info.status, "params": run.data.params, "metrics": metrics}
