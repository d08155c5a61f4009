"""Where the log goes, and in what shape: RabbitMQ's log outputs and line format.

Outputs (set up once by configure(), from the config file's log.* keys):

- the console (log.console, default on; log.console.level; log.console.stdio, Warren's
  default stderr);
- a file (log.file, log.dir; off unless one of them is set): without rotation a
  WatchedFileHandler, which reopens the file when it is moved or deleted, as RabbitMQ's
  handler does for logrotate; with log.file.rotation.size and/or .date a RotatingLogFile
  (below), which rotates the way RabbitMQ 3.10's rabbit_logger_std_h does.

Every line has RabbitMQ's default plaintext format, "$time [$level] $pid $msg":

    2026-11-27 09:24:16.172408+00:00 [info] <0.12.0> connection <0.12.0> (127.0.0.1:52976 -> 127.0.0.1:5672): user 'guest' authenticated and granted access to vhost '/'

the local time with microseconds and the UTC offset (rfc3339_space), the level in lower
case, then where the line comes from: Warren has no Erlang processes, so a connection's lines
carry the connection's id (<0.N.0>, N counting connections from 1, also named in the message
as RabbitMQ names its reader's pid) and every other line the name of the Warren logger that
wrote it (<warren.server>, <warren.config>...). A message of several lines is written as
several lines, each with the same prefix, as RabbitMQ does.
"""

from __future__ import annotations

import datetime
import gzip
import logging
import logging.handlers
import os
import re
import shutil
import sys
import time
from typing import Callable

NOTICE = logging.INFO + 5  # RabbitMQ's notice, between info and warning
logging.addLevelName(NOTICE, "NOTICE")

# RabbitMQ's levels (log.*.level) as Python logging levels; "none" is above every level.
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "notice": NOTICE, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL, "alert": logging.CRITICAL,
          "emergency": logging.CRITICAL, "none": logging.CRITICAL + 10}

# log.file.level also takes these (RabbitMQ's schema): only one level, or all below one.
FILE_LEVEL_FILTERS = {"=debug": ("debug", "=="), "!=info": ("info", "!="), "<=notice": ("notice", "<="),
                      "<warning": ("notice", "<=")}

DEFAULT_NODE = "warren@localhost"  # the node name the file is named after (<node>.log)


def level_name(levelno: int) -> str:
    """RabbitMQ's name of the level a Python level falls in."""
    if levelno >= logging.CRITICAL:
        return "critical"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    if levelno >= NOTICE:
        return "notice"
    if levelno >= logging.INFO:
        return "info"
    return "debug"


class RabbitFormatter(logging.Formatter):
    """RabbitMQ's plaintext line: "$time [$level] $pid $msg", every line of a message
    prefixed alike. `erl_pid` on the record (a connection's <0.N.0>) fills the pid field,
    else the logger's name in angle brackets."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        if record.stack_info:
            text = f"{text}\n{self.formatStack(record.stack_info)}"
        stamp = datetime.datetime.fromtimestamp(record.created).astimezone().isoformat(" ", "microseconds")
        origin = getattr(record, "erl_pid", None) or f"<{record.name}>"
        head = f"{stamp} [{level_name(record.levelno)}] {origin} "
        return "\n".join(head + line for line in text.split("\n"))


class LevelFilter(logging.Filter):
    """Keeps the records whose level name compares to `name` as `op` says (==, != or <=)."""

    _ORDER = ["debug", "info", "notice", "warning", "error", "critical"]

    def __init__(self, name: str, op: str):
        super().__init__()
        self.rank, self.op = self._ORDER.index(name), op

    def filter(self, record: logging.LogRecord) -> bool:
        rank = self._ORDER.index(level_name(record.levelno))
        return rank == self.rank if self.op == "==" else rank != self.rank if self.op == "!=" else rank <= self.rank


def file_level(name: str) -> tuple[int, logging.Filter | None]:
    """The handler level and filter of a log.file.level value."""
    if name in FILE_LEVEL_FILTERS:
        return logging.DEBUG, LevelFilter(*FILE_LEVEL_FILTERS[name])
    return LEVELS[name], None


# --- date rotation ----------------------------------------------------------------------------
# log.file.rotation.date, in the newsyslog-like syntax RabbitMQ inherited from lager. RabbitMQ
# 3.10.8's rabbit_logger_std_h parses $D, $W, $H and $M specs; it rotates on $D<hour> (daily)
# and $W<day>[D<hour>] (weekly, day 0 = Sunday), in local time, at the whole hour. Warren does
# those the same, and $H<minute> hourly at that minute (3.10.8 accepts $H but never rotates on
# it). Monthly rotation ($M...) has nothing in Python's logging to do it with: refused.
DateSpec = tuple  # ("day", hour) | ("week", day 0-6 from Sunday, hour) | ("hour", minute)

_DATE_FORMS = ("expected $D<hour> (daily, such as $D0 or $D23), $W<day>D<hour> (weekly, day 0 = Sunday, "
               "such as $W0D23) or $H<minute> (hourly, such as $H00)")


def parse_date_spec(text: str) -> DateSpec:
    """A log.file.rotation.date value (ValueError with the forms Warren takes if bad)."""
    if text.startswith("$M"):
        raise ValueError(f"monthly rotation ('{text}') is not supported: {_DATE_FORMS}, or rotation by size")
    m = re.fullmatch(r"\$(?:D(\d{1,2})|W([0-6])(?:D(\d{1,2}))?|H(\d{1,2}))", text)
    if m is None:
        raise ValueError(f"{_DATE_FORMS}, got '{text}'")
    day_hour, weekday, week_hour, minute = m.groups()
    if minute is not None:
        if int(minute) > 59:
            raise ValueError(f"expected a minute from 0 to 59 in $H<minute>, got '{text}'")
        return ("hour", int(minute))
    hour = int(day_hour if day_hour is not None else week_hour or 0)
    if hour > 23:
        raise ValueError(f"expected an hour from 0 to 23, got '{text}'")
    return ("day", hour) if weekday is None else ("week", int(weekday), hour)


def next_rollover(spec: DateSpec, now: float) -> float:
    """The first time after `now` (a timestamp) that `spec` names, in local wall-clock time."""
    at = datetime.datetime.fromtimestamp(now)
    kind = spec[0]
    if kind == "hour":
        when = at.replace(minute=spec[1], second=0, microsecond=0)
        step = datetime.timedelta(hours=1)
    elif kind == "day":
        when = at.replace(hour=spec[1], minute=0, second=0, microsecond=0)
        step = datetime.timedelta(days=1)
    else:
        days = (spec[1] - at.isoweekday() % 7) % 7  # isoweekday: Monday 1 .. Sunday 7
        when = (at + datetime.timedelta(days=days)).replace(hour=spec[2], minute=0, second=0, microsecond=0)
        step = datetime.timedelta(days=7)
    while when <= at:
        when += step
    return when.timestamp()


def _archive_name(default: str) -> str:
    # RotatingFileHandler names its archives FILE.1 .. FILE.N; RabbitMQ's are FILE.0 (newest)
    # .. FILE.(count - 1).
    base, _, n = default.rpartition(".")
    return f"{base}.{int(n) - 1}"


def _archive_name_gz(default: str) -> str:
    return _archive_name(default) + ".gz"


def _drop(source: str, dest: str) -> None:
    # log.file.rotation.count = 0: the full file is deleted and started afresh, as in RabbitMQ.
    os.remove(source)


def _gzip(source: str, dest: str) -> None:
    # log.file.rotation.compress: the newest archive is gzipped (FILE.0.gz), as in RabbitMQ.
    with open(source, "rb") as plain, gzip.open(dest, "wb") as packed:
        shutil.copyfileobj(plain, packed)
    os.remove(source)


class RotatingLogFile(logging.handlers.RotatingFileHandler):
    """The standard library's RotatingFileHandler with RabbitMQ's rotation (its
    rabbit_logger_std_h): archives FILE.0 (the newest) to FILE.(count - 1), none with count 0
    (the full file is deleted), gzipped (FILE.0.gz ...) with `compress`; rotated by size, by
    date (parse_date_spec), or both.

    TimedRotatingFileHandler is not used for the date: its archives are named by date and it
    cannot rotate by size as well; only the time of the next rotation is computed here, the
    rotation itself is RotatingFileHandler's."""

    def __init__(self, path: str, size: int = 0, count: int = 0, date: DateSpec | None = None,
                 compress: bool = False, clock: Callable[[], float] = time.time):
        super().__init__(path, maxBytes=size, backupCount=max(count, 1), encoding="utf-8")
        self.namer = _archive_name_gz if compress else _archive_name
        if count == 0:
            self.rotator = _drop
        elif compress:
            self.rotator = _gzip
        self.date = date
        self.clock = clock
        self.rollover_at = next_rollover(date, clock()) if date is not None else None

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.rollover_at is not None and self.clock() >= self.rollover_at and os.path.isfile(self.baseFilename):
            return True
        return bool(super().shouldRollover(record))

    def doRollover(self) -> None:
        super().doRollover()
        if self.date is not None:
            self.rollover_at = next_rollover(self.date, self.clock())


# --- setting up -------------------------------------------------------------------------------

class LogSetupError(Exception):
    """The log file cannot be opened: the server does not start."""


def log_file_path(config: dict) -> str | None:
    """The file the log goes to, or None: log.file (a relative one under log.dir, else the
    working directory); with log.dir alone, <log.dir>/warren@localhost.log, unless
    log.console = true was set (RabbitMQ's rule: an explicitly enabled console turns the
    default file off)."""
    path = config.get("log_file")
    if path is False:
        return None
    directory = config.get("log_dir")
    if path is None:
        if directory is None or config.get("log_console") is True:
            return None
        path = f"{DEFAULT_NODE}.log"
    return os.path.abspath(os.path.join(directory or os.getcwd(), path))


def file_handler(config: dict, path: str) -> logging.Handler:
    size = config.get("log_file_rotation_size", 0)
    date = config.get("log_file_rotation_date")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if size or date is not None:
            return RotatingLogFile(path, size, config.get("log_file_rotation_count", 0), date,
                                   config.get("log_file_rotation_compress", False))
        return logging.handlers.WatchedFileHandler(path, encoding="utf-8")
    except OSError as err:
        raise LogSetupError(f"cannot open log file {path}: {err.strerror or err}") from None


def configure(config: dict, console_level: int | None = None) -> list[logging.Handler]:
    """Install the outputs the config asks for on the root logger (replacing any), and the
    category levels (log.connection.level, log.channel.level). `console_level` (the
    command line's --log-level) wins over log.console.level."""
    formatter = RabbitFormatter()
    handlers: list[logging.Handler] = []
    if config.get("log_console", True):
        stream = sys.stdout if config.get("log_console_stdio") == "stdout" else sys.stderr
        console = logging.StreamHandler(stream)
        console.setLevel(console_level if console_level is not None else config.get("log_level", logging.INFO))
        handlers.append(console)
    path = log_file_path(config)
    if path is not None:
        handler = file_handler(config, path)
        level, level_filter = file_level(config.get("log_file_level", "info"))
        handler.setLevel(level)
        if level_filter is not None:
            handler.addFilter(level_filter)
        handlers.append(handler)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    # Records below every output's level are not even made.
    root.setLevel(min((h.level for h in handlers), default=LEVELS["none"]))
    for category in ("connection", "channel"):
        category_level = config.get(f"log_{category}_level")
        if category_level is not None:
            logging.getLogger(f"warren.{category}").setLevel(category_level)
    return handlers
