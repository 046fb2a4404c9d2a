"""Console page of the serving side: the adapter-cache configuration (``config.py``)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.serving import config
from apps.serving.cache.policies import POLICIES
from apps.tenants.console import (
    operators,
    principal_of,
    require,
    second_factor_page,
)
from apps.tenants.errors import Invalid, SecondFactorRequired
from lorahub.cacheconfig import config_problems

FIXED_KEYS = ("adapter_cache.placement.key_fields",)


CHOICES = {
    "adapter_cache.gpu_hot.eviction_policy": POLICIES,
    "on_overload": ("wait", "degrade", "reject"),
}


RESTART_KEYS = (
    "base_model",
    "base_model_revision",
    "adapter_cache.gpu_hot.max_adapters",
    "adapter_cache.gpu_hot.max_lora_rank",
    "adapter_cache.cpu_warm.max_adapters",
)


def _leaves(data: dict, prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _leaves(value, f"{path}.")
        else:
            out.append((path, value))
    return out


def _set(data: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[last] = value


def _parse(raw: str, current: object) -> object:
    """A form value in the type of the current value; left as text when it does not parse,
    so that validation names the field and says what it expects."""
    raw = raw.strip()
    if isinstance(current, bool):
        return raw == "on"
    if isinstance(current, int):
        try:
            return int(raw)
        except ValueError:
            return raw
    if isinstance(current, float):
        try:
            return float(raw)
        except ValueError:
            return raw
    if isinstance(current, list):
        return [item.strip() for item in raw.split(",") if item.strip()]
    return raw


def _fields(values: dict, errors: dict[str, str], restart: list[str]) -> list[dict]:
    fields = []
    for path, value in _leaves(values):
        if path in FIXED_KEYS:
            continue
        choices = CHOICES.get(path) or CHOICES.get(path.rsplit(".", 1)[-1])
        kind = (
            "checkbox"
            if isinstance(value, bool)
            else "select"
            if choices
            else "number"
            if isinstance(value, int | float)
            else "text"
        )
        fields.append(
            {
                "path": path,
                "section": path.rsplit(".", 1)[0] if "." in path else "model",
                "label": path.rsplit(".", 1)[-1].replace("_", " "),
                "value": ", ".join(value) if isinstance(value, list) else value,
                "kind": kind,
                "choices": choices,
                "step": "any" if isinstance(value, float) else "1",
                "error": errors.get(path),
                "restart": path in RESTART_KEYS,
                "needs_restart": path in restart,
            }
        )
    return fields


@require(operators, "operators")
def cache_config(request: HttpRequest) -> HttpResponse:
    current = config.effective_config().model_dump(mode="json")
    errors: dict[str, str] = {}
    restart: list[str] = []
    values = current
    status = 200
    if request.method == "POST":
        values = {}
        for path, value in _leaves(current):
            raw = value if path in FIXED_KEYS else _parse(request.POST.get(path, ""), value)
            _set(values, path, raw)
        errors = config_problems(values)
        if errors:
            status = 422
            messages.error(request, "Nothing was saved: fix the fields marked below.")
        else:
            try:
                _, restart = config.set_config(data=values, principal=principal_of(request))
            except SecondFactorRequired as exc:
                return second_factor_page(request, exc)
            except Invalid as exc:  # validated above; a race with another operator's change
                messages.error(request, exc.message)
                status = 422
            else:
                messages.success(
                    request,
                    "Saved. Nodes apply it at once"
                    + (
                        f", except {', '.join(restart)}: that needs a node restart."
                        if restart
                        else "."
                    ),
                )
    return render(
        request,
        "serving/cache_config.html",
        {
            "fields": _fields(values, errors, restart),
            "restart": restart,
            "section": "cache",
        },
        status=status,
    )
