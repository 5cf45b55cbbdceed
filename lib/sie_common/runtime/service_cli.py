"""The `<service> serve` command line every service shares: flags > SIE_* env > defaults, then run."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from sie_common.runtime.logs import configure_logging
from sie_common.runtime.settings import SettingsError, add_flags, load_settings
from sie_common.runtime.tracing import configure_tracing


def serve_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    serve_help: str,
    settings_type: type[Any],
    load_serve: Callable[[], Callable[[Any], Coroutine[Any, Any, None]]],
    startup_errors: Sequence[type[BaseException]] = (ValueError, OSError),
) -> int:
    """Parse `serve` and its flags, set up logging and tracing, and run the service until it stops.

    `load_serve` imports the service lazily, so argument errors come back before
    heavy imports; a `startup_errors` exception is logged and exits 1.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help=serve_help)
    add_flags(serve_parser, settings_type)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(settings_type, args)
    except SettingsError as error:
        parser.error(str(error))
    configure_logging(settings.log_level, json_lines=settings.log_json)
    try:
        configure_tracing(settings.tracing_enabled, default_service_name=prog)
    except ValueError as error:
        parser.error(str(error))
    try:
        tempfile.gettempdir()  # torch and transformers need one as they are imported; say so instead of a traceback
    except FileNotFoundError as error:
        parser.exit(1, f"{prog}: {error}: mount a writable /tmp (e.g. an emptyDir) or point TMPDIR at a writable one\n")
    serve = load_serve()
    return asyncio.run(_run(serve(settings), tuple(startup_errors), logging.getLogger(prog.replace("-", "_"))))


async def _run(
    serving: Coroutine[Any, Any, None], startup_errors: tuple[type[BaseException], ...], log: logging.Logger
) -> int:
    """Run the service; a `startup_errors` exception is logged as one line and gives 1. It is caught inside the event
    loop, and what the failed start left (a gRPC server that was started: its finaliser schedules a shutdown on the
    loop) is collected while the loop still runs: collected after asyncio.run had closed the loop, the server printed
    an "Event loop is closed" traceback under that line."""
    try:
        await serving
    except startup_errors as error:
        log.error("%s", error)
    else:
        return 0
    gc.collect()
    await asyncio.sleep(0)
    return 1
