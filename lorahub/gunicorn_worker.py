"""The console's gunicorn worker: uvicorn's, with its proxy-header handling off, because the
caller's address is read in one place for the console and the nodes (``lorahub/addresses.py``,
from ``LORAHUB_TRUSTED_PROXIES``); two readers would walk ``X-Forwarded-For`` twice."""

from __future__ import annotations

from uvicorn_worker import UvicornWorker


class ConsoleWorker(UvicornWorker):
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "proxy_headers": False}
