"""Settings helpers and the seed-shaped cache config: bad values fail with errors that name
the variable or key and say what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from lorahub import settings as lorahub_settings
from lorahub.cacheconfig import load_cache_config, parse_cache_config

SEED_EXAMPLE = """
base_model: llama-3.1-8b-instruct
adapter_cache:
  gpu_hot:
    max_adapters: 16
    max_memory_gb: 4
    eviction_policy: weighted_lru
  cpu_warm:
    max_adapters: 256
    max_memory_gb: 64
    ttl_minutes: 120
  disk_cache:
    max_size_gb: 500
    verify_checksum: true
  registry:
    require_signature: true
    allow_unapproved_adapter: false
  placement:
    key_fields:
      - tenant_id
      - adapter_id
      - adapter_version
      - base_model_revision
"""


def test_env_int_names_the_variable_when_it_is_not_a_number(monkeypatch):
    monkeypatch.setenv("LORAHUB_SOME_PORT", "eighty")
    with pytest.raises(ImproperlyConfigured, match="LORAHUB_SOME_PORT='eighty' is not an integer"):
        lorahub_settings.env_int("LORAHUB_SOME_PORT", 80)


def test_env_int_enforces_its_minimum(monkeypatch):
    monkeypatch.setenv("LORAHUB_KV", "4")
    with pytest.raises(ImproperlyConfigured, match="LORAHUB_KV=4 is below the minimum of 16"):
        lorahub_settings.env_int("LORAHUB_KV", 64, minimum=16)


def test_env_bool_accepts_common_spellings_and_refuses_others(monkeypatch):
    monkeypatch.setenv("LORAHUB_FLAG", "Yes")
    assert lorahub_settings.env_bool("LORAHUB_FLAG", False) is True
    monkeypatch.setenv("LORAHUB_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="LORAHUB_FLAG='maybe' is not a boolean"):
        lorahub_settings.env_bool("LORAHUB_FLAG", False)


def test_the_seeds_own_example_loads(tmp_path):
    path = tmp_path / "cache.yaml"
    path.write_text(SEED_EXAMPLE)
    config = load_cache_config(path)
    assert config.base_model == "llama-3.1-8b-instruct"
    assert config.adapter_cache.gpu_hot.max_adapters == 16
    assert config.adapter_cache.cpu_warm.ttl_minutes == 120


def test_the_shipped_config_loads():
    from django.conf import settings

    config = load_cache_config(settings.LORAHUB_CACHE_CONFIG)
    assert config.adapter_cache.cpu_warm.max_adapters >= config.adapter_cache.gpu_hot.max_adapters


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"gpu_hot": {"max_adapters": 0}}, "adapter_cache.gpu_hot.max_adapters: Input should be"),
        ({"gpu_hot": {"max_adaptors": 4}}, "adapter_cache.gpu_hot.max_adaptors: unknown key"),
        ({"gpu_hot": {"eviction_policy": "random"}}, "adapter_cache.gpu_hot.eviction_policy"),
        ({"cpu_warm": {"ttl_minutes": "soon"}}, "adapter_cache.cpu_warm.ttl_minutes"),
        ({"registry": {"allow_unapproved_adapter": True}}, "never serves unapproved versions"),
        ({"registry": {"require_signature": False}}, "only loads signed versions"),
        ({"placement": {"key_fields": ["adapter_id"]}}, "must include tenant_id"),
        ({"cpu_warm": {"max_adapters": 2}}, "cpu_warm.max_adapters (2) must be at least"),
        ({"disk_cache": {"path": "/srv/cache"}}, "disk_cache.path: not a cache-config key"),
    ],
)
def test_a_bad_key_is_named_in_the_error(patch, message):
    data = {"base_model": "m", "adapter_cache": patch}
    with pytest.raises(ImproperlyConfigured) as err:
        parse_cache_config(data, source="cache.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("cache.yaml: ")


def test_invalid_yaml_and_missing_files_are_reported_with_the_path(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("adapter_cache: [unclosed")
    with pytest.raises(ImproperlyConfigured, match=r"broken\.yaml: not valid YAML"):
        load_cache_config(broken)
    with pytest.raises(ImproperlyConfigured, match="cannot read cache config"):
        load_cache_config(tmp_path / "absent.yaml")
    with pytest.raises(ImproperlyConfigured, match="base_model: Field required"):
        parse_cache_config({"adapter_cache": {}})


@pytest.mark.parametrize(
    ("warm", "asked", "at_once"),
    [(16, 4, 4), (16, 8, 4), (4, 4, 1), (32, 2, 2), (2, 4, 1)],
)
def test_loads_at_once_are_at_most_a_quarter_of_the_host_slots(warm, asked, at_once):
    """Each load under way keeps a host slot: more than a quarter so kept and loads would
    evict each other's fresh versions (the soak's configuration has 4 host slots)."""
    config = parse_cache_config(
        {
            "base_model": "m",
            "adapter_cache": {
                "gpu_hot": {"max_adapters": 2},
                "cpu_warm": {"max_adapters": warm},
                "load_queue": {"max_concurrent_loads": asked},
            },
        }
    )
    assert config.adapter_cache.loads_at_once == at_once


# --- production (LORAHUB_PRODUCTION=1, set by the images) ---------------------------------------

PRODUCTION_ENV = {
    "LORAHUB_PRODUCTION": "1",
    "LORAHUB_SECRET_KEY": "k" * 30 + "-production-secret-key-0123456789",
    "LORAHUB_ALLOWED_HOSTS": "lorahub.example.com",
    "DATABASE_URL": "postgres://lorahub:Db-pass-7f3k9q2m@db.example.com:5432/lorahub",
    "CELERY_BROKER_URL": "redis://:Redis-pass-8h2j4k@redis.example.com:6379/0",
    "LORAHUB_BAD_KEY_STORAGE": "redis://:Redis-pass-8h2j4k@redis.example.com:6379/2",
    "LORAHUB_S3_ENDPOINT": "http://minio.example.com:9000",
    "LORAHUB_INTERNAL_TOKEN": "an-internal-token-4f8a1c9e",
    "LORAHUB_FIELD_KEYS": "1sKMwV0ZbUuXq6VwX9q6c8qcQm0K9d3m0y8m8fJ2H4o=",
}


def manage(*args: str, env: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        # the lane's own settings, and the browser tests' DJANGO_ALLOW_ASYNC_UNSAFE (which
        # check --deploy rightly refuses in production)
        if not k.startswith(("LORAHUB_", "DATABASE_", "CELERY_", "DJANGO_ALLOW_ASYNC"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=Path(lorahub_settings.BASE_DIR),
        env={**clean, "LORAHUB_VAR_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_check_deploy_is_clean_under_the_production_settings(tmp_path):
    checked = manage(
        "check", "--deploy", "--fail-level", "WARNING", env=PRODUCTION_ENV, tmp_path=tmp_path
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no issues" in checked.stdout


@pytest.mark.parametrize("missing", sorted(lorahub_settings.PRODUCTION_REQUIRED))
def test_a_missing_production_setting_stops_start_up_naming_it(missing, tmp_path):
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != missing}
    checked = manage("check", env=env, tmp_path=tmp_path)
    assert checked.returncode != 0
    assert f"{missing} must be set when LORAHUB_PRODUCTION=1" in checked.stderr
    assert not (tmp_path / "secret_key").exists()  # no embedded default was made instead


def test_a_weak_production_secret_key_is_refused(tmp_path):
    checked = manage(
        "check", env={**PRODUCTION_ENV, "LORAHUB_SECRET_KEY": "replace-me"}, tmp_path=tmp_path
    )
    assert checked.returncode != 0
    assert "LORAHUB_SECRET_KEY is too weak" in checked.stderr


def test_the_embedded_default_needs_none_of_them(tmp_path):
    checked = manage("check", env={}, tmp_path=tmp_path)
    assert checked.returncode == 0, checked.stderr
