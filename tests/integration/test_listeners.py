"""Where Warren listens for AMQP: both loopbacks by default (clients such as Node >= 17 resolve
"localhost" to ::1 first), several --host values, several listeners.tcp.* entries in the
config file. Each check completes an AMQP handshake (pika) on the address."""

import asyncio
import logging
import os
import socket
import time

import pika
import pytest

from conftest import EXTERNAL, free_port, scratch_dir
from warren.broker.broker import Broker
from warren.server.listener import Listen, Server

from .test_config import launch  # noqa: F401  (the fixture that starts `warren server --config`)


def _ipv6_loopback() -> bool:
    """The machine can bind ::1 (it has IPv6 on its loopback)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


IPV6 = _ipv6_loopback()
needs_ipv6 = pytest.mark.skipif(not IPV6, reason="this machine cannot bind ::1 (no IPv6)")


def amqp_works(host: str, port: int) -> bool:
    """A guest connection on host:port opens a channel and round-trips a message."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host, port, credentials=pika.PlainCredentials("guest", "guest"), connection_attempts=1,
        socket_timeout=5))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"hello")
        method, _, body = ch.basic_get(q, auto_ack=True)
        return method is not None and body == b"hello"
    finally:
        conn.close()


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return True
    return False


def test_default_listens_on_both_loopbacks(make_broker):
    b = make_broker(pass_host=False)
    assert amqp_works("127.0.0.1", b.port)
    if IPV6:
        assert amqp_works("::1", b.port)
    # Every address "localhost" resolves to here answers (::1 first on many machines).
    for *_, sockaddr in socket.getaddrinfo("localhost", b.port, type=socket.SOCK_STREAM):
        assert amqp_works(sockaddr[0], b.port), sockaddr
    assert amqp_works("localhost", b.port)
    if IPV6:
        assert "[::1]:%d" % b.port in b.log()


@needs_ipv6
def test_several_hosts_repeated_or_comma_separated(make_broker):
    b = make_broker("--host", "::1", pass_host=False, wait=False)
    deadline = time.monotonic() + 15
    while refused("::1", b.port):
        assert b.proc.poll() is None and time.monotonic() < deadline, b.log()
        time.sleep(0.05)
    assert amqp_works("::1", b.port)
    assert refused("127.0.0.1", b.port)  # --host replaces the default addresses
    b = make_broker("--host", "127.0.0.1", "--host", "::1", pass_host=False)
    assert amqp_works("127.0.0.1", b.port) and amqp_works("::1", b.port)
    b = make_broker("--host", "::1,127.0.0.1", pass_host=False)
    assert amqp_works("127.0.0.1", b.port) and amqp_works("::1", b.port)


def test_several_hosts_ipv4(make_broker):
    # 127.0.0.2 is loopback on Linux (the whole 127/8); another Warren holds nothing there.
    b = make_broker("--host", "127.0.0.1,127.0.0.2", pass_host=False)
    assert amqp_works("127.0.0.1", b.port)
    if IPV6:
        assert refused("::1", b.port)  # --host replaces the default addresses
    conn = socket.create_connection(("127.0.0.2", b.port), timeout=2)
    conn.close()


def test_a_named_address_that_cannot_be_bound_stops_the_start(make_broker):
    # (Not waiting for the port: 127.0.0.1 is bound, and may accept, a moment before the start stops.)
    b = make_broker("--host", "127.0.0.1,192.0.2.1", pass_host=False, wait=False)  # TEST-NET-1, not ours
    assert b.proc.wait(30) != 0
    assert "cannot listen on 192.0.2.1:" in b.log(), b.log()


def _config(text: str) -> str:
    directory = scratch_dir("warren-listeners-")
    path = os.path.join(directory, "rabbitmq.conf")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_config_with_two_listeners(launch):
    port, other, mgmt = free_port(), free_port(), free_port()
    # RabbitMQ's forms: an IPv4 address and a port, an IPv6 address without brackets.
    second = f"::1:{port}" if IPV6 else f"127.0.0.2:{port}"
    config = _config(f"listeners.tcp.1 = 127.0.0.1:{port}\nlisteners.tcp.2 = {second}\n"
                     f"listeners.tcp.other_port = 127.0.0.1:{other}\nmanagement.tcp.port = {mgmt}\n")
    launch(config, port=port, mgmt_port=mgmt)
    assert amqp_works("127.0.0.1", port)
    assert amqp_works("::1" if IPV6 else "127.0.0.2", port)
    assert amqp_works("127.0.0.1", other)


def test_config_listeners_and_flags(launch):
    port, file_port, mgmt = free_port(), free_port(), free_port()
    config = _config(f"listeners.tcp.a = 127.0.0.1:{file_port}\nlisteners.tcp.b = 127.0.0.2:{file_port}\n"
                     f"management.tcp.port = {mgmt}\n")
    # --port moves every listener of the file to that port.
    launch(config, "--port", str(port), port=port, mgmt_port=mgmt)
    assert amqp_works("127.0.0.1", port)
    socket.create_connection(("127.0.0.2", port), timeout=2).close()
    assert refused("127.0.0.1", file_port)


def test_erlang_config_with_two_listeners(launch):
    port, mgmt = free_port(), free_port()
    second = '"::1"' if IPV6 else '"127.0.0.2"'
    config = _config(f'[{{rabbit, [{{tcp_listeners, [{{"127.0.0.1", {port}}}, {{{second}, {port}}}]}}]}},\n'
                     f' {{rabbitmq_management, [{{listener, [{{port, {mgmt}}}]}}]}}].\n')
    os.rename(config, config[:-len(".conf")] + ".config")
    launch(config[:-len(".conf")] + ".config", port=port, mgmt_port=mgmt)
    assert amqp_works("127.0.0.1", port)
    assert amqp_works("::1" if IPV6 else "127.0.0.2", port)


@pytest.mark.skipif(bool(EXTERNAL), reason="checks Warren's own listener")
def test_an_optional_address_that_cannot_be_bound_is_skipped_with_one_line(caplog):
    """What a machine without IPv6 does with the default ::1: logs one line and starts; run
    in-process with an address no machine here has (TEST-NET-1) in ::1's place."""
    async def run():
        server = Server(Broker(), listen=[Listen("127.0.0.1", 0), Listen("192.0.2.1", 0, optional=True),
                                          Listen("127.0.0.2", 0)])
        await server.start()
        try:
            port = server.port
            assert server.addresses == [("127.0.0.1", port), ("127.0.0.2", port)]
            reader, writer = await asyncio.open_connection("127.0.0.2", port)
            writer.write(b"AMQP\x00\x00\x09\x01")
            assert (await reader.read(7))[:1] == b"\x01"  # connection.start, a method frame
            writer.close()
        finally:
            await server.stop()

    with caplog.at_level(logging.INFO, logger="warren.server"):
        asyncio.run(run())
    skipped = [r.getMessage() for r in caplog.records if "192.0.2.1" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].startswith("not listening on 192.0.2.1:"), skipped
