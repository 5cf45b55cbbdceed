"""`sie-config serve`: flags override the SIE_* environment variables."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from sie_common.etcd import EtcdUnavailable
from sie_common.model_config import ModelConfigError
from sie_common.settings import SettingsError, add_flags, load_settings
from sie_config.settings import ConfigSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sie-config", description="The SIE config service: the single writer of model configs into etcd.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="serve sie.v1.ConfigService")
    add_flags(serve_parser, ConfigSettings)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(ConfigSettings, args)
    except SettingsError as error:
        parser.error(str(error))
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from sie_config.server import serve

    try:
        asyncio.run(serve(settings))
    except (ValueError, OSError, ModelConfigError, EtcdUnavailable) as error:
        logging.getLogger("sie_config").error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
