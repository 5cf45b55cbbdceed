"""`sie-gateway serve`: flags override the SIE_* environment variables."""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine
from typing import Any

from sie_common.runtime.service_cli import serve_main
from sie_gateway.settings import GatewaySettings


def _load_serve() -> Callable[[GatewaySettings], Coroutine[Any, Any, None]]:
    from sie_gateway.server import serve

    return serve


def main(argv: list[str] | None = None) -> int:
    return serve_main(
        argv,
        prog="sie-gateway",
        description="The SIE gateway: routes inference to workers by model affinity and load.",
        serve_help="serve sie.v1.Inference in front of the cluster's workers",
        settings_type=GatewaySettings,
        load_serve=_load_serve,
    )


if __name__ == "__main__":
    sys.exit(main())
