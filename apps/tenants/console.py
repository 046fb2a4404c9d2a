"""What every console view needs: who is asking, which tenant a URL names, and tables.

Console views authorize with the same ``Principal`` the REST API uses, so a permission rule
lives in one place: another tenant's object is a 404 here as it is there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render

from apps.tenants.auth import Principal, principal_for_session
from apps.tenants.errors import DomainError, SecondFactorRequired
from apps.tenants.models import Tenant

PER_PAGE = 25


def principal_of(request: HttpRequest) -> Principal:
    """The signed-in user as a ``Principal`` (memberships and roles), once per request."""
    cached = getattr(request, "_lorahub_principal", None)
    if cached is None:
        cached = principal_for_session(request)
        request._lorahub_principal = cached  # type: ignore[attr-defined]
    return cached


def tenant_or_404(principal: Principal, slug: str) -> Tenant:
    """The tenant a console URL names: the user's own, or any for an operator; else 404."""
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None or (tenant.id not in principal.tenant_ids and not principal.is_operator):
        raise Http404(f"no tenant '{slug}' that you belong to")
    return tenant


def signed_in(_principal: Principal) -> bool:
    return True


def operators(principal: Principal) -> bool:
    return principal.is_operator


def reviewers(principal: Principal) -> bool:
    return principal.is_reviewer


def require(check: Callable[[Principal], bool], what: str):
    """A view decorator: signed in, and ``check(principal)``; otherwise 404 (never a hint)."""

    def decorate(view):
        @login_required
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs):
            if not check(principal_of(request)):
                raise Http404(f"this page is for {what}")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def second_factor_page(request: HttpRequest, exc: SecondFactorRequired) -> HttpResponse:
    """403 with what to do (a page with a link to the second factor, not a flash message)."""
    return render(
        request,
        "console/forbidden.html",
        {"message": exc.message, "second_factor": True},
        status=403,  # render's fourth positional argument is the content type
    )


def act(
    request: HttpRequest,
    action: Callable[[], object],
    success: str,
    back: str,
    *,
    back_on_error: str | None = None,
) -> HttpResponse:
    """Run a service call for a console form: its domain error becomes a message that says
    what to do, the success a confirmation; then back to ``back`` (POST-redirect-GET), or to
    ``back_on_error`` when the call failed and ``back`` would not exist."""
    try:
        action()
    except SecondFactorRequired as exc:
        return second_factor_page(request, exc)
    except DomainError as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect(back_on_error or back)
    messages.success(request, success)
    return HttpResponseRedirect(back)


@dataclass(frozen=True)
class Table:
    """One page of a sortable, filterable listing."""

    page: Page
    sort: str
    total: int


def table(request: HttpRequest, qs: QuerySet, *, sorts: dict[str, str], default: str) -> Table:
    """Sort ``qs`` by ``?sort=<key>`` (``-key`` descending; keys map to fields in ``sorts``)
    and return the ``?page=`` page of it. Unknown keys fall back to ``default``."""
    requested = request.GET.get("sort", default)
    key = requested.lstrip("-")
    if key not in sorts:
        requested, key = default, default.lstrip("-")
    field = sorts[key]
    descending = requested.startswith("-")
    qs = qs.order_by(f"-{field}" if descending else field, "-pk" if descending else "pk")
    paginator = Paginator(qs, PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    return Table(page=page, sort=requested, total=paginator.count)
