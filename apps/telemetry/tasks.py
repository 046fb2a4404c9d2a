"""Celery tasks of the telemetry: the daily usage export (``exports.py``)."""

from __future__ import annotations

from celery import shared_task

from apps.telemetry import exports


@shared_task
def export_usage() -> list[str]:
    """Export the finished days that have no file yet (beat, hourly)."""
    return [day.isoformat() for day in exports.export_finished_days()]
