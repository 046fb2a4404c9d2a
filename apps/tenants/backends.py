"""Login throttling: django-axes' backend, for logins that come with a request."""

from __future__ import annotations

from axes.backends import AxesStandaloneBackend


class LoginThrottleBackend(AxesStandaloneBackend):
    """Counts and locks out failed sign-ins (django-axes) made through a request.

    ``authenticate()`` without a request is server-side code checking a password it already
    holds (Django's test client, a management command): no one can guess passwords through it,
    so it is left to the next backend instead of failing as axes' own backend does.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
