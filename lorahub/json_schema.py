"""JSON Schemas a tenant or a caller writes, judged without ever reaching the network.

jsonschema resolves a ``$ref`` it does not hold by fetching it (``http://``, ``file://``, the
environment's proxy, redirects, no time limit): a schema in an evaluation set or a request's
``response_format`` would make the worker or the node a client of any URL, and pass/fail
would tell the author what came back. One rule for both:

- a schema whose ``$ref`` (``$dynamicRef``, ``$recursiveRef``) is not local — it does not start
  with ``#`` — is refused where it is written (``remote_refs`` names them), and
- every validator is built over an empty ``referencing.Registry`` with no retrieval, so a
  reference that is not inside the schema itself is unresolvable: the instance does not match,
  and nothing is fetched, whatever slipped past the first rule (a relative ``$ref`` under a
  remote ``$id``, a metaschema URL).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import referencing
import referencing.exceptions

REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# a registry that holds nothing and retrieves nothing: only references inside the schema resolve
NOWHERE = referencing.Registry()


def remote_refs(schema: Any, path: str = "") -> Iterator[str]:
    """``path: $ref value`` for every reference in ``schema`` that points outside it."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            here = f"{path}/{key}"
            if key in REFERENCE_KEYWORDS and isinstance(value, str):
                if not value.startswith("#"):
                    yield f"{here or key} = {value!r}"
            else:
                yield from remote_refs(value, here)
    elif isinstance(schema, list):
        for index, item in enumerate(schema):
            yield from remote_refs(item, f"{path}/{index}")


def check(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot be used (not valid against its metaschema, or a reference that
    leaves it), or None."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON Schema ({exc.message})"
    remote = list(remote_refs(schema))
    if remote:
        return (
            f"references outside the schema are not fetched ({', '.join(remote[:3])}); "
            "use local references such as '#/$defs/name' and put the definition in the schema"
        )
    return None


def validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """A validator for ``schema`` that resolves only references inside it."""
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=NOWHERE)


def matches(schema: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` matches ``schema``; a reference that cannot be resolved locally does
    not match (and is never fetched)."""
    try:
        return bool(validator(schema).is_valid(value))
    except referencing.exceptions.Unresolvable:
        return False
