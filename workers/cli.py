"""The gpuheal command line: a thin layer over the packages; `--json` prints one document on stdout.
The flags are workers/cli_parser.py's, the handlers workers/cli_local.py, cli_serve.py and
cli_operator.py's, what they share workers/cli_common.py's."""

from __future__ import annotations

import os
import sys

from workers.telemetry import FlagError, configure_logging


def main(argv: list[str] | None = None) -> int:
    from workers import cli_config
    from workers.cli_parser import build_parser

    parser = build_parser()
    args = parser.parse_args(argv)
    args.parser = parser
    configure_logging(args.log_level, args.log_format)
    try:
        if args.command != "config":
            cli_config.apply(args, sys.argv[1:] if argv is None else argv)
    except cli_config.ConfigError as err:
        print(f"gpuheal {args.command}: {err}", file=sys.stderr)
        return 2
    if hasattr(args, "output"):  # -o json|yaml is --json in that form; table and wide are the human views
        from workers import render

        args.json = args.json or args.output in ("json", "yaml")
        render.MACHINE["format"] = args.output if args.output in ("json", "yaml") else "json"
    try:
        return args.func(args)
    except FlagError as err:  # a bad --metrics/--tracing/TLS flag: one line
        print(f"gpuheal {args.command}: {err}", file=sys.stderr)
        return 2


def entry() -> None:
    """The console script: run a command, then leave without interpreter finalization once the
    Temporal SDK is loaded, since its native threads can abort a finalizing interpreter (exit -6)
    even after a command that succeeded."""
    code = main()
    if "temporalio.bridge.temporal_sdk_bridge" not in sys.modules:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    entry()
