"""Log lines that say what happened, never what a caller wrote to look like a log line.

A sign-in's user name, a provider's ``error_description`` and other text from outside reach
the logs as arguments of a message. Written raw, a newline forges a second log line and an
escape sequence rewrites an operator's terminal. ``PlainFormatter`` (the ``LOGGING`` of
``lorahub/settings.py``) escapes every control character of a record's message the way Python
writes it in a string (``\\n``, ``\\x1b``), and caps its length; tracebacks keep their lines.
"""

from __future__ import annotations

import logging
import re

MAX_MESSAGE_CHARS = 4000
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` with its control characters escaped, at most ``limit`` characters (then …)."""
    escaped = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return escaped if len(escaped) <= limit else escaped[:limit] + "…"


class PlainFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)
