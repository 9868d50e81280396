"""mkdocs hook: the command-line reference, generated from the parsers and the Hydra schema.

A page marks where generated text goes with an HTML comment on a line of its own:

- ``<!-- cli: sao-eval -->``: that command's ``--help`` (and each subcommand's);
- ``<!-- train-groups -->``: ``sao-train``'s config groups and their options;
- ``<!-- schema: optim -->``: a table of one section of ``TrainConfig`` (key, default, what it is),
  ``<!-- schema: top -->`` for the top-level keys, ``<!-- schema: algo/NAME -->`` for an algorithm's,
  ``<!-- schema: logger/wandb -->`` for a tracker's (the option of a group selected several at once).

So the reference cannot drift from the code; the prose around it is checked by ``tests/test_docs.py``.
The same module tells that test which parser each command has (:data:`COMMANDS`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
import typing
from functools import cache
from importlib import resources
from typing import Any

# every console script of pyproject.toml but sao-train (Hydra), and the modules run with `python -m`
COMMANDS: dict[str, str] = {
    "sao-eval": "sao.evals.cli:build_parser",
    "sao-env": "sao.envs.cli:build_parser",
    "sao-report": "sao.rl.training.report:build_parser",
    "sao-sim": "sao.rl.cli.sim:build_parser",
    "sao-model": "sao.agents.models.cli:build_parser",
    "sao-sandbox": "sao.sandboxes.cli:build_parser",
    "sao-proxy": "sao.agents.capture.cli:build_parser",
    "python -m sao.rl.weights.export": "sao.rl.weights.export:build_parser",
}
HYDRA_COMMAND = "sao-train"
MARKER = re.compile(r"^<!-- (cli|schema): ([\w./-]+(?: [\w./-]+)*) -->$|^<!-- (train-groups) -->$", re.M)


def parser(command: str) -> argparse.ArgumentParser:
    module, _, func = COMMANDS[command].partition(":")
    return getattr(importlib.import_module(module), func)()


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update(action.choices)
    return out


def flags(p: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and of its subcommands."""
    out = {s for a in p._actions for s in a.option_strings}
    for sub in subparsers(p).values():
        out |= flags(sub)
    return out


def _help(p: argparse.ArgumentParser) -> str:
    # a fixed width, so the page does not depend on the terminal of whoever builds it
    p.formatter_class = _fixed_width(p.formatter_class)
    return p.format_help().rstrip()


def _fixed_width(cls: type[argparse.HelpFormatter]) -> type[argparse.HelpFormatter]:
    class Fixed(cls):  # type: ignore[misc, valid-type]
        def __init__(self, prog: str, **kwargs: Any) -> None:
            kwargs["width"] = 100
            super().__init__(prog, **kwargs)
    return Fixed


def cli_help(command: str) -> str:
    p = parser(command)
    parts = [f"```text\n$ {command} --help\n{_help(p)}\n```"]
    for name, sub in subparsers(p).items():
        parts.append(f"```text\n$ {command} {name} --help\n{_help(sub)}\n```")
    return "\n\n".join(parts)


# ---- sao-train: the Hydra groups and the typed schema ------------------------------------------------

@cache
def group_options() -> dict[str, list[str]]:
    """Each config group of ``conf/`` and its options (files, and the environments registered without one)."""
    from sao.rl.cli import env_group

    conf = resources.files("sao.conf")
    out = {d.name: sorted(f.name.removesuffix(".yaml") for f in d.iterdir() if f.name.endswith(".yaml"))
           for d in conf.iterdir() if d.is_dir() and not d.name.startswith("_")}
    out["env"] = sorted(set(out["env"]) | set(env_group.register_options()))
    return dict(sorted(out.items()))


@cache
def defaults() -> dict[str, str]:
    """Each group's default option, from ``conf/config.yaml``'s defaults list."""
    import yaml

    text = (resources.files("sao.conf") / "config.yaml").read_text()
    out = {}
    for item in yaml.safe_load(text)["defaults"]:
        if isinstance(item, dict):
            # a group with several options selected (logger: [tensorboard]) reads as its override: [tensorboard]
            out.update({str(k): f"[{','.join(map(str, v))}]" if isinstance(v, list) else str(v) for k, v in item.items()})
    return out


def train_groups() -> str:
    rows = ["| group | options | default |", "| --- | --- | --- |"]
    for group, options in group_options().items():
        rows.append(f"| `{group}` | {', '.join(f'`{o}`' for o in options)} | `{defaults().get(group, '')}` |")
    return "\n".join(rows)


def _comments(cls: type) -> dict[str, str]:
    """The comment after (or the comment lines just above) each field of a dataclass's source."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("# ").strip())
            continue
        m = re.match(r"\s+(\w+)\s*:\s*[^=]+?(?:=.*?)?(?:#\s*(.*))?$", line)
        if m and not stripped.startswith(("def ", "return ", "if ", "raise ")) and "(" not in m.group(1):
            out[m.group(1)] = (m.group(2) or " ".join(pending)).strip()
        pending = []
    return out


def _all_comments(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            out.update(_comments(base))
    return out


def _type_name(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return str(text).replace("typing.", "").replace(" | None", " or null")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def section_class(section: str) -> type:
    from sao.rl import config

    if section == "top":
        return config.TrainConfig
    if section.startswith("algo/"):
        return config.ALGO_CONFIGS[section.removeprefix("algo/")]
    if "/" in section:  # an optional sub-section: logger/wandb (set when its option of the group is selected)
        outer, inner = section.split("/", 1)
        hint = _hints(section_class(outer))[inner]
        return next(a for a in typing.get_args(hint) if dataclasses.is_dataclass(a))
    return _hints(config.TrainConfig)[section]


def _default(value: Any) -> str:
    if dataclasses.is_dataclass(value) or isinstance(value, dict):
        return "(a section)"
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
    return text.replace("|", "\\|")


def schema_table(section: str) -> str:
    cls = section_class(section)
    comments = _all_comments(cls)
    yaml_defaults = _composed_section(section)
    prefix = "" if section == "top" else ("algo" if section.startswith("algo/") else section.replace("/", ".")) + "."
    rows = ["| key | type | default | what it is |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        if section == "top" and dataclasses.is_dataclass(_hints(cls)[f.name]):
            continue  # a section of its own
        value = yaml_defaults.get(f.name, _field_default(f))
        rows.append(f"| `{prefix}{f.name}` | {_type_name(_hints(cls)[f.name])} | `{_default(value)}` "
                    f"| {comments.get(f.name, '').replace('|', '/')} |")
    return "\n".join(rows)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


@cache
def _composed_section(section: str) -> dict[str, Any]:
    """The section as the default command line composes it (``conf/`` over the schema)."""
    if section.startswith("algo/"):
        cfg = compose([f"algo={section.removeprefix('algo/')}"])
        return dict(cfg["algo"])
    if "/" in section:
        outer, inner = section.split("/", 1)
        return dict(compose([f"{outer}=[{inner}]"])[outer][inner])
    cfg = compose([])
    return {k: v for k, v in cfg.items() if not isinstance(v, dict)} if section == "top" else dict(cfg[section])


def compose(overrides: list[str]) -> dict[str, Any]:
    """``sao-train``'s configuration for these overrides, as plain data (Hydra's compose API)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    importlib.import_module("sao.rl.cli.train")  # stores the schema in Hydra's ConfigStore
    group_options()  # stores the env options of environments without a file
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="sao.conf", version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=False)


# ---- the hook ------------------------------------------------------------------------------------------

def expand(markdown: str) -> str:
    def replace(m: re.Match[str]) -> str:
        if m.group(3) == "train-groups":
            return train_groups()
        kind, arg = m.group(1), m.group(2)
        return cli_help(arg) if kind == "cli" else schema_table(arg)
    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown)
