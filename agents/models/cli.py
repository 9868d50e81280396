"""``sao-model``: prepare the bundled models and show where they are.

    sao-model list                       aliases, and whether each is prepared
    sao-model prepare smollm2-135m       build it (once) and print its directory
    sao-model path smollm2-135m          print the directory of a prepared alias
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .prepare import MODELS, ModelError, is_prepared, model_dir, prepare_model, resolve_model, sao_home


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sao-model", description="Prepare and locate sao's bundled models.")
    home = argparse.ArgumentParser(add_help=False)
    home.add_argument("--home", type=Path, default=None, help="model cache root (default: $SAO_HOME or ~/.cache/sao)")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", parents=[home], help="build an alias into a Hugging Face checkpoint")
    prep.add_argument("name")
    prep.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    path = sub.add_parser("path", parents=[home], help="print the directory of a prepared alias")
    path.add_argument("name")
    sub.add_parser("list", parents=[home], help="list the aliases")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "prepare":
            print(prepare_model(args.name, home=args.home, force=args.force))
        elif args.command == "path":
            print(resolve_model(args.name, home=args.home) if args.name in MODELS else model_dir(args.name))
        else:
            print(f"# models in {Path(args.home or sao_home()).expanduser()}/models")
            for alias, source in sorted(MODELS.items()):
                state = "prepared" if is_prepared(alias, home=args.home) else "not prepared"
                print(f"{alias}\t{state}\t{source.description}")
    except ModelError as err:
        print(f"sao-model: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
