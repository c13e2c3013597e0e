"""Issue 27 point 9, checklist classes 33 and 43: every file a user or a model supplies that is read
whole has a size limit checked before it is read and a nesting limit checked before it is parsed
(engine.jsonfile, engine.limits, engine.models.file_limits, engine.metadata.xmp), refused with a
message naming the file and the limit; never a RecursionError traceback, never a 1 GiB file copied.
Real files in temporary folders (sparse ones for the huge cases: `truncate`, nothing really written),
the real CLI in a child process where the exit status and the absence of a traceback are the point."""

from __future__ import annotations

import ast
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import get_paths
from engine.errors import ModelIntegrityError
from engine.fileutil import FileTooLargeError
from engine.jsonfile import JsonTooDeepError, json_depth, read_json_file
from engine.limits import MAX_NESTING_DEPTH
from engine.metadata.xmp import XmpError, parse_xmp
from engine.models.registry import bundled_model_dir
from tests.datagen.conftest import serve  # noqa: F401  (the loopback chat server fixture)
from tests.e2e.conftest import TINY_MODEL
from tests.reliability.code_scan import ScopedCalls
from tests.reliability.test_checklist import child_env

REPO = Path(__file__).resolve().parents[2]
DEEP = 100_000
GIB = 1 << 30
MINI = bundled_model_dir("sceneworld-mini")
HAS_MINI = (MINI / "model.safetensors").is_file()
BUNDLED_TOWER = MINI / "text-towers" / "minilm-k6"


def deep_json(depth: int = DEEP) -> str:
    """A valid JSON object with an array nested `depth` deep inside it."""
    return '{"a": ' + "[" * depth + "]" * depth + "}"


def deep_xmp(depth: int = DEEP) -> bytes:
    """A well-formed XMP sidecar (a keyword, then an element nested `depth` deep)."""
    return (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            b'<rdf:Description xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:a="urn:deep">'
            b"<dc:subject><rdf:Bag><rdf:li>harbour</rdf:li></rdf:Bag></dc:subject>"
            + b"<a:x>" * depth + b"</a:x>" * depth + b"</rdf:Description></rdf:RDF></x:xmpmeta>")


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk space (`truncate -s`)."""
    subprocess.run(["truncate", "-s", str(size), str(path)], check=True)
    assert path.stat().st_size == size and path.stat().st_blocks * 512 < 1 << 20
    return path


def run_cli(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process (its own interpreter: a RecursionError there would be the child's)."""
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, cwd=REPO,
                          env=child_env(LONGLENS_HOME=str(home), HF_HUB_OFFLINE="1"), timeout=timeout)


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


# --------------------------------------------------------------------------- the reader


def _reference_depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_reference_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_reference_depth, value), default=0)
    return 0


def test_json_depth_agrees_with_the_parser_on_random_documents_with_brackets_and_escapes_in_strings():
    rnd = random.Random(27)
    pieces = ["[", "]", "{", "}", '"', "\\", "a", "\\\\", '\\"', "é", "\u2028"]

    def text() -> str:
        return "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 8)))

    def value(level: int):
        r = rnd.random()
        if level > 8 or r < 0.3:
            return text() if r < 0.2 else rnd.choice([1, None, 2.5, True])
        if r < 0.65:
            return [value(level + 1) for _ in range(rnd.randint(0, 3))]
        return {text(): value(level + 1) for _ in range(rnd.randint(0, 3))}

    for i in range(3000):
        doc = value(0)
        for s in (json.dumps(doc, ensure_ascii=bool(i % 2)), json.dumps(doc, indent=1)):
            assert json_depth(s) == _reference_depth(json.loads(s)), s


def test_read_json_file_refuses_a_huge_file_unread_and_a_deep_one_unparsed(tmp_path):
    big = sparse(tmp_path / "config.json", GIB)
    with pytest.raises(FileTooLargeError) as exc:
        read_json_file(big, max_bytes=1 << 20)
    assert str(exc.value) == f"{big} is too large ({GIB} bytes; the limit is {1 << 20})"

    deep = tmp_path / "deep.json"
    deep.write_text(deep_json(), encoding="utf-8")
    with pytest.raises(JsonTooDeepError) as exc2:
        read_json_file(deep, max_bytes=1 << 20)
    assert str(exc2.value) == (f"{deep} nests deeper than {MAX_NESTING_DEPTH} levels of arrays and objects "
                               f"(the limit is {MAX_NESTING_DEPTH}); not read")
    # At the limit it is read; one level more is refused.
    ok = tmp_path / "ok.json"
    ok.write_text(deep_json(MAX_NESTING_DEPTH - 1), encoding="utf-8")
    assert isinstance(read_json_file(ok, max_bytes=1 << 20), dict)
    ok.write_text(deep_json(MAX_NESTING_DEPTH), encoding="utf-8")
    with pytest.raises(JsonTooDeepError):
        read_json_file(ok, max_bytes=1 << 20)


# --------------------------------------------------------------------------- settings.json


@pytest.mark.timeout(300)
def test_settings_json_nested_100000_deep_or_over_its_size_is_exit_2_naming_file_and_limit(tmp_path):
    home = tmp_path / "home"
    config = get_paths(str(home)).config
    config.mkdir(parents=True)
    settings = config / "settings.json"
    empty = tmp_path / "empty"
    empty.mkdir()
    settings.write_text(deep_json(), encoding="utf-8")
    proc = run_cli("index", str(empty), home=home)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    assert (f"longlens: error: {settings} nests deeper than {MAX_NESTING_DEPTH} levels (the limit for a settings "
            "file); fix or remove it") in proc.stderr

    settings.write_text(json.dumps({"device": "cpu", "pad": "x" * (2 << 20)}), encoding="utf-8")
    proc = run_cli("index", str(empty), home=home)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert (f"longlens: error: {settings} is too large for a settings file (2.0 MiB; the limit is 1 MiB); "
            "fix or remove it") in proc.stderr


# --------------------------------------------------------------------------- model files


@pytest.mark.timeout(300)
def test_a_1gib_preprocessor_config_is_refused_at_import_before_anything_is_copied(cli, tmp_path, monkeypatch,
                                                                                  blip_tiny_checkpoint):
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    src = tmp_path / "model"
    shutil.copytree(blip_tiny_checkpoint, src)
    sparse(src / "preprocessor_config.json", GIB)
    rc, _out, err = cli("models", "import", str(src), "--name", "huge-preprocessor")
    assert rc == 2
    assert (f"{src}: preprocessor_config.json is too large (1 GiB; the limit for preprocessor_config.json is "
            "1 MiB); nothing was read; nothing was imported") in err
    models = get_paths(str(home)).models
    assert not (models / "huge-preprocessor").exists()
    # Nothing copied: not the 1 GiB file, not the weights (staging is created after the check).
    assert tree_bytes(home) < 1 << 20, sorted(str(p) for p in home.rglob("*"))


@pytest.mark.timeout(300)
def test_a_config_json_nested_100000_deep_is_refused_at_import_exit_2_no_traceback(tmp_path, blip_tiny_checkpoint):
    src = tmp_path / "model"
    shutil.copytree(blip_tiny_checkpoint, src)
    (src / "config.json").write_text(deep_json(), encoding="utf-8")
    home = tmp_path / "home"
    proc = run_cli("models", "import", str(src), "--name", "deep-config", home=home)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    assert (f"longlens: error: {src}: config.json nests deeper than {MAX_NESTING_DEPTH} levels (the limit for JSON "
            "files); nothing was read; nothing was imported") in proc.stderr
    assert not (get_paths(str(home)).models / "deep-config").exists()


def _replace_installed_file(model_dir: Path, rel: str, data: bytes) -> None:
    """What an install from before the limits holds: the file and a manifest that vouches for it."""
    import hashlib

    (model_dir / rel).write_bytes(data)
    manifest_path = model_dir / "longlens-manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    manifest_path.write_text(json.dumps(manifest), encoding="utf-8")


@pytest.mark.timeout(300)
def test_an_installed_model_with_a_deep_config_or_tokenizer_config_is_refused_at_load(home, cli, tmp_path):
    from engine.models.registry import load_embedder, verify_model

    paths = get_paths(str(home))
    model_dir = paths.models / TINY_MODEL
    for rel in ("config.json", "tokenizer_config.json"):
        original = (model_dir / rel).read_bytes()
        _replace_installed_file(model_dir, rel, deep_json().encode())
        assert verify_model(TINY_MODEL, paths).ok  # the manifest vouches for it: only the limit refuses it
        with pytest.raises(ModelIntegrityError) as exc:
            load_embedder(TINY_MODEL, paths, device="cpu")
        assert str(exc.value) == (f"{model_dir / rel} nests deeper than {MAX_NESTING_DEPTH} levels (the limit for "
                                  "JSON files); nothing was read")
        _replace_installed_file(model_dir, rel, original)
    photos = tmp_path / "photos"
    photos.mkdir()
    from PIL import Image

    Image.new("RGB", (40, 30), "teal").save(photos / "a.jpg")
    _replace_installed_file(model_dir, "config.json", deep_json().encode())
    rc, _out, err = cli("index", str(photos), "--model", TINY_MODEL)
    assert rc == 2 and "config.json nests deeper than 100 levels" in err, err


@pytest.mark.skipif(not HAS_MINI, reason="sceneworld-mini weights are not in this checkout")
@pytest.mark.timeout(300)
def test_a_text_tower_with_a_1gib_tokenizer_json_is_refused_at_load_naming_file_and_limit(tmp_path):
    from engine.models.registry import load_embedder

    tower = tmp_path / "tower"
    shutil.copytree(BUNDLED_TOWER, tower)
    (tower / "tokenizer" / "tokenizer.json").unlink()
    sparse(tower / "tokenizer" / "tokenizer.json", GIB + 1)
    with pytest.raises(ModelIntegrityError) as exc:
        load_embedder("sceneworld-mini", get_paths(str(tmp_path / "home")), device="cpu", text_tower_dir=tower)
    assert str(exc.value) == (f"{tower / 'tokenizer' / 'tokenizer.json'} is too large (1.0 GiB; the limit for "
                              "tokenizer.json is 64 MiB); nothing was read")


# --------------------------------------------------------------------------- a tower without tokenizer_config.json


@pytest.mark.skipif(not HAS_MINI, reason="sceneworld-mini weights are not in this checkout")
@pytest.mark.timeout(300)
def test_a_text_tower_without_tokenizer_config_json_is_refused_at_load_naming_the_file(tmp_path):
    """Before: it loaded, and the first search failed inside transformers ("Asking to pad but the
    tokenizer does not have a padding token")."""
    from engine.models.registry import load_embedder

    tower = tmp_path / "tower"
    shutil.copytree(BUNDLED_TOWER, tower)
    (tower / "tokenizer" / "tokenizer_config.json").unlink()
    with pytest.raises(ModelIntegrityError) as exc:
        load_embedder("sceneworld-mini", get_paths(str(tmp_path / "home")), device="cpu", text_tower_dir=tower)
    assert str(exc.value) == (
        f"{tower} is an incomplete LM tower: tokenizer/tokenizer_config.json is missing (it names the tokenizer's "
        "padding and special tokens the tower was trained with); copy it back from where the tower was saved. "
        "Nothing was loaded")
    # With the file back, the same tower reads queries (padding a batch of two lengths).
    shutil.copy(BUNDLED_TOWER / "tokenizer" / "tokenizer_config.json", tower / "tokenizer")
    emb = load_embedder("sceneworld-mini", get_paths(str(tmp_path / "home")), device="cpu", text_tower_dir=tower)
    assert emb.encode_texts(["a red cube", "a small dog on a table next to the house"]).shape[0] == 2


@pytest.mark.skipif(not HAS_MINI, reason="sceneworld-mini weights are not in this checkout")
@pytest.mark.timeout(300)
def test_a_model_folder_whose_bundled_tower_lacks_tokenizer_config_json_is_refused_at_import(cli, tmp_path,
                                                                                           monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    src = tmp_path / "mini"
    shutil.copytree(MINI, src)
    (src / "longlens-manifest.json").unlink()
    (src / "text-towers" / "minilm-k6" / "tokenizer" / "tokenizer_config.json").unlink()
    rc, _out, err = cli("models", "import", str(src), "--name", "mini-copy")
    assert rc == 2
    assert (f"{src}: the text tower text-towers/minilm-k6 has no tokenizer/tokenizer_config.json (it names the "
            "tokenizer's padding and special tokens the tower was trained with); copy it from where the tower was "
            "saved and import again. Nothing was imported") in err
    assert not (get_paths(str(home)).models / "mini-copy").exists()


# --------------------------------------------------------------------------- XMP


def test_an_xmp_packet_nested_100000_deep_is_refused_with_xmp_error_naming_file_and_limit():
    with pytest.raises(XmpError) as exc:
        parse_xmp(deep_xmp(), "IMG_1.jpg.xmp")
    assert str(exc.value) == (f"IMG_1.jpg.xmp: elements nest deeper than {MAX_NESTING_DEPTH} levels (the limit for "
                              "XMP); nothing of it was read")
    # A real sidecar's depth (darktable's history, Lightroom's masks: about a dozen) reads as before.
    packet = parse_xmp(deep_xmp(MAX_NESTING_DEPTH - 4), "IMG_1.jpg.xmp")
    assert packet.values["keywords"][0] == ("harbour",)


@pytest.mark.timeout(600)
def test_index_records_a_deep_sidecar_as_a_problem_and_indexes_everything(home, cli, tmp_path):
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    for name, colour in (("deep.jpg", "navy"), ("plain.jpg", "olive")):
        Image.new("RGB", (48, 32), colour).save(photos / name, "JPEG")
    (photos / "deep.jpg.xmp").write_bytes(deep_xmp())
    summary = cli.json("index", str(photos), "--model", TINY_MODEL)
    assert summary["new"] == 2
    assert any(f"deep.jpg.xmp: elements nest deeper than {MAX_NESTING_DEPTH} levels" in str(p)
               for p in summary["xmp_problems"]), summary["xmp_problems"]


# --------------------------------------------------------------------------- caption lines


def test_a_caption_line_nested_deep_is_a_problem_of_its_line_and_the_others_are_read(tmp_path):
    from engine import review
    from engine.training.data import read_training_jsonl

    photo = tmp_path / "a.jpg"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(photo)
    good = json.dumps({"image": "a.jpg", "caption": "A red cube."})
    deep_line = '{"image": "a.jpg", "caption": "x", "extra": ' + "[" * DEEP + "]" * DEEP + "}"
    captions = tmp_path / "captions.jsonl"
    captions.write_text("\n".join([good, deep_line, good]) + "\n", encoding="utf-8")

    cf = review.load_caption_file(captions)
    assert [i.line_no for i in cf.items] == [1, 3]
    assert [str(p) for p in cf.problems] == [
        f"line 2: nests deeper than {MAX_NESTING_DEPTH} levels (the limit); not read"]

    training = tmp_path / "train.jsonl"
    good = json.dumps({"image": "a.jpg", "original_caption": "A red cube.", "paragraph": "A red cube. It is small."})
    training.write_text("\n".join([good, deep_line, good]) + "\n", encoding="utf-8")
    data = read_training_jsonl(training, check_images=False)
    assert [r.line for r in data.records] == [1, 3]
    assert [(p.line, p.reason) for p in data.errors] == [
        (2, f"nests deeper than {MAX_NESTING_DEPTH} levels (the limit); not read")]


def test_the_limits_named_in_engine_limits_cover_every_file_a_model_import_copies():
    """Every JSON or tokenizer file `models import` copies has a limit (weights, licences and READMEs
    are not read whole)."""
    from engine.limits import MODEL_FILE_LIMITS
    from engine.models.download import _IMPORT_NAMES

    read_whole = {n for n in _IMPORT_NAMES if n.endswith((".json", ".txt", ".model")) and not n.startswith("LICENSE")}
    assert read_whole <= set(MODEL_FILE_LIMITS), read_whole - set(MODEL_FILE_LIMITS)
    assert os.path.basename("tokenizer/tokenizer.model") in MODEL_FILE_LIMITS


# --------------------------------------------------------------------------- datagen


def test_a_datagen_answer_over_its_size_or_depth_is_an_unusable_answer_not_a_memory_blow_up(serve):  # noqa: F811
    from engine.datagen.client import MAX_RESPONSE_BYTES, ChatClient, EndpointError
    from engine.datagen.fake_server import Reply

    endless = b'{"choices": [' + b" " * (MAX_RESPONSE_BYTES + 10) + b"]}"
    deep = b'{"choices": [{"message": {"content": "ok"}}], "x": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    srv = serve({"score": [Reply(raw=endless), Reply(raw=deep)]})
    client = ChatClient(srv.url, max_retries=0, sleep=lambda s: None)
    with pytest.raises(EndpointError) as exc:
        client.chat("m", [{"role": "user", "content": "hi"}], task="score")
    assert f"unusable answer: the response is larger than {MAX_RESPONSE_BYTES:,} bytes (the limit); not read" in str(
        exc.value)
    with pytest.raises(EndpointError) as exc2:
        client.chat("m", [{"role": "user", "content": "hi"}], task="score")
    assert f"unusable answer: the response nests deeper than {MAX_NESTING_DEPTH} levels" in str(exc2.value)


def test_resuming_a_datagen_output_reads_it_line_by_line_and_refuses_a_deep_line_by_number(tmp_path):
    from engine.datagen.output import OutputError, recover

    out = tmp_path / "train.jsonl"
    good = json.dumps({"image": "a.jpg", "original_caption": "x"})
    out.write_text(good + "\n" + good.replace("a.jpg", "b.jpg") + "\n" + '{"image": "c.jpg"', encoding="utf-8")
    state = recover(out)
    assert (state.lines, state.torn_bytes) == (2, len('{"image": "c.jpg"'))
    assert out.read_text(encoding="utf-8").endswith("b.jpg\", \"original_caption\": \"x\"}\n")
    with out.open("a", encoding="utf-8") as fh:
        fh.write('{"image": "d.jpg", "x": ' + "[" * DEEP + "]" * DEEP + "}\n")
    with pytest.raises(OutputError) as exc:
        recover(out)
    assert str(exc.value).startswith(f"{out}:3: not a valid JSON line (line 3 nests deeper than {MAX_NESTING_DEPTH}")
    # A torn tail of 1 GiB (sparse) is found by reading back from the end and cut, never held whole.
    out.write_text(good + "\n", encoding="utf-8")
    with out.open("r+b") as fh:
        fh.truncate(len(good) + 1 + GIB)
    state = recover(out)
    assert (state.lines, state.torn_bytes, out.stat().st_size) == (1, GIB, len(good) + 1)


# --------------------------------------------------------------------------- the rule, across the code

# Every json.load/json.loads in engine/ outside engine/jsonfile.py, and why it is not a file or text a
# user or a model supplies. Anything else goes through engine.jsonfile (read_json_file, loads_bounded).
JSON_PARSES_ALLOWED: dict[tuple[str, str], str] = {
    ("engine/catalog/catalog.py", "Catalog.photo_metadata"): "catalog columns Longlens wrote (json.dumps of short lists)",
    ("engine/training/cache.py", "EmbeddingCache.__init__"): "a probe vector in the embedding cache Longlens writes",
    ("engine/bench/suite.py", "_strip_for_json"): "a json.dumps round trip of the benchmark's own result",
    ("engine/bench/rss.py", "run"): "the lines its own child process printed",
    ("engine/datagen/fake_server.py", "FakeVLMServer._handler_class.Handler.do_POST"): "the test server parsing Longlens's requests",
}


class _JsonParses(ScopedCalls):
    """(module, enclosing function, line) of every json.load / json.loads call."""

    def visit_call(self, node: ast.Call) -> None:
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr in ("load", "loads") and isinstance(f.value, ast.Name)
                and f.value.id == "json"):
            self.found.append((self.module, self.scope_name, node.lineno))


def _json_parses(root: Path) -> list[tuple[str, str, int]]:
    found: list[tuple[str, str, int]] = []
    for path in sorted(root.joinpath("engine").rglob("*.py")):
        module = path.relative_to(root).as_posix()
        if module != "engine/jsonfile.py":
            visitor = _JsonParses(module)
            visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
            found += visitor.found
    return found


def test_every_json_parse_in_the_engine_goes_through_the_bounded_reader_unless_it_is_longlens_own():
    parses = _json_parses(REPO)
    unlisted = [f"{m}:{line} {fn}()" for m, fn, line in parses if (m, fn) not in JSON_PARSES_ALLOWED]
    assert not unlisted, ("these parse JSON without engine.jsonfile's size and depth limits; use read_json_file / "
                          "loads_bounded, or list them in JSON_PARSES_ALLOWED with why the text is Longlens's own:\n"
                          + "\n".join(unlisted))
    assert {(m, fn) for m, fn, _ in parses} == set(JSON_PARSES_ALLOWED)  # no stale entry


@pytest.mark.timeout(600)
def test_xmp_export_refuses_a_deep_sidecar_with_its_reason_and_writes_the_others(home, cli, tmp_path):
    """Before: the export's serialiser recursed into the deep packet, a RecursionError stopped the run
    part-way with no summary."""
    from PIL import Image

    from engine import review
    from engine.catalog import Catalog

    photos = tmp_path / "photos"
    photos.mkdir()
    for name, colour in (("deep.jpg", "navy"), ("plain.jpg", "olive")):
        Image.new("RGB", (48, 32), colour).save(photos / name, "JPEG")
    deep_sidecar = photos / "deep.jpg.xmp"
    deep_sidecar.write_bytes(deep_xmp())
    assert cli("index", str(photos), "--model", TINY_MODEL, "--quiet")[0] == 0
    captions = tmp_path / "captions.jsonl"
    captions.write_text("".join(json.dumps({"image": str(photos / n), "caption": "A small square of colour."}) + "\n"
                                for n in ("deep.jpg", "plain.jpg")), encoding="utf-8")
    with Catalog(get_paths().catalog) as cat:
        session = review.open_session(cat, captions)
        for item in review.session_items(cat, session):
            review.set_verdict(cat, item.id, None, "faithful", "checked")
    rc, out, err = cli("xmp", "export", str(captions), "--convention", "darktable", "--json")
    summary = json.loads(out)
    assert rc == 1, err
    assert summary["counts"] == {"create": 1, "refused": 1}, summary
    refused = next(s for s in summary["sidecars"] if Path(s["sidecar"]).name == "deep.jpg.xmp")
    assert f"elements nest deeper than {MAX_NESTING_DEPTH} levels (the limit for XMP)" in json.dumps(refused)
    assert deep_sidecar.read_bytes() == deep_xmp()  # refused: not touched
    assert (photos / "plain.jpg.xmp").is_file()
