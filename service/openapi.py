"""Make the generated OpenAPI document say what the API really answers.

FastAPI documents every problem under `application/json` and adds its own 422 schema; the API
answers problems as `application/problem+json` with the `Problem` schema. This rewrites both once.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .problems import PROBLEM_MEDIA_TYPE

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        for path_item in schema.get("paths", {}).values():
            for operation in path_item.values():
                for status, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    json_schema = content.get("application/json", {}).get("schema")
                    problem = any(media.get("schema") == _PROBLEM_REF for media in content.values())
                    if status == "422" or problem:  # also on routes whose own media type is text
                        response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": _PROBLEM_REF}}
                        if status == "422" and response.get("description") == "Validation Error":
                            response["description"] = "Invalid request (`validation_error`)."
                    elif (
                        status == "200"
                        and len(content) > 1
                        and "application/json" in content
                        and not json_schema
                    ):
                        # routes answering bytes declare their own media type; drop FastAPI's default
                        del content["application/json"]
        components = schema.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
