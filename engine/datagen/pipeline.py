"""The synthetic caption pipeline (research brief §1, "data per image").

Per image: three generation requests to the generator model, each conditioned on the image and
its original caption when there is one (5 positive captions, 5 hard negatives, one paragraph of
3-6 sentences), and one faithfulness request to the scorer model (0-10). A paragraph scoring at
or below the threshold (5) is regenerated, up to 3 more times, and the best-scoring one is kept.
An answer that cannot be parsed (wrong count, refusal, chatter only) is asked for again, at most
`parse_retries` more times.

Images run concurrently (a bounded thread pool; each image's requests run one after another),
each finished image is appended to the output as one fsynced line, and images already in the
output are skipped, so an interrupted run resumes where it stopped. `datagen_job` is a generator
of Progress like every long engine job; its last report ("done") carries the summary.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.datagen.client import ChatClient, EndpointError
from engine.datagen.inputs import DEFAULT_MAX_SIDE, ImageItem, InputError, dedupe, image_data_url
from engine.datagen.output import LineAppender, image_key, recover
from engine.datagen.parsing import Parsed, parse_list, parse_paragraph, parse_score
from engine.datagen.prompts import Prompts, load_prompts
from engine.datagen.sampling import Sampling
from engine.errors import JobCancelled, LonglensError
from engine.jobs import CancelToken, Progress, RateMeter
from engine.training.data import EXPECTED_COUNT, Requirements, check_line


@dataclass(frozen=True)
class DatagenRequest:
    items: list[ImageItem]
    out: Path
    endpoint: str
    generator: str
    scorer: str
    api_key: str | None = None
    sampling: Sampling = Sampling()
    prompts_dir: Path | None = None
    concurrency: int = 4
    timeout: float = 120.0
    max_retries: int = 5
    backoff: float = 1.0
    max_backoff: float = 60.0
    parse_retries: int = 2
    score_threshold: float = 5.0
    max_regenerations: int = 3
    min_sentences: int = 3
    max_sentences: int = 6
    max_side: int = DEFAULT_MAX_SIDE
    limit: int | None = None  # at most this many new images in this run

    def check(self) -> None:
        if self.concurrency < 1:
            raise LonglensError("the number of images in flight must be at least 1", settings=("concurrency",))
        if self.parse_retries < 0 or self.max_regenerations < 0 or self.max_retries < 0:
            raise LonglensError("re-asks, regenerations and retries must be 0 or more",
                               settings=("parse_retries", "max_regenerations", "max_retries"))
        if not 0 <= self.score_threshold <= 10:
            raise LonglensError("the score threshold must be within 0..10", settings=("score_threshold",))
        if not 1 <= self.min_sentences <= self.max_sentences:
            raise LonglensError("sentence bounds must satisfy 1 <= min <= max")
        if self.timeout <= 0:
            raise LonglensError("the request timeout must be positive", settings=("timeout",))
        if self.max_side < 64:
            raise LonglensError("the picture side must be at least 64 pixels", settings=("max_side",))
        if not self.generator or not self.scorer:
            raise LonglensError("the generator and scorer models of the endpoint are both needed",
                               settings=("generator", "scorer"))


class ImageFailed(LonglensError):
    """One image could not be completed; the run goes on and a rerun tries it again."""


@dataclass
class ParseStats:
    parse_retries: int = 0
    regenerations: int = 0
    paragraphs_below_threshold: int = 0  # images whose best paragraph still scored <= threshold


@dataclass
class ImageResult:
    item: ImageItem
    row: dict[str, Any] | None = None
    error: str = ""
    regenerations: int = 0
    parse_retries: int = 0


def _messages(system: str | None, data_url: str, text: str) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if system:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url}},
        {"type": "text", "text": text},
    ]})
    return msgs


class _ImageWorker:
    """Everything one image needs, run in a pool thread."""

    def __init__(self, req: DatagenRequest, client: ChatClient, prompts: Prompts) -> None:
        self.req, self.client, self.prompts, self.s = req, client, prompts, req.sampling

    def _ask(self, res: ImageResult, what: str, model: str, messages: list[dict[str, Any]],
             parse: Any, **params: Any) -> tuple[Any, list[str]]:
        """Ask until the answer parses, at most 1 + parse_retries times."""
        problems: list[str] = []
        for attempt in range(self.req.parse_retries + 1):
            if attempt:
                res.parse_retries += 1
            answer = self.client.chat(model, messages, task=what, **params)
            parsed: Parsed = parse(answer.text)
            if parsed.ok:
                return parsed.value, list(parsed.notes)
            problems.append(parsed.problem)
        raise ImageFailed(f"{what}: no usable answer in {len(problems)} tries (last: {problems[-1]})")

    def run(self, item: ImageItem) -> ImageResult:
        res = ImageResult(item)
        req, s = self.req, self.s
        try:
            url = image_data_url(item.path, req.max_side)
            system = self.prompts.system(item.caption)
            gen = {"temperature": s.temperature, "top_p": s.top_p}
            positives, _ = self._ask(res, "positives", req.generator,
                                     _messages(system, url, self.prompts.positives(EXPECTED_COUNT)),
                                     lambda t: parse_list(t, EXPECTED_COUNT),
                                     max_tokens=s.max_tokens_positives, **gen)
            negatives, _ = self._ask(res, "negatives", req.generator,
                                     _messages(system, url, self.prompts.negatives(EXPECTED_COUNT)),
                                     lambda t: parse_list(t, EXPECTED_COUNT),
                                     max_tokens=s.max_tokens_negatives, **gen)
            para_msgs = _messages(system, url, self.prompts.paragraph(req.min_sentences, req.max_sentences))
            attempts: list[tuple[str, float]] = []
            while True:
                paragraph, _ = self._ask(res, "paragraph", req.generator, para_msgs,
                                         lambda t: parse_paragraph(t, req.min_sentences, req.max_sentences),
                                         max_tokens=s.max_tokens_paragraph, **gen)
                score, _ = self._ask(res, "score", req.scorer, _messages(None, url, self.prompts.score(paragraph)),
                                     parse_score, temperature=s.score_temperature,
                                     max_tokens=s.score_max_tokens)
                attempts.append((paragraph, score))
                if score > req.score_threshold or len(attempts) > req.max_regenerations:
                    break
                res.regenerations += 1
            # max() keeps the first of equal scores: the earliest paragraph wins a tie.
            best_paragraph, best_score = max(attempts, key=lambda a: a[1])
        except (ImageFailed, InputError) as exc:
            res.error = str(exc)
            return res
        except EndpointError as exc:
            if exc.fatal:
                # Stop this thread's next image too, before the main loop sees the error.
                if self.client.cancel is not None:
                    self.client.cancel.cancel()
                raise
            res.error = str(exc)
            return res
        generated_original = item.caption is None
        res.row = {
            "image": "",  # filled in by the writer, relative to the output file
            # The format needs an original caption; an image without one gets its first generated
            # caption, and meta says so (C1/C3/C5 then train on generated text only).
            "original_caption": item.caption or positives[0],
            "positives": positives,
            "negatives": negatives,
            "paragraph": best_paragraph,
            "paragraph_score": best_score,
            "meta": {
                "source": "datagen",
                "generator": req.generator,
                "scorer": req.scorer,
                "original_caption_generated": generated_original,
                "paragraph_scores": [a[1] for a in attempts],
            },
        }
        return res


def _image_ref(path: Path, out_dir: Path) -> str:
    try:
        return Path(os.path.relpath(path, out_dir)).as_posix()
    except ValueError:  # another drive on Windows
        return str(path)


@dataclass
class Summary:
    out: str
    images: int = 0  # in the input, after removing duplicates
    already_done: int = 0
    todo: int = 0
    written: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)
    regenerations: int = 0
    parse_retries: int = 0
    below_threshold: int = 0
    torn_bytes_removed: int = 0
    cancelled: bool = False
    elapsed_s: float = 0.0
    requests: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def datagen_job(req: DatagenRequest, cancel: CancelToken | None = None) -> Iterator[Progress]:
    """Run the pipeline; yields Progress("generate", done, total) per finished image and a final
    Progress("done") whose extra["summary"] is Summary.as_dict()."""
    req.check()
    cancel = cancel or CancelToken()
    prompts = load_prompts(req.prompts_dir)  # a bad template fails before any request
    out = Path(req.out).expanduser()
    out_dir = out.resolve().parent
    state = recover(out)
    items = dedupe(req.items)
    todo = [it for it in items if it.path not in state.done]
    summary = Summary(str(out), images=len(items), already_done=len(items) - len(todo),
                      torn_bytes_removed=state.torn_bytes)
    if req.limit is not None:
        todo = todo[: req.limit]
    summary.todo = len(todo)
    client = ChatClient(req.endpoint, api_key=req.api_key, timeout=req.timeout, max_retries=req.max_retries,
                        backoff=req.backoff, max_backoff=req.max_backoff, cancel=cancel)
    worker = _ImageWorker(req, client, prompts)
    needs = Requirements(positives=EXPECTED_COUNT, negatives=EXPECTED_COUNT, paragraph=True, needed_by="datagen")
    meter = RateMeter(len(todo))
    start = time.monotonic()
    line_no = state.lines
    done = 0

    def report(stage: str, message: str = "") -> Progress:
        return meter.progress(stage, done, message, requests=client.stats.requests, failed=len(summary.failed),
                              retries=client.stats.retries, written=summary.written)

    yield report("generate", f"{summary.already_done} already in {out.name}, {len(todo)} to do")
    pending = iter(todo)
    in_flight: dict[cf.Future, ImageItem] = {}
    with LineAppender(out) as appender, cf.ThreadPoolExecutor(req.concurrency, thread_name_prefix="datagen") as pool:
        try:
            while True:
                # Keep the pool busy but never queue far ahead, so a cancel stops quickly.
                while not cancel.cancelled and len(in_flight) < req.concurrency * 2:
                    nxt = next(pending, None)
                    if nxt is None:
                        break
                    in_flight[pool.submit(worker.run, nxt)] = nxt
                if not in_flight:
                    break
                if cancel.cancelled:  # queued images never start; running ones stop at their next request
                    for fut in in_flight:
                        fut.cancel()
                finished, _ = cf.wait(in_flight, timeout=0.5, return_when=cf.FIRST_COMPLETED)
                for fut in finished:
                    item = in_flight.pop(fut)
                    try:
                        res = fut.result()
                    except (JobCancelled, cf.CancelledError):
                        continue
                    summary.regenerations += res.regenerations
                    summary.parse_retries += res.parse_retries
                    if res.row is not None:
                        res.row["image"] = _image_ref(item.path, out_dir)
                        line_no += 1
                        record, problems = check_line(json.dumps(res.row), line_no, out_dir, needs)
                        if record is None:  # our own output failing the format is a bug; never write it
                            line_no -= 1
                            res.error = "; ".join(p.format() for p in problems)
                        else:
                            appender.append(res.row)
                            summary.written += 1
                            if res.row["paragraph_score"] <= req.score_threshold:
                                summary.below_threshold += 1
                    if res.error:
                        summary.failed.append({"image": str(item.path), "reason": res.error})
                    done += 1
                    yield report("generate", item.path.name)
        except EndpointError as exc:  # fatal: wrong key, URL or model; every image would fail alike
            cancel.cancel()
            raise LonglensError(f"stopping: {exc}") from exc
        finally:
            if cancel.cancelled or in_flight:
                cancel.cancel()
                for fut in in_flight:
                    fut.cancel()
    summary.cancelled = cancel.cancelled and done < len(todo)
    summary.elapsed_s = round(time.monotonic() - start, 3)
    summary.requests = client.stats.as_dict()
    summary.requests["backoff_s"] = round(sum(client.delays), 3)
    yield Progress("done", done, len(todo), _summary_line(summary), extra={"summary": summary.as_dict()})


def _summary_line(s: Summary) -> str:
    r = s.requests
    state = "cancelled" if s.cancelled else "finished"
    return (f"{state}: {s.written} written, {len(s.failed)} failed, {s.already_done} already done; "
            f"{r.get('requests', 0)} requests ({r.get('retries', 0)} retries, {r.get('failed', 0)} failed attempts), "
            f"{s.regenerations} paragraph regenerations, {s.parse_retries} re-asks for unusable answers; "
            f"tokens {r.get('prompt_tokens', 0)} in / {r.get('completion_tokens', 0)} out")


def sceneworld_job(out: Path, seed: int, n: int, *, size: int = 256, image_dir: Path | None = None,
                   cancel: CancelToken | None = None) -> Iterator[Progress]:
    """The same format from SceneWorld's ground truth (exact captions, negatives and paragraphs;
    score 10), no endpoint involved. The file is written whole and atomically by the exporter."""
    from engine.sceneworld import check_train_seed
    from engine.sceneworld.export import write_training_jsonl
    from engine.training.data import read_training_jsonl

    try:
        check_train_seed(seed)
    except ValueError as exc:
        raise LonglensError(str(exc)) from None
    if n < 1:
        raise LonglensError("the number of scenes must be at least 1", settings=("n",))
    out = Path(out).expanduser()
    image_dir = Path(image_dir) if image_dir is not None else out.parent / f"{out.stem}_images"
    cancel = cancel or CancelToken()
    meter = RateMeter(n)
    chunk = 64
    rows: list[str] = []
    tmp = out.with_name(f".{out.name}.part")
    try:
        for start in range(0, n, chunk):
            cancel.raise_if_cancelled()
            write_training_jsonl(tmp, image_dir, seed, min(chunk, n - start), size, start=start)
            rows.extend(tmp.read_text(encoding="utf-8").splitlines(keepends=True))
            yield meter.progress("sceneworld", len(rows))
    finally:
        tmp.unlink(missing_ok=True)
    from engine.fileutil import atomic_write_text

    atomic_write_text(out, "".join(rows))
    data = read_training_jsonl(out)
    yield Progress("done", n, n, f"wrote {len(data.records)} SceneWorld lines to {out} (images in {image_dir})",
                   extra={"summary": {"out": str(out), "images": str(image_dir), **data.summary(),
                                      "seed": seed, "cancelled": False}})


__all__ = ["DatagenRequest", "Sampling", "datagen_job", "image_key", "sceneworld_job"]
