"""Rewrite the "Every option" section of docs/commands.md from ``hyperreg``'s parser.

Run after adding or changing an option: ``python scripts/write_options_reference.py``
(tests/test_help.py fails while an option is missing from docs/commands.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hyperreg.cli import build_parser
from hyperreg.cli.help_layout import DOCS, END, START, options_reference


def write_reference(docs: Path) -> None:
    """Replace the text between ``START`` and ``END`` of ``docs`` (appended when missing) by
    :func:`~hyperreg.cli.help_layout.options_reference` of ``hyperreg``'s parser."""
    text = docs.read_text(encoding="utf-8")
    block = f"{START}\n{options_reference(build_parser())}{END}\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    docs.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Rewrite the section in the file named by ``argv[0]`` (default docs/commands.md)."""
    argv = sys.argv[1:] if argv is None else argv
    write_reference(Path(argv[0] if argv else Path(__file__).parents[1] / DOCS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
