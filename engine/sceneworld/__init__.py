"""SceneWorld: a deterministic procedural world of pictures with long, exactly true captions.

Each scene (seed, index) has a setting, 2-6 objects (kind, colour, size, pattern, box,
draw order), the relations that hold between them, and texts: a short original caption,
5 positive captions, 5 hard negatives (one detail wrong, tagged), and a 3-6 sentence
paragraph, all with phrase spans that point at object ids. `render_scene` draws it at any
size with per-object visible masks.

Everything is a pure function of (seed, index): the same pair gives byte-identical PNGs
and identical texts in any process.

Splits: seeds below EVAL_SEED_MIN (0-999) are for training; seeds >= EVAL_SEED_MIN are
reserved for evaluation. Training code should call `check_train_seed`, evaluation code
`check_eval_seed`, so a benchmark can never be built from training scenes by accident.
"""

from __future__ import annotations

from engine.sceneworld.language import describe_scene, parse_object_phrase
from engine.sceneworld.layout import sample_scene_graph
from engine.sceneworld.render import render_batch, render_scene
from engine.sceneworld.world import (
    COLOURS,
    KIND_NAMES,
    PATTERNS,
    RELATIONS,
    SETTINGS,
    SIZES,
    Count,
    Negative,
    Paragraph,
    Phrase,
    Relation,
    Scene,
    SceneObject,
    Span,
    Text,
    describe_world,
    relation_holds,
)

__all__ = [
    "COLOURS",
    "EVAL_SEED_MIN",
    "KIND_NAMES",
    "PATTERNS",
    "RELATIONS",
    "SETTINGS",
    "SIZES",
    "Count",
    "Negative",
    "Paragraph",
    "Phrase",
    "Relation",
    "Scene",
    "SceneObject",
    "Span",
    "Text",
    "check_eval_seed",
    "check_train_seed",
    "describe_world",
    "generate_scene",
    "generate_scenes",
    "parse_object_phrase",
    "relation_holds",
    "render_batch",
    "render_scene",
]

EVAL_SEED_MIN = 1000


def check_eval_seed(seed: int) -> int:
    """Return seed if it is reserved for evaluation, else raise ValueError."""
    if seed < EVAL_SEED_MIN:
        raise ValueError(
            f"SceneWorld seed {seed} is a training seed; evaluation sets must use seeds >= {EVAL_SEED_MIN} "
            "so that no evaluated scene can have been trained on"
        )
    return seed


def check_train_seed(seed: int) -> int:
    """Return seed if it may be used for training, else raise ValueError."""
    if not 0 <= seed < EVAL_SEED_MIN:
        raise ValueError(
            f"SceneWorld seed {seed} is not a training seed; training uses seeds 0..{EVAL_SEED_MIN - 1}, "
            f"seeds >= {EVAL_SEED_MIN} are reserved for evaluation"
        )
    return seed


def generate_scene(seed: int, index: int) -> Scene:
    """Scene graph and all texts of scene (seed, index)."""
    return describe_scene(sample_scene_graph(seed, index))


def generate_scenes(seed: int, start: int, n: int) -> list[Scene]:
    """Scenes (seed, start) .. (seed, start + n - 1)."""
    return [generate_scene(seed, i) for i in range(start, start + n)]
