"""`sie-config serve`: flags override the SIE_* environment variables."""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine
from typing import Any

from sie_common.cluster.model_config import ModelConfigError
from sie_common.runtime.service_cli import serve_main
from sie_config.settings import ConfigSettings


def _load_serve() -> Callable[[ConfigSettings], Coroutine[Any, Any, None]]:
    from sie_config.server import serve

    return serve


def main(argv: list[str] | None = None) -> int:
    return serve_main(
        argv,
        prog="sie-config",
        description="The SIE config service: the single writer of model configs into etcd.",
        serve_help="serve sie.v1.ConfigService",
        settings_type=ConfigSettings,
        load_serve=_load_serve,
        startup_errors=(ValueError, OSError, ModelConfigError),  # OSError covers an unreachable etcd
    )


if __name__ == "__main__":
    sys.exit(main())
