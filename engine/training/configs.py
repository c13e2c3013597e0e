"""Training configurations C1–C10 (research brief §1) plus custom JSON config files.

Each configuration says which texts stand for an image in a step and with which loss:

| config | texts per image (tokens)                                  | loss            |
|--------|-----------------------------------------------------------|-----------------|
| C1     | original caption (77)                                     | InfoNCE         |
| C2     | one random generated caption (77)                         | InfoNCE         |
| C3     | original + one random generated caption (77)              | multi-positive  |
| C4     | paragraph (128)                                           | InfoNCE         |
| C5     | original caption (77) + paragraph (128)                   | multi-positive  |
| C6     | one random generated caption (77) + paragraph (128)       | multi-positive  |
| C7     | original caption (77) + its 5 hard negatives              | hard-negative   |
| C8     | original + 5 generated captions (77), K = 6               | multi-positive  |
| C9     | 5 generated captions (77) + paragraph (128), K = 6        | multi-positive  |
| C10    | original + 5 generated (77) + paragraph (128), K = 7      | multi-positive  |

The source leaves C6 and C10 unspecified; the choices above are ours (the brief suggests them).
"pretrain" is not from the paper: both towers train on one random short caption per image
(original or generated), the stand-in for BLIP's own pre-training in sceneworld-mini.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from engine.errors import ConfigError

SOURCES = ("original", "generated_one", "generated_all", "caption_any", "paragraph")
LOSSES = ("infonce", "multipos", "hardneg")
CAPTION_TOKENS = 77
PARAGRAPH_TOKENS = 128


@dataclass(frozen=True)
class TextInput:
    source: str
    tokens: int = CAPTION_TOKENS

    def count(self) -> int:
        return 5 if self.source == "generated_all" else 1


@dataclass(frozen=True)
class TrainConfig:
    name: str
    description: str
    inputs: tuple[TextInput, ...]
    loss: str
    hard_negatives: int = 0
    lr: float = 1e-5
    batch_size: int = 256
    temperature: float = 0.07
    learn_temperature: bool = False
    warmup_steps: int = 500
    epochs: int = 10
    weight_decay: float = 0.05
    train_vision: bool = False
    grad_accum: int = 1
    seed: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def positives_per_image(self) -> int:
        return sum(i.count() for i in self.inputs)

    def validate(self) -> None:
        for i in self.inputs:
            if i.source not in SOURCES:
                raise ConfigError(f"config {self.name}: unknown text source {i.source!r} (one of {SOURCES})")
            if not 2 <= i.tokens <= 512:
                raise ConfigError(f"config {self.name}: tokens must be in 2..512, got {i.tokens}")
        if self.loss not in LOSSES:
            raise ConfigError(f"config {self.name}: unknown loss {self.loss!r} (one of {LOSSES})")
        if self.loss in ("infonce", "hardneg") and self.positives_per_image != 1:
            raise ConfigError(f"config {self.name}: {self.loss} needs exactly one positive text per image")
        if self.loss == "hardneg" and not 1 <= self.hard_negatives <= 5:
            raise ConfigError(f"config {self.name}: hardneg needs 1..5 hard negatives")
        if self.batch_size < 2 or self.lr <= 0 or self.epochs < 1 or self.grad_accum < 1:
            raise ConfigError(f"config {self.name}: batch_size ≥ 2, lr > 0, epochs ≥ 1, grad_accum ≥ 1")
        local = self.extra.get("local_alignment", 0.0)
        if not isinstance(local, (int, float)) or isinstance(local, bool) or not 0.0 <= local <= 100.0:
            raise ConfigError(f"config {self.name}: local_alignment must be a weight in 0..100, got {local!r}")
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"config {self.name}: batch_size must be a multiple of grad_accum")

    def with_overrides(self, **kw) -> TrainConfig:
        cfg = replace(self, **{k: v for k, v in kw.items() if v is not None})
        cfg.validate()
        return cfg

    def to_dict(self) -> dict:
        return asdict(self)


def _c(name: str, desc: str, loss: str, *inputs: TextInput, **kw) -> TrainConfig:
    return TrainConfig(name=name, description=desc, inputs=tuple(inputs), loss=loss, **kw)


_ORIG = TextInput("original", CAPTION_TOKENS)
_GEN1 = TextInput("generated_one", CAPTION_TOKENS)
_GEN5 = TextInput("generated_all", CAPTION_TOKENS)
_PARA = TextInput("paragraph", PARAGRAPH_TOKENS)

PRESETS: dict[str, TrainConfig] = {
    c.name: c
    for c in (
        _c("C1", "original caption", "infonce", _ORIG),
        _c("C2", "one random generated caption", "infonce", _GEN1),
        _c("C3", "original + one random generated caption", "multipos", _ORIG, _GEN1),
        _c("C4", "paragraph only", "infonce", _PARA),
        _c("C5", "original caption + paragraph", "multipos", _ORIG, _PARA),
        _c("C6", "one random generated caption + paragraph", "multipos", _GEN1, _PARA),
        _c("C7", "original caption with its 5 hard negatives", "hardneg", _ORIG, hard_negatives=5),
        _c("C8", "original + 5 generated captions", "multipos", _ORIG, _GEN5),
        _c("C9", "5 generated captions + paragraph", "multipos", _GEN5, _PARA),
        _c("C10", "original + 5 generated captions + paragraph", "multipos", _ORIG, _GEN5, _PARA),
        _c("pretrain", "both towers, one random short caption", "infonce", TextInput("caption_any"),
           train_vision=True, learn_temperature=True),
    )
}


def load_config(name_or_path: str, **overrides) -> TrainConfig:
    """A preset name (C1..C10, pretrain) or a JSON file with the same fields ("base" may name a preset)."""
    if name_or_path in PRESETS:
        cfg = PRESETS[name_or_path]
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ConfigError(f"{name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a config file")
        from engine.jsonfile import JsonTooDeepError, read_json_file
        from engine.limits import MAX_SMALL_JSON_BYTES

        try:
            raw = read_json_file(path, max_bytes=MAX_SMALL_JSON_BYTES)  # never blocks on a FIFO or device
        except JsonTooDeepError as exc:
            raise ConfigError(str(exc)) from None
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a training config is a JSON object, not {type(raw).__name__}")
        base = PRESETS.get(raw.pop("base", ""), None)
        fields = base.to_dict() if base else {"description": str(path)}
        fields.update(raw)
        fields["name"] = raw.get("name", path.stem)
        try:
            fields["inputs"] = tuple(TextInput(**i) if isinstance(i, dict) else i for i in fields["inputs"])
            cfg = TrainConfig(**fields)
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    return cfg.with_overrides(**overrides)
