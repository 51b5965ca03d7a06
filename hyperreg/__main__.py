"""``python -m hyperreg`` runs the command line."""

from hyperreg.cli import main

raise SystemExit(main())
