"""``sao-env``: the registered environments, and the conformance check for one of them.

    sao-env list                                   name, source (built-in or the plug-in's distribution),
                                                   Gymnasium id and description of every environment
    sao-env check NAME [--env-arg KEY=VALUE ...]   run check_env on one instance (sao.envs.checker)

Exit status: 0 ok; 1 the environment could not be made or breaks the contract (the checker's
message says how); 2 bad input (an unknown name, with a suggestion; a malformed --env-arg).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from .checker import EnvConformanceError, check_env
from .errors import UnknownEnvError
from .registry import BUILTINS, GROUP, broken, entries, make, resolve

BUILTIN = "built-in"


@dataclass(frozen=True)
class Listing:
    """One line of ``sao-env list``; ``problem`` is why a plug-in could not be loaded (else None)."""

    name: str
    source: str  # "built-in", or the distribution that provides the plug-in ("my-envs 0.1.0")
    gym_id: str = ""
    description: str = ""
    problem: str | None = None


def listings() -> list[Listing]:
    """Every environment the registry knows, then every plug-in that failed to load."""
    builtin = {e.name for e in BUILTINS}
    dists = {ep.name: _dist(ep) for ep in entry_points(group=GROUP)}
    known = entries()
    out = [Listing(e.name, BUILTIN if e.name in builtin else dists.get(e.name, "?"), e.gym_id, e.description)
           for e in known.values()]
    out += [Listing(name, dists.get(name, "?"), problem=why) for name, why in sorted(broken().items())]
    return out


def _dist(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "?"


def env_args(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as keyword arguments; a value is read as JSON when it parses (``0.5``,
    ``true``, ``[1, 2]``), else kept as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _list() -> int:
    rows = listings()
    width = max(len(r.name) for r in rows)
    src = max(len(r.source) for r in rows)
    gid = max(len(r.gym_id) for r in rows)
    for r in rows:
        detail = f"{r.gym_id:<{gid}}  {r.description}" if r.problem is None else f"BROKEN: {r.problem}"
        print(f"{r.name:<{width}}  {r.source:<{src}}  {detail}".rstrip())
    return 0


def _check(name: str, pairs: list[str], seed: int, max_steps: int) -> int:
    try:
        entry = resolve(name)
        kwargs = env_args(pairs)
    except (UnknownEnvError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    try:
        env = make(entry.name, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the constructor's own error is the answer
        print(f"error: {entry.name}({shown}) could not be made: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        check_env(env, seed=seed, max_steps=max_steps)
    except EnvConformanceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a method that raised outside the checker's own probes
        print(f"error: {entry.name}: the check stopped on {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {entry.name} ({entry.gym_id}) keeps the text-environment contract")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sao-env", description="The registered environments and their "
                                     "conformance check.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every registered environment with its source (built-in or distribution)")
    p_check = commands.add_parser("check", help="run the conformance checker (check_env) on one instance")
    p_check.add_argument("name", help="a short name (sao-env list) or a Gymnasium id")
    p_check.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                         help="a keyword argument of the environment (JSON value, else text); repeatable")
    p_check.add_argument("--seed", type=int, default=0, help="the seed of the determinism check (default 0)")
    p_check.add_argument("--max-steps", type=int, default=8,
                         help="steps of a sampled action within which an episode must end (default 8)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        return _list()
    return _check(args.name, args.env_arg, args.seed, args.max_steps)


if __name__ == "__main__":
    raise SystemExit(main())
