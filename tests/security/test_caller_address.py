"""Points 1 and 2 of the threat model: one caller must not throttle every tenant, and nobody
chooses their own address.

The caller's address is read once for the console and the nodes (``lorahub/addresses.py``):
``X-Forwarded-For`` only from ``LORAHUB_TRUSTED_PROXIES``, walked from the right."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from apps.tenants import services as tenant_services
from apps.tenants import throttle
from lorahub import addresses

pytestmark = pytest.mark.django_db

ROUTER = "127.0.0.1"


def through_router(key: str, forwarded_for: str) -> Client:
    """A REST call as the router forwards it: from the router, with the caller's address."""
    return Client(
        HTTP_AUTHORIZATION=f"Bearer {key}", REMOTE_ADDR=ROUTER, HTTP_X_FORWARDED_FOR=forwarded_for
    )


def test_a_valid_key_is_answered_after_25_bad_ones_from_the_same_address(settings, tenant_a):
    throttle.bad_keys.cache_clear()
    _, good = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    statuses = [
        Client(HTTP_AUTHORIZATION="Bearer lh_00000000_x", REMOTE_ADDR=ROUTER)
        .get("/api/adapters")
        .status_code
        for _ in range(25)
    ]
    assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {good}", REMOTE_ADDR=ROUTER).get("/api/adapters")
    assert answer.status_code == 200, answer.content


def test_the_left_most_forwarded_for_value_is_never_believed(settings, tenant_a):
    """A guesser who rotates the left-most X-Forwarded-For value is still one address: the
    router appends (or sets) what it saw, and that is what counts."""
    throttle.bad_keys.cache_clear()
    statuses = [
        through_router("lh_00000000_x", f"10.9.9.{n}, 203.0.113.50")
        .get("/api/adapters")
        .status_code
        for n in range(22)
    ]
    assert statuses.count(429) == 2, statuses


def test_a_victim_is_not_throttled_by_bad_keys_sent_in_its_name(settings, tenant_a):
    throttle.bad_keys.cache_clear()
    _, good = tenant_services.issue_api_key(tenant=tenant_a, name="app", actor=None)
    victim = "198.51.100.20"
    for _ in range(25):  # straight to the console, claiming to be the victim
        Client(
            HTTP_AUTHORIZATION="Bearer lh_00000000_x",
            REMOTE_ADDR="203.0.113.66",
            HTTP_X_FORWARDED_FOR=victim,
        ).get("/api/adapters")
    assert through_router(good, victim).get("/api/adapters").status_code == 200
    assert through_router("lh_00000000_y", victim).get("/api/adapters").status_code == 401


def test_password_guesses_from_rotating_addresses_lock_the_account(settings, tenant_a):
    """django-axes locks on the user name alone too: rotating X-Forwarded-For (or real
    addresses) gives no more guesses."""
    for n in range(settings.AXES_FAILURE_LIMIT):
        Client(REMOTE_ADDR=ROUTER, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}").post(
            "/accounts/login/", {"username": "alice", "password": f"wrong-{n}"}
        )
    locked = Client(REMOTE_ADDR=ROUTER, HTTP_X_FORWARDED_FOR="192.0.2.200").post(
        "/accounts/login/", {"username": "alice", "password": "alice-pass-123"}
    )
    assert locked.status_code == 429
    assert "_auth_user_id" not in locked.client.session


@pytest.mark.parametrize(
    ("peer", "forwarded", "caller"),
    [
        ("127.0.0.1", "6.6.6.6, 198.51.100.1", "198.51.100.1"),  # the router's hop, not the claim
        ("127.0.0.1", "198.51.100.1, 127.0.0.1", "198.51.100.1"),  # past two trusted hops
        ("203.0.113.5", "198.51.100.1", "203.0.113.5"),  # not from a proxy: ignored
        ("127.0.0.1", "not-an-address, 198.51.100.1", "198.51.100.1"),
        ("127.0.0.1", "198.51.100.1, not-an-address", "127.0.0.1"),  # the walk stops there
    ],
)
def test_the_caller_is_read_from_the_right_past_trusted_proxies(peer, forwarded, caller):
    trusted = addresses.parse_networks("127.0.0.1, ::1")
    assert addresses.caller_address(peer, [forwarded], trusted) == caller


def test_trusting_every_proxy_is_refused_at_start_up():
    with pytest.raises(ImproperlyConfigured, match="LORAHUB_TRUSTED_PROXIES='\\*'"):
        addresses.parse_networks("*")


def test_no_deploy_file_trusts_every_proxy():
    from pathlib import Path

    deploy = Path(__file__).resolve().parents[2] / "deploy"
    for path in [deploy / "entrypoint.sh", *deploy.glob("k8s/**/*.yaml"), deploy / "compose.yaml"]:
        text = path.read_text()
        assert "forwarded-allow-ips" not in text, path
        assert 'PROXIES\n              value: "*"' not in text, path
        assert 'TRUSTED_PROXIES: "*"' not in text, path


def test_a_clients_own_forwarded_proto_is_not_believed(settings):
    """``X-Forwarded-Proto`` by the same rule as ``X-Forwarded-For``: a client that writes
    ``https`` itself does not make Django treat its plain-HTTP request as secure."""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    seen: dict[str, bool] = {}

    def view(request):
        seen["secure"] = request.is_secure()
        return None

    middleware = addresses.CallerAddressMiddleware(view)
    from django.test import RequestFactory

    factory = RequestFactory()
    middleware(factory.get("/", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_PROTO="https"))
    assert seen["secure"] is False
    middleware(factory.get("/", REMOTE_ADDR=ROUTER, HTTP_X_FORWARDED_PROTO="https"))
    assert seen["secure"] is True


def test_compose_trusts_no_router_in_front_of_the_console():
    """Compose publishes the console's port directly: its clients arrive from the network's
    gateway, inside the network's range, so trusting the range believed any client's own
    X-Forwarded-For (evading per-address lockouts)."""
    from pathlib import Path

    import yaml

    compose = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "deploy" / "compose.yaml").read_text()
    )
    trusted = compose["services"]["console"]["environment"]["LORAHUB_TRUSTED_PROXIES"]
    default = trusted.split(":-", 1)[1].rstrip("}")
    assert addresses.parse_networks(default) == addresses.parse_networks("127.0.0.1, ::1")
