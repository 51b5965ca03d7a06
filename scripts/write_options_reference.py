"""Rewrite the "Every option" section of docs/commands.md from ``hyperreg``'s parser.

Run after adding or changing an option: ``python scripts/write_options_reference.py``
(tests/test_help.py fails while an option is missing from docs/commands.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hyperreg.cli.help_layout import DOCS, write_reference


def main(argv: list[str] | None = None) -> int:
    """Rewrite the section in the file named by ``argv[0]`` (default docs/commands.md)."""
    argv = sys.argv[1:] if argv is None else argv
    write_reference(Path(argv[0] if argv else Path(__file__).parents[1] / DOCS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
