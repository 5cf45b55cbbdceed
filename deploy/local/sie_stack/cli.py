"""`sie up` (the whole stack on this machine) and `sie envoy-config` (Envoy's config for any deployment)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from sie_common.runtime.settings import (
    DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
    DEFAULT_MAX_SEND_MESSAGE_BYTES,
    SettingsError,
    add_flags,
    load_settings,
)
from sie_stack.envoy_config import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEAP_BYTES, DEFAULT_PEER_BODY_SHARE
from sie_stack.settings import StackSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sie", description="Run and configure the SIE engine.")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start etcd, the config service, workers, the gateway and Envoy on loopback")
    add_flags(up, StackSettings)
    envoy = commands.add_parser("envoy-config", help="print Envoy's config (JSON) for the HTTP/JSON edge")
    envoy.add_argument("--gateway", required=True, help="gateway host:port")
    envoy.add_argument("--config", required=True, help="config service host:port")
    envoy.add_argument(
        "--adapter", help="the gateway's HTTP adapter host:port (SIE_GATEWAY_HTTP_PORT): serves the foreign wires"
    )
    envoy.add_argument("--listen-port", type=int, default=8080)
    envoy.add_argument("--admin-port", type=int, default=9901)
    envoy.add_argument("--listen-host", default="0.0.0.0")
    envoy.add_argument("--descriptor", help="descriptor set path (default: the one shipped in the sie package)")
    envoy.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
        help="largest HTTP body transcoded (larger: 413); the services' SIE_MAX_RECEIVE_MESSAGE_BYTES",
    )
    envoy.add_argument(
        "--max-response-bytes",
        type=int,
        default=DEFAULT_MAX_SEND_MESSAGE_BYTES,
        help="largest gRPC answer transcoded to JSON; the gateway's SIE_MAX_SEND_MESSAGE_BYTES",
    )
    envoy.add_argument(
        "--max-heap-bytes",
        type=int,
        default=DEFAULT_MAX_HEAP_BYTES,
        help="heap the overload manager holds Envoy under (about 60%% of its memory limit); a third of it again for "
        "the JSON bodies the request check holds while they arrive",
    )
    envoy.add_argument(
        "--peer-body-share",
        type=float,
        default=DEFAULT_PEER_BODY_SHARE,
        help="share of that body budget one client address may hold (1 behind a proxy that hides client addresses)",
    )
    envoy.add_argument(
        "--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, help="downstream connections at once"
    )
    args = parser.parse_args(argv)

    if args.command == "envoy-config":
        from pathlib import Path

        from sie_stack.envoy_config import render

        descriptor = Path(args.descriptor) if args.descriptor else None
        try:
            rendered = render(
                listen_port=args.listen_port,
                admin_port=args.admin_port,
                gateway=args.gateway,
                config=args.config,
                adapter=args.adapter,
                descriptor=descriptor,
                host=args.listen_host,
                max_request_bytes=args.max_request_bytes,
                max_response_bytes=args.max_response_bytes,
                max_heap_bytes=args.max_heap_bytes,
                max_connections=args.max_connections,
                peer_body_share=args.peer_body_share,
            )
        except ValueError as error:
            parser.error(str(error))
        print(json.dumps(rendered, indent=2))
        return 0

    try:
        settings = load_settings(StackSettings, args)
    except SettingsError as error:
        parser.error(str(error))
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sie_stack.up import run

    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
