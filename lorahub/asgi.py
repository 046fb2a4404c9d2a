from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from lorahub import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")
tracing.instrument_console()  # off unless OTEL_EXPORTER_OTLP_ENDPOINT is set
application = get_asgi_application()
