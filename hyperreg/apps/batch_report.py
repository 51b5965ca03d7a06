"""The web report of a batch (``batch --report``): one page for the batch, one per pair.

:func:`write_report` reads a batch folder's ``summary.csv`` and ``failures.csv``
(:mod:`hyperreg.apps.batch_records`) and writes ``report.html``: one row per pair (names, Dice
before / affine / after, folding, std log J, λ and its source, seconds, warnings, verdict),
the pairs to check and the failed ones first, sortable by a click on a column header, each
registered pair linking to its own page ``pairs/<name>/report.html``: the fixed and moved
images flickering (or shown one at a time) in each plane (:func:`hyperreg.figures.planes.
pair_planes`: one for 2D, axial, coronal and sagittal for 3D), with the moved image's edges
and the label borders laid over them. Every page is one self-contained HTML file (images
inline: grey slices as WebP, the layer as a palette PNG; a few lines of inline JavaScript,
nothing fetched): it opens from ``file://``.

A pair's page is written once, when missing or older than the pair's ``record.json``, so the
report can be rewritten after every pair at the cost of one pair's images
(:func:`hyperreg.apps.batch.batch_register` does, with ``report=True``). Imports the figures
layer and :mod:`hyperreg.geometry.io`; never torch, train or cli.
"""

from __future__ import annotations

import base64
import html
import logging
import math
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hyperreg._files import atomic_text, read_csv
from hyperreg.apps.batch_records import RECORD

__all__ = ["REPORT", "pair_page", "write_report"]

logger = logging.getLogger(__name__)

REPORT = "report.html"
"""The file name of the batch page (in the batch folder) and of each pair's page (in its
folder)."""

# (summary column, header, kind): kind "num" cells sort as numbers, "text" as text
_COLUMNS = (
    ("index", "#", "int"),
    ("moving", "moving", "file"),
    ("fixed", "fixed", "file"),
    ("dice_before", "Dice before", "3"),
    ("dice_affine", "Dice affine", "3"),
    ("mean_dice", "Dice after", "3"),
    ("folding_percent", "folding %", "4"),
    ("log_jacobian_std", "std log J", "3"),
    ("lambda_chosen", "λ", "3"),
    ("lambda_reason", "λ source", "text"),
    ("seconds", "seconds", "1"),
    ("warnings", "warnings", "text"),
    ("verdict", "verdict", "text"),
)

_STYLE = """
body{font:13px system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:20px;margin:0 0 6px}p.note{color:#555;margin:4px 0 12px}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #ccc;padding:3px 5px;text-align:left;vertical-align:top}
th{background:#eee;cursor:pointer;user-select:none;white-space:nowrap}
th[data-dir=asc]::after{content:' ▲'}th[data-dir=desc]::after{content:' ▼'}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.check td{background:#fff4d6}tr.failed td{background:#fde2e2}
td.warn,td.small{max-width:11em;font-size:12px;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis}td.warn{color:#8a5a00}td.file{white-space:nowrap}
table.numbers td{white-space:normal;max-width:none;text-align:left}
table.numbers{max-width:760px}
.planes{display:flex;flex-wrap:wrap;gap:14px}.plane{display:flex;flex-direction:column}
.stack{position:relative;background:#000}.stack img{position:absolute;left:0;top:0;
width:100%;height:100%;image-rendering:auto}.tag{position:absolute;left:4px;top:2px;
color:#ff0;font:bold 13px monospace;text-shadow:0 0 2px #000}
.controls{margin:10px 0}.controls button{font-size:14px;margin-right:8px}
"""

_SORT_JS = """
function sortBy(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th);
const asc=th.dataset.dir!=='asc';for(const h of th.parentNode.children)delete h.dataset.dir;
th.dataset.dir=asc?'asc':'desc';const body=t.tBodies[0],rows=[...body.rows];
const key=r=>{const c=r.cells[i],v=c.dataset.value;
 if(v===undefined)return c.textContent.toLowerCase();return v===''?null:parseFloat(v);};
rows.sort((a,b)=>{const x=key(a),y=key(b);if(x===null||y===null)return(x===null)-(y===null);
 return(x<y?-1:x>y?1:0)*(asc?1:-1);});for(const r of rows)body.appendChild(r);}
for(const th of document.querySelectorAll('th'))th.addEventListener('click',()=>sortBy(th));
document.body.dataset.ready='1';
"""

_FLICKER_JS = """
let shown='moved',timer=null;const moved=[...document.querySelectorAll('img.moved')];
function show(which){shown=which;for(const m of moved)m.style.visibility=
 which==='moved'?'visible':'hidden';for(const t of document.querySelectorAll('.tag'))
 t.textContent=which;document.body.dataset.shown=which;}
function flicker(on){clearInterval(timer);timer=on?setInterval(()=>show(
 shown==='moved'?'fixed':'moved'),700):null;document.getElementById('flick').textContent=
 on?'stop flicker':'flicker';}
document.getElementById('flick').onclick=()=>flicker(timer===null);
document.getElementById('showFixed').onclick=()=>{flicker(false);show('fixed');};
document.getElementById('showMoved').onclick=()=>{flicker(false);show('moved');};
document.getElementById('layer').onchange=e=>{for(const l of document.querySelectorAll(
 'img.layer'))l.style.display=e.target.checked?'':'none';};
show('moved');flicker(true);document.body.dataset.ready='1';
"""


def write_report(out: str | os.PathLike[str]) -> Path:
    """Write ``out/report.html`` from the batch's ``summary.csv`` and ``failures.csv``, and the
    page of every registered pair that has none or an older one than its ``record.json``.

    Rows: the failed pairs (with their error) and those whose verdict is ``check: …`` first,
    then the others, each group by row index. A pair whose images cannot be read (e.g. removed
    since) gets a page that says so; the batch page is written all the same.

    Args:
        out: The batch's output folder (``summary.csv`` there; a missing ``failures.csv``
            means none failed).

    Returns:
        The path of ``report.html``.

    Raises:
        FileNotFoundError: If ``out/summary.csv`` does not exist.
        OSError: If a page cannot be written (the message names it).
    """
    root = Path(out)
    _, rows = read_csv("write_report", root / "summary.csv")
    failures = []
    if (root / "failures.csv").is_file():
        failures = read_csv("write_report", root / "failures.csv")[1]
    for row in rows:
        if _stale(root / "pairs" / row["name"]):
            pair_page(root, row)
    body = _table(rows, failures)
    done = len(rows)
    checks = sum(r.get("verdict", "").startswith("check") for r in rows)
    title = f"hyperreg batch: {done} registered, {checks} to check, {len(failures)} failed"
    page = (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}"
        "</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p class=note>{html.escape(str(root.resolve()))}: summary.csv and failures.csv as of "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}. Pairs to check and failed pairs first; click a "
        "column header to sort; click a pair's number for its images.</p>"
        f"{body}<script>{_SORT_JS}</script></body></html>\n"
    )
    return atomic_text(root / REPORT, lambda handle: handle.write(page))


def _stale(folder: Path) -> bool:
    """The pair's page is missing or older than its ``record.json``."""
    page, record = folder / REPORT, folder / RECORD
    if not page.is_file():
        return True
    return record.is_file() and page.stat().st_mtime < record.stat().st_mtime


def _ordered(rows: list[dict[str, str]], failures: list[dict[str, str]]) -> list[dict[str, str]]:
    """Failed pairs, then pairs to check, then the others; by index within each group."""
    failed = [
        {**f, "verdict": "failed: " + "".join((f.get("error") or "").splitlines()[:1]),
         "_failed": "1"}
        for f in failures
    ]  # fmt: skip

    def order(row: dict[str, str]) -> tuple[int, float]:
        group = 0 if row.get("_failed") else 1 if row.get("verdict", "").startswith("check") else 2
        index = row.get("index", "")
        return group, float(index) if _number(index) is not None else float("inf")

    return sorted([*rows, *failed], key=order)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _cell(row: dict[str, str], column: str, kind: str, link: bool = True) -> str:
    """One ``<td>``: numbers right-aligned with their value for sorting (none for a missing or
    non-finite one: it sorts last), files by name; the index links to the pair's page unless
    ``link`` is False or the pair failed."""
    text = row.get(column, "") or ""
    tip = html.escape(text, quote=True)
    if kind == "file":
        return f"<td class=file title='{tip}'>{html.escape(Path(text).name)}</td>"
    if kind == "text":  # one line; the whole text on hover (and on the pair's page)
        css = "warn" if column == "warnings" and text else "small"
        return f"<td class={css} title='{tip}'>{html.escape(text)}</td>"
    value = _number(text)
    if value is None or not math.isfinite(value):
        return f"<td class=num data-value=''>{html.escape(text)}</td>"
    shown = f"{value:.0f}" if kind == "int" else f"{value:.{kind}f}"
    if kind == "int" and link and not row.get("_failed"):
        link = f"pairs/{quote(row['name'])}/{REPORT}"
        shown = f"<a href='{html.escape(link, quote=True)}'>{shown}</a>"
    return f"<td class=num data-value='{value!r}'>{shown}</td>"


def _table(rows: list[dict[str, str]], failures: list[dict[str, str]]) -> str:
    """The batch table's HTML (``<table id=pairs>``)."""
    head = "".join(f"<th>{html.escape(header)}</th>" for _, header, _ in _COLUMNS)
    lines = [f"<table id=pairs><thead><tr>{head}</tr></thead><tbody>"]
    for row in _ordered(rows, failures):
        css = (
            "failed"
            if row.get("_failed")
            else ("check" if row.get("verdict", "").startswith("check") else "ok")
        )
        cells = "".join(_cell(row, column, kind) for column, _, kind in _COLUMNS)
        lines.append(f"<tr class={css} data-name='{html.escape(row['name'], quote=True)}'>"
                     f"{cells}</tr>")  # fmt: skip
    lines.append("</tbody></table>")
    return "".join(lines)


def pair_page(out: str | os.PathLike[str], row: dict[str, str]) -> Path:
    """Write the page of one registered pair, ``out/pairs/<name>/report.html``.

    Its numbers (the batch table's columns, one per line), then per plane (one for 2D; axial,
    coronal, sagittal for 3D) the fixed and moved images flickering (0.7 s each; buttons stop
    it or show one of them) with the moved image's strongest edges (red) and, with label maps,
    the label borders (fixed yellow, moved cyan, both green) laid over them (a check box hides
    them).

    Args:
        out: The batch's output folder.
        row: The pair's row of ``summary.csv`` (``name``, ``fixed``, ``moved``; ``fixed_seg``,
            ``moved_seg`` when present; ``moved`` and ``moved_seg`` relative to ``out``).

    Returns:
        The page's path.

    Raises:
        OSError: If the page cannot be written. Images that cannot be read are not an error:
            the page says why it has none.
    """
    root = Path(out)
    folder = root / "pairs" / row["name"]
    try:
        figures = _pair_images(root, row)
    except (OSError, ValueError) as err:
        logger.warning("no images on the page of pair %s: %s", row["name"], err)
        figures = f"<p class=note>No images: {html.escape(str(err))}</p>"
    numbers = "".join(
        f"<tr><th>{html.escape(header)}</th>{_cell(row, column, kind, link=False)}</tr>"
        for column, header, kind in _COLUMNS
    )
    title = f"hyperreg batch: pair {row['name']}"
    page = (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}"
        f"</title><style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p><a href='../../{REPORT}'>all pairs</a></p><table class=numbers>{numbers}</table>"
        f"{figures}</body></html>\n"
    )
    return atomic_text(folder / REPORT, lambda handle: handle.write(page))


def _pair_images(root: Path, row: dict[str, str]) -> str:
    """The images part of a pair's page: controls, one panel per plane and the flicker script.

    Raises:
        OSError, ValueError: If an image cannot be read or is not on the moved image's grid.
    """
    from hyperreg.figures.planes import pair_planes
    from hyperreg.geometry.io import load_volume

    moved = load_volume(root / row["moved"])
    fixed = load_volume(row["fixed"], geometry_from=moved)
    labels: dict[str, Any] = {}
    if row.get("moved_seg") and row.get("fixed_seg"):
        labels["moved_seg"] = load_volume(root / row["moved_seg"], label=True).data
        labels["fixed_seg"] = load_volume(row["fixed_seg"], label=True, geometry_from=moved).data
    planes = pair_planes(fixed.data, moved.data, moved.affine, **labels)
    width = 300 if len(planes) > 1 else 420
    panels = []
    for plane in planes:
        size = f"width:{width}px;height:{round(width * plane.aspect)}px"
        panels.append(
            f"<div class=plane data-plane={plane.plane}><div class=stack style='{size}'>"
            f"<img class=fixed alt='fixed, {plane.plane}' src='{_uri(plane.fixed, plane.mime)}'>"
            f"<img class=moved alt='moved, {plane.plane}' src='{_uri(plane.moved, plane.mime)}'>"
            f"<img class=layer alt='' src='{_uri(plane.layer)}'><span class=tag></span></div>"
            f"<small>{html.escape(plane.label)}</small></div>"
        )
    borders = ", label borders: fixed yellow, moved cyan, both green" if labels else ""
    return (
        "<div class=controls><button id=flick>stop flicker</button><button id=showFixed>"
        "fixed</button><button id=showMoved>moved</button><label><input type=checkbox "
        f"id=layer checked> moved image's edges (red){borders}</label></div>"
        f"<div class=planes>{''.join(panels)}</div><script>{_FLICKER_JS}</script>"
    )


def _uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
