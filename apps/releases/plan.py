"""A release's plan: which phases run and the gates that judge them.

Defaults are the platform's (``Plan()``), overridden by the tenant's (``ReleaseDefaults``),
overridden again per release. A bad value is refused with the field it belongs to
(``PlanError.fields``: field → message), before anything is stored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from apps.tenants.errors import Invalid


class CanaryStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    percent: int = Field(ge=1, le=100, description="share of the alias's requests")
    dwell_s: int = Field(ge=1, le=7 * 86400, description="at least this long at this step")
    min_requests: int = Field(ge=1, le=10_000_000, description="candidate requests to judge")


def default_steps() -> list[CanaryStep]:
    return [CanaryStep(percent=p, dwell_s=300, min_requests=50) for p in (5, 25, 50, 100)]


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # how often the judge looks, and how many failed checks in a row roll back
    interval_s: int = Field(30, ge=1, le=3600)
    failure_threshold: int = Field(2, ge=1, le=100)
    # prewarm: load the candidate into the engine of every node (L2) before anything else
    prewarm: bool = True
    # evaluation: each named set's latest revision, candidate against the baseline
    evaluation_sets: list[str] = Field(default_factory=list, max_length=20)
    evaluation_max_drop: float = Field(0.0, ge=0, le=1)  # candidate ≥ baseline - this
    # shadow (0: skipped): a copy of this share of the alias's requests, for this long
    shadow_percent: int = Field(0, ge=0, le=100)
    shadow_duration_s: int = Field(300, ge=1, le=7 * 86400)
    shadow_min_comparisons: int = Field(20, ge=1, le=10_000_000)
    shadow_min_agreement: float = Field(0.5, ge=0, le=1)  # share of identical answers
    shadow_max_error_increase: float = Field(0.01, ge=0, le=1)  # over the live error rate
    # the TTFT gates; None turns one off (a baseline whose TTFT is a few milliseconds makes any
    # adapter load a large ratio)
    shadow_max_ttft_ratio: float | None = Field(1.5, gt=0, le=100)  # shadow mean TTFT / live mean
    # canary steps, then promote
    canary_steps: list[CanaryStep] = Field(default_factory=default_steps, min_length=1)
    canary_max_error_increase: float = Field(0.01, ge=0, le=1)
    canary_max_ttft_ratio: float | None = Field(1.5, gt=0, le=100)  # candidate / baseline p95
    canary_max_marker_increase: float = Field(0.05, ge=0, le=1)  # cut, empty, refused, bad JSON

    @model_validator(mode="after")
    def steps_rise(self) -> Plan:
        percents = [s.percent for s in self.canary_steps]
        if percents != sorted(set(percents)):
            raise ValueError(
                f"canary_steps: each step's percent must be above the one before, got {percents}"
            )
        return self


class PlanError(Invalid):
    """A plan the platform cannot run; ``fields`` maps each bad field to what is wrong."""

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields
        super().__init__(
            "the release plan is not valid: "
            + "; ".join(f"{field}: {message}" for field, message in fields.items())
        )


def _field_errors(error: ValidationError) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "canary_steps"
        message = str(item["msg"]).removeprefix("Value error, ")
        if message.startswith(f"{where}: "):
            message = message[len(where) + 2 :]
        fields.setdefault(where, message)
    return fields


def build(*layers: dict[str, Any] | None) -> Plan:
    """The platform's defaults, then each layer's fields over them (later layers win)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer or {})
    try:
        return Plan.model_validate(merged)
    except ValidationError as exc:
        raise PlanError(_field_errors(exc)) from None


def parse_steps(text: str, *, dwell_s: int, min_requests: int) -> list[dict[str, int]]:
    """The console's "5, 25, 50, 100" as steps with one dwell and minimum each."""
    steps = []
    for part in text.replace("%", "").split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise PlanError({"canary_steps": f"'{part}' is not a whole percent; e.g. 5, 25, 100"})
        steps.append({"percent": int(part), "dwell_s": dwell_s, "min_requests": min_requests})
    return steps
