"""`sie-worker serve`: flags override the SIE_* environment variables."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from sie_common.settings import SettingsError, add_flags, load_settings
from sie_worker.settings import WorkerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sie-worker", description="The SIE worker: batches and runs search models.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="serve sie.v1.Inference (standalone mode)")
    add_flags(serve_parser, WorkerSettings)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(WorkerSettings, args)
    except SettingsError as error:
        parser.error(str(error))
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from sie_worker.server import serve  # heavy imports (torch) after argument errors

    try:
        asyncio.run(serve(settings))
    except (ValueError, OSError) as error:
        logging.getLogger("sie_worker").error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
