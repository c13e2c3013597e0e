"""The installation self-test behind `--self-test`: model, index and search, end to end, offline.

An installer is only as good as the proof that what it installed runs. The self-test loads the
bundled demo model (verifying every file against its manifest), indexes the bundled sample
(a dozen small SceneWorld pictures in resources/selftest/), searches with the paragraph of each
picture and checks that the described picture ranks first. It works in a temporary
LONGLENS_HOME-style folder, so the user's catalog, settings and models are never read or written,
and it needs no network.

`python -m engine.selftest --write-sample DIR` regenerates the sample (deterministic files).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.errors import LonglensError
from engine.jobs import CancelToken, Progress
from engine.jsonfile import read_json_file
from engine.limits import MAX_SMALL_JSON_BYTES

SAMPLE_RESOURCE = "selftest"
SAMPLE_FILE = "selftest.json"
SAMPLE_FORMAT = 1
# Scenes from the evaluation seed range (the demo collection's seed): none was seen in training.
SAMPLE_SEED = 4242
SAMPLE_COUNT = 12
# sceneworld-mini reads 64 px pictures; 128 px keeps the sample under 100 KB with room to spare.
SAMPLE_PIXELS = 128


class SelfTestFailed(LonglensError):
    """The installation does not work; the message says which step failed and what to do."""


@dataclass
class QueryCheck:
    image: str
    paragraph: str
    rank: int | None  # 1-based rank of the described picture; None when it was not returned
    score: float | None
    top_image: str | None


@dataclass
class SelfTestReport:
    model: str
    model_dir: str
    device: str
    sample_dir: str
    images_indexed: int
    checks: list[QueryCheck] = field(default_factory=list)
    top_k: int = 1

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.rank is not None and c.rank <= self.top_k for c in self.checks)

    def summary(self) -> str:
        passed = sum(1 for c in self.checks if c.rank is not None and c.rank <= self.top_k)
        where = "first" if self.top_k == 1 else f"in the top {self.top_k}"
        return (
            f"self-test {'passed' if self.ok else 'FAILED'}: model {self.model} on {self.device}, "
            f"{self.images_indexed} sample pictures indexed, {passed}/{len(self.checks)} paragraphs "
            f"ranked their picture {where}"
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


# -- the sample ----------------------------------------------------------------------------------
def default_sample_dir() -> Path:
    """resources/selftest in whichever layout is running (source tree, wheel, frozen app)."""
    from engine.models.registry import find_resource

    return find_resource(SAMPLE_RESOURCE)


def write_sample(folder: Path, *, seed: int = SAMPLE_SEED, count: int = SAMPLE_COUNT,
                 pixels: int = SAMPLE_PIXELS) -> Path:
    """Write the sample pictures and selftest.json (picture -> its paragraph) into `folder`."""
    from engine.fileutil import atomic_write_text
    from engine.sceneworld import generate_scene
    from engine.sceneworld.export import image_name, write_collection

    folder = Path(folder)
    write_collection(folder, seed, count, size=pixels, fmt="jpeg")
    # write_collection also writes its own ground truth; the self-test reads only selftest.json.
    (folder / "sceneworld.jsonl").unlink(missing_ok=True)
    queries = [
        {"image": image_name(seed, i, "jpeg"), "paragraph": generate_scene(seed, i).paragraph.text}
        for i in range(count)
    ]
    doc = {"format": SAMPLE_FORMAT, "model": "sceneworld-mini", "seed": seed, "queries": queries}
    atomic_write_text(folder / SAMPLE_FILE, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return folder


def read_sample(folder: Path) -> tuple[str, list[tuple[str, str]]]:
    """(model name, [(image file name, paragraph)]) from folder/selftest.json, checked field by field."""
    path = Path(folder) / SAMPLE_FILE
    if not path.is_file():
        raise SelfTestFailed(
            f"the self-test sample is missing from this installation: no {SAMPLE_FILE} in {folder}. "
            "Reinstall Longlens, or rebuild the sample with `python -m engine.selftest --write-sample DIR`."
        )
    try:
        doc = read_json_file(path, max_bytes=MAX_SMALL_JSON_BYTES)
    except (OSError, ValueError) as exc:
        raise SelfTestFailed(f"{path} is unreadable: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != SAMPLE_FORMAT:
        raise SelfTestFailed(f"{path}: field 'format' must be {SAMPLE_FORMAT}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise SelfTestFailed(f"{path}: field 'model' must name the model the sample is made for")
    queries = doc.get("queries")
    if not isinstance(queries, list) or not queries:
        raise SelfTestFailed(f"{path}: field 'queries' must be a non-empty list")
    out: list[tuple[str, str]] = []
    for i, q in enumerate(queries):
        image = q.get("image") if isinstance(q, dict) else None
        paragraph = q.get("paragraph") if isinstance(q, dict) else None
        if not isinstance(image, str) or "/" in image or "\\" in image or not image:
            raise SelfTestFailed(f"{path}: queries[{i}].image must be a file name in the sample folder")
        if not isinstance(paragraph, str) or not paragraph.strip():
            raise SelfTestFailed(f"{path}: queries[{i}].paragraph must be a non-empty text")
        if not (Path(folder) / image).is_file():
            raise SelfTestFailed(f"{path}: queries[{i}] names {image}, which is not in {folder}")
        out.append((image, paragraph))
    return model, out


# -- the test ------------------------------------------------------------------------------------
def self_test_job(home: Path, *, sample_dir: Path | None = None, device: str = "auto",
                  top_k: int = 1, cancel: CancelToken | None = None) -> Iterator[Progress]:
    """Run the self-test with all data under `home` (which should be empty and disposable).

    Stages: "sample", "model", "index", "search"; the last Progress has stage "done" and the
    SelfTestReport in extra["report"]. Raises SelfTestFailed when a step fails.
    """
    from engine.config import get_paths
    from engine.models.registry import installed_model_dir, load_embedder
    from engine.services import Services

    cancel = cancel or CancelToken()
    sample_dir = Path(sample_dir) if sample_dir is not None else default_sample_dir()
    yield Progress("sample", message=f"reading the sample in {sample_dir}")
    model, queries = read_sample(sample_dir)
    paths = get_paths(home).ensure()
    # Index a copy: the installation folder may be read-only, and the catalog then never points
    # into it.
    photos = paths.data / "selftest-photos"
    photos.mkdir(parents=True, exist_ok=True)
    for image, _ in queries:
        shutil.copyfile(sample_dir / image, photos / image)
    cancel.raise_if_cancelled()

    yield Progress("model", message=f"loading and verifying {model}")
    try:
        embedder = load_embedder(model, paths, device=device)
    except LonglensError as exc:
        raise SelfTestFailed(f"the model {model!r} cannot be loaded: {exc}") from exc
    except (ImportError, OSError, RuntimeError) as exc:  # a broken bundle: missing library or file
        raise SelfTestFailed(f"the model {model!r} cannot be loaded ({type(exc).__name__}): {exc}") from exc
    report = SelfTestReport(model=model, model_dir=str(installed_model_dir(model, paths)),
                            device=str(embedder.device), sample_dir=str(sample_dir),
                            images_indexed=0, top_k=top_k)

    with Services(paths) as svc:
        last = None
        for last in svc.indexer(embedder).run(photos, cancel=cancel):
            if last.stage != "done":
                yield Progress("index", last.done, last.total, last.message)
        summary = last.extra["summary"] if last is not None else None
        if summary is None or summary.cancelled:
            raise SelfTestFailed("indexing the sample did not finish")
        report.images_indexed = summary.new
        if summary.unreadable or summary.new != len(queries):
            reasons = "; ".join(f"{u.get('path')}: {u.get('reason')}" for u in summary.unreadable)
            raise SelfTestFailed(
                f"indexing the sample gave {summary.new} of {len(queries)} pictures"
                + (f" (unreadable: {reasons})" if reasons else "")
            )

        searcher = svc.searcher(embedder)
        for n, (image, paragraph) in enumerate(queries):
            cancel.raise_if_cancelled()
            yield Progress("search", n, len(queries), image)
            result = searcher.search_text(paragraph, top_k=len(queries))
            names = [Path(h.path).name for h in result.hits]
            rank = names.index(image) + 1 if image in names else None
            hit = result.hits[rank - 1] if rank else None
            report.checks.append(QueryCheck(image, paragraph, rank, hit.score if hit else None,
                                            names[0] if names else None))
    if not report.ok:
        bad = [c for c in report.checks if c.rank is None or c.rank > top_k]
        detail = ", ".join(f"{c.image} ranked {c.rank or 'nowhere'} (first: {c.top_image})" for c in bad)
        raise SelfTestFailed(f"{report.summary()}: {detail}. The model or the search code in this "
                             "installation is damaged; reinstall Longlens.")
    yield Progress("done", len(queries), len(queries), report.summary(), extra={"report": report})


def run_self_test(*, sample_dir: Path | None = None, device: str = "auto", top_k: int = 1,
                  keep: Path | None = None) -> SelfTestReport:
    """Run the self-test in a fresh temporary folder (removed afterwards) and return its report.

    `keep`: use this folder instead and leave it in place, to inspect what the test wrote.
    """
    if keep is not None:
        home = Path(keep)
        home.mkdir(parents=True, exist_ok=True)
        return _drain(self_test_job(home, sample_dir=sample_dir, device=device, top_k=top_k))
    with tempfile.TemporaryDirectory(prefix="longlens-selftest-") as tmp:
        return _drain(self_test_job(Path(tmp), sample_dir=sample_dir, device=device, top_k=top_k))


def _drain(job: Iterator[Progress]) -> SelfTestReport:
    from engine.jobs import run_to_end

    last = run_to_end(job)
    assert last is not None and last.stage == "done"
    return last.extra["report"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.selftest", description=__doc__.splitlines()[0])
    p.add_argument("--write-sample", type=Path, metavar="DIR", help="write the sample into DIR and stop")
    p.add_argument("--sample", type=Path, help="run against this sample folder instead of the bundled one")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.write_sample:
        write_sample(args.write_sample)
        print(f"wrote the self-test sample into {args.write_sample}")
        return 0
    try:
        report = run_self_test(sample_dir=args.sample, device=args.device)
    except LonglensError as exc:
        print(f"longlens self-test: FAILED: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
