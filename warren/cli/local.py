"""Where the broker on this machine keeps its state and its control socket: the one place
`warren server` and `warrenctl` agree on (standard library only, as warrenctl is).

The control socket gives warrenctl rabbitmqctl's node-local authority: the broker serves its
management API on it as well, to its own Unix user only, and trusts every request fully.
"""

import os

DEFAULT_DATA_DIR = os.path.expanduser("~/.local/share/warren")
DATA_DIR_ENV = "WARREN_DATA_DIR"
CONTROL_SOCKET = "warren-ctl.sock"


def data_dir(explicit: str | None = None) -> str:
    """--data-dir if given, else $WARREN_DATA_DIR, else ~/.local/share/warren."""
    if explicit is not None:
        return explicit
    return os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR


def control_socket(directory: str) -> str:
    return os.path.join(directory, CONTROL_SOCKET)
