"""``GET /docs``: the API reference as one plain HTML page, rendered on the server from the OpenAPI
document, with no script at all.

FastAPI's own ``/docs`` and ``/redoc`` load their JavaScript from a CDN. On this origin the
dashboard keeps its token in sessionStorage, so any script from elsewhere running here could read
it: those pages are turned off (app.py) and this one replaces them. The machine-readable document
stays at ``/openapi.json``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, select_autoescape

from gpuledger.server.dashboard.routes import SECURITY_HEADERS

router = APIRouter(include_in_schema=False)
METHODS = ("get", "post", "put", "patch", "delete")

_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title }} · API</title>
<link rel="stylesheet" href="{{ root }}/dashboard/static/dashboard.css">
</head>
<body>
<main>
<h1>{{ title }} {{ version }}</h1>
<p>{{ description }} Every call under <code>/api/v1</code> takes <code>Authorization: Bearer &lt;token&gt;</code>.
The machine-readable document: <a href="{{ root }}{{ openapi_url }}">{{ openapi_url }}</a>.</p>
{% for op in operations %}
<section id="{{ op.id }}">
<h2><code>{{ op.method | upper }} {{ op.path }}</code></h2>
<p>{{ op.summary }}</p>
{% if op.parameters %}
<table>
<tr><th>parameter</th><th>in</th><th>required</th><th>type</th><th>meaning</th></tr>
{% for p in op.parameters %}
<tr><td><code>{{ p.name }}</code></td><td>{{ p.where }}</td><td>{{ "yes" if p.required else "" }}</td>
<td>{{ p.type }}</td><td>{{ p.description }}</td></tr>
{% endfor %}
</table>
{% endif %}
{% if op.body %}<p>Body: {{ op.body }}</p>{% endif %}
<p>Answers: {% for code, text in op.responses -%}
<code>{{ code }}</code> {{ text }}{% if not loop.last %}; {% endif %}
{%- endfor %}</p>
</section>
{% endfor %}
</main>
</body>
</html>
"""


@lru_cache(maxsize=1)
def _template() -> Any:
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    return env.from_string(_TEMPLATE)


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " | ".join(str(v) for v in schema["enum"])
    kind = str(schema.get("type", "any"))
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    return kind


def operations(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            params = [
                {
                    "name": p.get("name", ""),
                    "where": p.get("in", ""),
                    "required": p.get("required", False),
                    "type": _type(p.get("schema", {})),
                    "description": p.get("description", "") or p.get("schema", {}).get("description", ""),
                }
                for p in op.get("parameters", [])
            ]
            content = op.get("requestBody", {}).get("content", {})
            body = "; ".join(f"{media} ({_type(c.get('schema', {}))})" for media, c in content.items())
            responses = [(code, r.get("description", "")) for code, r in op.get("responses", {}).items()]
            out.append(
                {
                    "id": f"{method}-{path}".replace("/", "-").replace("{", "").replace("}", ""),
                    "method": method,
                    "path": path,
                    "summary": op.get("summary", ""),
                    "parameters": params,
                    "body": body,
                    "responses": responses,
                }
            )
    return out


@router.get("/docs", response_class=HTMLResponse)
def api_docs(request: Request) -> HTMLResponse:
    app = request.app
    doc = app.openapi()
    html = _template().render(
        title=app.title,
        version=app.version,
        description=app.description,
        openapi_url=app.openapi_url,
        root=request.scope.get("root_path", "").rstrip("/"),
        operations=operations(doc),
    )
    return HTMLResponse(html, headers={**SECURITY_HEADERS, "Cache-Control": "no-store"})
