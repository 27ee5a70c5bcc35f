"""`/problems/{code}`: the page each problem's `type` URI links to, and `/problems`, every code.

Rendered from the same table as `docs/reference/problems.md` (`api/problem_codes.py`), so the
link resolves wherever the API runs. Open, like `/docs`: it holds nothing but documentation.
"""

from __future__ import annotations

import html
import re

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from api.errors import ApiProblem
from api.problem_codes import PROBLEM_CODES, SECTIONS, ProblemCode

router = APIRouter(prefix="/problems", include_in_schema=False)

_CODE_SPAN = re.compile(r"`([^`]+)`")
_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:48rem;margin:2rem auto;padding:0 1rem;"
    "line-height:1.5}code{background:#f2f2f2;padding:0 .2em}dt{font-weight:600}"
)


@router.get("")
async def problem_index() -> HTMLResponse:
    """Every code, by section, each linking to its page."""
    parts = []
    for section, problems in SECTIONS.items():
        rows = "".join(
            f'<li><a href="problems/{problem.code}"><code>{problem.code}</code></a>'
            f" ({_status(problem)}): {_inline(problem.meaning)}</li>"
            for problem in problems
        )
        parts.append(f"<h2>{html.escape(section)}</h2><ul>{rows}</ul>")
    return _page("Problem codes", "".join(parts), code=False)


@router.get("/{code}")
async def problem_page(code: str) -> HTMLResponse:
    """One code: its status, what it means and what to do."""
    problem = PROBLEM_CODES.get(code)
    if problem is None:
        raise ApiProblem(404, "not-found", "Not found", f"no problem code {code!r}")
    body = (
        "<dl>"
        f"<dt>Status</dt><dd>{_status(problem)}</dd>"
        + (
            f'<dt>Type</dt><dd><a href="{problem.refines}"><code>/problems/{problem.refines}'
            "</code></a>, which this code refines</dd>"
            if problem.refines
            else ""
        )
        + f"<dt>Meaning</dt><dd>{_inline(problem.meaning)}</dd>"
        f"<dt>What to do</dt><dd>{_inline(problem.remedy)}</dd>"
        "</dl>"
        '<p><a href="../problems">Every problem code</a></p>'
    )
    return _page(problem.code, body)


def _page(title: str, body: str, *, code: bool = True) -> HTMLResponse:
    escaped = html.escape(title)
    heading = f"<code>{escaped}</code>" if code else escaped
    return HTMLResponse(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escaped} - durable-outbox</title><style>{_STYLE}</style></head>"
        f"<body><h1>{heading}</h1>{body}</body></html>"
    )


def _status(problem: ProblemCode) -> str:
    return str(problem.status) if problem.status is not None else "any"


def _inline(text: str) -> str:
    """The table's Markdown (code spans only) as HTML."""
    return _CODE_SPAN.sub(r"<code>\1</code>", html.escape(text, quote=False))
