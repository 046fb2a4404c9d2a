"""lorahub's tenant client: ``Client`` for Python, ``lorahub`` on the command line."""

from lorahub_client.client import Client
from lorahub_client.errors import (
    ApiError,
    LorahubError,
    NotFound,
    Refused,
    Rejected,
    TimedOut,
    Unauthorized,
    Unavailable,
)
from lorahub_client.models import ChatAnswer
from lorahub_client.version import __version__

__all__ = [
    "ApiError",
    "ChatAnswer",
    "Client",
    "LorahubError",
    "NotFound",
    "Refused",
    "Rejected",
    "TimedOut",
    "Unauthorized",
    "Unavailable",
    "__version__",
]
