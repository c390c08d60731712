#!/usr/bin/env python3
"""Writes the built-in rule table of docs/rules.md from the rules themselves.

    .venv/bin/python scripts/rules_table.py          # rewrite the table in place
    .venv/bin/python scripts/rules_table.py --check  # exit 1 if the docs are stale

The table is the block of lines starting with its header row and ending at the
first line that is not a table row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mineru_health.classifier import builtin_rules

DOCS = Path(__file__).resolve().parents[1] / "docs" / "rules.md"
HEADER = "| id | strength | target / origin | category | pattern (RE2, case-insensitive) |"


def table() -> list[str]:
    rows = [HEADER, "| --- | --- | --- | --- | --- |"]
    for rule in builtin_rules():
        pattern = rule.pattern.replace("|", "\\|")
        rows.append(f"| `{rule.id}` | {rule.strength} | {rule.target_name} / {rule.scope_name} "
                    f"| {rule.category} | `{pattern}` |")
    return rows


def rewrite(text: str) -> str:
    lines = text.split("\n")
    start = lines.index(HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], *table(), *lines[end:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when stale")
    args = parser.parse_args(argv)
    text = DOCS.read_text(encoding="utf-8")
    new = rewrite(text)
    if args.check:
        if new != text:
            print(f"{DOCS} is stale: run scripts/rules_table.py", file=sys.stderr)
            return 1
        return 0
    DOCS.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
