"""`warren server`: run the broker in the foreground."""

import argparse
import asyncio
import json
import logging
import os
import sys

from ..broker import definitions
from ..broker.broker import Broker, Limits
from ..server.listener import Server
from .config import ConfigError, load_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warren", description="Warren AMQP 0-9-1 broker")
    sub = parser.add_subparsers(dest="command", required=True)
    server = sub.add_parser("server", help="run the broker in the foreground")
    server.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=None, help="AMQP port (default 5672)")
    server.add_argument("--data-dir", default=None, help="directory for broker state")
    server.add_argument("--config", default=None, help="RabbitMQ-style config file")
    server.add_argument("--definitions", default=None, help="RabbitMQ definitions JSON to load at start")
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config) if args.config else {}
    except ConfigError as err:
        print(f"warren: {err}", file=sys.stderr)
        return 2
    limits = Limits(**{k: config[k] for k in ("channel_max", "frame_max", "heartbeat", "max_message_size")
                       if k in config})
    broker = Broker.with_defaults(config.get("default_user", "guest"), config.get("default_pass", "guest"),
                                  config.get("default_vhost", "/"), limits=limits)
    if "loopback_users" in config:
        broker.loopback_users = config["loopback_users"]
    if args.definitions:
        try:
            with open(args.definitions) as f:
                definitions.load(broker, json.load(f))
        except (OSError, ValueError) as err:
            print(f"warren: cannot load definitions {args.definitions}: {err}", file=sys.stderr)
            return 2
    if args.data_dir:
        os.makedirs(args.data_dir, exist_ok=True)
    host = args.host or config.get("host", "127.0.0.1")
    port = args.port if args.port is not None else config.get("port", 5672)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    server = Server(broker, host, port)
    try:
        asyncio.run(server.serve())
    except OSError as err:
        print(f"warren: cannot listen on {host}:{port}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
