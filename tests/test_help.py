"""``--help`` of every subcommand: grouped, about one screen, no option lost, each option in
docs/commands.md."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from hyperreg.cli import build_parser, main
from hyperreg.cli.args import subparser
from hyperreg.cli.help_layout import ADVANCED, END, START, short_help

ROOT = Path(__file__).resolve().parents[1]
# lines of `hyperreg <cmd> --help` at 80 columns; train has the most options (about 45)
BUDGET = {"register": 60, "train": 85}
DEFAULT_BUDGET = 56


def _commands() -> list[str]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(actions[0].choices)


def _options(command: str) -> list[str]:
    """The option strings of ``command`` that --help shows (not the hidden former names)."""
    actions = subparser(build_parser(), command)._actions
    return [o for a in actions if a.help != argparse.SUPPRESS for o in a.option_strings]


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([command, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", _commands())
def test_help_fits_its_budget_and_lists_every_option(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = _help(command, capsys)
    lines = text.splitlines()
    assert len(lines) <= BUDGET.get(command, DEFAULT_BUDGET), f"{command}: {len(lines)} lines"
    assert max(map(len, lines)) <= 80
    shown = set(re.findall(r"(?<![\w-])-{1,2}[A-Za-z][\w-]*", text))
    for option in _options(command):
        assert option in shown, f"{command} --help lost {option}"
    assert "docs/commands.md" in text


def test_register_help_is_grouped_with_units(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = _help("register", capsys)
    for title in ("inputs:", "outputs:", "λ and model:", "refinement:", "affine stage:"):
        assert title in text.splitlines()
    warp = next(line for line in text.splitlines() if line.lstrip().startswith("--warp "))
    assert "NIfTI (I,J,K,3)" in warp and "voxels" in warp


def test_an_unknown_option_lands_under_advanced() -> None:
    parser = build_parser()
    from hyperreg.cli.help_layout import layout_help

    sub = subparser(parser, "evaluate")
    sub.add_argument("--not-yet-grouped", help="an option no group names")
    sub._action_groups = [g for g in sub._action_groups if g.title != ADVANCED]
    layout_help(parser)
    assert "--not-yet-grouped" in sub.format_help().split(f"{ADVANCED}:")[-1]


def test_every_option_is_in_docs_commands_md() -> None:
    docs = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    assert START in docs and END in docs
    reference = docs.split(START)[1].split(END)[0]
    for command in _commands():
        section = reference.split(f"### hyperreg {command}\n")[1].split("\n### ")[0]
        for option in _options(command):
            if option in ("-h", "--help"):
                continue
            assert f"`{option}" in section or f", {option}" in section, (
                f"docs/commands.md lacks {command} {option}: run scripts/write_options_reference.py"
            )


def test_short_help_keeps_the_first_clause_and_fits() -> None:
    assert short_help("fixed image; every output is on its grid", 60) == "fixed image"
    assert short_help("moving image (NIfTI, MGZ or npz)", 60) == "moving image (NIfTI, MGZ or npz)"
    long = "an option whose help, written at length, goes on and on, without a stop, " * 3
    assert len(short_help(long, 40)) <= 40
    assert "(" not in short_help("word " * 6 + "(a parenthesis, never cut inside it)", 40)
