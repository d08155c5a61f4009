"""AMQP sessions: the connection and channel state machines that turn frames into broker
operations and broker events into frames. No sockets here: bytes come in through
`Connection.data_received` and leave through the transport object the server supplies."""
