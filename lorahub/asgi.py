from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from lorahub import tracing
from lorahub.body_limit import BodyLimit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lorahub.settings")
tracing.instrument_console()  # off unless OTEL_EXPORTER_OTLP_ENDPOINT is set
# bodies are bounded before Django spools them to disk (lorahub/body_limit.py)
application = BodyLimit(get_asgi_application())
