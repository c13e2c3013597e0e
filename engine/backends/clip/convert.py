"""OpenAI-layout CLIP checkpoints (Long-CLIP's official .pt files) -> a transformers CLIPModel folder.

Long-CLIP publishes its weights as `torch.save(model.state_dict())` pickles in OpenAI's layout
(BeichenZhang/LongCLIP-B, -L). They are converted once into a Hugging Face folder with
model.safetensors, which the CLIP backend then imports like any other. The pickle is loaded only
after its SHA-256 matched the pin below, read from the same open descriptor the hash was taken
from, and only with torch.load(weights_only=True): a file that needs code to unpickle is refused.

The mapping is transformers' own (convert_clip_original_pytorch_to_hf.py): attention in_proj
split into q/k/v, c_fc/c_proj -> fc1/fc2, ln_1/ln_2 -> layer_norm1/2, ln_pre/ln_post ->
pre_layrnorm/post_layernorm, proj matrices transposed into Linear weights. Long-CLIP's text
positions are two tables combined by fixed masks (model/model_longclip.py, encode_text:
positional_embedding * mask1 + positional_embedding_res * mask2, mask1 = the first 20 rows): the
converted table takes rows 0..19 from the first and 20..247 from the second, which is exactly what
its forward adds. Heads follow OpenAI's rule (width // 64); the text is pooled at the highest
token id (config eos_token_id 2, transformers' name for OpenAI's argmax rule).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any

from engine.errors import ModelError, ModelIntegrityError
from engine.jobs import CancelToken, Progress
from engine.models.registry import OPENAI_LAYOUT_CHECKPOINTS, PinnedCheckpoint

# Where the pins come from: the Git LFS pointers of the commits that uploaded the files, as shown on
# huggingface.co (commit 5ec98ddcf52692ea2e5a663a5e0f6920c4554c99 of BeichenZhang/LongCLIP-B
# "Upload longclip-B.pt"; commit a29856989d49817508dbda0fb95c7f6ffc314331 of BeichenZhang/LongCLIP-L
# "Upload longclip-L.pt", which replaced the first upload 92e2948 after the authors' DDP fix).


# The pins live in the registry's one table (the pulls use the same entries).
PINNED = OPENAI_LAYOUT_CHECKPOINTS


OPENAI_HEAD_WIDTH = 64
_HASH_CHUNK = 4 * 1024 * 1024
# Entries OpenAI's JIT state dicts carry besides tensors of the model (build_model deletes them).
_IGNORED_KEYS = frozenset({"input_resolution", "context_length", "vocab_size"})


def pinned_checkpoint(name: str) -> PinnedCheckpoint:
    try:
        return PINNED[name]
    except KeyError:
        raise ModelError(f"no pinned OpenAI-layout checkpoint is known for {name!r}; known: "
                         f"{', '.join(PINNED)}") from None


# ------------------------------------------------------------------------------- loading


def load_pinned_state_dict(path: Path, sha256: str, *, size: int | None = None,
                           cancel: CancelToken | None = None) -> Generator[Progress, None, dict[str, Any]]:
    """Hash `path` and, only when it matches `sha256` (and `size`, checked first), unpickle it with
    weights_only=True from the same descriptor. Yields hashing progress; returns the state dict."""
    import torch

    from engine.fileutil import open_user_file

    path = Path(path)
    try:
        fh = open_user_file(path)
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror or exc}") from None
    with fh:
        total = fh.size
        if size is not None and total != size:
            raise ModelIntegrityError(
                f"{path} has {total} bytes, not the {size} of the pinned checkpoint; nothing was loaded. "
                "Download the file again from the pinned revision.")
        digest = hashlib.sha256()
        done = 0
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if cancel is not None:
                cancel.raise_if_cancelled()
            yield Progress("verify", done, total, f"checking {path.name}")
        actual = digest.hexdigest()
        if actual != sha256.lower():
            raise ModelIntegrityError(
                f"{path} does not match its pinned SHA-256 (expected {sha256.lower()}, found {actual}); "
                "nothing was loaded. Download the file again from the pinned revision.")
        fh.seek(0)
        try:
            obj = torch.load(fh, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, AttributeError, TypeError) as e:
            raise ModelIntegrityError(
                f"{path.name} is not a plain weights file: it needs code to unpickle, which Longlens never "
                f"runs (torch.load with weights_only=True refused it: {str(e).splitlines()[0]})") from None
    if not isinstance(obj, dict) or not obj:
        raise ModelIntegrityError(f"{path.name} does not hold a state dict of tensors")
    for key, value in obj.items():
        if not isinstance(key, str) or not (isinstance(value, torch.Tensor) or key in _IGNORED_KEYS):
            raise ModelIntegrityError(f"{path.name} holds a non-tensor entry {key!r}; not a plain state dict")
    return obj


# ------------------------------------------------------------------------------- mapping


def _count_blocks(state: dict[str, Any], prefix: str) -> int:
    return len({k[len(prefix):].split(".", 1)[0] for k in state if k.startswith(prefix)})


def _shape(state: dict[str, Any], key: str) -> tuple[int, ...]:
    if key not in state:
        raise ModelIntegrityError(f"the checkpoint has no {key}; it is not an OpenAI-layout ViT CLIP")
    return tuple(state[key].shape)


def openai_config(state: dict[str, Any]) -> Any:
    """The CLIPConfig an OpenAI-layout ViT state dict describes (OpenAI's build_model rules)."""
    from transformers import CLIPConfig

    if any(k.startswith("visual.layer1.") for k in state):
        raise ModelError("this is a ResNet CLIP checkpoint; only Vision Transformer CLIP models are supported")
    vw, _, patch, _ = _shape(state, "visual.conv1.weight")
    n_pos, _ = _shape(state, "visual.positional_embedding")
    grid = round((n_pos - 1) ** 0.5)
    if grid * grid + 1 != n_pos:
        raise ModelIntegrityError(f"visual.positional_embedding has {n_pos} rows, not a square grid plus [CLS]")
    tw = _shape(state, "ln_final.weight")[0]
    vocab, _ = _shape(state, "token_embedding.weight")
    context, _ = _shape(state, "positional_embedding")
    embed = _shape(state, "text_projection")[1]
    v_layers = _count_blocks(state, "visual.transformer.resblocks.")
    t_layers = _count_blocks(state, "transformer.resblocks.")
    for what, width in (("vision", vw), ("text", tw)):
        if width % OPENAI_HEAD_WIDTH:
            raise ModelIntegrityError(f"the {what} width {width} is not a multiple of {OPENAI_HEAD_WIDTH} (OpenAI's heads)")
    if not v_layers or not t_layers:
        raise ModelIntegrityError("the checkpoint has no transformer blocks")
    text = {"vocab_size": vocab, "hidden_size": tw, "intermediate_size": _shape(state, "transformer.resblocks.0.mlp.c_fc.weight")[0],
            "num_hidden_layers": t_layers, "num_attention_heads": tw // OPENAI_HEAD_WIDTH,
            "max_position_embeddings": context, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
            "projection_dim": embed, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1}
    vision = {"hidden_size": vw, "intermediate_size": _shape(state, "visual.transformer.resblocks.0.mlp.c_fc.weight")[0],
              "num_hidden_layers": v_layers, "num_attention_heads": vw // OPENAI_HEAD_WIDTH,
              "image_size": patch * grid, "patch_size": patch, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
              "projection_dim": embed}
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=embed,
                      logit_scale_init_value=2.6592, architectures=["CLIPModel"])


def _blocks(state: dict[str, Any], src: str, dst: str, n: int, used: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def take(key: str) -> Any:
        used.add(key)
        return state[key]

    for i in range(n):
        s, d = f"{src}{i}.", f"{dst}{i}."
        q, k, v = take(s + "attn.in_proj_weight").chunk(3, dim=0)
        qb, kb, vb = take(s + "attn.in_proj_bias").chunk(3, dim=0)
        for name, w, b in (("q_proj", q, qb), ("k_proj", k, kb), ("v_proj", v, vb)):
            out[f"{d}self_attn.{name}.weight"], out[f"{d}self_attn.{name}.bias"] = w, b
        for a, b_ in (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"),
                      ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
            out[f"{d}{b_}.weight"], out[f"{d}{b_}.bias"] = take(f"{s}{a}.weight"), take(f"{s}{a}.bias")
    return out


def text_positions(state: dict[str, Any]) -> Any:
    """The position table the text forward adds: OpenAI's as is, Long-CLIP's two tables combined."""
    import torch

    from engine.backends.clip.checkpoints import LONGCLIP_CONTEXT, LONGCLIP_KEPT_POSITIONS

    pe = state["positional_embedding"]
    res = state.get("positional_embedding_res")
    if res is None:
        return pe
    if tuple(res.shape) != tuple(pe.shape) or pe.shape[0] != LONGCLIP_CONTEXT:
        raise ModelIntegrityError(f"positional_embedding {tuple(pe.shape)} and positional_embedding_res "
                                  f"{tuple(res.shape)} are not Long-CLIP's two {LONGCLIP_CONTEXT}-row tables")
    return torch.cat([pe[:LONGCLIP_KEPT_POSITIONS], res[LONGCLIP_KEPT_POSITIONS:]], dim=0)


def openai_to_hf(state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(CLIPConfig, transformers state dict) of an OpenAI-layout ViT CLIP state dict; every tensor
    of the input is used (an unknown one is refused, so nothing is silently dropped)."""
    import torch

    config = openai_config(state)
    used: set[str] = set(_IGNORED_KEYS)
    v_layers = config.vision_config.num_hidden_layers
    t_layers = config.text_config.num_hidden_layers

    def take(key: str) -> Any:
        used.add(key)
        return state[key]

    try:
        out = {
            "logit_scale": take("logit_scale"),
            "text_projection.weight": take("text_projection").T,
            "visual_projection.weight": take("visual.proj").T,
            "text_model.embeddings.token_embedding.weight": take("token_embedding.weight"),
            "text_model.embeddings.position_embedding.weight": text_positions(state),
            "text_model.final_layer_norm.weight": take("ln_final.weight"),
            "text_model.final_layer_norm.bias": take("ln_final.bias"),
            "vision_model.embeddings.class_embedding": take("visual.class_embedding"),
            "vision_model.embeddings.patch_embedding.weight": take("visual.conv1.weight"),
            "vision_model.embeddings.position_embedding.weight": take("visual.positional_embedding"),
            "vision_model.pre_layrnorm.weight": take("visual.ln_pre.weight"),
            "vision_model.pre_layrnorm.bias": take("visual.ln_pre.bias"),
            "vision_model.post_layernorm.weight": take("visual.ln_post.weight"),
            "vision_model.post_layernorm.bias": take("visual.ln_post.bias"),
            **_blocks(state, "transformer.resblocks.", "text_model.encoder.layers.", t_layers, used),
            **_blocks(state, "visual.transformer.resblocks.", "vision_model.encoder.layers.", v_layers, used),
        }
    except KeyError as e:
        raise ModelIntegrityError(f"the checkpoint has no {e.args[0]}; it is not an OpenAI-layout ViT CLIP") from None
    used |= {"positional_embedding", "positional_embedding_res"}
    unknown = sorted(k for k in state if k not in used)
    if unknown:
        raise ModelIntegrityError(f"the checkpoint has tensors an OpenAI-layout ViT CLIP does not: "
                                  f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
    tensors = {k: (v.detach().to(torch.float32) if v.is_floating_point() else v).contiguous().clone()
               for k, v in out.items()}
    return config, tensors


# ------------------------------------------------------------------------------- writing


def write_hf_folder(config: Any, tensors: dict[str, Any], out_dir: Path) -> Path:
    """config.json, model.safetensors, the CLIP tokenizer (model_max_length = the context) and
    preprocessor_config.json, written into a fresh folder that appears under `out_dir` whole."""
    from safetensors.torch import save_file

    from engine.backends.clip.checkpoints import save_folder_extras

    out_dir = Path(out_dir)
    if out_dir.exists() or out_dir.is_symlink():
        raise ModelError(f"{out_dir} already exists; the converted model is written into a new folder")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        config.save_pretrained(str(staging))
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        save_folder_extras(staging, int(config.vision_config.image_size),
                           int(config.text_config.max_position_embeddings))
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def convert_openai_checkpoint(pt_path: Path, out_dir: Path, *, sha256: str, size: int | None = None,
                              cancel: CancelToken | None = None) -> Generator[Progress, None, Path]:
    """The job: verify `pt_path` against its pin, load it without running code, map it and write the
    CLIPModel folder `out_dir`. Yields Progress; returns out_dir."""
    state = yield from load_pinned_state_dict(Path(pt_path), sha256, size=size, cancel=cancel)
    yield Progress("convert", 0, None, "mapping the weights to transformers' CLIPModel layout")
    config, tensors = openai_to_hf(state)
    del state
    if cancel is not None:
        cancel.raise_if_cancelled()
    yield Progress("write", 0, None, f"writing {Path(out_dir).name}")
    return write_hf_folder(config, tensors, Path(out_dir))
