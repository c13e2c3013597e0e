"""`longlens models list|pull|import|verify`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.cli import common
from engine.text.inert import inert


def cmd_models(args: argparse.Namespace) -> int:
    from engine.models import registry

    paths = common.paths(args).ensure()
    if args.models_cmd == "list":
        rows = registry.list_models(paths)
        if args.json:
            common.print_json([dataclasses.asdict(r) for r in rows])
        else:
            for r in rows:
                state = "installed" if r.installed else "not installed"
                print(f"{inert(r.name):24} {inert(r.backend):16} {state:14} {inert(r.description)}")
                if r.text_towers:
                    print(f"{'':24} query readers included (--text-tower NAME): {', '.join(inert(t) for t in r.text_towers)}")
        return 0
    if args.models_cmd == "pull":
        from engine.errors import JobCancelled
        from engine.models.download import human_size, kept_download_bytes, pull_model

        # One bar per stage: looking files up counts files; the download counts bytes (and checks
        # each file against its pin) with tqdm's size, rate and time left; its first report, the
        # sizes in all and still to fetch, is written above its bar. A checkpoint the backend
        # converts (Long-CLIP's .pt) is checked once more, in bytes, before it is unpickled.
        try:
            common.run_job(
                lambda tok: pull_model(args.name, paths, cancel=tok, trust_unpinned=args.trust_unpinned),
                quiet=False,
                bars=common.Bars(unit=lambda stage: "B" if stage in ("download", "verify") else "file", announce=True,
                                 scaled_units=frozenset({"B"})),
            )
        except JobCancelled:
            # What the stop left: nothing installed (a model installed before stays as it was), and
            # the bytes fetched so far, which the next pull continues from.
            kept = kept_download_bytes(args.name, paths)
            left = (f"; the {human_size(kept)} downloaded so far are kept, and pulling again continues from there"
                    if kept else "")
            print(f"cancelled: {args.name} was not installed{left}", file=sys.stderr)
            return 130
        print(f"installed {args.name} in {registry.installed_model_dir(args.name, paths)}")
        return 0
    if args.models_cmd == "import":
        from engine.models.download import import_model

        backend = registry.import_backend(Path(args.dir).expanduser(), args.name)
        dest = import_model(Path(args.dir), args.name, paths, backend=backend, replace=args.replace)
        print(f"imported {inert(args.name)} ({inert(backend)}) into {inert(dest)}")
        return 0
    if args.models_cmd == "convert":
        common.run_job(lambda tok: _convert_job(Path(args.file), args.name, paths, args.replace, tok),
                       quiet=False, bars=common.Bars(unit="B"))
        print(f"converted {inert(Path(args.file).name)} and installed {inert(args.name)} in "
              f"{inert(registry.installed_model_dir(args.name, paths))}")
        return 0
    if args.models_cmd == "verify":
        from engine.models.download import verify_model

        report = verify_model(args.name, paths)
        if args.json:
            common.print_json({"name": args.name, "ok": report.ok,
                               "files": [dataclasses.asdict(f) for f in report.files]})
        else:
            print(inert(report.summary(), layout=True))
        return 0 if report.ok else 1
    raise AssertionError(args.models_cmd)


def _convert_job(pt_file: Path, name: str, paths: Any, replace: bool, cancel: Any) -> Iterator[Any]:
    """Convert a pinned OpenAI-layout checkpoint into a fresh folder under the cache, import that
    folder as `name`, then remove it."""
    import shutil
    import uuid

    from engine.backends.clip.convert import convert_openai_checkpoint, pinned_checkpoint
    from engine.jobs import Progress
    from engine.models.download import import_model

    pin = pinned_checkpoint(name)
    work = paths.cache / f"convert-{name}-{uuid.uuid4().hex[:8]}"
    try:
        folder = yield from convert_openai_checkpoint(pt_file, work / name, sha256=pin.sha256, size=pin.size,
                                                      cancel=cancel)
        yield Progress("install", 0, None, f"installing {name}")
        dest = import_model(folder, name, paths, backend="clip", replace=replace)
        yield Progress("done", 1, 1, f"installed {name}", extra={"path": str(dest)})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def register(sub: Any) -> None:
    sm = sub.add_parser("models", help="list, pull, import and verify models")
    msub = sm.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list")
    ml.add_argument("--json", action="store_true")
    mp = msub.add_parser("pull", help="download a registered model (pinned revision, every file checked against "
                         "its pin; an interrupted pull resumes)")
    mp.add_argument("name")
    mp.add_argument("--trust-unpinned", action="store_true",
                    help="only for a model listing files without a pin (`models list --json`: unpinned): accept "
                         "them as downloaded and record their hashes; fully pinned models never need it")
    mp.set_defaults(flags={"trust_unpinned": "--trust-unpinned"})
    mi = msub.add_parser("import", help="install a local Hugging Face-format folder (the offline path)")
    mi.add_argument("dir")
    mi.add_argument("--name", required=True)
    mi.add_argument("--replace", action="store_true")
    mi.set_defaults(flags={"replace": "--replace"})
    mc = msub.add_parser("convert", help="install an official OpenAI-layout .pt checkpoint (Long-CLIP) once its "
                         "pinned SHA-256 matched: converted to a CLIPModel folder with safetensors")
    mc.add_argument("file")
    mc.add_argument("--name", required=True, help="the registered model the file is (longclip-b, longclip-l)")
    mc.add_argument("--replace", action="store_true")
    mc.set_defaults(flags={"replace": "--replace"})
    mv = msub.add_parser("verify", help="re-check an installed model's files against its manifest")
    mv.add_argument("name")
    mv.add_argument("--json", action="store_true")
    sm.set_defaults(func=cmd_models)
