"""How a file's content is checked against its declared format, for every format ddlstudy
reads: the use case and the study plan a person writes (``config.usecase``, ``plan``), and
the manifest, study.json and advise.json it writes itself (``ddlstudy.records.formats``).

A format is declared once, as pydantic validates it: a dataclass or a model whose fields
give the types, the defaults and (in their docstrings) the meaning; ranges and rules that
tie fields together are the validators of the same declaration (a dataclass's
``__post_init__``). Documents are validated as the JSON they are (``validate``), so a
number written as a string is refused, not converted; what is refused is said in one
line, the field first (``problem``)."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, TypeAdapter, ValidationError

WRITTEN = ConfigDict(strict=True, extra="forbid", use_attribute_docstrings=True)
"""A file a person writes (a use case, a plan): strict types and no unknown key, since an
unknown key is most often a misspelt one."""
RECORDED = ConfigDict(strict=True, extra="allow", use_attribute_docstrings=True)
"""A file ddlstudy wrote: strict types; unknown fields pass (a newer ddlstudy may add
some)."""


def finite(x: float) -> float:
    """A number's validator: NaN and infinities are refused (JSON and TOML can write them)."""
    if not math.isfinite(x):
        raise ValueError("must be a finite number")
    return x


Finite = Annotated[float, AfterValidator(finite)]
"""A finite number (an integer is one too)."""

_WORDS = {"an object": "a table", "a valid array": "a list", "a valid dictionary": "a table"}


def validate(adapter: TypeAdapter, doc: Any) -> Any:
    """``doc`` (parsed TOML or JSON) validated by ``adapter`` as JSON text, strictly: a
    date or another value JSON has no word for arrives as text and is refused as one."""
    return adapter.validate_json(json.dumps(doc, default=str, allow_nan=True))


def dotted(loc: tuple) -> str:
    """A location as a reader writes it: ``train.lr``, ``classes[0]``, ``epochs[2].epoch``."""
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return text or "the document"


def problem(error: ValidationError, where=dotted) -> tuple[str, str]:
    """The first error of a validation: its field (``where`` names a location) and what
    is wrong, with the value that was given."""
    first = error.errors(include_url=False)[0]
    got = first.get("input")
    msg = first["msg"][0].lower() + first["msg"][1:]
    msg = msg.replace("input should be", "must be").replace("value should be", "must be")
    msg = msg.removeprefix("value error, ")
    for word, plain in _WORDS.items():
        msg = msg.replace(word, plain)
    if first["type"] in ("missing", "missing_keyword_only_argument"):
        return where(first["loc"]), "is required"
    if first["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        return where(first["loc"]), "unknown key"
    shown = "" if isinstance(got, dict | list) else f" (got {got!r:.60})"
    return where(first["loc"]), f"{msg}{shown}"


def field_rows(schema: dict, defs: dict, prefix: str) -> list[str]:
    """A model's JSON schema as the formats' reference shows it: a Markdown row a field
    (its nested models' fields after it), with its type, whether it is required and its
    meaning (its attribute docstring)."""
    rows = []
    required = set(schema.get("required", ()))
    for name, field in schema.get("properties", {}).items():
        meaning = " ".join(field.get("description", "").split()).replace("|", "\\|") \
            .replace("``", "`")
        rows.append(f"| `{prefix}{name}` | {kind_words(field, defs)} | "
                    f"{'yes' if name in required else 'no'} | {meaning} |")
        for inner in [field, *field.get("anyOf", ()), field.get("items") or {}]:
            if "$ref" in inner:
                sub = defs[inner["$ref"].rsplit("/", 1)[1]]
                each = "[]" if inner is field.get("items") else ""
                rows += field_rows(sub, defs, f"{prefix}{name}{each}.")
    return rows


def kind_words(field: dict, defs: dict) -> str:
    """A field's type and bounds in words: 'integer >= 1', 'string or null', ..."""
    if "anyOf" in field:
        return " or ".join(kind_words(f, defs) for f in field["anyOf"])
    if "$ref" in field:
        return "object"
    if "enum" in field:
        return "one of " + ", ".join(f"`{v}`" for v in field["enum"])
    if "const" in field:
        return f"`{field['const']!r}`"
    kind = field.get("type", "any")
    if kind == "array":
        kind = f"list of {kind_words(field.get('items', {}), defs)}"
    bounds = [f"{op} {field[key]:g}" for key, op in (("minimum", ">="), ("exclusiveMinimum",
              ">"), ("maximum", "<="), ("exclusiveMaximum", "<")) if key in field]
    if "pattern" in field:
        bounds.append(f"matching `{field['pattern']}`")
    return " ".join([kind, *bounds])
