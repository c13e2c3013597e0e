"""`longlens search`: a paragraph (or an image) against the indexed libraries."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine import options
from engine.cli import common
from engine.text.inert import inert

# engine.catalog.dates.DATE_FROM_FILE_TIME (not imported here: `longlens --help` loads no SQLAlchemy).
DATE_FROM_FILE_TIME = "file time"


def _filter(args: argparse.Namespace):
    from engine.search.filters import build_filters

    return build_filters(args.folder, args.after, args.before, args.camera, rating=args.rating, label=args.label,
                         keyword=args.keyword, near=args.near, km=args.km)


# What each JSON result carries of its picture's metadata (engine.metadata.showing.metadata_view,
# the inspector's source too); the hit itself already gives the date and the camera as shown.
_METADATA_KEYS = ("title", "description", "titles", "descriptions", "keywords", "rating", "label", "pick", "lens",
                  "gps", "fields")


def _with_metadata(svc, results: list[dict]) -> list[dict]:
    """The JSON results with what the picture's metadata says (title, keywords once each, rating,
    label, pick, lens, GPS, every field with its source), as the inspector shows it."""
    from engine.metadata.showing import metadata_view

    found = svc.catalog.photo_metadata([r["image_id"] for r in results])
    for r in results:
        m = found.get(r["image_id"])
        view = metadata_view(m)
        r.update({k: view[k] for k in _METADATA_KEYS})
        r["metadata_sources"], r["metadata_problems"] = view["sources"], view["problems"]
    return results


def cmd_search(args: argparse.Namespace) -> int:
    from engine.errors import QueryError

    if args.image is None and args.query is None:
        raise QueryError("give a paragraph to search for, or --image PATH")
    flt = _filter(args)  # cheap checks first: a typo in a date should not wait for a model to load
    args = common.with_settings(args)
    with common.services(args) as svc:
        embedder = svc.embedder(args.model, device=args.device, text_tower=args.text_tower)
        searcher = svc.searcher(embedder)
        if args.image is not None:
            result = searcher.search_image(args.image, top_k=args.top, flt=flt, order=args.sort,
                                           cutoff=args.cutoff)
        else:
            text = sys.stdin.read() if args.query == "-" else args.query
            result = searcher.search_text(text, top_k=args.top, flt=flt, max_tokens=args.max_tokens,
                                          rerank=args.rerank, rerank_k=args.rerank_k, order=args.sort,
                                          cutoff=args.cutoff)
        for warning in result.warnings:
            print(f"warning: {inert(warning, layout=True)}", file=sys.stderr)
        for note in result.notes:
            print(f"note: {inert(note, layout=True)}", file=sys.stderr)
        if args.json:
            common.print_json({
                "model": result.model_id,
                "tokens_used": result.tokens_used,
                "tokens_total": result.tokens_total,
                "truncated": result.truncated,
                "reranked": result.reranked,
                "timings_ms": result.timings_ms,
                "order": result.order,
                "cutoff": result.cutoff.as_dict() if result.cutoff is not None else None,
                "warnings": result.warnings,
                "results": _with_metadata(svc, [h.to_json() for h in result.hits]),
            })
            return 0
        if result.tokens_total is not None:
            note = " (TRUNCATED)" if result.truncated else ""
            print(f"query: {result.tokens_used}/{result.tokens_total} tokens used{note}; model {inert(result.model_id)}")
        if result.cutoff is not None:
            print(f"cut-off: {result.cutoff.text()}")
        if not result.hits:
            print("no results (is the folder indexed with this model? try `longlens index DIR`)")
        if result.order != "relevance":
            print(f"ordered by date, {'newest' if result.order == 'date-new' else 'oldest'} first "
                  "(the rank is the relevance rank)")
        for h in result.hits:
            rr = h.extra.get("rerank_score")
            both = f"  itm {rr:6.4f} (ann #{h.extra['ann_rank']})" if rr is not None else ""
            print(f"{h.rank:4}  {h.score:8.4f}{both}  {_date_column(h)}  {inert(h.path)}")
        if any(h.date_source == DATE_FROM_FILE_TIME for h in result.hits):
            print("* no EXIF, XMP or IPTC date: the date shown is the file's modification time")
        return 0


def _date_column(hit: Any) -> str:
    """The picture's date to the minute, or as much of it as is known ("2023-06"), '*' marking a
    file time (no EXIF, XMP or IPTC date)."""
    if not hit.date:
        return " " * 17
    mark = "*" if hit.date_source == DATE_FROM_FILE_TIME else " "
    return f"{hit.date[:16].replace('T', ' '):16}{mark}"


def cmd_show(args: argparse.Namespace) -> int:
    """What the catalog knows about one picture: the inspector's view (engine.metadata.showing)."""
    from engine.errors import LonglensError
    from engine.metadata.showing import picture_view, view_lines

    given = Path(args.path).expanduser()
    with common.services(args) as svc:
        # As given, else with links resolved (the library's root is stored resolved).
        view = picture_view(svc.catalog, path=str(given.absolute()))
        if view is None and given.exists():
            view = picture_view(svc.catalog, path=str(given.resolve()))
    if view is None:
        raise LonglensError(f"{args.path} is not a picture of an indexed library: index its folder first "
                            "(`longlens index FOLDER`)")
    if args.json:
        common.print_json(view)
        return 0
    print(inert(view["path"]))
    for line in view_lines(view):
        print(f"  {inert(line)}")
    return 0


SEARCH_FLAGS = {"model": "--model", "top_k": "--top", "max_tokens": "--max-tokens", "rerank_k": "--rerank-k",
                "text_tower": "--text-tower", "after": "--after", "before": "--before", "camera": "--camera",
                "folder": "--folder", "order": "--sort", "cutoff": "--cutoff", "rating": "--rating", "label": "--label",
                "keyword": "--keyword", "near": "--near", "km": "--km"}


def register(sub: Any) -> None:
    ss = sub.add_parser("search", help="search with a paragraph (or - to read it from stdin)")
    ss.add_argument("query", nargs="?")
    ss.add_argument("--top", type=options.TOP_K, default=20)
    ss.add_argument("--json", action="store_true")
    ss.add_argument("--image", help="search with an image instead of text")
    ss.add_argument("--folder", help="only images under this folder")
    ss.add_argument("--after", help="only images taken on or after this date (YYYY-MM-DD); a picture without an "
                    "EXIF date is dated by its XMP or IPTC date (a month or year alone counts from its start), "
                    "else by its file's modification time")
    ss.add_argument("--before", help="only images taken before this date (YYYY-MM-DD), dated as for --after")
    ss.add_argument("--camera", help="only images whose camera make/model contains this text, as the file's "
                    "EXIF or its XMP gives it (pictures that record no camera are left out)")
    ss.add_argument("--sort", type=options.RESULT_ORDER, default="relevance", metavar="{relevance,date-new,date-old}",
                    help="order of the results: by relevance (default), or the same results by date, newest or "
                         "oldest first (the EXIF date, else the XMP or IPTC date, else the file's modification time, marked *)")
    ss.add_argument("--cutoff", type=options.RELEVANCE_CUTOFF, metavar="DELTA",
                    help="show only the results whose score is within DELTA of the best result's score (e.g. "
                         "0.05), so the list ends where the scores fall off; prints where it cut")
    ss.add_argument("--rating", type=options.MIN_RATING,
                    help="only images rated at least this many stars in their XMP (0-5; 0 leaves out rejected ones)")
    ss.add_argument("--label", help="only images with this colour label (e.g. Red), whichever tool wrote it "
                    "(Lightroom's name, digiKam's or darktable's number), case ignored")
    ss.add_argument("--keyword", action="append",
                    help="only images with this XMP keyword; a path like 'Places|Norway' also matches the "
                         "keywords under it. Repeat it: every keyword must match")
    ss.add_argument("--near", metavar="LAT,LON",
                    help="only images whose GPS position is within --km of this place (decimal degrees, south "
                         "and west negative, e.g. 59.91,10.75); images with no GPS position are left out")
    ss.add_argument("--km", metavar="R", type=options.GPS_RADIUS_KM,
                    help="the radius for --near, in kilometres (more than 0)")
    ss.add_argument("--model")
    ss.add_argument("--text-tower", type=Path, help="a paragraph-trained text tower folder (default: the settings')")
    ss.add_argument("--max-tokens", type=options.TOKEN_BUDGET,
                    help="token budget for the query (default: the settings', else the model's)")
    ss.add_argument("--device", help="auto, cpu, cuda, cuda:N or mps (default: the settings' device, auto)")
    ss.add_argument("--rerank", action=argparse.BooleanOptionalAction, default=False,
                    help="re-score the top --rerank-k candidates with the model's matching head (BLIP: ITM; "
                         "sceneworld-mini: its matching head) and order by it (default: off, ANN order; "
                         "see docs/grounding.md)")
    ss.add_argument("--rerank-k", type=options.RERANK_K, default=32, help="candidates to re-rank (default 32)")
    ss.set_defaults(func=cmd_search, flags=SEARCH_FLAGS)

    sh = sub.add_parser("show", help="show what the catalog knows about one picture: its date, camera, GPS, "
                        "metadata, and every field read with where it came from (the inspector's view)")
    sh.add_argument("path", help="an indexed picture")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)
