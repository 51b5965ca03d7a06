"""Command line for looking at λ: ``hyperreg view``.

``view`` prepares one pair, serves the λ explorer (:mod:`hyperreg.apps.view`,
:mod:`hyperreg.apps.view_server`) on 127.0.0.1 with a random token, prints its address and
opens the browser; Ctrl-C stops it. :func:`add_parsers` adds the subcommand to ``hyperreg``'s
parser (:mod:`hyperreg.cli.run`); :data:`COMMANDS` maps it to its function. The library is
imported inside the command function.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hyperreg.cli import args as opts
from hyperreg.cli.inputs import check_out_folder, model_for, pair_options

__all__ = ["COMMANDS", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add the ``view`` subparser to ``sub`` (from ``add_subparsers``)."""
    view = sub.add_parser(
        "view",
        help="a local web page for one pair: move a λ slider and see the registration live",
    )
    opts.add_input_arguments(view)
    view.add_argument(
        "--lambda",
        dest="lam",
        type=opts.lambda_value,
        help="λ the page starts at (default: the model's default λ)",
    )
    view.add_argument(
        "--port", type=int, default=0, help="TCP port of the page (default 0: any free port)"
    )
    view.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to serve on (default 127.0.0.1, this machine only; any other address "
        "lets other machines reach the page, with the token)",
    )
    view.add_argument(
        "--no-browser", action="store_true", help="print the address without opening a browser"
    )
    view.add_argument(
        "--out",
        default="hyperreg_view",
        help="folder the page's Save writes into (created when saving; default hyperreg_view): "
        "moved_lam<λ>.nii.gz, warp_lam<λ>.nii.gz (displacement field, voxels, i/j/k order, "
        "fixed affine, the whole transform as register --warp) and moved_seg_lam<λ>.nii.gz",
    )
    opts.add_lambda_grid_argument(view, "λ values of the background sweep for the curves")
    opts.add_init_argument(view, initial=False)
    opts.add_preprocessing_arguments(view)
    opts.add_mask_arguments(view)
    opts.add_contrast_argument(view)
    opts.add_npz_geometry_argument(view)
    opts.add_common(view)


def _cmd_view(args: argparse.Namespace) -> int:
    from hyperreg.apps.view import open_view
    from hyperreg.apps.view_server import LOOPBACK, make_server

    if bool(args.moving_seg) != bool(args.fixed_seg):
        raise ValueError("--moving-seg and --fixed-seg go together (Dice needs both)")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"argument --port: must be 0..65535, got {args.port}")
    check_out_folder(args.out)  # Save writes there: a file in the way is said now
    session = open_view(
        model_for(args),
        args.moving,
        args.fixed,
        out=args.out,
        lam=args.lam,
        grid=args.lambdas,
        init=args.init,
        npz_geometry=args.npz_geometry,
        fixed_mask=args.fixed_mask,
        moving_mask=args.moving_mask,
        contrast=opts.contrast_from(args),
        **pair_options(args),
    )
    try:
        server = make_server(session, args.host, args.port)
    except OSError as err:
        raise ValueError(
            f"argument --port: cannot serve on {args.host}:{args.port}: {err}"
        ) from err
    if args.host not in (LOOPBACK, "localhost", "::1"):
        print(
            f"{opts.PROG} view: warning: serving on {args.host}, not only this machine: anyone "
            "who can reach it and has the address with its token can use the page",
            file=sys.stderr,
        )
    session.start_sweep()
    print(f"{opts.PROG} view: open {server.url}  (Ctrl-C stops)", flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print(f"{opts.PROG} view: stopped")
    finally:
        server.close()
    return 0


COMMANDS = {"view": _cmd_view}
