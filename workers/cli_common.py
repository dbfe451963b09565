"""What every gpuheal command shares: the one way to connect, print a document, serve, and run an
operator command (a table, or -o json|yaml; a one-line reason and non-zero on failure)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from workers.telemetry import FlagError


def machine_text(doc) -> str:
    """The one document a command prints with --json or -o json|yaml."""
    from workers import render

    return render.document(doc, render.MACHINE["format"])


def print_json(doc) -> None:
    sys.stdout.write(machine_text(doc) + "\n")


class ConnectError(Exception):
    """Temporal could not be reached: said in one line."""


async def connect(args, service: str):
    """The one way a command connects: a bad flag raises FlagError, an unreachable server ConnectError (one line)."""
    from workers.temporal_client import connect

    try:
        return await connect(opts=temporal_options(args, service))
    except FlagError:
        raise
    except Exception as err:  # noqa: BLE001 - one line, not a stack trace
        raise ConnectError(f"cannot reach Temporal at {address(args)}: {err}") from None


def serve(args, body) -> int:
    """A long-running process: connect (one line if Temporal is not there), run until SIGINT/SIGTERM."""
    import signal

    async def run() -> int:
        try:
            client = await connect(args, f"gpuheal-{args.command}")
        except ConnectError as err:
            print(f"gpuheal {args.command}: {err}", file=sys.stderr)
            return 2
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await body(client, stop)
        return 0

    return asyncio.run(run())


def fail(reason: str) -> int:
    print(reason, file=sys.stderr)
    return 1


COMMAND_DEADLINE_S = 120  # a backstop: each query and update has its own, shorter deadline


class Unreachable(Exception):
    """Temporal could not be reached: the command could not run (exit 2)."""


def run_operator(args, work) -> int:
    """Run one operator command: a table (or -o json|yaml), a one-line reason and non-zero on failure.
    With --watch, again every WATCH_EVERY_S until Ctrl-C: redrawn in place on a terminal, printed
    again when it changed otherwise."""
    from workers.operator import OperatorError

    def show(doc) -> str:
        doc = doc.model_dump(mode="json") if hasattr(doc, "model_dump") else doc
        if args.json:
            return machine_text(doc)
        from workers.render import human

        return human(args.command, doc, wide=getattr(args, "output", None) == "wide")

    async def go():
        try:
            client = await connect(args, "gpuheal-cli")
        except ConnectError as err:
            raise Unreachable(str(err)) from None
        last = None
        while True:
            try:
                text = show(await asyncio.wait_for(work(client), COMMAND_DEADLINE_S))
            except TimeoutError:
                raise Unreachable(f"no answer from Temporal at {address(args)} within {COMMAND_DEADLINE_S} s") from None
            if not getattr(args, "watch", False):
                return print(text)
            if text != last:
                print(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "") + text, flush=True)
                last = text
            await asyncio.sleep(WATCH_EVERY_S)

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        return 0
    except Unreachable as err:
        print(f"gpuheal {args.command}: {err}", file=sys.stderr)
        return 2
    except OperatorError as err:
        return fail(f"gpuheal {args.command}: {err}")
    except Exception as err:  # noqa: BLE001 - rejected updates and the like
        return fail(f"gpuheal {args.command}: {getattr(err, 'cause', None) or err}")
    return 0


WATCH_EVERY_S = 2.0


def address(args) -> str:
    return args.temporal or os.environ.get("TEMPORAL_ADDRESS") or "127.0.0.1:7233"


def temporal_options(args: argparse.Namespace, service: str):
    from workers.temporal_client import TemporalOptions

    return TemporalOptions(address=args.temporal, namespace=args.namespace, tls_ca=args.tls_ca,
                           tls_cert=args.tls_cert, tls_key=args.tls_key, tls_server_name=args.tls_server_name,
                           api_key=args.api_key, metrics=args.metrics, tracing=args.tracing, service=service)
