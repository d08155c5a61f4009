"""The asyncio shell: sockets, timers and signals. Everything else is I/O-free."""
