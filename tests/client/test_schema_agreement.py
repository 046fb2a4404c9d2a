"""The client's models against the server's OpenAPI schema: every endpoint the client calls
exists with the method it uses, and the model it reads the answer into has exactly the
fields of the server's response schema, with the same types and the same required ones.
Change a response model on either side and this fails, naming the endpoint and the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from lorahub_client.downloads import DOWNLOADS
from lorahub_client.endpoints import ENDPOINTS

from lorahub.api import api


def resolve(node: Any, document: dict[str, Any]) -> Any:
    """Follow a ``$ref`` (``#/components/schemas/X`` or ``#/$defs/X``) inside ``document``."""
    while isinstance(node, dict) and "$ref" in node:
        *_, name = node["$ref"].split("/")
        node = (document.get("components", {}).get("schemas") or document.get("$defs", {}))[name]
    return node


def shape(node: Any, document: dict[str, Any]) -> Any:
    """A schema reduced to what a client depends on: types, fields, which are required."""
    node = resolve(node, document)
    if "anyOf" in node:
        return ("any", frozenset(shape(option, document) for option in node["anyOf"]))
    kind = node.get("type")
    if kind == "array":
        return ("array", shape(node.get("items", {}), document))
    if kind == "object" or "properties" in node:
        properties = node.get("properties")
        if not properties:  # a free-form object (dict[str, X])
            extra = node.get("additionalProperties", True)
            return ("map", shape(extra, document) if isinstance(extra, dict) else "any")
        fields = tuple(sorted((k, shape(v, document)) for k, v in properties.items()))
        return ("object", fields, frozenset(node.get("required", ())))
    if kind == "string" and node.get("format") == "date-time":
        return "date-time"
    return kind or "any"


def differences(expected: Any, actual: Any, where: str = "") -> list[str]:
    """Where two shapes differ, as 'path: server has X, client has Y' lines."""
    if expected == actual:
        return []
    if expected[0] == actual[0] == "object" and isinstance(expected, tuple):
        server, client = dict(expected[1]), dict(actual[1])
        found = [f"{where}.{k}: the client has no field for it" for k in server.keys() - client]
        found += [f"{where}.{k}: the server sends no such field" for k in client.keys() - server]
        for key in server.keys() & client.keys():
            found += differences(server[key], client[key], f"{where}.{key}")
        if expected[2] != actual[2]:
            found.append(
                f"{where}: required fields differ: server {sorted(expected[2])}, "
                f"client {sorted(actual[2])}"
            )
        return found
    if expected[0] == actual[0] == "array":
        return differences(expected[1], actual[1], f"{where}[]")
    return [f"{where}: server {expected!r}, client {actual!r}"]


def server_answer(document: dict[str, Any], method: str, path: str) -> Any:
    operation = document["paths"].get(path, {}).get(method.lower())
    assert operation is not None, f"the server has no {method} {path}"
    answers = {
        code: body for code, body in operation["responses"].items() if str(code).startswith("2")
    }
    assert len(answers) >= 1, f"{method} {path} documents no 2xx answer"
    schemas = {
        repr(shape(b["content"]["application/json"]["schema"], document)) for b in answers.values()
    }
    assert len(schemas) == 1, f"{method} {path} answers differently per status"
    return shape(next(iter(answers.values()))["content"]["application/json"]["schema"], document)


def disagreements(document: dict[str, Any]) -> list[str]:
    found = []
    for name, (method, path, model, many) in sorted(ENDPOINTS.items()):
        server = server_answer(document, method, path)
        schema = model.model_json_schema()
        client = shape(schema, schema)
        if many:
            client = ("array", client)
        found += [f"{name} ({method} {path}){line}" for line in differences(server, client)]
    return found


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return api.get_openapi_schema()


def test_every_model_the_client_reads_matches_the_servers_schema(document):
    found = disagreements(document)
    assert not found, "the client and the server disagree:\n" + "\n".join(found)


def test_a_changed_response_model_is_caught(document):
    """The check itself can fail: a field renamed, removed or retyped on the server."""
    changed = copy.deepcopy(document)
    version = changed["components"]["schemas"]["VersionOut"]
    version["properties"]["state_name"] = version["properties"].pop("state")
    version["required"] = [("state_name" if f == "state" else f) for f in version["required"]]
    changed["components"]["schemas"]["AliasOut"]["properties"]["canary_percent"] = {
        "type": "number"
    }
    del changed["components"]["schemas"]["ApiKeyOut"]["properties"]["admin"]
    found = disagreements(changed)
    assert (
        "version (GET /api/versions/{version_id}).state_name: the client has no field for it"
        in found
    )
    assert "version (GET /api/versions/{version_id}).state: the server sends no such field" in found
    assert any(".canary_percent: server 'number', client 'integer'" in line for line in found)
    assert any(line.startswith("keys (GET /api/tenants/{slug}/keys)[].admin") for line in found)


def test_every_file_the_client_downloads_is_documented_as_a_file(document):
    """``lorahub pull``'s downloads: each path exists with its method and documents a 200
    whose body is bytes (not JSON)."""
    for name, (method, path) in sorted(DOWNLOADS.items()):
        operation = document["paths"].get(path, {}).get(method.lower())
        assert operation is not None, f"{name}: the server has no {method} {path}"
        content = operation["responses"][200]["content"]
        assert "application/json" not in content, (name, content)
        assert all(c["schema"].get("format") == "binary" for c in content.values()), (name, content)
