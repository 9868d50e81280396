"""The agent's tools (``bash``, ``editor``, ``submit``), their schemas and the prompts that name them."""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Mapping
from typing import Any

from sao.sandboxes import DockerSandbox

from .workspace import _TOOL_ENV, TESTBED, shell


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


BASH_TOOL = _function(
    "bash",
    "Run a bash command in the repository's container (working directory /testbed; no network). Each call "
    "starts a fresh shell: `cd` and variables do not carry over. Long output is truncated; a command that "
    "runs too long is killed.",
    {"command": {"type": "string", "description": "the bash command to run"}},
    ["command"],
)
EDITOR_TOOL = _function(
    "editor",
    "View, create or edit files. `view`: a file with line numbers (optionally `view_range` [start, end], "
    "1-based, end -1 = to the end) or a directory listing. `str_replace`: replace `old_str`, which must occur "
    "exactly once in the file, with `new_str`. `create`: write `file_text` to `path`. Relative paths are "
    "relative to /testbed.",
    {"command": {"type": "string", "enum": ["view", "str_replace", "create"]},
     "path": {"type": "string"},
     "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
     "old_str": {"type": "string"}, "new_str": {"type": "string"}, "file_text": {"type": "string"}},
    ["command", "path"],
)
SUBMIT_TOOL = _function(
    "submit",
    "Submit the current state of the repository as your solution and end the episode. Your changes are "
    "taken as a `git diff` of /testbed and graded by the project's tests.",
    {}, [],
)
TOOLS = (BASH_TOOL, EDITOR_TOOL, SUBMIT_TOOL)

SYSTEM_PROMPT = (
    "You are a software engineer working in a Linux container. The repository for the task is at /testbed, "
    "checked out at the commit where the issue was reported. Resolve the issue by editing the repository's "
    "source files with the tools: `bash` runs commands, `editor` views and edits files, `submit` ends the "
    "episode. Make one or more tool calls in every reply. Your change is graded by running the project's tests, "
    "including tests you cannot see, so fix the behaviour itself rather than adapting existing tests."
)
USER_TEMPLATE = (
    "<issue>\n{problem_statement}\n</issue>\n\n"
    "Resolve this issue in the repository at /testbed (repository {repo}). Reproduce the problem, fix the "
    "source, check your fix, and then call `submit`."
)
NO_TOOL_CALL = ("Your reply had no tool call. Reply with one or more tool calls: `bash` to run a command, "
                "`editor` to view or change a file, `submit` when the issue is resolved.")


MAX_EDITOR_BYTES = 4_000_000


class ToolError(Exception):
    """A tool call the agent got wrong; its message becomes the tool's observation."""


def clip(text: str, limit: int, *, head_share: float = 0.5, what: str = "observation") -> str:
    """Keep the head (``head_share`` of ``limit``) and the tail of a long ``what`` around a marker line."""
    if len(text) <= limit:
        return text
    head = int(limit * head_share)
    tail = int(limit * (1 - head_share))
    return (f"{text[:head]}\n[... {what} truncated: {len(text) - head - tail} characters omitted ...]\n"
            f"{text[len(text) - tail:]}")


class Workspace:
    """The tools, on one agent container."""

    def __init__(self, sb: DockerSandbox, *, command_timeout_s: float, observation_chars: int):
        self.sb = sb
        self.command_timeout_s = command_timeout_s
        self.observation_chars = observation_chars

    def bash(self, command: str) -> str:
        if "\0" in command:
            raise ToolError("the command contains a NUL byte")
        result = self.sb.run(shell(command), timeout_s=self.command_timeout_s, env=_TOOL_ENV)
        body = result.output if result.output.strip() else "(no output)\n"
        return clip(f"[exit code {result.exit_code}]\n{body}", self.observation_chars)

    def editor(self, command: str, path: str, view_range: list[int] | None = None, old_str: str | None = None,
               new_str: str | None = None, file_text: str | None = None) -> str:
        path = posixpath.normpath(posixpath.join(TESTBED, path))
        if command == "view":
            return clip(self._view(path, view_range), self.observation_chars)
        if command == "create":
            if file_text is None:
                raise ToolError("`create` needs `file_text`")
            kind, _ = self._kind(path)
            if kind == "directory":
                raise ToolError(f"{path} is a directory; `create` writes files")
            if kind == "other":
                raise ToolError(f"{path} is not a regular file")
            self.sb.write_file(path, file_text)
            return f"{'Overwrote' if kind == 'file' else 'Created'} {path} ({len(file_text.splitlines())} lines)."
        if command == "str_replace":
            if not old_str:
                raise ToolError("`str_replace` needs a non-empty `old_str`")
            if new_str is None:
                raise ToolError("`str_replace` needs `new_str` (use \"\" to delete)")
            text = self._read_text(path)
            count = text.count(old_str)
            if count == 0:
                raise ToolError(f"no replacement made: `old_str` does not occur verbatim in {path}")
            if count > 1:
                lines = sorted({text.count("\n", 0, i) + 1 for i in _find_all(text, old_str)})
                raise ToolError(f"no replacement made: `old_str` occurs {count} times in {path} (lines "
                                f"{', '.join(map(str, lines))}); include more context to make it unique")
            mode = self.sb.run(f"stat -c %a {shlex.quote(path)}", timeout_s=30).output.strip()
            at = text.index(old_str)
            new_text = text[:at] + new_str + text[at + len(old_str):]
            self.sb.write_file(path, new_text, mode=int(mode, 8) if mode.isdigit() else 0o644)
            first = new_text.count("\n", 0, at) + 1
            last = first + new_str.count("\n")
            snippet = _numbered(new_text.splitlines(), max(1, first - 3), last + 3)
            return clip(f"Edited {path}. The region around the change:\n{snippet}", self.observation_chars)
        raise ToolError(f"unknown editor command {command!r}; use view, str_replace or create")

    def _kind(self, path: str) -> tuple[str, int]:
        """``(kind, size)``: kind is file, directory, other or missing."""
        res = self.sb.run(f"stat -L -c '%F|%s' {shlex.quote(path)}", timeout_s=30)
        if res.exit_code != 0:
            return "missing", 0
        kind, _, size = res.output.strip().rpartition("|")
        kind = {"regular file": "file", "regular empty file": "file", "directory": "directory"}.get(kind, "other")
        return kind, int(size) if size.isdigit() else 0

    def _read(self, path: str) -> bytes:
        kind, size = self._kind(path)
        if kind == "missing":
            raise ToolError(f"{path}: no such file or directory")
        if kind == "directory":
            raise IsADirectoryError(path)
        if kind == "other":
            raise ToolError(f"{path} is not a regular file")
        if size > MAX_EDITOR_BYTES:
            raise ToolError(f"{path} has {size} bytes, more than the editor handles ({MAX_EDITOR_BYTES}); "
                            "use bash (sed, head, grep)")
        try:
            return self.sb.read_file(path)
        except FileNotFoundError:
            raise ToolError(f"{path}: no such file or directory") from None

    def _read_text(self, path: str) -> str:
        try:
            data = self._read(path)
        except IsADirectoryError:
            raise ToolError(f"{path} is a directory") from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text; edit it with bash") from None

    def _view(self, path: str, view_range: list[int] | None) -> str:
        try:
            data = self._read(path)
        except IsADirectoryError:
            listing = self.sb.run(f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort | head -n 400",
                                  timeout_s=60)
            return f"Files and directories up to 2 levels deep in {path}:\n{listing.output}"
        lines = data.decode("utf-8", errors="replace").splitlines()
        start, end = 1, len(lines)
        if view_range is not None:
            if (not isinstance(view_range, list) or len(view_range) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)):
                raise ToolError("`view_range` must be two integers [start, end]")
            start, end = view_range
            end = len(lines) if end == -1 else end
            if not 1 <= start <= max(len(lines), 1) or end < start:
                raise ToolError(f"invalid `view_range` {view_range}: the file has {len(lines)} lines")
        return _numbered(lines, start, min(end, len(lines))) or "(empty file)"


def _find_all(text: str, sub: str) -> list[int]:
    found, at = [], text.find(sub)
    while at != -1:
        found.append(at)
        at = text.find(sub, at + 1)
    return found


def _numbered(lines: list[str], start: int, end: int) -> str:
    return "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(start, min(end, len(lines)) + 1))


_ARG_TYPES = {"command": str, "path": str, "old_str": str, "new_str": str, "file_text": str, "view_range": list}


def _arguments(call: Mapping[str, Any], tool: Mapping[str, Any]) -> dict[str, Any]:
    raw = call["function"].get("arguments") or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolError(f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(args, dict):
        raise ToolError("the arguments must be a JSON object")
    params = tool["function"]["parameters"]
    unknown = sorted(set(args) - set(params["properties"]))
    missing = [p for p in params["required"] if p not in args]
    wrong = [k for k, v in args.items() if k in _ARG_TYPES and v is not None and not isinstance(v, _ARG_TYPES[k])]
    problems = ([f"unknown argument(s) {unknown}"] if unknown else []) + \
               ([f"missing required argument(s) {missing}"] if missing else []) + \
               ([f"argument(s) of the wrong type: {wrong}"] if wrong else [])
    if problems:
        raise ToolError("; ".join(problems) + f". Expected: {json.dumps(params['properties'])}")
    return args

