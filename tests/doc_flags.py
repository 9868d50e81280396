"""Every flag and override that the README and the docs name must exist (``tests/test_docs.py``).

The documents are read as a user reads them: the fenced code blocks (a ``\\`` continues a line) and
the inline code spans of the prose. In each, a command (``sao-eval ...``, ``.venv/bin/sao-train ...``,
``python benchmarks/war.py ...``, ``python -m MODULE ...``, ``bash scripts/test ...``, ``pytest ...``)
owns the flags that follow it, up to a shell separator, and each must be one its parser defines:

- the ``sao-*`` commands: their argparse parsers (``docs/hooks/cli_reference.py:COMMANDS``), subcommands
  included; the first word after a command with subcommands must be one of them;
- ``sao-train``: Hydra's own flags (Hydra's parser), and every ``KEY=VALUE`` must name a key of the
  typed schema (``sao.rl.config.TrainConfig``, every algorithm's config) or a group and its options;
- a Python script or module: the option strings of its ``add_argument`` calls (read from its source);
- a shell script: the flag appears in the script's text;
- ``pytest``: pytest's parser with the project's options (``tests/tiers.py``).

In the prose, an inline span that starts with ``--`` must be a flag of one of those parsers (or of the
external tool :data:`EXTERNAL_FLAGS` names for it), and a span that is an override (``optim.lr=1e-6``,
``rollout.keep_kv``, ``algo=grpo``) must name the schema. Placeholders are values (``N``, ``DIR``); a
key in capitals (``KEY=VALUE``) is a placeholder too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import shlex
import sys
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]

# flags of other programs that the docs name in their prose, each with the program that has it
EXTERNAL_FLAGS: dict[str, str] = {
    "--enable-lora": "vllm serve",
    "--speculative-config": "vllm serve",
    "--enable-scale-out": "vllm serve",
    "--enable-prefix-caching": "vllm serve",
    "--max-model-len": "vllm serve",
    "--network": "docker run",
    "--rm": "docker run",
    "--no-deps": "pip download / install",
    "--only-binary": "pip download",
    "--no-compile": "pip install",
    "--allow-empty": "git commit",
    "--prune": "git gc",
    "--strict": "mkdocs build",
    "--head": "ray start",
    "--address": "ray start",
    "--resources": "ray start",
    "--port": "ray start",
}
EXTERNAL_COMMANDS = ("pip", "python3 -m pip", "docker", "git", "ray", "vllm", "mkdocs", "curl", "kill",
                     "apt-get", "uv", "nvidia-smi", "ls", "cat", "tail", "export", "cd", "time", "env")
# plug-in environments that the docs define themselves (the guide's example), with the file that registers it
DOC_PLUGINS = {"reverse-word": 'reverse-word = "my_envs:ReverseWord"'}
SEPARATORS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&", "<"}
FILE_SUFFIXES = (".py", ".jsonl", ".json", ".yaml", ".yml", ".md", ".txt", ".png", ".log", ".safetensors",
                 ".csv", ".parquet", ".toml", ".sh", ".db", ".html")
SWEEP_FUNCTIONS = ("range(", "choice(", "glob(", "interval(", "tag(")


@dataclass(frozen=True)
class Snippet:
    """A piece of code in a document: one logical line of a code block, or one inline span."""
    path: Path
    line: int
    text: str
    inline: bool

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True)
class Problem:
    snippet: Snippet
    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.snippet.where()}: {self.name}: {self.why}  (in `{self.snippet.text.strip()[:100]}`)"


# ---- reading the documents -----------------------------------------------------------------------------

def documents() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [REPO / "README.md", *([REPO / "AGENTS.md"] if (REPO / "AGENTS.md").exists() else []), *docs]


def snippets(path: Path, text: str | None = None) -> Iterator[Snippet]:
    text = path.read_text() if text is None else text
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*(```+|~~~+)(\S*)", lines[i])
        if fence:
            marker = fence.group(1)
            i += 1
            block: list[tuple[int, str]] = []
            while i < len(lines) and not lines[i].strip().startswith(marker):
                block.append((i + 1, lines[i]))
                i += 1
            i += 1
            if fence.group(2) in ("python", "toml", "json", "yaml", "jsonl"):
                continue  # code and data, not command lines
            yield from _logical_lines(path, block)
            continue
        for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", lines[i]):
            yield Snippet(path, i + 1, m.group(1), inline=True)
        i += 1


def _logical_lines(path: Path, block: list[tuple[int, str]]) -> Iterator[Snippet]:
    pending, first = "", 0
    for number, line in block:
        if not pending:
            first = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield Snippet(path, first, pending + stripped, inline=False)
        pending = ""
    if pending:
        yield Snippet(path, first, pending, inline=False)


def words(text: str) -> list[str]:
    text = re.sub(r"^\s*\$\s+", "", text)  # a prompt
    text = re.sub(r"\s#\s.*$|^#.*$", "", text)  # a comment
    try:
        out = shlex.split(text, posix=True)
    except ValueError:
        out = text.split()
    return [w.strip("[]") for w in out if w.strip("[]") not in ("", "...")]


# ---- what exists ---------------------------------------------------------------------------------------

@cache
def hook() -> Any:
    """``docs/hooks/cli_reference.py``, the mkdocs hook that knows each command's parser."""
    spec = importlib.util.spec_from_file_location("cli_reference", REPO / "docs" / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@cache
def command_flags(command: str) -> frozenset[str]:
    return frozenset(hook().flags(hook().parser(command)))


@cache
def command_subcommands(command: str) -> frozenset[str]:
    return frozenset(hook().subparsers(hook().parser(command)))


@cache
def hydra_flags() -> frozenset[str]:
    from hydra._internal.utils import get_args_parser

    return frozenset(s for a in get_args_parser()._actions for s in a.option_strings)


@cache
def source_flags(path: Path) -> frozenset[str]:
    """The option strings of every ``add_argument``/``addoption`` call in a Python file."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add_argument", "addoption")):
            out |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                    and a.value.startswith("-")}
    return frozenset(out)


def module_file(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    return origin.parent / "__main__.py" if origin.name == "__init__.py" else origin


@cache
def schema() -> tuple[frozenset[str], frozenset[str]]:
    """(every key path of the schema, the paths of its free-form dictionaries)."""
    from sao.rl.config import ALGO_CONFIGS, TrainConfig

    keys: set[str] = set()
    free: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            # an optional section (logger.wandb: WandbConfig | None, set when its option is selected)
            tp = next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), tp)
            path = f"{prefix}{f.name}"
            keys.add(path)
            if dataclasses.is_dataclass(tp):
                walk(tp, path + ".")
            elif typing.get_origin(tp) is dict:
                free.add(path)

    walk(TrainConfig, "")
    for algo in ALGO_CONFIGS.values():
        walk(algo, "algo.")
    return frozenset(keys), frozenset(free)


@cache
def composed_keys() -> frozenset[str]:
    """The key paths of the configuration that the default command line composes, and each group option's:
    the keys of a free-form dictionary that an option already sets (``env.kwargs.difficulty`` with
    ``env=arithmetic``) can be set without ``+``; any other key in such a dictionary needs ``+``."""
    out: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                out.add(prefix + str(k))
                walk(v, f"{prefix}{k}.")

    walk(hook().compose([]), "")
    for group, options in groups().items():
        for option in options:
            walk(hook().compose([f"{group}={option}"]), "")
    return frozenset(out)


@cache
def groups() -> dict[str, frozenset[str]]:
    return {g: frozenset(options) for g, options in hook().group_options().items()}


@cache
def all_flags() -> frozenset[str]:
    out: set[str] = set(hydra_flags())
    for command in hook().COMMANDS:
        out |= command_flags(command)
    for path in [*(REPO / "benchmarks").rglob("*.py"), *(REPO / "tests").rglob("*.py"),
                 *(p for folder in ("agents", "envs", "evals", "rl", "sandboxes") for p in (REPO / folder).rglob("*.py"))]:
        out |= source_flags(path)
    for script in (REPO / "scripts").iterdir():
        if script.is_file():
            out |= set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", script.read_text(errors="replace")))
    return frozenset(out)


# ---- checking ------------------------------------------------------------------------------------------

def _placeholder(text: str) -> bool:
    return bool(re.search(r"[A-Z<>{}$]", text)) or text in ("...",)


def check_override(token: str) -> str | None:
    """Why ``KEY=VALUE`` (or a bare ``KEY``) names nothing of ``sao-train``'s configuration; None if it does."""
    key, sep, value = token.partition("=")
    added = key.startswith("+")
    key = key.lstrip("+~")
    if _placeholder(key) or key.startswith("hydra.") or key == "hydra":
        return None
    if sep and key in groups():
        # several options of one group at once: logger=[tensorboard,wandb] (logger=[]: none)
        for option in re.split(r"[,|]", value.removeprefix("[").removesuffix("]")):
            option = option.strip()
            if not option or _placeholder(option) or option.startswith(SWEEP_FUNCTIONS) or option in groups()[key]:
                continue
            if key == "env" and option in DOC_PLUGINS:
                continue
            return f"no option {option!r} in the config group {key!r} (options: {', '.join(sorted(groups()[key]))})"
        return None
    keys, free = schema()
    if key in keys:
        return None
    if any(key.startswith(f + ".") for f in free):
        if added or not sep or key in composed_keys():
            return None
        return f"a new key of a free-form dictionary needs '+': +{key}=... (Hydra: not in struct)"
    return "no such key in sao-train's schema (sao.rl.config.TrainConfig and the algorithms' configs)"


def _is_override(token: str) -> bool:
    if token.endswith("/"):
        return False  # a folder named by overrides (a sweep's run folder)
    key = token.partition("=")[0].lstrip("+~")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z0-9_]+)*", key) or key.endswith(FILE_SUFFIXES):
        return False
    head = key.split(".")[0]
    keys, _ = schema()
    return head in keys and ("=" in token or "." in key)


def _command_at(ws: list[str], i: int) -> tuple[str, str | None, int] | None:
    """(kind, name, number of words it takes) when a command starts at ws[i]."""
    w = ws[i]
    base = w.rsplit("/", 1)[-1] if w.startswith((".venv/bin/", "/")) else w
    if base == hook().HYDRA_COMMAND:
        return "train", None, 1
    if base in hook().COMMANDS:
        return "argparse", base, 1
    if base in ("python", "python3") or w.endswith("/bin/python"):
        if i + 1 < len(ws):
            nxt = ws[i + 1]
            if nxt == "-m" and i + 2 < len(ws):
                name = f"python -m {ws[i + 2]}"
                if name in hook().COMMANDS:
                    return "argparse", name, 3
                if ws[i + 2] == "pytest":
                    return "pytest", None, 3
                if not ws[i + 2].startswith(("sao.", "tests.", "benchmarks.")):
                    return None  # another program's module (pip, vllm's server): not ours to check
                return "module", ws[i + 2], 3
            if nxt.endswith(".py"):
                return "script", nxt, 2
        return None
    if base == "bash" and i + 1 < len(ws) and ws[i + 1].startswith("scripts/"):
        return "shell", ws[i + 1], 2
    if w.startswith("scripts/") or w.startswith(".ci/"):
        return "shell", w, 1
    if base == "pytest":
        return "pytest", None, 1
    return None


def check_snippet(s: Snippet, pytest_flags: frozenset[str]) -> list[Problem]:
    ws = words(s.text)
    problems: list[Problem] = []
    if not ws:
        return problems
    if s.inline and ws[0].startswith("--") and len(ws) <= 3:
        flag = ws[0].split("=")[0]
        if flag not in all_flags() | pytest_flags and flag not in EXTERNAL_FLAGS:
            problems.append(Problem(s, flag, "no parser of the project defines this flag"))
        return problems
    if s.inline and not any(_command_at(ws, i) for i in range(len(ws))):
        if ws[0] in EXTERNAL_COMMANDS or " ".join(ws[:3]).startswith(EXTERNAL_COMMANDS):
            return problems
        for w in ws:
            if _is_override(w):
                why = check_override(w)
                if why:
                    problems.append(Problem(s, w, why))
        return problems
    i = 0
    while i < len(ws):
        found = _command_at(ws, i)
        if not found:
            i += 1
            continue
        kind, name, width = found
        j = i + width
        args: list[str] = []
        while j < len(ws) and ws[j] not in SEPARATORS and not _command_at(ws, j):
            args.append(ws[j])
            j += 1
        problems += _check_args(s, kind, name, args, pytest_flags)
        i = j
    return problems


def _check_args(s: Snippet, kind: str, name: str | None, args: list[str], pytest_flags: frozenset[str]) -> list[Problem]:
    out: list[Problem] = []
    flags_of = lambda a: [a.split("=")[0] for a in args if a.startswith("-") and len(a) > 1 and not _number(a)]
    if kind == "argparse":
        assert name is not None
        known = command_flags(name)
        out += [Problem(s, f, f"{name} has no such option") for f in flags_of(args) if f not in known]
        subs = command_subcommands(name)
        positional = [a for a in args if not a.startswith("-")]
        if subs and positional and not _placeholder(positional[0]) and positional[0] not in subs:
            out.append(Problem(s, positional[0], f"{name} has no subcommand of that name ({', '.join(sorted(subs))})"))
    elif kind == "train":
        out += [Problem(s, f, "sao-train (Hydra) has no such flag") for f in flags_of(args) if f not in hydra_flags()]
        for a in args:
            if "=" in a and not a.startswith("-"):
                why = check_override(a)
                if why:
                    out.append(Problem(s, a, why))
    elif kind in ("script", "module"):
        assert name is not None
        path = REPO / name if kind == "script" else module_file(name)
        if path is None or not path.exists():
            return [Problem(s, name, "no such script or module")]
        known = source_flags(path)
        out += [Problem(s, f, f"{name} defines no such option") for f in flags_of(args) if f not in known]
    elif kind == "shell":
        assert name is not None
        path = REPO / name
        if not path.exists():
            return [Problem(s, name, "no such script")]
        text = path.read_text(errors="replace")
        out += [Problem(s, f, f"{name} does not mention this flag") for f in flags_of(args)
                if not re.search(re.escape(f) + r"(?![\w-])", text)]
    elif kind == "pytest":
        out += [Problem(s, f, "pytest (with the project's options) has no such flag")
                for f in flags_of(args) if f not in pytest_flags and f[:2] not in pytest_flags]
    return out


def _number(text: str) -> bool:
    return bool(re.fullmatch(r"-\d[\d.e-]*", text))


def check(paths: list[Path], pytest_flags: frozenset[str], texts: dict[Path, str] | None = None) -> list[Problem]:
    problems: list[Problem] = []
    for path in paths:
        for s in snippets(path, None if texts is None else texts.get(path)):
            problems += check_snippet(s, pytest_flags)
    return problems


if __name__ == "__main__":  # python -m tests.doc_flags: list what the docs name that does not exist
    found = check(documents(), frozenset())
    print("\n".join(map(str, found)) or "every flag and override exists")
    sys.exit(1 if found else 0)
