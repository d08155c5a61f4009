"""The Prometheus endpoint on its own port (RabbitMQ's rabbitmq_prometheus: 15692), one of the
server's services (warren.server.listener.Service), served by aiohttp on the broker's loop:

- GET /metrics: the node's metrics, every queue, channel and connection summed (or one by
  one with `prometheus.return_per_object_metrics = true`), and the process's own
  (process_cpu_seconds_total, ...);
- GET /metrics/per-object: a sample per queue, channel and connection.

In Prometheus's text format 0.0.4 (gzip-compressed when the scraper accepts it), without
authentication, as RabbitMQ 3.10 serves it: also to a scraper that prefers OpenMetrics
(Prometheus 2.42's Accept header), with RabbitMQ's Content-Type, and the info metrics
(rabbitmq_build_info, rabbitmq_identity_info) untyped. The metrics are read from the broker at each scrape
(warren.mgmt.metrics).

With `required` False (the port nobody asked for: the default), a port already taken is
logged (at INFO) and the broker runs without the endpoint, so two brokers on one machine
still start; a port given in the config file or on the command line must be bound, or the
start fails.
"""

from __future__ import annotations

import asyncio
import logging
import os

from aiohttp import web
from prometheus_client import generate_latest

from .metrics import Endpoint, endpoints

log = logging.getLogger("warren.mgmt")

DEFAULT_PORT = 15692
CONTENT_TYPE = "text/plain; version=0.0.4"  # RabbitMQ 3.10.8's, whatever the Accept header (generate_latest's format)


def _handler(endpoint: Endpoint):
    async def metrics(request: web.Request) -> web.Response:
        # The broker is read here, on its loop (the model has no locks); the samples are made
        # and written out in a thread.
        reading = endpoint.read()
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, reading)
        # (compressed in a thread too, past 64 KiB)
        response = web.Response(body=body, headers={"Content-Type": CONTENT_TYPE}, zlib_executor_size=64 * 1024)
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            response.enable_compression()
        return response
    return metrics


def make_app(server, per_object_metrics: bool = False) -> web.Application:
    default, per_object = endpoints(server, per_object_metrics)
    app = web.Application()
    app.add_routes([web.get("/metrics", _handler(default)), web.get("/metrics/per-object", _handler(per_object))])
    return app


class PrometheusService:
    """The endpoint on host:port; `listening` once bound."""

    def __init__(self, host: str, port: int, per_object_metrics: bool = False, required: bool = True):
        self.host = host
        self.port = port
        self.per_object_metrics = per_object_metrics
        self.required = required
        self.listening = False
        self._runner: web.AppRunner | None = None

    async def start(self, server) -> None:
        runner = self._runner = web.AppRunner(make_app(server, self.per_object_metrics), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            where = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
            reason = os.strerror(err.errno) if err.errno and err.errno > 0 else str(err)
            await runner.cleanup()
            self._runner = None
            if self.required:
                raise OSError(f"cannot listen for Prometheus on {where}: {reason}") from err
            # (INFO: nothing that was asked for failed; another broker on the machine has it.)
            log.info("Prometheus metrics not served: cannot listen on %s: %s (set prometheus.tcp.port "
                     "or --prometheus-port to another port, or 0 to turn them off)", where, reason)
            return
        self.listening = True
        log.info("Prometheus metrics at http://%s:%d/metrics", self.host if ":" not in self.host
                 else f"[{self.host}]", self.port)

    async def stop(self) -> None:
        self.listening = False
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
