"""The endpoint reference of the docs site, from the OpenAPI schema the server serves.

Two files are committed and kept fresh by tests/ops/test_openapi_reference.py:

* ``docs/reference/openapi.yaml``: the bytes ``GET /api/v1/schema`` answers (drf-spectacular
  with the project's postprocessing hooks: the HTTP server's 414 and 431, the links);
* ``docs/reference/endpoints.md``: that schema written as a Markdown page, so the site shows
  every operation and schema statically: no Swagger UI, no script, nothing from a CDN.

``make openapi`` (``manage.py openapi_reference``) writes both; ``--check`` only compares.
"""

import re
from pathlib import Path

import yaml
from django.conf import settings
from django.test import RequestFactory
from django.urls import resolve

SCHEMA_URL = "/api/v1/schema"
DOCS = Path(settings.BASE_DIR) / "docs" / "reference"
SCHEMA_FILE = DOCS / "openapi.yaml"
PAGE_FILE = DOCS / "endpoints.md"
REGENERATE = "make openapi  (or: DJANGO_DEBUG=1 .venv/bin/python manage.py openapi_reference)"
METHODS = ("get", "post", "put", "patch", "delete", "head", "options", "trace")


def served_schema() -> bytes:
    """The body of ``GET /api/v1/schema``, produced in-process by the view the URL resolves to."""
    match = resolve(SCHEMA_URL)
    request = RequestFactory().get(SCHEMA_URL)
    response = match.func(request, *match.args, **match.kwargs)
    response.render()
    assert response.status_code == 200, response.status_code
    return response.content


def cell(text: str | None) -> str:
    """Text for one table cell: line breaks kept as <br>, pipes escaped."""
    if not text:
        return ""
    lines = [line.strip() for line in text.strip().splitlines()]
    out = []
    for line in lines:
        if not line:
            continue
        if line.startswith("* ") or (out and out[-1].startswith("• ")):
            out.append("• " + line[2:] if line.startswith("* ") else line)
        else:
            out.append(line)
    joined = ""
    for line in out:
        if not joined:
            joined = line
        elif line.startswith("• "):
            joined += "<br>" + line
        else:
            joined += " " + line
    return escape_pipes(joined)


CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")


def escape_pipes(text: str) -> str:
    """Pipes escaped for a table cell, except inside code spans (which the tables extension keeps whole)."""
    out, last = [], 0
    for match in CODE_SPAN.finditer(text):
        out.append(text[last : match.start()].replace("|", "\\|"))
        out.append(match.group(0))
        last = match.end()
    out.append(text[last:].replace("|", "\\|"))
    return "".join(out)


def paragraph(text: str | None) -> str:
    return (text or "").strip()


def schema_anchor(name: str) -> str:
    return "schema-" + name.lower()


def ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def code(value) -> str:
    text = str(value)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def type_of(schema: dict | None) -> str:
    """A schema in a few words, with links to the named schemas it refers to."""
    if not schema:
        return ""
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        return f"[{name}](#{schema_anchor(name)})"
    if "allOf" in schema and len(schema["allOf"]) == 1:
        text = type_of(schema["allOf"][0])
    elif "allOf" in schema or "oneOf" in schema or "anyOf" in schema:
        key = next(k for k in ("oneOf", "anyOf", "allOf") if k in schema)
        joiner = " and " if key == "allOf" else " or "
        text = joiner.join(type_of(s) for s in schema[key])
    elif schema.get("type") == "array":
        text = "array of " + type_of(schema.get("items"))
    elif "enum" in schema:
        text = (schema.get("type") or "") + " (" + ", ".join(code(v) for v in schema["enum"] if v is not None) + ")"
    else:
        text = schema.get("type", "any")
        if "format" in schema:
            text += f" ({schema['format']})"
        if schema.get("type") == "object" and isinstance(schema.get("additionalProperties"), dict):
            text += " of " + type_of(schema["additionalProperties"])
    if schema.get("nullable"):
        text += ", nullable"
    return text


CONSTRAINTS = (
    ("minimum", "≥ {}"),
    ("maximum", "≤ {}"),
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "items ≥ {}"),
    ("maxItems", "items ≤ {}"),
    ("minProperties", "properties ≥ {}"),
)


def constraints(schema: dict | None) -> str:
    if not schema:
        return ""
    parts = [template.format(schema[key]) for key, template in CONSTRAINTS if key in schema]
    if "pattern" in schema:
        parts.append("pattern " + code(schema["pattern"]))
    if "default" in schema:
        parts.append("default " + code(schema["default"]))
    return escape_pipes(", ".join(parts))


def media_schemas(content: dict | None) -> str:
    if not content:
        return ""
    return ", ".join(f"{type_of(media.get('schema'))} ({code(kind)})" for kind, media in content.items())


def operation_section(path: str, method: str, operation: dict) -> list[str]:
    lines = [f"### `{method.upper()} {path}` {{ #{operation['operationId']} }}", ""]
    if operation.get("summary"):
        lines += [f"**{operation['summary'].strip()}**", ""]
    if operation.get("description"):
        lines += [paragraph(operation["description"]), ""]
    security = operation.get("security")
    auth = "none" if not security or security == [{}] else ", ".join(code(name) for s in security for name in s)
    lines += [f"Authentication: {auth}. Operation id: `{operation['operationId']}`.", ""]
    if operation.get("parameters"):
        lines += ["| parameter | in | type | required | constraints | description |", "|---|---|---|---|---|---|"]
        for p in operation["parameters"]:
            schema = p.get("schema", {})
            lines.append(
                f"| `{p['name']}` | {p['in']} | {escape_pipes(type_of(schema))} | "
                f"{'yes' if p.get('required') else 'no'} | {constraints(schema)} | {cell(p.get('description'))} |"
            )
        lines.append("")
    body = operation.get("requestBody")
    if body:
        required = "required" if body.get("required") else "optional"
        lines += [f"Request body ({required}): {media_schemas(body.get('content'))}", ""]
    lines += ["| status | body | description |", "|---|---|---|"]
    for status, response in operation["responses"].items():
        description = cell(response.get("description"))
        for header, spec in (response.get("headers") or {}).items():
            description += f"<br>Header `{header}`: {cell(spec.get('description'))}"
        for name, link in (response.get("links") or {}).items():
            description += f"<br>Link `{name}` → [`{link['operationId']}`](#{link['operationId']})"
            if link.get("description"):
                description += ": " + cell(link["description"])
        lines.append(f"| {status} | {media_schemas(response.get('content'))} | {description} |")
    lines.append("")
    for name, callback in (operation.get("callbacks") or {}).items():
        for expression, item in callback.items():
            for callback_method, callback_operation in item.items():
                if callback_method not in METHODS:
                    continue
                lines += [
                    f"Callback `{name}`: `{callback_method.upper()} {expression}`, body "
                    f"{media_schemas((callback_operation.get('requestBody') or {}).get('content'))}. "
                    f"{paragraph(callback_operation.get('description') or callback_operation.get('summary'))}",
                    "",
                ]
    return lines


def schema_section(name: str, schema: dict) -> list[str]:
    lines = [f"### {name} {{ #{schema_anchor(name)} }}", ""]
    if schema.get("description"):
        lines += [paragraph(schema["description"]), ""]
    properties = schema.get("properties")
    if properties:
        required = set(schema.get("required", []))
        extra = schema.get("additionalProperties")
        lines += ["| field | type | required | constraints | description |", "|---|---|---|---|---|"]
        for field, spec in properties.items():
            flags = "yes" if field in required else "no"
            if spec.get("readOnly"):
                flags += ", read-only"
            if spec.get("writeOnly"):
                flags += ", write-only"
            lines.append(
                f"| `{field}` | {escape_pipes(type_of(spec))} | {flags} | {constraints(spec)} | "
                f"{cell(spec.get('description'))} |"
            )
        lines.append("")
        if extra is False:
            lines += ["No other field is accepted.", ""]
    elif "enum" in schema:
        values = ", ".join(code(v) for v in schema["enum"] if v is not None)
        lines += [f"{schema.get('type', 'value')}, one of: {values}.", ""]
    else:
        lines += [f"{type_of(schema)}. {constraints(schema)}".strip(), ""]
    return lines


def markdown_page(schema_bytes: bytes) -> str:
    """The endpoint reference page for a schema: an index by tag, each operation, each schema."""
    schema = yaml.safe_load(schema_bytes)
    info = schema["info"]
    operations = [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]
    tags: dict[str, list] = {}
    for path, method, operation in operations:
        tags.setdefault((operation.get("tags") or ["other"])[0], []).append((path, method, operation))
    lines = [
        "<!-- Generated from docs/reference/openapi.yaml by devtools/openapi_reference.py: do not edit.",
        f"     Regenerate with {REGENERATE}. -->",
        "",
        "# Endpoints",
        "",
        f"Every operation of the {info['title']} {info['version']}, as the served OpenAPI schema "
        "(`/api/v1/schema`) describes it. The schema itself is [openapi.yaml](openapi.yaml), the "
        "same bytes the server answers; the rules it cannot say well are on the [API](api.md) page. "
        "Both files are generated (`make openapi`) and a test fails when either is stale.",
        "",
        paragraph(info.get("description")),
        "",
        "| method | path | summary |",
        "|---|---|---|",
    ]
    for tag in tags:
        for path, method, operation in tags[tag]:
            lines.append(
                f"| {method.upper()} | [`{path}`](#{operation['operationId']}) | {cell(operation.get('summary'))} |"
            )
    lines.append("")
    for tag, members in tags.items():
        lines += [f"## {tag}", ""]
        for path, method, operation in members:
            lines += operation_section(path, method, operation)
    lines += ["## Schemas", ""]
    for name, component in schema["components"]["schemas"].items():
        lines += schema_section(name, component)
    schemes = schema["components"].get("securitySchemes") or {}
    if schemes:
        lines += ["## Authentication", ""]
        for name, scheme in schemes.items():
            where = f"{scheme.get('in', '')} `{scheme.get('name', '')}`".strip() if scheme.get("in") else ""
            lines.append(f"* `{name}`: {scheme.get('type')} {where}. {paragraph(scheme.get('description'))}".rstrip())
        lines.append("")
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def generated() -> dict[Path, bytes]:
    """What the two committed files should hold now."""
    schema = served_schema()
    return {SCHEMA_FILE: schema, PAGE_FILE: markdown_page(schema).encode()}


def stale() -> list[Path]:
    return [path for path, content in generated().items() if not path.exists() or path.read_bytes() != content]
