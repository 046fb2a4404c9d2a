from __future__ import annotations

from lorahub.celery import app as celery_app

__all__ = ["celery_app"]
