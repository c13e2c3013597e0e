"""A model backend is a folder and the registry is the one dispatch point.

1. A toy backend defined here (a colour-histogram embedder, a trivial grounder, re-ranker and training
   adapter), registered through `engine.models.registry.register_backend` and installed as a model
   folder whose manifest names it, goes through index, search (with re-ranking), ground, check and
   a one-step train run via the CLI's main(argv) - without any file under engine/ knowing it.
2. An AST scan of engine/: nothing outside engine/models/registry.py and the backend folders
   branches on a backend's class name or name string, or touches an embedder's or grounder's
   underscore-private members from another module.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.cli import main as cli_main
from engine.grounding.base import Analysis, BaseGrounder
from engine.models import registry
from engine.models.backend import ModelBackend
from engine.models.base import Embedder, l2_normalise

TOY = "toy-colours"
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
DIM = 8


# --------------------------------------------------------------------------- the toy backend


def _text_vector(text: str) -> np.ndarray:
    words = text.lower().replace(".", " ").split()
    v = np.zeros(DIM, np.float32)
    for k, name in enumerate(COLOURS):
        v[k] = sum(w == name for w in words)
    v[DIM - 1] = 0.1  # never all zero
    return v


class ToyEmbedder:
    """Embedder interface (engine/models/base.py) on numpy: an image is its mean RGB."""

    backend = TOY

    def __init__(self, model_dir: Path, *, model_id: str | None = None, identity: str | None = None,
                 text_identity: str | None = None, text_tower_dir: Path | None = None, device: str = "cpu") -> None:
        self.model_dir = Path(model_dir)
        self.model_id = self.text_model_id = model_id or self.model_dir.name
        self.identity = identity or self.model_id
        self.text_identity = text_identity or self.model_id
        self.text_tower_dir = None
        self.dim, self.image_size, self.max_text_tokens, self.default_text_tokens = DIM, 8, 64, 32
        self.device = "cpu"
        self.batch_size = 16

    def preprocess(self, images: Sequence[Image.Image]) -> np.ndarray:
        out = [np.asarray(im.convert("RGB").resize((8, 8)), np.float32).transpose(2, 0, 1) / 255.0 for im in images]
        return np.stack(out) if out else np.zeros((0, 3, 8, 8), np.float32)

    def encode_pixels(self, pixel_values: np.ndarray) -> np.ndarray:
        v = np.zeros((len(pixel_values), DIM), np.float32)
        v[:, :3] = np.asarray(pixel_values).mean(axis=(2, 3))
        v[:, DIM - 1] = 0.1
        return l2_normalise(v)

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        return self.encode_pixels(self.preprocess(images))

    def encode_texts(self, texts: Sequence[str], max_tokens: int | None = None) -> np.ndarray:
        if not len(texts):
            return np.zeros((0, DIM), np.float32)
        return l2_normalise(np.stack([_text_vector(t) for t in texts]))

    def token_count(self, text: str) -> int:
        return len(text.split()) + 2


class ToyGrounder(BaseGrounder):
    method = "toy-uniform"
    feature_names = {"phrase": ["cosine"], "relation": ["cosine"], "sentence": ["cosine"]}

    def image_features(self, image: Image.Image) -> np.ndarray:
        return self.embedder.encode_images([image])[0]

    def _analyse(self, feats: np.ndarray, text: str, chunking) -> Analysis:
        def cos(t: str) -> list[float]:
            return [float(self.embedder.encode_texts([t])[0] @ feats)]

        maps = np.full((len(chunking.phrases), 2, 2), 0.5, np.float32)
        levels = ["relation" if p.kind == "relation" else "phrase" for p in chunking.phrases]
        return Analysis(text, chunking, maps, levels, [cos(p.text) for p in chunking.phrases],
                        [cos(text[a:b]) for a, b in chunking.sentences])

    def _uncalibrated(self, level: str, x: np.ndarray) -> np.ndarray:
        return np.clip(x[:, 0], 0.0, 1.0)


CALLS: dict[str, int] = {}


def _count(hook: str) -> None:
    CALLS[hook] = CALLS.get(hook, 0) + 1


class ToyAdapter:
    """DualEncoderAdapter (engine/training/trainer.py): a bag-of-words text tower in torch."""

    def __init__(self, device: str = "cpu") -> None:
        import torch

        self.device = device
        torch.manual_seed(0)
        self.text = torch.nn.EmbeddingBag(64, DIM, mode="mean")

    def trainable_parameters(self, train_vision: bool, learn_temperature: bool) -> list:
        return list(self.text.parameters())

    def train_mode(self, train_vision: bool) -> None:
        self.text.train()

    def encode_pixels(self, pixels):
        import torch

        return torch.nn.functional.normalize(pixels.flatten(1)[:, :DIM], dim=-1)

    def encode_texts(self, texts: Sequence[str], max_tokens: int):
        import torch

        ids = [torch.tensor([hash(w) % 64 for w in t.split()[:max_tokens]] or [0]) for t in texts]
        offsets = torch.tensor([0] + [len(i) for i in ids[:-1]]).cumsum(0)
        return torch.nn.functional.normalize(self.text(torch.cat(ids), offsets), dim=-1)

    def logit_scale(self, cfg):
        import torch

        return torch.tensor(1.0 / cfg.temperature)

    def save(self, out_dir: Path, cfg, *, text_only: bool, extra: dict) -> Path:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "toy_tower.json").write_text(json.dumps({"config": cfg.name, **extra}), encoding="utf-8")
        return out_dir


def _load_embedder(model_dir: Path, **kwargs) -> ToyEmbedder:
    _count("load_embedder")
    kwargs.pop("default_text_tokens", None)
    kwargs.pop("installed", None)
    return ToyEmbedder(model_dir, **kwargs)


def _make_grounder(embedder, calibration, *, method=None, **options) -> ToyGrounder:
    _count("make_grounder")
    return ToyGrounder(embedder, calibration)


def _rerank_scores(embedder, images, query, ann_scores, max_tokens=None) -> np.ndarray:
    _count("rerank_scores")
    return -np.asarray(ann_scores, np.float64)  # reversed: proves the backend's order is used


def _make_training_adapter(folder: Path, **kwargs) -> ToyAdapter:
    _count("make_training_adapter")
    return ToyAdapter()


TOY_BACKEND = ModelBackend(
    name=TOY,
    folder_description="a toy folder (toy.json)",
    detect=lambda folder: (Path(folder) / "toy.json").is_file(),
    load_embedder=_load_embedder,
    make_grounder=_make_grounder,
    rerank_support=lambda embedder: (True, ""),
    rerank_scores=_rerank_scores,
    make_training_adapter=_make_training_adapter,
)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def toy_home(tmp_path, monkeypatch) -> Path:
    from engine.config import get_paths
    from engine.models.download import write_local_manifest

    registry.register_backend(TOY_BACKEND)
    CALLS.clear()
    home = tmp_path / "home"
    monkeypatch.setenv("LONGLENS_HOME", str(home))
    model = get_paths(home).models / "toy"
    model.mkdir(parents=True)
    (model / "toy.json").write_text("{}", encoding="utf-8")
    write_local_manifest(model, "toy", TOY)
    yield home
    registry.unregister_backend(TOY)  # leave the table as it was


@pytest.fixture
def photos(tmp_path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name, rgb in COLOURS.items():
        Image.new("RGB", (32, 32), rgb).save(folder / f"{name}.png")
    return folder


def _cli(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli_main(list(args))
    return rc, capsys.readouterr().out


# --------------------------------------------------------------------------- tests


def test_registered_backend_is_in_the_table_and_found_by_embedder_and_folder(toy_home, tmp_path) -> None:
    assert TOY in registry.backend_names() and TOY in registry.BACKENDS
    emb = ToyEmbedder(tmp_path)
    assert isinstance(emb, Embedder)
    assert registry.backend_of(emb) is TOY_BACKEND
    folder = tmp_path / "loose"
    folder.mkdir()
    (folder / "toy.json").write_text("{}", encoding="utf-8")
    assert registry.detect_backend(folder) == TOY
    assert registry.rerank_support(object()) == (False, "re-ranking is not available for model '?'")


def test_toy_backend_through_index_search_ground_check_and_train(toy_home, photos, tmp_path, capsys) -> None:
    model = ["--model", "toy"]
    rc, out = _cli(capsys, "index", str(photos), *model)
    assert rc == 0, out
    assert CALLS.get("load_embedder")

    rc, out = _cli(capsys, "search", "a red square", *model, "--json")
    assert rc == 0
    plain = json.loads(out)
    assert Path(plain["results"][0]["path"]).name == "red.png"

    rc, out = _cli(capsys, "search", "a red square", *model, "--rerank", "--json")
    assert rc == 0
    ranked = json.loads(out)
    assert ranked["reranked"] == len(ranked["results"]) == 3 and CALLS.get("rerank_scores")
    assert Path(ranked["results"][0]["path"]).name != "red.png"  # the toy re-ranker reverses the order
    assert all("rerank_score" in h for h in ranked["results"])

    rc, out = _cli(capsys, "ground", str(photos / "red.png"), "A red square. A blue sky.", "--out",
                   str(tmp_path / "g"), *model, "--json")
    assert rc == 0
    g = json.loads(out)
    assert g["phrases"] and len(g["sentences"]) == 2 and CALLS.get("make_grounder")

    captions = tmp_path / "captions.jsonl"
    captions.write_text("".join(json.dumps({"image": str(photos / f"{c}.png"), "caption": f"a {c} square"}) + "\n"
                                for c in COLOURS), encoding="utf-8")
    rc, out = _cli(capsys, "check", str(captions), "--out", str(tmp_path / "report.jsonl"), *model)
    assert rc == 0, out
    report = [json.loads(x) for x in (tmp_path / "report.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(report) == 3 and all("phrases" in r for r in report)

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"image": str(photos / f"{c}.png"), "original_caption": f"a {c} square"})
                            + "\n" for c in COLOURS for _ in range(2)), encoding="utf-8")
    rc, out = _cli(capsys, "train", "--config", "C1", "--data", str(data), "--base", "toy", "--out",
                   str(tmp_path / "run"), "--epochs", "1", "--batch-size", "6", "--warmup-steps", "1",
                   "--checkpoint-every", "0", "--device", "cpu", "--quiet", "--json")
    assert rc == 0, out
    assert CALLS.get("make_training_adapter") == 1
    assert (tmp_path / "run" / "toy_tower.json").is_file()


# --------------------------------------------------------------------------- the dispatch rule

ENGINE = Path(__file__).resolve().parents[2] / "engine"
DISPATCH_OWNERS = ("models/registry.py", "backends/blip/", "backends/sceneworld_mini/")
BACKEND_NAMES = {"blip", "sceneworld-mini"}
BACKEND_CLASSES = {"BlipEmbedder", "SceneWorldMiniEmbedder", "BlipGrounder", "MiniGrounder"}
# Objects whose private members stay inside their own module.
MODEL_OBJECTS = {"embedder", "emb", "grounder", "g", "base", "model_embedder"}


def _engine_files() -> list[tuple[str, ast.AST]]:
    out = []
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE).as_posix()
        out.append((rel, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))))
    return out


def _is_type_name(node: ast.AST) -> bool:
    # type(x).__name__ / x.__class__.__name__
    return isinstance(node, ast.Attribute) and node.attr == "__name__" and (
        (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "type")
        or (isinstance(node.value, ast.Attribute) and node.value.attr == "__class__"))


def _const_strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def dispatch_violations() -> list[str]:
    found = []
    for rel, tree in _engine_files():
        owner = rel.startswith(DISPATCH_OWNERS)
        for node in ast.walk(tree):
            where = f"engine/{rel}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
                if any(_is_type_name(p) for p in parts):
                    found.append(f"{where}: compares a class name")
                elif not owner and any(_const_strings(p) & BACKEND_NAMES for p in parts):
                    found.append(f"{where}: compares with a backend name")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
                if len(node.args) == 2:
                    names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                    names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                    if names & BACKEND_CLASSES and not owner:
                        found.append(f"{where}: isinstance against a backend class")
            elif isinstance(node, ast.Match) and not owner:
                for case in node.cases:
                    if _const_strings(case.pattern) & BACKEND_NAMES:
                        found.append(f"{where}: matches a backend name")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
                if name in MODEL_OBJECTS or name.endswith(("embedder", "grounder")):
                    if name != "self":
                        found.append(f"{where}: {name}.{node.attr} is another object's private member")
    return found


def test_nothing_outside_the_registry_and_backend_folders_dispatches_on_a_backend() -> None:
    assert dispatch_violations() == []


def test_the_scan_finds_what_it_forbids(tmp_path, monkeypatch) -> None:
    bad = tmp_path / "engine"
    (bad / "search").mkdir(parents=True)
    (bad / "search" / "bad.py").write_text(
        "def f(embedder, base):\n"
        "    if type(embedder).__name__ == 'BlipEmbedder':\n        pass\n"
        "    if base.backend == 'blip':\n        pass\n"
        "    if isinstance(embedder, BlipEmbedder):\n        pass\n"
        "    return embedder._torch_dtype\n", encoding="utf-8")
    monkeypatch.setattr(__import__(__name__, fromlist=["ENGINE"]), "ENGINE", bad)
    got = dispatch_violations()
    assert len(got) == 4, got
