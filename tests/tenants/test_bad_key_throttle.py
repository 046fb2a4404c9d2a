"""Repeated bad API keys from one address get 429 on the REST API; a valid key is always
answered, from that address too, and other addresses are not affected."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.tenants import services as tenant_services
from apps.tenants import throttle
from apps.tenants.throttle import BadKeyThrottle


def test_an_address_is_throttled_after_its_limit_of_bad_keys_and_only_that_address():
    limiter = BadKeyThrottle("3/minute")
    for _ in range(3):
        assert limiter.failed("198.51.100.1") == 0
    assert 1 <= limiter.failed("198.51.100.1") <= 60
    assert limiter.failed("198.51.100.2") == 0


def rest(address: str, key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", REMOTE_ADDR=address)


@pytest.mark.django_db
def test_the_rest_api_answers_429_after_repeated_bad_keys_from_one_address(settings, tenant_a):
    settings.LORAHUB_BAD_KEY_LIMIT = "5/minute"
    throttle.bad_keys.cache_clear()
    _, good = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    guesser = "203.0.113.9"
    for n in range(5):
        answer = rest(guesser, f"lh_guess{n}_x").get("/api/adapters")
        assert answer.status_code == 401, answer.content
    throttled = rest(guesser, "lh_guess6_x").get("/api/adapters")
    assert throttled.status_code == 429
    assert throttled.json()["code"] == "too_many_bad_keys"
    assert "too many invalid API keys" in throttled.json()["detail"]
    assert 1 <= int(throttled["Retry-After"]) <= 60
    # a valid key from that address is still answered: failures never cost a good key
    assert rest(guesser, good).get("/api/adapters").status_code == 200
    # everyone else carries on
    assert rest("203.0.113.10", good).get("/api/adapters").status_code == 200


@pytest.mark.django_db
def test_good_keys_and_missing_keys_are_never_counted(settings, tenant_a):
    settings.LORAHUB_BAD_KEY_LIMIT = "2/minute"
    throttle.bad_keys.cache_clear()
    _, good = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    for _ in range(5):
        assert rest("192.0.2.1", good).get("/api/adapters").status_code == 200
        assert Client(REMOTE_ADDR="192.0.2.1").get("/api/adapters").status_code == 401
    assert rest("192.0.2.1", good).get("/api/adapters").status_code == 200
