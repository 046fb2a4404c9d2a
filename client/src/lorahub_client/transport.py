"""How the client talks to the server: one ``httpx`` client and the bounded retries.

Every call retries what is safe to retry, a bounded number of times: a connection that could
not be opened (nothing was sent), and answers 429/502/503/504, waiting what ``Retry-After``
says (capped) or backing off exponentially. Reads (GET) are also retried when the connection
broke mid-answer. Errors are raised as ``errors.*`` with the server's code and message.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import tenacity

from lorahub_client.errors import ApiError, NotFound, Refused, Unauthorized, Unavailable
from lorahub_client.version import __version__

T = TypeVar("T")
RETRY_STATUSES = frozenset({429, 502, 503, 504})


class _RetryableAnswer(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code}")
        self.response = response


class Transport:
    """The server at ``url`` with ``api_key``: requests with the bounded retries."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        max_retry_wait: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries, self.max_retry_wait, self.sleep = retries, max_retry_wait, sleep
        self.http = httpx.Client(
            base_url=self.url,
            headers={
                "Authorization": f"Bearer {api_key}",
                "User-Agent": f"lorahub-client/{__version__}",
            },
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self.http.close()

    def elsewhere(self, url: str) -> httpx.Client:
        """A client for another server (a node) with the same key and timeout."""
        return httpx.Client(
            base_url=url, headers=dict(self.http.headers), timeout=self.http.timeout
        )

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """What the server asked for (Retry-After, capped), or exponential backoff."""
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, _RetryableAnswer):
            raw = error.response.headers.get("Retry-After", "")
            if raw.strip().isdigit():
                return min(float(raw), self.max_retry_wait)
        return min(0.5 * 2 ** (state.attempt_number - 1), self.max_retry_wait)

    def send(self, method: str, url: str, *, base: httpx.Client | None = None, **kw: Any):
        """One request with the bounded retries; the answer, or an ``errors.*`` raised."""
        http = base or self.http

        def attempt() -> httpx.Response:
            response = http.request(method, url, **kw)
            if response.status_code in RETRY_STATUSES:
                raise _RetryableAnswer(response)
            return response

        response = self.send_with_retries(
            attempt, reads=method == "GET", where=str(http.base_url or url)
        )
        if response.status_code >= 400:
            raise api_error(response)
        return response

    def send_with_retries(self, attempt: Callable[[], T], *, reads: bool, where: str) -> T:
        """``attempt`` again, a bounded number of times, while what failed is safe to retry:
        a connection never opened, a 429/502/503/504, or (``reads``) a connection that broke
        mid-answer."""

        def retryable(error: BaseException) -> bool:
            if isinstance(error, _RetryableAnswer | httpx.ConnectError | httpx.ConnectTimeout):
                return True
            # a GET whose connection broke mid-answer changed nothing: ask again
            return reads and isinstance(error, httpx.ReadError | httpx.RemoteProtocolError)

        try:
            return tenacity.Retrying(
                stop=tenacity.stop_after_attempt(self.retries + 1),
                wait=self._wait,
                retry=tenacity.retry_if_exception(retryable),
                sleep=self.sleep,
                reraise=True,
            )(attempt)
        except _RetryableAnswer as exc:
            error = api_error(exc.response)
            raise Unavailable(
                f"{where} answered {exc.response.status_code} "
                f"{self.retries + 1} times ({error.detail}); try again later"
            ) from None
        except httpx.TransportError as exc:
            where = where.rstrip("/")
            raise Unavailable(
                f"cannot reach {where} ({type(exc).__name__}: {exc or 'no answer'}) after "
                f"{self.retries + 1} attempts; is the server running, and is the URL right?"
            ) from None

    def download(self, method: str, url: str, dest: Path) -> str:
        """Stream the answer to ``method url`` into ``dest``; its SHA-256 (hex)."""

        def attempt() -> str:
            digest = hashlib.sha256()
            with self.http.stream(method, url) as response:
                if response.status_code in RETRY_STATUSES:
                    response.read()
                    raise _RetryableAnswer(response)
                if response.status_code >= 400:
                    response.read()
                    raise api_error(response)
                with dest.open("wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
            return digest.hexdigest()

        return self.send_with_retries(attempt, reads=True, where=self.url)


def api_error(response: httpx.Response) -> ApiError:
    """The server's error as an exception: its ``code`` and ``detail``, verbatim."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    detail = body.get("detail") or response.reason_phrase or f"HTTP {response.status_code}"
    error = body.get("error")  # the nodes' OpenAI-shaped errors
    if isinstance(error, dict):
        detail = error.get("message") or detail
    if isinstance(detail, list):  # request validation: one line per field
        detail = "; ".join(_field_error(item) for item in detail)
    code = str(body.get("code") or (error or {}).get("code") or "error")
    status = response.status_code
    if status == 401 and code == "key_expired":  # the server says when, and what to do
        return Unauthorized(status, code, str(detail))
    if status == 401:
        return Unauthorized(
            status,
            "invalid_api_key",
            "invalid API key: the server refused it; check LORAHUB_API_KEY or run `lorahub login`",
        )
    if status == 404:
        return NotFound(status, code, str(detail))
    if 400 <= status < 500:
        return Refused(status, code, str(detail))
    return ApiError(status, code, str(detail))


def _field_error(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(p) for p in item.get("loc", []) if p not in ("body", "query", "path"))
    return f"{where}: {item.get('msg', '')}" if where else str(item.get("msg", item))
