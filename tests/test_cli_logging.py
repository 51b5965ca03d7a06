"""How the command line prints log lines: hyperreg's under the command's name, other
libraries' (matplotlib's font-cache message) under their own logger's name."""

from __future__ import annotations

import logging

import pytest

from hyperreg.cli import main


def test_third_party_log_lines_are_not_printed_under_hyperreg(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hyperreg.cli.run as run

    def command(args: object) -> int:
        logging.getLogger("matplotlib.font_manager").warning(
            "Matplotlib is building the font cache; this may take a moment."
        )
        logging.getLogger("PIL.PngImagePlugin").info("STREAM b'IHDR' 16 13")  # below WARNING
        logging.getLogger("hyperreg.apps.models").info("using the bundled model")
        return 0

    monkeypatch.setitem(run.COMMANDS, "models", command)
    root_level = logging.getLogger().level
    assert main(["models"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert (
        "matplotlib.font_manager: warning: Matplotlib is building the font cache; this may "
        "take a moment." in err
    )
    assert not [line for line in err if line.startswith("hyperreg") and "Matplotlib" in line]
    assert not [line for line in err if "IHDR" in line]  # other libraries' INFO stays quiet
    assert "hyperreg models: using the bundled model" in err
    assert logging.getLogger().level == root_level  # restored: main() also runs in-process
