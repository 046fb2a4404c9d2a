"""lorahub settings: every knob is an environment variable read through a typed helper.

Embedded defaults need no outside service: SQLite, a local-directory object store and a
filesystem Celery transport, all under ``var/``. Setting ``DATABASE_URL``,
``CELERY_BROKER_URL`` and ``LORAHUB_S3_ENDPOINT`` switches the same code to PostgreSQL,
Redis and S3. A bad value fails start-up with ``ImproperlyConfigured`` naming the variable.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no"
    )


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum of {minimum}")
    return value


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


# --- core -----------------------------------------------------------------------------------

VAR_DIR = env_path("LORAHUB_VAR_DIR", BASE_DIR / "var")
DEBUG = env_bool("LORAHUB_DEBUG", False)
# The images set LORAHUB_PRODUCTION=1 (deploy/): every outside service must then be named, the
# embedded defaults (SQLite, a local folder for S3, a key generated per checkout) are refused,
# and the console's transport security is on (see "production" below).
PRODUCTION = env_bool("LORAHUB_PRODUCTION", False)
# Which part of the platform this process is: the control plane (console, worker, beat) or a
# serving node (the node image sets LORAHUB_PROCESS=node). A node gets the least it needs: it
# verifies signatures with the published public keys, signs no session and opens no sealed
# secret, so the signing key, SECRET_KEY and the field keys are refused on it.
PROCESS = env_str("LORAHUB_PROCESS", "control-plane")
if PROCESS not in ("control-plane", "node"):
    raise ImproperlyConfigured(f"LORAHUB_PROCESS={PROCESS!r}: use control-plane or node")
NODE_PROCESS = PROCESS == "node"
PRODUCTION_REQUIRED = {
    "LORAHUB_SECRET_KEY": "the key that signs console sessions; 50+ random characters",
    "LORAHUB_ALLOWED_HOSTS": "the host names the console answers to, comma-separated",
    "DATABASE_URL": "PostgreSQL, e.g. postgres://lorahub:secret@db:5432/lorahub",
    "CELERY_BROKER_URL": "Redis, e.g. redis://:password@redis:6379/0",
    "LORAHUB_S3_ENDPOINT": "the S3-compatible store, e.g. http://minio:9000",
    "LORAHUB_INTERNAL_TOKEN": "the token the console and HAProxy's checks use on nodes",
    "LORAHUB_FIELD_KEYS": "the Fernet key(s) that seal TOTP keys and webhook secrets",
}
NODE_REQUIRED = {
    **{
        name: PRODUCTION_REQUIRED[name]
        for name in ("DATABASE_URL", "LORAHUB_S3_ENDPOINT", "LORAHUB_INTERNAL_TOKEN")
    },
    "LORAHUB_EVENTS_URL": "the change broadcast as the nodes' Redis user, e.g. "
    "redis://lorahub-node:secret@redis:6379/0 (deploy/compose.yaml's ACL)",
}
NODE_REFUSED = {
    "LORAHUB_SECRET_KEY": "a node signs no session",
    "LORAHUB_SIGNING_KEY": "a node verifies with the published public keys only",
    "LORAHUB_SIGNING_KEY_FILE": "a node verifies with the published public keys only",
    "LORAHUB_BUNDLE_KEY": "a node signs no model-signing bundle",
    "LORAHUB_BUNDLE_KEY_FILE": "a node signs no model-signing bundle",
    "LORAHUB_FIELD_KEYS": "a node opens no sealed secret",
    "CELERY_BROKER_URL": "a node queues no task: it hears the change broadcast through "
    "LORAHUB_EVENTS_URL, as a Redis user that may do nothing else",
}
if PRODUCTION:
    if DEBUG:
        raise ImproperlyConfigured("LORAHUB_DEBUG must be off when LORAHUB_PRODUCTION=1")
    for _name, _what in (NODE_REQUIRED if NODE_PROCESS else PRODUCTION_REQUIRED).items():
        if not os.environ.get(_name, "").strip():
            raise ImproperlyConfigured(
                f"{_name} must be set when LORAHUB_PRODUCTION=1 (the images set it): {_what}"
            )
    if NODE_PROCESS:
        for _name, _why in NODE_REFUSED.items():
            if os.environ.get(_name, "").strip():
                raise ImproperlyConfigured(
                    f"{_name} is set on a serving node: remove it from the node's environment "
                    f"({_why}; docs/security.md, least privilege)"
                )
SECRET_KEY = env_str("LORAHUB_SECRET_KEY")
if PRODUCTION and not NODE_PROCESS and (len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5):
    raise ImproperlyConfigured(
        "LORAHUB_SECRET_KEY is too weak: use 50 or more random characters, e.g. "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )
if not SECRET_KEY and NODE_PROCESS:
    import secrets

    SECRET_KEY = secrets.token_urlsafe(50)  # per process: a node signs nothing with it
if not SECRET_KEY:
    if not DEBUG and env_bool("LORAHUB_REQUIRE_SECRET_KEY", False):
        raise ImproperlyConfigured("LORAHUB_SECRET_KEY must be set in production")
    # Embedded default: a per-checkout key, never a constant shared by every install.
    _key_file = VAR_DIR / "secret_key"
    if _key_file.exists():
        SECRET_KEY = _key_file.read_text().strip()
    else:
        import secrets

        SECRET_KEY = secrets.token_urlsafe(50)
        _key_file.parent.mkdir(parents=True, exist_ok=True)
        _key_file.write_text(SECRET_KEY)
        _key_file.chmod(0o600)
if PRODUCTION:
    # every secret refuses a placeholder or a short value at start, naming the variable
    from lorahub.tokens import check_secret as _check_secret
    from lorahub.tokens import url_password as _url_password

    for _name in (
        "LORAHUB_SECRET_KEY",
        "LORAHUB_INTERNAL_TOKEN",
        "LORAHUB_S3_SECRET_KEY",
        "LORAHUB_OIDC_CLIENT_SECRET",
    ):
        _check_secret(_name, env_str(_name))
    for _name in (
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "LORAHUB_BAD_KEY_STORAGE",
        "LORAHUB_EVENTS_URL",
    ):
        _check_secret(f"{_name}'s password", _url_password(env_str(_name)), min_length=12)
    if env_str("LORAHUB_SIGNING_KEY") and "PRIVATE KEY" not in env_str("LORAHUB_SIGNING_KEY"):
        raise ImproperlyConfigured(
            "LORAHUB_SIGNING_KEY is not a PEM private key (still a placeholder?): "
            "openssl genpkey -algorithm ed25519"
        )
    if env_str("LORAHUB_BUNDLE_KEY") and "PRIVATE KEY" not in env_str("LORAHUB_BUNDLE_KEY"):
        raise ImproperlyConfigured(
            "LORAHUB_BUNDLE_KEY is not a PEM private key (still a placeholder?): "
            "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256"
        )

ALLOWED_HOSTS = env_list("LORAHUB_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    # Django's admin under the console's sign-in rules (lorahub/admin.py)
    "lorahub.admin.LorahubAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",  # thousands separators on the usage page
    # django-ninja's Swagger UI files, served locally (no CDN: machines may have no internet)
    "ninja",
    "axes",
    # the second factor's devices: TOTP, and single-use recovery codes (docs/security.md)
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",
    "mozilla_django_oidc",
    "apps.tenants",
    "apps.registry",
    "apps.telemetry",
    "apps.fleet",
    "apps.serving",
    "apps.evaluations",
    "apps.releases",
    "apps.demo",
]

MIDDLEWARE = [
    # the caller's address from X-Forwarded-For, believed from LORAHUB_TRUSTED_PROXIES only
    "lorahub.addresses.CallerAddressMiddleware",
    # bodies read into memory are bounded before anything reads them (lorahub/body_limit.py)
    "lorahub.body_limit.BodyLimitMiddleware",
    # /healthz for probes, before the host and HTTPS checks (lorahub/health.py)
    "lorahub.health.HealthCheckMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # reviewers and operators without their second factor go to set it up (docs/security.md)
    "apps.tenants.signin.SecondFactorMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # last, as django-axes asks: it turns a locked-out login into its lockout response
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "lorahub.urls"
WSGI_APPLICATION = "lorahub.wsgi.application"
ASGI_APPLICATION = "lorahub.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.tenants.context.console_nav",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------

_database_url = env_str("DATABASE_URL")
if _database_url:
    try:
        # Persistent connections (60 s), checked before reuse: after a database restart the
        # next query reconnects instead of failing on the dead connection (the node's threads,
        # the worker and the console alike).
        DATABASES = {
            "default": dj_database_url.parse(
                _database_url, conn_max_age=60, conn_health_checks=True
            )
        }
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL: {exc}") from None
else:
    # The embedded default is written by four processes at once (console, worker, the node's
    # statistics and heartbeat): WAL lets readers run beside the one writer, a writer waits
    # for the lock (busy timeout) instead of failing with "database is locked", and IMMEDIATE
    # transactions take the write lock when they begin, so none fails half-way on upgrading.
    # Connections persist (60 s) as on PostgreSQL: opening one (Django registers its functions,
    # runs the PRAGMAs) was most of an idle node's CPU, whose change poll runs twice a second.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "lorahub.sqlite3",
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# The images collect static files at build time into a folder of the image (read-only).
STATIC_ROOT = env_path("LORAHUB_STATIC_ROOT", VAR_DIR / "staticfiles")
# Serve static files from the app folders too, so the console works before collectstatic.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Plotly's JavaScript comes from the installed plotly package, never a CDN.
import plotly as _plotly  # noqa: E402

STATICFILES_DIRS.append(("plotly", Path(_plotly.__file__).resolve().parent / "package_data"))

# --- console security ---------------------------------------------------------------------------
# In production (LORAHUB_PRODUCTION=1) the console sits behind a TLS-terminating proxy or
# ingress that says X-Forwarded-Proto: plain-HTTP requests are redirected to HTTPS and browsers
# told to stay there (HSTS). /healthz answers before this (lorahub/health.py).
if env_bool("LORAHUB_TRUST_FORWARDED_PROTO", PRODUCTION):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("LORAHUB_SSL_REDIRECT", PRODUCTION)
SECURE_HSTS_SECONDS = env_int("LORAHUB_HSTS_SECONDS", 31536000 if PRODUCTION else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("LORAHUB_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
# Preloading is a commitment an operator makes for a whole domain (hstspreload.org), not one
# an application can make for it: off unless asked, and check --deploy's reminder silenced.
SECURE_HSTS_PRELOAD = env_bool("LORAHUB_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = ["security.W021"]
# Cookies are Secure outside debug (browsers accept Secure cookies from http://127.0.0.1 and
# localhost, so `make run` still signs in); LORAHUB_SECURE_COOKIES=0 turns that off behind a
# TLS-terminating proxy that speaks plain HTTP to us on another host name.
SECURE_COOKIES = env_bool("LORAHUB_SECURE_COOKIES", not DEBUG)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True  # pages carry the token in a <meta> tag for their scripts
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
CSRF_FAILURE_VIEW = "apps.tenants.views.csrf_failure"

# Content-Security-Policy: scripts and styles from our own origin only; no inline script and
# no eval. Plotly writes inline styles into its SVG, hence 'unsafe-inline' for styles alone.
from csp.constants import NONE, SELF, UNSAFE_INLINE  # noqa: E402

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:", "blob:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# Login throttling (django-axes): 5 failures for one user name from one address lock that pair
# out for 15 minutes, and so do 5 for one user name from any addresses (a guesser with many
# addresses); a success resets the count. An operator lifts a lockout early with
# `manage.py axes_reset_username NAME` (docs/security.md).
AUTHENTICATION_BACKENDS = [
    "apps.tenants.backends.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("LORAHUB_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = 0.25  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "username"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

# --- sign-in: OpenID Connect, local passwords, the second factor (docs/security.md) -----------
# OpenID Connect is on when an issuer is set: the console shows "Sign in with <name>" and takes
# each user's roles from the provider's groups at every sign-in. The provider's endpoints come
# from its discovery document; its keys from its key set (fetched again on an unknown key id).
# the issuer exactly as the provider publishes it (a trailing "/" is kept: Auth0, authentik)
OIDC_ISSUER = env_str("LORAHUB_OIDC_ISSUER").strip()
OIDC_NAME = env_str("LORAHUB_OIDC_NAME", "single sign-on")
OIDC_RP_CLIENT_ID = env_str("LORAHUB_OIDC_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env_str("LORAHUB_OIDC_CLIENT_SECRET")
OIDC_RP_SCOPES = env_str("LORAHUB_OIDC_SCOPES", "openid email profile groups")
OIDC_GROUPS_CLAIM = env_str("LORAHUB_OIDC_GROUPS_CLAIM", "groups")
OIDC_USERNAME_CLAIM = env_str("LORAHUB_OIDC_USERNAME_CLAIM", "preferred_username")
# group → role: "lorahub-operators=operator, lorahub-reviewers=reviewer, acme-admins=admin:acme,
# acme-members=member:acme", or a YAML file of the same (LORAHUB_OIDC_ROLES_FILE)
OIDC_ROLES = env_str("LORAHUB_OIDC_ROLES")
OIDC_ROLES_FILE = env_str("LORAHUB_OIDC_ROLES_FILE")
# which sign-ins count as a second factor: an `amr` value among these, or an `acr` among these
OIDC_MFA_AMR = env_list("LORAHUB_OIDC_MFA_AMR", ["mfa", "otp", "hwk", "swk", "sc", "fpt"])
OIDC_MFA_ACR = env_list("LORAHUB_OIDC_MFA_ACR", [])
OIDC_TIMEOUT = env_int("LORAHUB_OIDC_TIMEOUT_S", 10, minimum=1)
OIDC_CLOCK_SKEW_S = env_int("LORAHUB_OIDC_CLOCK_SKEW_S", 30, minimum=0)
# a token signed with a key id not seen yet fetches the key set again at once, at most this often
OIDC_KEY_REFETCH_S = env_int("LORAHUB_OIDC_KEY_REFETCH_S", 2, minimum=0)
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_STORE_ID_TOKEN = True  # the logout's id_token_hint
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_callback"
if OIDC_ISSUER:
    if not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
        raise ImproperlyConfigured(
            "LORAHUB_OIDC_ISSUER is set: set LORAHUB_OIDC_CLIENT_ID and "
            "LORAHUB_OIDC_CLIENT_SECRET too (the client registered with the provider)"
        )
    AUTHENTICATION_BACKENDS.append("apps.tenants.oidc.ProviderBackend")
# Local passwords; off: only the break-glass account signs in with one (an outage of the
# provider must not lock the platform team out)
LOCAL_SIGN_IN = env_bool("LORAHUB_LOCAL_SIGN_IN", True)
BREAK_GLASS_USER = env_str("LORAHUB_BREAK_GLASS_USER")
if not LOCAL_SIGN_IN and not OIDC_ISSUER:
    raise ImproperlyConfigured(
        "LORAHUB_LOCAL_SIGN_IN=0 needs LORAHUB_OIDC_ISSUER: nobody but the break-glass "
        "account could sign in"
    )
# Reviewers and operators need a second factor: TOTP for a password, the provider's amr/acr
# for single sign-on. Approving or rejecting a version, lifting a quarantine, changing the
# tiers' capacities and promoting or aborting a release are refused without one.
REQUIRE_SECOND_FACTOR = env_bool("LORAHUB_REQUIRE_SECOND_FACTOR", PRODUCTION)
if OIDC_ISSUER:
    # sign-out is a form whose answer redirects to the provider's logout: browsers hold such
    # redirects to the page's form-action
    from urllib.parse import urlsplit as _urlsplit

    _provider = _urlsplit(OIDC_ISSUER)
    CONTENT_SECURITY_POLICY["DIRECTIVES"]["form-action"].append(
        f"{_provider.scheme}://{_provider.netloc}"
    )
# Django's admin (/admin/): off in production unless asked for; when on, the console's sign-in
# rules apply to it (lorahub/admin.py)
LORAHUB_DJANGO_ADMIN = env_bool("LORAHUB_DJANGO_ADMIN", not PRODUCTION)
# The keys that seal TOTP keys and webhook secrets at rest (apps/tenants/sealing.py): Fernet
# keys, comma-separated; the first seals, every one opens. Required in production for the
# control plane; a serving node never holds them. The embedded default is made per checkout.
LORAHUB_FIELD_KEYS = env_list("LORAHUB_FIELD_KEYS", [])
if not LORAHUB_FIELD_KEYS and not (PRODUCTION or NODE_PROCESS):
    _field_keys = VAR_DIR / "field-keys"
    if not _field_keys.exists():
        import base64
        import secrets

        _field_keys.parent.mkdir(parents=True, exist_ok=True)
        _field_keys.write_text(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode())
        _field_keys.chmod(0o600)
    LORAHUB_FIELD_KEYS = [_field_keys.read_text().strip()]
# How recent a password (and code) must be to set up a first second factor as a reviewer or
# operator, or to make new recovery codes
LORAHUB_FRESH_SIGN_IN_S = env_int("LORAHUB_FRESH_SIGN_IN_S", 600, minimum=30)
# Admin API keys stand in for a second factor: they must expire, within this many days
LORAHUB_ADMIN_KEY_MAX_DAYS = env_int("LORAHUB_ADMIN_KEY_MAX_DAYS", 90, minimum=1)
OTP_TOTP_ISSUER = env_str("LORAHUB_TOTP_ISSUER", "lorahub")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # control characters in a message are escaped: text from outside cannot forge a line
    "formatters": {
        "plain": {
            "()": "lorahub.logs.PlainFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LORAHUB_LOG_LEVEL", "INFO")},
    # django-axes logs every sign-in at INFO; lockouts are WARNING and still show
    "loggers": {"axes": {"level": "WARNING"}},
}

# --- Celery ---------------------------------------------------------------------------------
# Redis when CELERY_BROKER_URL is set; otherwise kombu's filesystem transport under var/, which
# still runs a real worker process and needs no server.

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL")
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND")
if CELERY_BROKER_URL:
    CELERY_RESULT_BACKEND = CELERY_RESULT_BACKEND or CELERY_BROKER_URL
elif NODE_PROCESS and PRODUCTION:
    # a node in production queues no task and holds no broker password (docs/security.md)
    CELERY_BROKER_URL = "memory://"
    CELERY_RESULT_BACKEND = CELERY_RESULT_BACKEND or "cache+memory://"
else:
    _queue_dir = VAR_DIR / "celery"
    for _sub in ("queue", "processed", "results", "control"):
        (_queue_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # the exchange tables too, or kombu writes them to ./control in the working directory
        "control_folder": str(_queue_dir / "control"),
        "data_folder_in": str(_queue_dir / "queue"),
        "data_folder_out": str(_queue_dir / "queue"),
        "processed_folder": str(_queue_dir / "processed"),
        "store_processed": False,
    }
    CELERY_RESULT_BACKEND = CELERY_RESULT_BACKEND or f"file://{_queue_dir / 'results'}"
CELERY_TASK_ACKS_LATE = True
# A version still validating this long after its upload is queued again (worker killed
# mid-task, message lost); `celery beat` (or `manage.py up`'s worker, started with -B) runs
# the sweep every 5 minutes, and each worker once at start.
LORAHUB_VALIDATION_STALE_S = env_int("LORAHUB_VALIDATION_STALE_S", 600, minimum=10)
# Releases are judged on the beat: each round judges the active releases whose plan's
# interval (default 30 s) has passed; the tick bounds how late a judgement may be.
LORAHUB_RELEASE_TICK_S = env_int("LORAHUB_RELEASE_TICK_S", 5, minimum=1)
CELERY_BEAT_SCHEDULE = {
    "sweep-stale-validations": {
        "task": "apps.registry.tasks.sweep_stale_validations",
        "schedule": 300.0,
    },
    "judge-releases": {
        "task": "apps.releases.tasks.judge_releases",
        "schedule": LORAHUB_RELEASE_TICK_S,
    },
    # webhook deliveries whose message was lost; nodes gone quiet (the operators' node.down)
    "sweep-webhooks": {"task": "apps.tenants.tasks.sweep_webhooks", "schedule": 60.0},
    "watch-nodes": {"task": "apps.fleet.tasks.watch_nodes", "schedule": 30.0},
    # nodes report quarantines as rows; the control plane checks, audits and announces them
    "announce-quarantines": {"task": "apps.fleet.tasks.announce_quarantines", "schedule": 15.0},
    # the daily usage export (apps/telemetry/exports.py): hourly, it writes each finished day once
    "export-usage": {"task": "apps.telemetry.tasks.export_usage", "schedule": 3600.0},
}
# How long after a UTC day ends its usage file waits for the nodes' late records (a request is
# recorded when it ends, under the minute it started in).
LORAHUB_USAGE_EXPORT_DELAY_S = env_int("LORAHUB_USAGE_EXPORT_DELAY_S", 900, minimum=0)
# --- notifications (apps/tenants/webhooks.py) ---
# A receiver must be public (the URL is a tenant's): private, loopback and link-local
# addresses are refused unless allowed; HTTPS is required in production.
LORAHUB_WEBHOOK_ALLOW_PRIVATE = env_bool("LORAHUB_WEBHOOK_ALLOW_PRIVATE", False)
LORAHUB_WEBHOOK_REQUIRE_HTTPS = env_bool("LORAHUB_WEBHOOK_REQUIRE_HTTPS", PRODUCTION)
LORAHUB_WEBHOOK_TIMEOUT_S = env_int("LORAHUB_WEBHOOK_TIMEOUT_S", 10, minimum=1)
LORAHUB_WEBHOOK_ATTEMPTS = env_int("LORAHUB_WEBHOOK_ATTEMPTS", 8, minimum=1)
# deliveries never take a proxy from the environment (HTTP_PROXY...); one named here, they do
LORAHUB_WEBHOOK_PROXY = env_str("LORAHUB_WEBHOOK_PROXY")
# Webhook deliveries have a queue of their own: a receiver that answers slowly must not hold
# the slots that validate uploads and judge releases. A worker started without -Q takes both
# (`make run`, the tests); production runs `worker` (-Q celery) and `webhooks` (-Q webhooks).
from kombu import Queue as _Queue  # noqa: E402

CELERY_TASK_QUEUES = (_Queue("celery"), _Queue("webhooks"))
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_ROUTES = {"apps.tenants.tasks.deliver_webhook": {"queue": "webhooks"}}
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Every task has a time limit: a task that waits on something silent gives its slot back. The
# soft limit raises inside the task (an evaluation run is failed with the reason); the hard
# one, 30 s later, ends the worker process that still runs it. Evaluation runs answer up to
# 500 cases twice, so they have a limit of their own.
LORAHUB_TASK_TIME_LIMIT_S = env_int("LORAHUB_TASK_TIME_LIMIT_S", 900, minimum=60)
LORAHUB_EVALUATION_TIME_LIMIT_S = env_int("LORAHUB_EVALUATION_TIME_LIMIT_S", 3600, minimum=60)
CELERY_TASK_SOFT_TIME_LIMIT = LORAHUB_TASK_TIME_LIMIT_S
CELERY_TASK_TIME_LIMIT = LORAHUB_TASK_TIME_LIMIT_S + 30

# --- object store ---------------------------------------------------------------------------
# S3 (any S3-compatible endpoint) when LORAHUB_S3_ENDPOINT is set; otherwise a local directory
# with the same interface.

LORAHUB_S3_ENDPOINT = env_str("LORAHUB_S3_ENDPOINT")
LORAHUB_S3_BUCKET = env_str("LORAHUB_S3_BUCKET", "lorahub")
LORAHUB_S3_REGION = env_str("LORAHUB_S3_REGION", "us-east-1")
LORAHUB_S3_ACCESS_KEY = env_str("LORAHUB_S3_ACCESS_KEY")
LORAHUB_S3_SECRET_KEY = env_str("LORAHUB_S3_SECRET_KEY")
LORAHUB_LOCAL_STORE_DIR = env_path("LORAHUB_LOCAL_STORE_DIR", VAR_DIR / "objectstore")
if LORAHUB_S3_ENDPOINT and not LORAHUB_S3_ENDPOINT.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"LORAHUB_S3_ENDPOINT={LORAHUB_S3_ENDPOINT!r} must start with http:// or https://"
    )

# --- serving ----------------------------------------------------------------------------------

LORAHUB_CACHE_CONFIG = env_path("LORAHUB_CACHE_CONFIG", BASE_DIR / "lorahub" / "cache.yaml")
LORAHUB_DEMO_DIR = env_path("LORAHUB_DEMO_DIR", VAR_DIR / "demo")
LORAHUB_BASE_MODEL_DIR = env_path("LORAHUB_BASE_MODEL_DIR", LORAHUB_DEMO_DIR / "base-model")
LORAHUB_ENGINE_DTYPE = env_str("LORAHUB_ENGINE_DTYPE", "float32")
# KV cache for the engine, in MiB (vLLM on the CPU otherwise reserves whole GiB).
LORAHUB_ENGINE_KV_CACHE_MB = env_int("LORAHUB_ENGINE_KV_CACHE_MB", 64, minimum=16)
LORAHUB_ENGINE_MAX_MODEL_LEN = env_int("LORAHUB_ENGINE_MAX_MODEL_LEN", 512, minimum=32)
# Tokens one engine step may take (vLLM's max_num_batched_tokens; long prompts are prefilled
# in chunks of it). A step is as long as its tokens: a request arriving while a flood of long
# prompts is prefilled waits at least one step for its first token (bench/noisy_neighbour.py).
LORAHUB_ENGINE_MAX_BATCHED_TOKENS = env_int("LORAHUB_ENGINE_MAX_BATCHED_TOKENS", 256, minimum=64)
# vLLM's prefix cache (KV blocks of shared prompt prefixes reused across requests). Safe with
# LoRA here: a version's engine name and id are its own and never reused (cache/manager.py
# lora_id_for), so one version's cached blocks never answer for another (vLLM #30931);
# tests/serving/node/test_cache_node.py moves an alias with it on.
LORAHUB_ENGINE_PREFIX_CACHING = env_bool("LORAHUB_ENGINE_PREFIX_CACHING", False)
LORAHUB_NODE_HOST = env_str("LORAHUB_NODE_HOST", "127.0.0.1")
LORAHUB_NODE_PORT = env_int("LORAHUB_NODE_PORT", 8001, minimum=1)

# --- signing ----------------------------------------------------------------------------------
# The control plane's Ed25519 private key (PEM): LORAHUB_SIGNING_KEY holds it inline, or
# LORAHUB_SIGNING_KEY_FILE names a file. `manage.py init_signing_key` creates the embedded
# default under var/. Retired public keys (base64, comma-separated) stay published so that
# versions signed before a key rotation still verify.
LORAHUB_SIGNING_KEY = env_str("LORAHUB_SIGNING_KEY")
LORAHUB_SIGNING_KEY_FILE = env_path("LORAHUB_SIGNING_KEY_FILE", VAR_DIR / "signing-key.pem")
LORAHUB_RETIRED_PUBLIC_KEYS = env_list("LORAHUB_RETIRED_PUBLIC_KEYS", [])
# The ECDSA P-256 key (PEM) of the OpenSSF model-signing bundles (apps/registry/bundles.py):
# inline, or a file (default: model-signing-key.pem beside the Ed25519 key's file, which
# `init_signing_key` creates with it).
LORAHUB_BUNDLE_KEY = env_str("LORAHUB_BUNDLE_KEY")
LORAHUB_BUNDLE_KEY_FILE = env_str("LORAHUB_BUNDLE_KEY_FILE")

# --- uploads ----------------------------------------------------------------------------------
# Hard ceiling for one upload, whatever a tenant's quota says; uploads stream to disk beyond
# FILE_UPLOAD_MAX_MEMORY_SIZE.
LORAHUB_MAX_UPLOAD_MB = env_int("LORAHUB_MAX_UPLOAD_MB", 1024, minimum=1)
# Every other body (forms, JSON) the console reads into memory: bounded, or one anonymous
# 300 MB POST takes the console's memory (CSRF reads the form before any view runs).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("LORAHUB_MAX_BODY_KB", 10240, minimum=64) * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024

# --- API keys -------------------------------------------------------------------------------
# Repeated bad API keys from one client address get 429 (apps/tenants/throttle.py), on the REST
# API and on every node: at most LORAHUB_BAD_KEY_LIMIT of them in a moving window ("20/minute",
# "100/hour"). Counts are per process ("memory://") unless a shared store is named (redis://...).
LORAHUB_BAD_KEY_LIMIT = env_str("LORAHUB_BAD_KEY_LIMIT", "20/minute")
LORAHUB_BAD_KEY_STORAGE = env_str("LORAHUB_BAD_KEY_STORAGE", "memory://")
# Audit events of nobody signed in (failed sign-ins, a provider's errors) per caller address
LORAHUB_ANONYMOUS_AUDIT_LIMIT = env_str("LORAHUB_ANONYMOUS_AUDIT_LIMIT", "30/minute")
try:
    import limits as _limits

    _limits.parse(LORAHUB_BAD_KEY_LIMIT)
    _limits.parse(LORAHUB_ANONYMOUS_AUDIT_LIMIT)
except ValueError:
    raise ImproperlyConfigured(
        f"LORAHUB_BAD_KEY_LIMIT={LORAHUB_BAD_KEY_LIMIT!r} or LORAHUB_ANONYMOUS_AUDIT_LIMIT="
        f"{LORAHUB_ANONYMOUS_AUDIT_LIMIT!r} is not a rate; write e.g. 20/minute"
    ) from None
# The routers (HAProxy, an ingress) whose X-Forwarded-For the console and the nodes believe for
# the caller's address (lorahub/addresses.py): addresses or networks, comma-separated; never *.
# LORAHUB_NODE_TRUSTED_PROXIES is its older name.
LORAHUB_TRUSTED_PROXIES = env_str(
    "LORAHUB_TRUSTED_PROXIES", env_str("LORAHUB_NODE_TRUSTED_PROXIES", "127.0.0.1, ::1")
)
# Where a node's control API (/internal/) may be called from, besides needing the internal
# token: the console's and the router's network (the caller's address, as above).
LORAHUB_INTERNAL_NETWORKS = env_str("LORAHUB_INTERNAL_NETWORKS", "127.0.0.0/8, ::1")
from lorahub.addresses import parse_networks as _parse_networks  # noqa: E402

_parse_networks(LORAHUB_TRUSTED_PROXIES)
_parse_networks(LORAHUB_INTERNAL_NETWORKS, name="LORAHUB_INTERNAL_NETWORKS")

# --- change events ----------------------------------------------------------------------------
# Alias, key and quota changes are broadcast to every serving node over Redis pub/sub (works
# across machines). Defaults to the Celery broker when that is Redis; with no Redis (the embedded
# default) nodes poll the database's change marker instead. Either way a periodic full refresh
# is the safety net.
LORAHUB_EVENTS_URL = env_str(
    "LORAHUB_EVENTS_URL", CELERY_BROKER_URL if CELERY_BROKER_URL.startswith("redis") else ""
)
LORAHUB_EVENTS_CHANNEL = env_str("LORAHUB_EVENTS_CHANNEL", "lorahub:changes")
LORAHUB_NODE_FULL_REFRESH_S = env_int("LORAHUB_NODE_FULL_REFRESH_S", 30, minimum=1)

# --- request statistics -----------------------------------------------------------------------
# How often a node writes its request statistics. Each write costs a few upserts per
# (minute, tenant, alias, version) touched, whatever the traffic: writing every second was a
# quarter of the node process's busy time at one request at a time (py-spy, 3 aliases).
LORAHUB_STATS_FLUSH_MS = env_int("LORAHUB_STATS_FLUSH_MS", 2000, minimum=100)
# Shadow traffic: the share of a node's generation slots shadow copies may hold at once (at
# least one); beyond it, and whenever a caller waits, copies are dropped and counted.
# Test seams on a node (apps/serving/node/seams.py: faults injected per version); tests only.
LORAHUB_TEST_SEAMS = env_bool("LORAHUB_TEST_SEAMS", False)
LORAHUB_SHADOW_BUDGET_PERCENT = env_int("LORAHUB_SHADOW_BUDGET_PERCENT", 20, minimum=0)
# ... and they start only while callers hold at most this share of the generation slots: on a
# busy engine every sequence in the batch slows the others (bench/shadow.py measures it).
LORAHUB_SHADOW_WHILE_BUSY_BELOW_PERCENT = env_int(
    "LORAHUB_SHADOW_WHILE_BUSY_BELOW_PERCENT", 25, minimum=1
)
# How long a shadow's kept examples (prompts with both answers; only for aliases that ask) stay.
LORAHUB_SHADOW_EXAMPLE_RETENTION_DAYS = env_int(
    "LORAHUB_SHADOW_EXAMPLE_RETENTION_DAYS", 7, minimum=1
)
LORAHUB_REQUEST_LOG_RETENTION_DAYS = env_int("LORAHUB_REQUEST_LOG_RETENTION_DAYS", 7, minimum=1)
LORAHUB_ROLLUP_RETENTION_DAYS = env_int("LORAHUB_ROLLUP_RETENTION_DAYS", 90, minimum=1)
LORAHUB_NODE_NAME = env_str("LORAHUB_NODE_NAME", "node-1")
# Arrival traces the console's replay page offers (by name, never by a path from a browser).
LORAHUB_TRACES_DIR = env_path("LORAHUB_TRACES_DIR", BASE_DIR.parent / "shared" / "traces")
# Overload: concurrent generations, and requests allowed to wait for one; beyond, 503.
LORAHUB_NODE_MAX_CONCURRENT = env_int("LORAHUB_NODE_MAX_CONCURRENT", 32, minimum=1)
LORAHUB_NODE_MAX_QUEUE = env_int("LORAHUB_NODE_MAX_QUEUE", 64, minimum=0)
# Seats of the engine's batch beyond MAX_CONCURRENT that only a tenant below its fair share may
# take (apps/serving/fairness.py): a tenant flooding the node fills MAX_CONCURRENT, and
# another's request still enters the next step. The engine's max_num_seqs is the sum.
LORAHUB_NODE_FAIR_HEADROOM = env_int("LORAHUB_NODE_FAIR_HEADROOM", 8, minimum=0)
# Prefetch from rising demand (apps/serving/node/demand.py). Off by default: the replay does
# not model it yet, and with it on the replay's tiers stop matching the node's.
LORAHUB_NODE_PREFETCH_RISING = env_bool("LORAHUB_NODE_PREFETCH_RISING", False)
# While idle (nothing in the engine's batch, nothing loading), a node re-hashes one L3 copy
# every SCRUB_EVERY_S against its seal (apps/serving/cache/disk.py); 0: never.
LORAHUB_NODE_SCRUB_EVERY_S = env_int("LORAHUB_NODE_SCRUB_EVERY_S", 30, minimum=0)
# An adapter waiting for a device slot is next once this many free slots went to adapters that
# began waiting after it (apps/serving/cache/gate.py); 0: only the bound in seconds.
LORAHUB_NODE_GATE_MAX_PASSED = env_int("LORAHUB_NODE_GATE_MAX_PASSED", 4, minimum=0)
# With nothing pinned, up to max_cpu_loras adapters may have requests in vLLM, whose scheduler
# picks max_loras of them a step (apps/serving/cache/gate.py, GateRule); off: max_loras.
LORAHUB_NODE_GATE_WIDE = env_bool("LORAHUB_NODE_GATE_WIDE", False)
# The largest request body a node reads (a prompt, messages); beyond, 413 naming the limit.
LORAHUB_NODE_MAX_BODY_KB = env_int("LORAHUB_NODE_MAX_BODY_KB", 4096, minimum=16)
# A node's stop (SIGTERM, apps/serving/node/drain.py): it stays out of rotation answering 503
# for at least LEAVE_S (the router's health checks notice), and waits up to TIMEOUT_S for the
# requests under way. Kubernetes' terminationGracePeriodSeconds must exceed preStop + TIMEOUT_S.
LORAHUB_NODE_DRAIN_LEAVE_S = env_int("LORAHUB_NODE_DRAIN_LEAVE_S", 3, minimum=0)
LORAHUB_NODE_DRAIN_TIMEOUT_S = env_int("LORAHUB_NODE_DRAIN_TIMEOUT_S", 60, minimum=0)
LORAHUB_NODE_CACHE_DIR = env_path("LORAHUB_NODE_CACHE_DIR", VAR_DIR / "node-cache")
# The node's internal control API (/internal/*): off unless a token is set.
LORAHUB_INTERNAL_TOKEN = env_str("LORAHUB_INTERNAL_TOKEN")
# Where the control plane reaches this node (its row in the node registry); default: the
# address it listens on. Set it when the node listens on 0.0.0.0 or behind NAT.
LORAHUB_NODE_URL = env_str("LORAHUB_NODE_URL")
# The node registry: each node heartbeats every LORAHUB_NODE_HEARTBEAT_S; one silent for
# LORAHUB_NODE_LOST_AFTER_S is shown as lost.
LORAHUB_NODE_HEARTBEAT_S = env_int("LORAHUB_NODE_HEARTBEAT_S", 2, minimum=1)
LORAHUB_NODE_LOST_AFTER_S = env_int("LORAHUB_NODE_LOST_AFTER_S", 10, minimum=2)
# Nodes the console shows and steers besides the registered ones ("name=http://host:port",
# comma-separated), reached server-side with the internal token. Registered nodes need no entry.
LORAHUB_NODES = env_list("LORAHUB_NODES", [])
# HAProxy's internal listener (``manage.py haproxy_config``): alias-level warm/evict go through
# it, so they reach the node(s) that HAProxy routes the alias to. Unset: they go to every node.
LORAHUB_ROUTER_INTERNAL_URL = env_str("LORAHUB_ROUTER_INTERNAL_URL").rstrip("/")
for _entry in LORAHUB_NODES:
    _name, _, _url = _entry.partition("=")
    if not _name or not _url.startswith(("http://", "https://")):
        raise ImproperlyConfigured(
            f"LORAHUB_NODES entry {_entry!r} must look like name=http://host:port"
        )
