"""lorahub's tenant client: ``Client`` for Python, ``lorahub`` on the command line."""

__version__ = "0.1.0"

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
]
