"""The console's endpoints for machines (lorahub/health.py): probes reach /healthz by a pod's
address, which is no allowed host; Prometheus reads /metrics with the internal token only."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_healthz_answers_a_probe_that_names_no_allowed_host():
    answer = Client().get("/healthz", HTTP_HOST="10.1.2.3:8000")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}
    # every other path still refuses that host
    assert Client().get("/accounts/login/", HTTP_HOST="10.1.2.3:8000").status_code == 400


def test_metrics_need_the_internal_token(settings):
    settings.LORAHUB_INTERNAL_TOKEN = "scrape-token"
    assert Client().get("/metrics").status_code == 401
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.status_code == 401
    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token")
    assert scraped.status_code == 200
    text = scraped.content.decode()
    assert 'lorahub_nodes{state="draining"} 0.0' in text
    assert "lorahub_quarantines_active 0.0" in text


def test_without_a_token_only_this_machine_may_scrape(settings):
    settings.LORAHUB_INTERNAL_TOKEN = ""
    assert Client().get("/metrics").status_code == 200  # the test client is 127.0.0.1
    assert Client(REMOTE_ADDR="10.0.0.9").get("/metrics").status_code == 401
