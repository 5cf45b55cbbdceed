"""Render the reliability summary (build/reliability.json, written by the suite) into docs/reliability.md.

    python tools/reliability_doc.py [--check]

Replaces the text between `<!-- reliability:<section>:begin -->` and
`<!-- reliability:<section>:end -->` with a table of that section's rows.
--check only reports whether the page is current.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "build" / "reliability.json"
PAGE = ROOT / "docs" / "reliability.md"


def table(rows: list[dict[str, object]]) -> str:
    """A column for each figure more than one row has; a row's other figures go in the last column."""
    counts: dict[str, int] = {}
    for row in rows:
        for key in row:
            if key not in ("section", "name"):
                counts[key] = counts.get(key, 0) + 1
    columns = [key for key, count in counts.items() if count > 1 or len(rows) == 1]
    lines = ["| | " + " | ".join([*columns, "other"]) + " |", "| --- |" + " --- |" * (len(columns) + 1)]
    for row in rows:
        other = ", ".join(f"{key}={value}" for key, value in row.items() if key not in ("section", "name", *columns))
        lines.append(
            f"| {row['name']} | " + " | ".join([*(str(row.get(column, "")) for column in columns), other]) + " |"
        )
    return "\n".join(lines)


def render(page: str, rows: list[dict[str, object]]) -> str:
    sections: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        sections.setdefault(str(row["section"]), []).append(row)
    for section, section_rows in sections.items():
        page = _replace_section(page, section, table(section_rows))
    return page


def _replace_section(page: str, section: str, rendered: str) -> str:
    pattern = re.compile(
        rf"(<!-- reliability:{re.escape(section)}:begin -->\n).*?(<!-- reliability:{re.escape(section)}:end -->)", re.S
    )
    return pattern.sub(lambda match: match.group(1) + rendered + "\n" + match.group(2), page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if docs/reliability.md differs from the rendered page"
    )
    args = parser.parse_args(argv)
    if not REPORT.exists():
        print(f"{REPORT} does not exist: run the suite first (make test)", file=sys.stderr)
        return 1
    page = PAGE.read_text()
    rendered = render(page, json.loads(REPORT.read_text()))
    if args.check:
        return 0 if rendered == page else 1
    PAGE.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
