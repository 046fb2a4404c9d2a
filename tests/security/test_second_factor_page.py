"""A reviewer or operator without a second factor who presses a guarded console button gets
the refusal page as a page: 403, HTML (it was shown as text, with status 200: ``render``'s
fourth positional argument is the content type, and 403 went there)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

from apps.tenants.console import second_factor_page
from apps.tenants.errors import SecondFactorRequired

pytestmark = pytest.mark.django_db


def test_the_refusal_is_a_403_html_page_with_the_way_to_a_second_factor():
    request = RequestFactory().post("/review/1/approve")
    request.user = AnonymousUser()
    refused = second_factor_page(request, SecondFactorRequired("approving a version"))
    assert refused.status_code == 403
    assert refused["Content-Type"].startswith("text/html")
    assert "/accounts/second-factor/" in refused.content.decode()
