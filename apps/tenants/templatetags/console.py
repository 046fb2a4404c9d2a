"""Template helpers of the console: sortable headers, state badges, sizes."""

from __future__ import annotations

from django import template
from django.utils.html import format_html

register = template.Library()

BADGES = {
    "validating": "info",
    "pending_review": "warn",
    "approved": "ok",
    "rejected": "bad",
    "deprecated": "muted",
    "quarantined": "bad",
    "pinned": "ok",
    "held": "ok",
    "landing": "warn",
    "loading": "warn",
    "in engine": "info",
    "on disk": "muted",
    "absent": "muted",
    "ready": "ok",
    "starting": "warn",
    "restarting": "warn",
    "dead": "bad",
    "lost": "bad",
    "stopped": "muted",
}


@register.simple_tag(takes_context=True)
def sort_header(context, key: str, label: str):
    """A column header that sorts by ``key``; a second click reverses the order."""
    request = context["request"]
    current = context.get("table").sort if context.get("table") else ""
    params = request.GET.copy()
    params.pop("page", None)
    arrow = ""
    if current.lstrip("-") == key:
        descending = current.startswith("-")
        params["sort"] = key if descending else f"-{key}"
        arrow = " ▼" if descending else " ▲"
        aria = "descending" if descending else "ascending"
    else:
        params["sort"] = key
        aria = "none"
    return format_html(
        '<th aria-sort="{}"><a href="?{}">{}{}</a></th>', aria, params.urlencode(), label, arrow
    )


@register.filter
def badge(state: str):
    label = str(state).replace("_", " ")
    return format_html('<span class="badge badge-{}">{}</span>', BADGES.get(state, "muted"), label)


@register.filter
def size(n):
    if n is None or n == "":
        return "—"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


@register.filter
def ms(value):
    return "—" if value is None else f"{value:.1f} ms"


@register.filter
def percent(value):
    return "—" if value is None else f"{100 * value:.1f} %"


@register.filter
def weights_sha(files) -> str:
    """The sha256 of a version's weights file, from its ``files`` manifest."""
    return ((files or {}).get("adapter_model.safetensors") or {}).get("sha256", "")
