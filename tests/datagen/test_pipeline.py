"""datagen_job end to end against the loopback server: requests per image, conditioning, sampling
defaults, the regeneration loop, re-asking for unusable answers, failures, resume and cancel."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from engine.datagen.fake_server import DefaultAnswers, Reply
from engine.datagen.inputs import ImageItem, images_in_folder, read_image_list
from engine.datagen.pipeline import DatagenRequest, datagen_job
from engine.datagen.prompts import PromptError
from engine.errors import LonglensError
from engine.jobs import CancelToken, run_to_end
from engine.training.configs import load_config
from engine.training.data import read_training_jsonl

GOOD_LIST = "\n".join(f"{i}. Caption number {i} of a scene." for i in range(1, 6))
GOOD_PARA = "A dog sits on a step. A red door is behind it. The light is soft and warm. {tag}"


def _req(items, out: Path, srv, **kw) -> DatagenRequest:
    kw.setdefault("backoff", 0.01)
    kw.setdefault("concurrency", 2)
    return DatagenRequest(items=items, out=out, endpoint=srv.url, generator="gen-model", scorer="score-model", **kw)


def _run(req: DatagenRequest, cancel: CancelToken | None = None) -> dict:
    return run_to_end(datagen_job(req, cancel)).extra["summary"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_every_image_gets_four_requests_and_a_valid_line(serve, photos, tmp_path):
    srv = serve()
    items = images_in_folder(photos)
    out = tmp_path / "out" / "data.jsonl"
    summary = _run(_req(items, out, srv))
    assert (summary["written"], summary["failed"], summary["images"]) == (8, [], 8)
    data = read_training_jsonl(out, load_config("C10"))
    assert (len(data.records), data.errors, data.warnings) == (8, [], [])
    rows = _rows(out)
    assert sorted((out.parent / r["image"]).resolve() for r in rows) == sorted(i.path for i in items)
    # 3 generation requests + 1 score per paragraph attempt, nothing else.
    for task in ("positives", "negatives"):
        assert len(srv.requests(task)) == 8
    n_paragraphs = sum(len(r["meta"]["paragraph_scores"]) for r in rows)
    assert len(srv.requests("paragraph")) == len(srv.requests("score")) == n_paragraphs
    assert summary["requests"]["requests"] == 16 + 2 * n_paragraphs
    assert summary["regenerations"] == n_paragraphs - 8
    # The fake server's usage adds up to the summary's token counts.
    seen = srv.requests()
    assert summary["requests"]["completion_tokens"] == sum(len((s.reply.content or "").split()) for s in seen)
    # No original caption: the first generated caption stands in, and meta says so.
    for r in rows:
        assert r["original_caption"] == r["positives"][0] and r["meta"]["original_caption_generated"] is True
        assert (r["meta"]["generator"], r["meta"]["scorer"]) == ("gen-model", "score-model")


def test_sampling_defaults_models_and_the_image_sent(serve, photos, tmp_path):
    srv = serve()
    big = photos / "big.png"
    Image.new("RGB", (2000, 1000), (200, 30, 30)).save(big)
    _run(_req([ImageItem(big.resolve())], tmp_path / "d.jsonl", srv, max_side=512))
    expect = {"positives": ("gen-model", 0.7, 0.9, 160), "negatives": ("gen-model", 0.7, 0.9, 200),
              "paragraph": ("gen-model", 0.7, 0.9, 200), "score": ("score-model", 0.0, None, 16)}
    for task, (model, temp, top_p, max_tokens) in expect.items():
        body = srv.requests(task)[0].body
        assert (body["model"], body["temperature"], body.get("top_p"), body["max_tokens"]) == (
            model, temp, top_p, max_tokens), task
        url = body["messages"][-1]["content"][0]["image_url"]["url"]
        assert url.startswith("data:image/jpeg;base64,")
        im = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
        assert im.size == (512, 256)  # downscaled, aspect kept
    paragraph = _rows(tmp_path / "d.jsonl")[0]["paragraph"]
    scored = [s.body["messages"][-1]["content"][1]["text"] for s in srv.requests("score")]
    assert any(paragraph in text for text in scored)  # the kept paragraph is one the scorer saw


def test_original_caption_conditions_the_generation(serve, photos, tmp_path):
    srv = serve()
    files = sorted(p for p in photos.rglob("*") if p.is_file())[:2]
    lst = tmp_path / "list.csv"
    lst.write_text("image,caption\n" + f"{files[0]},A tabby cat on a windowsill\n" + f"{files[1]},\n")
    items = read_image_list(lst)
    out = tmp_path / "d.jsonl"
    _run(_req(items, out, srv))
    systems = {}
    for s in srv.requests():
        if s.task != "score":
            systems.setdefault(s.body["messages"][0]["content"], set()).add(s.task)
    with_caption = [t for t in systems if "A tabby cat on a windowsill" in t]
    assert len(with_caption) == 1 and systems[with_caption[0]] == {"positives", "negatives", "paragraph"}
    assert len(systems) == 2  # the other image: a system prompt without any caption section
    by_image = {(out.parent / r["image"]).resolve(): r for r in _rows(out)}
    first = by_image[files[0].resolve()]
    assert first["original_caption"] == "A tabby cat on a windowsill"
    assert first["meta"]["original_caption_generated"] is False
    assert by_image[files[1].resolve()]["meta"]["original_caption_generated"] is True


def test_low_scores_regenerate_up_to_three_times_and_keep_the_best(serve, photos, tmp_path):
    paragraphs = [GOOD_PARA.format(tag=f"Draft {i} ends here.") for i in range(1, 6)]
    srv = serve({"paragraph": paragraphs, "score": ["3", "5", "4", "2"]})
    item = images_in_folder(photos)[:1]
    out = tmp_path / "d.jsonl"
    summary = _run(_req(item, out, srv))
    row = _rows(out)[0]
    assert len(srv.requests("paragraph")) == 4  # the first try plus 3 regenerations, then it stops
    assert row["meta"]["paragraph_scores"] == [3.0, 5.0, 4.0, 2.0]
    assert row["paragraph"] == paragraphs[1] and row["paragraph_score"] == 5.0  # 5 is the best, kept
    assert summary["regenerations"] == 3 and summary["below_threshold"] == 1


def test_regeneration_stops_at_the_first_good_score(serve, photos, tmp_path):
    paragraphs = [GOOD_PARA.format(tag=f"Draft {i} ends here.") for i in range(1, 4)]
    srv = serve({"paragraph": paragraphs, "score": ["4", "9", "10"]})
    out = tmp_path / "d.jsonl"
    summary = _run(_req(images_in_folder(photos)[:1], out, srv, score_threshold=5, max_regenerations=3))
    row = _rows(out)[0]
    assert row["paragraph"] == paragraphs[1] and row["meta"]["paragraph_scores"] == [4.0, 9.0]
    assert summary["regenerations"] == 1 and summary["below_threshold"] == 0


def test_unusable_answers_are_asked_again_a_bounded_number_of_times(serve, photos, tmp_path):
    srv = serve({
        "positives": ["I'm sorry, I can't describe people in images.", "1. Only one.\n2. Only two.", GOOD_LIST],
        "score": ["Very faithful!", "Score: 8/10"],
    })
    out = tmp_path / "d.jsonl"
    summary = _run(_req(images_in_folder(photos)[:1], out, srv))
    row = _rows(out)[0]
    assert row["positives"] == [f"Caption number {i} of a scene." for i in range(1, 6)]
    assert row["paragraph_score"] == 8.0
    assert len(srv.requests("positives")) == 3 and len(srv.requests("score")) == 2
    assert summary["parse_retries"] == 3 and summary["written"] == 1


def test_an_image_that_never_parses_fails_alone_and_a_rerun_completes_it(serve, photos, tmp_path):
    items = images_in_folder(photos)[:3]
    bad = "1. just one caption"
    srv = serve({"negatives": [bad, bad]})  # 1 + parse_retries(1) tries; other images get good answers
    out = tmp_path / "d.jsonl"
    summary = _run(_req(items, out, srv, parse_retries=1, concurrency=1))
    assert summary["written"] == 2 and len(summary["failed"]) == 1
    failed = summary["failed"][0]
    assert failed["image"] == str(items[0].path)
    assert failed["reason"] == "negatives: no usable answer in 2 tries (last: 1 usable item(s), expected 5)"
    again = _run(_req(items, out, srv, parse_retries=1))
    assert (again["already_done"], again["written"], again["failed"]) == (2, 1, [])
    assert len(_rows(out)) == 3


def test_requests_that_fail_for_good_fail_the_image_not_the_run(serve, photos, tmp_path):
    srv = serve({"score": [Reply(status=500, raw=b"down")] * 3})
    out = tmp_path / "d.jsonl"
    summary = _run(_req(images_in_folder(photos)[:2], out, srv, max_retries=2, concurrency=1))
    assert summary["written"] == 1 and len(summary["failed"]) == 1
    assert "HTTP 500: down (gave up after 3 attempts)" in summary["failed"][0]["reason"]
    assert summary["requests"]["retries"] == 2 and summary["requests"]["gave_up"] == 1


def test_a_fatal_endpoint_error_stops_the_run(serve, photos, tmp_path):
    srv = serve(api_key="k")
    out = tmp_path / "d.jsonl"
    with pytest.raises(LonglensError, match="stopping: .*HTTP 401.*check the API key"):
        _run(_req(images_in_folder(photos), out, srv, api_key="nope"))
    assert out.read_text() == ""
    assert len(srv.requests()) <= 2  # the images in flight, not one request per image


def test_resume_skips_done_images_and_cuts_a_torn_tail(serve, photos, tmp_path):
    srv = serve()
    items = images_in_folder(photos)
    out = tmp_path / "d.jsonl"
    _run(_req(items[:3], out, srv))
    complete = out.read_bytes()
    with open(out, "ab") as fh:
        fh.write(b'{"image": "photos/sample_00')  # a line cut short by a crash
    srv.log.clear()
    summary = _run(_req(items, out, srv))
    assert (summary["already_done"], summary["written"], summary["torn_bytes_removed"]) == (3, 5, 27)
    assert len(srv.requests("positives")) == 5  # only the new images were asked for
    data = out.read_bytes()
    assert data.startswith(complete) and data.endswith(b"\n")
    images = [r["image"] for r in _rows(out)]
    assert len(images) == len(set(images)) == 8


def test_a_last_line_missing_only_its_newline_is_kept(serve, photos, tmp_path):
    srv = serve()
    items = images_in_folder(photos)
    out = tmp_path / "d.jsonl"
    _run(_req(items[:2], out, srv))
    out.write_bytes(out.read_bytes().rstrip(b"\n"))  # e.g. saved by an editor without the final newline
    summary = _run(_req(items[:3], out, srv))
    assert (summary["already_done"], summary["written"], summary["torn_bytes_removed"]) == (2, 1, 0)
    assert len(_rows(out)) == 3 and read_training_jsonl(out).errors == []


def test_a_corrupt_complete_line_is_reported_not_dropped(serve, photos, tmp_path):
    out = tmp_path / "d.jsonl"
    out.write_text('{"image": "a.png"}\nnot json\n')
    with pytest.raises(LonglensError, match=r"d\.jsonl:2: not a valid JSON line"):
        _run(_req(images_in_folder(photos), out, serve()))
    assert out.read_text() == '{"image": "a.png"}\nnot json\n'


def test_cancel_keeps_finished_lines_and_stops_early(serve, photos, tmp_path):
    srv = serve(responder=lambda task, body: (time.sleep(0.05), DefaultAnswers()(task, body))[1])
    out = tmp_path / "d.jsonl"
    token = CancelToken()
    job = datagen_job(_req(images_in_folder(photos), out, srv, concurrency=1), token)
    last = None
    for last in job:
        if last.stage == "generate" and last.done == 1:
            token.cancel()
    summary = last.extra["summary"]
    assert summary["cancelled"] is True and 1 <= summary["written"] < 8
    assert len(_rows(out)) == summary["written"]
    assert read_training_jsonl(out).errors == []


def test_concurrency_is_bounded(serve, photos, tmp_path):
    active, peak, lock = [0], [0], threading.Lock()
    answers = DefaultAnswers()

    def slow(task, body):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return answers(task, body)

    srv = serve(responder=slow)
    summary = _run(_req(images_in_folder(photos), tmp_path / "d.jsonl", srv, concurrency=3))
    assert summary["written"] == 8 and 2 <= peak[0] <= 3


def test_prompt_templates_can_be_overridden(serve, photos, tmp_path):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "positives.txt").write_text("List {count} TRUE captions, numbered.")
    srv = serve()
    _run(_req(images_in_folder(photos)[:1], tmp_path / "d.jsonl", srv, prompts_dir=prompts))
    assert srv.requests("positives")[0].body["messages"][-1]["content"][1]["text"] == "List 5 TRUE captions, numbered."
    # the templates not overridden keep their defaults
    assert "numbered list from 1 to 5" in srv.requests("negatives")[0].body["messages"][-1]["content"][1]["text"]
    (prompts / "score.txt").write_text("Rate the picture.")
    with pytest.raises(PromptError, match=r"score\.txt must contain \{paragraph\}"):
        _run(_req(images_in_folder(photos)[:1], tmp_path / "e.jsonl", srv, prompts_dir=prompts))
    (prompts / "score.txt").unlink()
    (prompts / "scores.txt").write_text("typo")
    with pytest.raises(PromptError, match="unknown prompt file"):
        _run(_req(images_in_folder(photos)[:1], tmp_path / "e.jsonl", srv, prompts_dir=prompts))


def test_list_file_problems_are_named_by_line(tmp_path, photos):
    img = next(p for p in photos.rglob("*.jpg"))
    lst = tmp_path / "list.jsonl"
    lst.write_text(json.dumps({"image": str(img), "caption": "ok"}) + "\n" + "{broken\n"
                   + json.dumps({"image": "nope.jpg"}) + "\n" + json.dumps({"image": str(img), "caption": 3}) + "\n")
    with pytest.raises(LonglensError) as info:
        read_image_list(lst)
    msg = str(info.value)
    assert f"{lst}:2: line: not valid JSON" in msg
    assert f"{lst}:3: image: image not found" in msg and f"{lst}:4: caption: the caption is not text" in msg
    txt = tmp_path / "paths.txt"
    txt.write_text(f"# my photos\n{img}\n\n{img.relative_to(tmp_path)}\n")
    items = read_image_list(txt)
    assert [i.path for i in items] == [img.resolve(), img.resolve()] and items[0].caption is None
