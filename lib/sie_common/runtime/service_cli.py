"""The `<service> serve` command line every service shares: flags > SIE_* env > defaults, then run."""

from __future__ import annotations

import argparse
import asyncio
import logging
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
    serve = load_serve()
    try:
        asyncio.run(serve(settings))
    except tuple(startup_errors) as error:
        logging.getLogger(prog.replace("-", "_")).error("%s", error)
        return 1
    return 0
