"""How a scale run ends: its report written as JSON and printed, and PASS or FAIL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def verdict(title: str, report: dict[str, Any], problems: list[str], result: Path) -> int:
    """Write `report` to `result`, print it and the verdict; the exit status (1 on a problem)."""
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps(report, indent=2) + "\n")
    width = max(len(name) for name in report)
    for name, value in report.items():
        print(f"{name:<{width}}  {value}")
    print(f"{title}:", "FAIL" if problems else "PASS", f"(written to {result})")
    return 1 if problems else 0
