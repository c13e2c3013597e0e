"""Installing models: pulling pinned files from the hub, importing local folders.

This is the only module in Longlens that talks to a model hub. Rules it enforces:

* Only allow-listed files of a registered spec, at its pinned commit (never a branch).
* Every file is checked against its pin before anything is installed: a SHA-256 (Git LFS files)
  or a git blob id (small git-tracked files), see engine/models/pins.py. A model whose files are
  all pinned installs without any question; a file with no pin is installed only when the user
  explicitly trusts it (`trust_unpinned`), and its computed hash then goes into the manifest so
  that later verification still catches tampering. A file that does not match its pin is deleted
  and the pull stops with nothing installed.
* Pickled weights (.bin) are accepted only when pinned by SHA-256; they are loaded with
  `torch.load(weights_only=True)`, converted to model.safetensors and not kept. Imports refuse
  pickles outright. Nothing is ever loaded with trust_remote_code.
* Installs are atomic: files are assembled in a dot-prefixed staging folder inside paths.models,
  checked, given their manifest, verified, and only then renamed to their final name; a replaced
  model stays installed until then, and a killed install is repaired at the next start
  (engine.models.install_state).

Why not `hf_hub_download`: in huggingface_hub 2.x it downloads into a process-unique
`*.incomplete` file and deletes it on failure (huggingface_hub PR #4228), so an interrupted
900 MB download always restarts from zero. We use huggingface_hub's own pieces instead
(`get_hf_file_metadata` for the HEAD with the hub's headers and redirects, `http_get` for the
ranged GET with its retry logic) and keep the partial file under paths.cache ourselves, which
makes a second pull continue where the first stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from engine.config import Paths
from engine.errors import JobCancelled, ModelError, ModelIntegrityError, OfflineError
from engine.jobs import CancelToken, Progress
from engine.jsonfile import read_json_file
from engine.limits import MAX_MODEL_CONFIG_BYTES, MAX_WEIGHT_INDEX_BYTES, model_file_limit, size_words
from engine.models.file_limits import check_model_file, check_model_tree
from engine.models.install_state import Staging, pause_point, recover_models_folder, swap_in
from engine.models.pins import FileDigests, hash_file
from engine.models.registry import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    ModelSpec,
    check_model_name,
    get_spec,
    installed_model_dir,
    sha256_file,
    verify_dir,
    verify_model,
)
from engine.models.text_towers import TEXT_TOWERS_DIR

__all__ = ["import_model", "pull_model", "verify_model"]

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})

# What an import copies. Anything else in the source folder (README images, tf_model.h5,
# flax weights, .gitattributes) is left behind.
_IMPORT_NAMES = frozenset(
    {
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "preprocessor_config.json",
        "processor_config.json",
        "special_tokens_map.json",
        "tokenizer_config.json",
        "tokenizer.json",
        "vocab.txt",
        # CLIP's BPE tokenizer files: with them a CLIP folder needs no tokenizer.json.
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "generation_config.json",
        "README.md",
        "LICENSE",
        "LICENSE.txt",
        "LICENSE.md",
    }
)
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
# A paragraph-trained text tower (see engine.backends.blip.embedder) may travel in a text_tower/ subfolder.
TEXT_TOWER_DIR = "text_tower"
_TEXT_TOWER_NAMES = frozenset({"text_tower.safetensors", "text_tower.json"})
# Query readers bundled with a model (engine/models/text_towers.py): text-towers/NAME/ holding an LM
# tower folder (engine/models/lm_tower.py: its weights, LM config, tokenizer/ and licence NOTICE).
_BUNDLED_TOWER_RE = re.compile(
    rf"^{re.escape(TEXT_TOWERS_DIR)}/[A-Za-z0-9][A-Za-z0-9_.-]*/(lm_tower\.json|config\.json|model\.safetensors|NOTICE|"
    r"tokenizer/(tokenizer\.json|tokenizer_config\.json|vocab\.txt|vocab\.json|merges\.txt|"
    r"special_tokens_map\.json|added_tokens\.json|tokenizer\.model))$")

_COPY_CHUNK = 4 * 1024 * 1024


# --- Shared install machinery ----------------------------------------------------------------


def _longlens_version() -> str:
    from engine import __version__

    return __version__


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _new_staging(paths: Paths, name: str) -> Staging:
    # Every install start first repairs what killed installs left (engine.models.install_state).
    recover_models_folder(paths)
    return Staging(paths, name)


def _verify_staged(staging: Path, name: str) -> None:
    """The staged folder must verify against its own manifest before it may replace anything."""
    report = verify_dir(staging, name)
    if not report.ok:
        raise ModelIntegrityError(f"the staged copy did not verify, nothing was installed: {report.summary()}")


def _write_manifest(staging: Path, manifest: dict[str, Any]) -> None:
    tmp = staging / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, staging / MANIFEST_NAME)


def _manifest(
    *,
    name: str,
    backend: str,
    source: str,
    repo_id: str | None,
    revision: str | None,
    files: dict[str, dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "name": name,
        "backend": backend,
        "source": source,
        "repo_id": repo_id,
        "revision": revision,
        "files": files,
        "installed_at": _now_iso(),
        "longlens_version": _longlens_version(),
        **extra,
    }


def write_local_manifest(folder: Path, name: str, backend: str, **extra: Any) -> Path:
    """Hash every file of a model folder made here (e.g. the trained demo model) into its manifest,
    so it verifies and loads like a pulled or imported model."""
    from engine.models.registry import sha256_file

    folder = Path(folder)
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST_NAME:
            rel = p.relative_to(folder).as_posix()
            files[rel] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    _write_manifest(folder, _manifest(name=name, backend=backend, source="trained", repo_id=None,
                                      revision=None, files=files, **extra))
    return folder / MANIFEST_NAME


def list_subfolder_in_manifest(model_dir: Path, rel_dir: str) -> bool:
    """(Re)list every file under model_dir/rel_dir in the model folder's manifest, replacing that
    folder's old entries, so `longlens models verify` (which fails on unlisted files) covers them
    (the matching head, a bundled text tower). False when the folder has no manifest."""
    from engine.models.manifest import read_manifest_file
    from engine.models.registry import sha256_file

    model_dir = Path(model_dir)
    if not (model_dir / MANIFEST_NAME).is_file():
        return False
    manifest = read_manifest_file(model_dir)
    prefix = rel_dir.strip("/") + "/"
    files = {k: v for k, v in manifest["files"].items() if not k.startswith(prefix)}
    sub = model_dir / rel_dir
    for p in sorted(sub.rglob("*")) if sub.is_dir() else ():
        if p.is_file():
            files[p.relative_to(model_dir).as_posix()] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    manifest["files"] = dict(sorted(files.items()))
    _write_manifest(model_dir, manifest)
    return True


def _validate_hf_folder(folder: Path, backend: str, weights: list[str]) -> None:
    """The backend's config file (config.json for Hugging Face folders) parses, and every
    safetensors file has a readable header (no weights loaded)."""
    from engine.models.registry import get_backend

    hooks = get_backend(backend)
    config_name = hooks.config_file
    cfg_path = folder / config_name
    # Every file read whole within its size and nesting limit (engine.models.file_limits), the
    # config first: what is checked is the copy that will be installed.
    check_model_tree(folder)
    try:
        cfg = read_json_file(cfg_path, max_bytes=model_file_limit(config_name) or MAX_MODEL_CONFIG_BYTES)
    except FileNotFoundError:
        raise ModelError(f"{folder} has no {config_name}") from None
    except (OSError, ValueError) as e:
        raise ModelIntegrityError(f"{config_name} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ModelIntegrityError(f"{config_name} is not a JSON object")
    if hooks.import_config_check is not None:
        hooks.import_config_check(cfg)
    from safetensors import safe_open

    for rel in weights:
        try:
            with safe_open(str(folder / rel), framework="numpy") as f:
                keys = list(f.keys())
        except Exception as e:  # safetensors raises its own error types for bad headers
            raise ModelIntegrityError(f"{rel} is not a valid safetensors file: {e}") from None
        if not keys:
            raise ModelIntegrityError(f"{rel} contains no tensors")
    if hooks.import_weights_check is not None:
        # The config's sizes decide what loading allocates: refuse them now, not at first search.
        hooks.import_weights_check(folder, [w for w in weights if not w.startswith(TEXT_TOWER_DIR + "/")])


# --- import ----------------------------------------------------------------------------------


def importable_backends() -> list[str]:
    """Backends whose folders `longlens models import` can install (the registry's table says)."""
    from engine.models.registry import backend_names, get_backend

    return [n for n in backend_names() if get_backend(n).importable]


def _is_importable(rel: str) -> bool:
    if rel.startswith(TEXT_TOWERS_DIR + "/"):
        return bool(_BUNDLED_TOWER_RE.fullmatch(rel))
    if rel.startswith(TEXT_TOWER_DIR + "/"):
        return rel.split("/", 1)[1] in _TEXT_TOWER_NAMES
    return rel in _IMPORT_NAMES or bool(_SHARD_RE.fullmatch(rel))


def _allowed_roots(src: Path) -> list[Path]:
    roots = [src]
    # A huggingface_hub cache snapshot (…/snapshots/<commit>/) is made of symlinks into the
    # repo's own …/blobs/ folder; following those is as safe as following links inside src.
    if src.parent.name == "snapshots":
        roots.append(src.parent.parent / "blobs")
    return roots


def _copy_hashing(src: Path, dst: Path, rel: str | None = None) -> tuple[str, int]:
    """Copy and hash in one pass, so the recorded hash is of the bytes we wrote. A file read whole
    later (engine.limits.MODEL_FILE_LIMITS) that grew past its limit since it was checked is refused
    before a byte of it is copied."""
    from engine.fileutil import open_user_file

    h = hashlib.sha256()
    size = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Checked on the open descriptor: a file that became a FIFO or device since the folder was
        # listed never blocks the import, and one still growing is copied up to its size at open.
        fin = open_user_file(src, follow_symlinks=False)  # links were resolved and checked by the caller
    except OSError as exc:
        raise ModelError(f"cannot read {src}: {exc.strerror or exc}") from None
    limit = model_file_limit(rel or src.name)
    if limit is not None and fin.size > limit:
        fin.close()
        raise ModelIntegrityError(f"{rel or src} is too large ({size_words(fin.size)}; the limit for "
                                  f"{(rel or src.name).rsplit('/', 1)[-1]} is {size_words(limit)}); nothing was imported")
    with fin, open(dst, "wb") as fout:
        while chunk := fin.read(_COPY_CHUNK):
            h.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return h.hexdigest(), size


def import_model(
    src_dir: str | os.PathLike[str],
    name: str,
    paths: Paths,
    *,
    backend: str = "blip",
    replace: bool = False,
) -> Path:
    """Install a local Hugging Face-style model folder under `name`; returns the installed folder."""
    check_model_name(name)
    src = Path(src_dir).expanduser()
    if not src.is_dir():
        raise ModelError(f"{src} is not a folder")
    src = src.resolve()
    try:
        spec = get_spec(name)
    except ModelError:
        spec = None
    if spec is not None:
        if spec.bundled:
            raise ModelError(f"{name!r} is the bundled demo model; import under another name")
        if backend != spec.backend:
            raise ModelError(f"{name!r} is a {spec.backend} model; cannot import it as {backend!r}")
    importable = importable_backends()
    if backend not in importable:
        raise ModelError(
            f"importing {backend!r} models is not supported; only {', '.join(map(repr, importable))} "
            "folders can be imported"
        )

    from engine.models.registry import get_backend

    config_name = get_backend(backend).config_file
    final = paths.models / name
    recover_models_folder(paths)  # a model a killed replace left aside is back before we look
    if (final.exists() or final.is_symlink()) and not replace:
        raise ModelError(f"a model named {name!r} already exists at {final}; replace it to overwrite it, or choose "
                         "another name", settings=("replace",))

    roots = _allowed_roots(src)
    selected: list[tuple[str, Path]] = []  # (relative name in the install, source path)
    pickles: list[str] = []
    outside: list[str] = []

    def scan(folder: Path, prefix: str) -> None:
        for p in sorted(folder.iterdir()):
            rel = prefix + p.name
            if p.is_dir() and not p.is_symlink():
                if (not prefix and p.name in (TEXT_TOWER_DIR, TEXT_TOWERS_DIR)) or prefix.startswith(
                        TEXT_TOWERS_DIR + "/"):
                    scan(p, rel + "/")
                continue
            if p.suffix.lower() in PICKLE_SUFFIXES:
                pickles.append(rel)
                continue
            if not _is_importable(rel) and rel != config_name:
                continue
            if p.is_symlink():
                try:
                    target = p.resolve(strict=True)
                except (OSError, RuntimeError):
                    outside.append(f"{rel} (broken link)")
                    continue
                if not any(target.is_relative_to(r) for r in roots) or not target.is_file():
                    outside.append(f"{rel} -> {target}")
                    continue
                p = target  # the checked target is what gets copied, so no link is followed later
            elif not p.is_file():
                continue
            selected.append((rel, p))

    scan(src, "")
    if pickles:
        raise ModelIntegrityError(
            f"{src} contains pickled weights ({', '.join(pickles)}). Longlens does not import pickle "
            "files because loading them can run arbitrary code. Convert them to model.safetensors "
            "with a trusted tool (or move them out if the folder already has safetensors weights) "
            "and import again."
        )
    if outside:
        raise ModelIntegrityError(
            f"{src} has symbolic links pointing outside the folder: {', '.join(outside)}. "
            "Copy the real files into the folder and import again."
        )
    names = {rel for rel, _ in selected}
    if config_name not in names:
        raise ModelError(f"{src} has no {config_name}; is this {get_backend(backend).folder_description}?")
    # Files read whole (configs, tokenizers) within their size and nesting limits before a byte is
    # copied: a 1 GiB preprocessor_config.json would otherwise be copied and read by every load.
    for rel, p in selected:
        try:
            check_model_file(p, rel)
        except ModelIntegrityError as exc:
            raise ModelIntegrityError(f"{src}: {exc}; nothing was imported") from None
    _check_bundled_towers_complete(src, names)
    weights = _weights_of(names, src)

    stage = _new_staging(paths, name)
    staging = stage.dir
    try:
        files: dict[str, dict[str, Any]] = {}
        for rel, p in selected:
            digest, size = _copy_hashing(p, staging.joinpath(*rel.split("/")), rel)
            files[rel] = {"sha256": digest, "size": size}
        pause_point("copied")
        _validate_hf_folder(staging, backend, weights + _tower_weights(names))
        _write_manifest(
            staging,
            _manifest(
                name=name,
                backend=backend,
                source="import",
                repo_id=None,
                revision=None,
                files=files,
                imported_from=str(src),
            ),
        )
        _verify_staged(staging, name)
        pause_point("verified")
        swap_in(staging, final, paths, replace=replace)
    finally:
        stage.close()
    return final


def _check_bundled_towers_complete(src: Path, names: set[str]) -> None:
    """A bundled LM tower (text-towers/NAME/) without its tokenizer's tokenizer_config.json loads a
    tokenizer with no padding token: refused here, naming the file, instead of at the first search."""
    # engine.models.lm_tower's TOKENIZER_DIR and TOKENIZER_CONFIG_FILE (importing it loads torch).
    TOKENIZER_DIR, TOKENIZER_CONFIG_FILE = "tokenizer", "tokenizer_config.json"  # noqa: N806
    towers = sorted({rel.split("/")[1] for rel in names
                     if rel.startswith(TEXT_TOWERS_DIR + "/") and rel.endswith("/lm_tower.json")})
    for tower in towers:
        needed = f"{TEXT_TOWERS_DIR}/{tower}/{TOKENIZER_DIR}/{TOKENIZER_CONFIG_FILE}"
        if needed not in names:
            raise ModelIntegrityError(
                f"{src}: the text tower {TEXT_TOWERS_DIR}/{tower} has no {TOKENIZER_DIR}/{TOKENIZER_CONFIG_FILE} (it "
                "names the tokenizer's padding and special tokens the tower was trained with); copy it from where the "
                "tower was saved and import again. Nothing was imported")


def _weights_of(names: set[str], src: Path) -> list[str]:
    """The safetensors files that make up the main weights; refuse a folder without them."""
    if "model.safetensors" in names:
        return ["model.safetensors"]
    shards = sorted(n for n in names if _SHARD_RE.fullmatch(n))
    if "model.safetensors.index.json" in names:
        try:
            index = read_json_file(src / "model.safetensors.index.json", max_bytes=MAX_WEIGHT_INDEX_BYTES)
            wanted = set(index["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelIntegrityError(f"model.safetensors.index.json is unreadable: {e}") from None
        missing = sorted(wanted - set(shards))
        if missing:
            raise ModelIntegrityError(f"{src} lacks weight shards listed in its index: {', '.join(missing)}")
        return sorted(wanted)
    raise ModelError(
        f"{src} has no safetensors weights (model.safetensors, or shards with model.safetensors.index.json)"
    )


def _tower_weights(names: set[str]) -> list[str]:
    return sorted(n for n in names if n.startswith(TEXT_TOWER_DIR + "/") and n.endswith(".safetensors"))


# --- pull ------------------------------------------------------------------------------------


@dataclass
class _Remote:
    filename: str
    url: str
    size: int | None


def _is_offline_env() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.strip().upper() in {"1", "ON", "YES", "TRUE"} or constants.is_offline_mode()


def _offline(endpoint: str, name: str, why: str) -> OfflineError:
    return OfflineError(
        f"cannot reach the model hub at {endpoint} ({why}). Without network, copy the model folder "
        f"from another machine and use `longlens models import DIR --name {name}`."
    )


def _hub_error(e: Exception, endpoint: str, spec: ModelSpec, filename: str) -> Exception:
    """Translate huggingface_hub/httpx errors into errors a user can act on."""
    import httpx2
    from huggingface_hub.errors import (
        FileMetadataError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(e, OfflineModeIsEnabled):
        return _offline(endpoint, spec.name, "offline mode is enabled (HF_HUB_OFFLINE)")
    if isinstance(e, httpx2.TransportError):
        return _offline(endpoint, spec.name, f"{type(e).__name__}: {e}")
    if isinstance(e, FileMetadataError):
        return _offline(endpoint, spec.name, f"the server did not answer like a model hub: {e}")
    if isinstance(e, RevisionNotFoundError):
        return ModelError(f"the hub has no revision {spec.revision} of {spec.repo_id}")
    if isinstance(e, RemoteEntryNotFoundError):
        return ModelError(f"the hub has no {filename} in {spec.repo_id} at {spec.revision}")
    if isinstance(e, (RepositoryNotFoundError, GatedRepoError)):
        return ModelError(f"the hub refused access to {spec.repo_id}: {e}")
    if isinstance(e, HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", 0) or 0
        if status >= 500:
            return _offline(endpoint, spec.name, f"the hub answered HTTP {status}")
        return ModelError(f"the hub refused {filename} of {spec.repo_id}: {e}")
    return e


class _ByteSink:
    """Shared between the download thread and the generator: bytes so far, and a stop flag."""

    def __init__(self, cancel: CancelToken | None) -> None:
        self.done = 0
        self.stop = threading.Event()
        self._cancel = cancel

    def check(self) -> None:
        if self.stop.is_set() or (self._cancel is not None and self._cancel.cancelled):
            raise JobCancelled("cancelled by the user")


class _Bar:
    """Stands in for tqdm inside huggingface_hub's http_get: counts bytes, stops on cancel."""

    def __init__(self, sink: _ByteSink, *, initial: int = 0, **_: Any) -> None:
        self._sink = sink
        sink.done = initial

    def update(self, n: int = 1) -> None:
        self._sink.done += n
        self._sink.check()

    def close(self) -> None:
        pass

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def pull_model(
    spec_or_name: ModelSpec | str,
    paths: Paths,
    *,
    cancel: CancelToken | None = None,
    trust_unpinned: bool = False,
    endpoint: str | None = None,
    timeout_s: float = 10.0,
) -> Generator[Progress, None, Path]:
    """Download, verify and install a registered model. A job: yields Progress, returns the folder.

    Every file is checked against its pin (engine/models/pins.py) before anything is installed; a
    spec whose files are all pinned needs no `trust_unpinned`. Partial downloads are kept under
    paths.cache, so a pull that was interrupted continues where it stopped. Download reports carry
    the total size, the rate of this pull and the time left.

    `endpoint` defaults to $HF_ENDPOINT (read at call time) or huggingface.co. `timeout_s` bounds the
    metadata request, so an unreachable hub fails in seconds rather than hanging.
    """
    spec = spec_or_name if isinstance(spec_or_name, ModelSpec) else get_spec(spec_or_name)
    name = spec.name
    _check_pullable(spec)
    _check_pull_files(spec, trust_unpinned)

    from huggingface_hub import constants

    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")

    existing = installed_model_dir(name, paths)
    if existing is not None:
        yield Progress("verify", 0, None, f"checking the installed {name}")
        if verify_dir(existing, name).ok:
            yield Progress(
                "done", 1, 1, f"{name} is already installed and intact", extra={"path": str(existing)}
            )
            return existing
    _check_cancel(cancel)
    if _is_offline_env():
        raise _offline(endpoint, name, "offline mode is enabled (HF_HUB_OFFLINE)")

    cache_dir = paths.cache / "downloads" / spec.repo_id.replace("/", "--") / spec.revision
    cache_dir.mkdir(parents=True, exist_ok=True)

    # 1. Ask the hub for each file's location and size (fails fast when offline).
    remotes: list[_Remote] = []
    for i, fname in enumerate(spec.files):
        _check_cancel(cancel)
        yield Progress("resolve", i, len(spec.files), f"looking up {fname}")
        remotes.append(_head(spec, fname, endpoint, timeout_s))
    sizes = [r.size for r in remotes]
    total = sum(s for s in sizes if s is not None) if all(s is not None for s in sizes) else None

    # 2. Files a previous pull finished are kept if they still match their pins; partial ones resume.
    digests: dict[str, FileDigests] = {}
    for remote in remotes:
        _check_cancel(cancel)
        cached = cache_dir.joinpath(*remote.filename.split("/"))
        if cached.is_file():
            found = hash_file(cached)
            pin = spec.pin(remote.filename)
            if found.matches(pin) if pin is not None else remote.size in (None, found.size):
                digests[remote.filename] = found
            else:
                cached.unlink()
    done_before = sum(d.size for d in digests.values())
    parts = [_part_path(cache_dir.joinpath(*r.filename.split("/"))) for r in remotes if r.filename not in digests]
    meter = _Meter(total, present=done_before + sum(p.stat().st_size for p in parts if p.is_file()))
    sizes = meter.report(meter.present, _size_summary(name, len(remotes), total, meter.present))
    sizes.extra["sizes"] = {"files": len(remotes), "total": total, "present": meter.present}
    yield sizes

    # 3. Download the rest into the cache (continuing partial files), checking each against its pin.
    for remote in remotes:
        _check_cancel(cancel)
        fname = remote.filename
        if fname in digests:
            continue
        cached = cache_dir.joinpath(*fname.split("/"))
        yield from _download(remote, cached, spec, endpoint, cancel, done_before, meter)
        part = _part_path(cached)
        # Still the download stage: one bar (and one line in the GUI) runs from the first byte to the last check.
        yield meter.report(done_before + (remote.size or 0), f"checking {fname}")
        found = hash_file(part)
        pin = spec.pin(fname)
        if pin is not None and not found.matches(pin):
            part.unlink(missing_ok=True)  # so the next pull downloads it afresh
            raise ModelIntegrityError(
                f"{fname} of {name} does not match its pin: expected {pin.describe()}, got "
                f"{found.of_kind(pin.kind)} ({found.size} bytes). The download was deleted and nothing "
                f"was installed. To get it again, pull {name} again: the file is downloaded afresh. If it "
                f"fails the same way, the hub (or a proxy between you and it) serves other bytes than "
                f"revision {spec.revision} holds: import a copy you trust from a folder instead "
                f"(`longlens models import DIR --name {name}`)."
            )
        os.replace(part, cached)
        digests[fname] = found
        done_before += found.size

    # 4. Assemble the install in a staging folder, convert pickles, then swap it into place.
    _check_cancel(cancel)
    stage = _new_staging(paths, name)
    staging = stage.dir
    try:
        files: dict[str, dict[str, Any]] = {}
        converted: dict[str, dict[str, Any]] = {}
        checkpoint = _backend_checkpoint(spec)
        if checkpoint is not None:
            found = digests[checkpoint]
            files = yield from _convert_backend_checkpoint(spec, cache_dir.joinpath(*checkpoint.split("/")), found,
                                                           staging, cancel)
            converted[checkpoint] = {"sha256": found.sha256, "size": found.size}
        for fname in spec.files if checkpoint is None else ():
            _check_cancel(cancel)
            cached = cache_dir.joinpath(*fname.split("/"))
            if fname.endswith(".bin"):
                yield Progress("convert", 0, None, f"converting {fname} to safetensors")
                out = staging / "model.safetensors"
                _convert_pickle_to_safetensors(cached, out)
                files["model.safetensors"] = {"sha256": sha256_file(out), "size": out.stat().st_size}
                converted[fname] = {"sha256": digests[fname].sha256, "size": digests[fname].size}
                continue
            dst = staging.joinpath(*fname.split("/"))
            dst.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(cached, dst)
            files[fname] = {"sha256": digests[fname].sha256, "size": dst.stat().st_size}
        weights = ["model.safetensors"] if "model.safetensors" in files else _weights_of(set(files), staging)
        _validate_hf_folder(staging, spec.backend, weights)
        _check_cancel(cancel)
        yield Progress("install", 0, None, f"installing {name}")
        _write_manifest(
            staging,
            _manifest(
                name=name,
                backend=spec.backend,
                source="pull",
                repo_id=spec.repo_id,
                revision=spec.revision,
                files=files,
                endpoint=endpoint,
                pinned={f: str(p) for f, p in spec.pins.items()},
                trusted_unpinned=spec.unpinned_files,
                converted_from=converted,
            ),
        )
        final = paths.models / name
        _verify_staged(staging, name)
        # Replacing is safe here: the folder is either absent, not a model (no manifest) or failed
        # verification above, and the user asked for this model to be installed.
        swap_in(staging, final, paths, replace=True)
    finally:
        stage.close()

    # The install holds its own links/copies; the cached downloads are no longer needed.
    shutil.rmtree(cache_dir, ignore_errors=True)
    _prune_empty_parents(cache_dir.parent, stop=paths.cache)
    yield Progress("done", total or done_before, total, f"installed {name}", extra={"path": str(final)})
    return final


def _check_pullable(spec: ModelSpec) -> None:
    """Refuse, with what to do instead, a spec that names nothing to pull: each kind its own reason."""
    from engine.models.registry import how_to_get

    name = spec.name
    if spec.bundled:
        raise ModelError(f"{name!r} is bundled with Longlens: it ships inside this build and is never downloaded, "
                         "so there is nothing to pull.")
    if not spec.repo_id:
        raise ModelError(f"{name!r} names no model hub repository to pull it from. {how_to_get(name)}")
    if not spec.revision:
        raise ModelError(f"{name!r} names no pinned revision of {spec.repo_id}; Longlens pulls only a pinned "
                         f"commit, never a branch. {how_to_get(name)}")
    if not spec.files:
        raise ModelError(f"{name!r} lists no files to pull from {spec.repo_id}. {how_to_get(name)}")


def _backend_checkpoint(spec: ModelSpec) -> str | None:
    """The one file of a spec that is a checkpoint in its backend's own format (converted by the
    backend's convert_checkpoint into the whole model folder), or None."""
    from engine.models.registry import get_backend

    suffixes = get_backend(spec.backend).checkpoint_suffixes
    found = [f for f in spec.files if Path(f).suffix.lower() in suffixes]
    return found[0] if found else None


def _check_pull_files(spec: ModelSpec, trust_unpinned: bool) -> None:
    checkpoint = _backend_checkpoint(spec)
    if checkpoint is not None and len(spec.files) != 1:
        raise ModelError(f"{spec.name}: {checkpoint} is converted into the whole model folder, so the spec "
                         "lists it alone")
    for fname in spec.files:
        parts = fname.split("/")
        if any(p in ("", ".", "..") for p in parts) or "\\" in fname:
            raise ModelError(f"{spec.name}: unsafe file name in the spec: {fname!r}")
        suffix = Path(fname).suffix.lower()
        if suffix in PICKLE_SUFFIXES:
            pin = spec.pin(fname)
            if pin is None:
                raise ModelIntegrityError(
                    f"{spec.name}: {fname} is a pickle file without a pinned SHA-256; Longlens never "
                    "loads unpinned pickles (they can run code), and trusting unpinned files does not change that"
                )
            if pin.kind != "sha256":
                raise ModelIntegrityError(
                    f"{spec.name}: {fname} is a pickle file pinned by its {pin.describe()}; pickles are "
                    "loaded, so Longlens takes them only when pinned by their SHA-256"
                )
            if suffix != ".bin" and fname != checkpoint:
                raise ModelError(f"{spec.name}: only pickled .bin weights (or a checkpoint the {spec.backend} "
                                 f"backend converts) can be converted, not {fname}")
    bins = [f for f in spec.files if f.endswith(".bin")]
    if len(bins) > 1 or (bins and "model.safetensors" in spec.files):
        raise ModelError(f"{spec.name}: a spec may convert one .bin file and then has no model.safetensors")
    unpinned = spec.unpinned_files
    if unpinned and not trust_unpinned:
        raise ModelIntegrityError(
            f"{spec.name}: no pinned hash is known for {', '.join(unpinned)}, so Longlens cannot "
            "check them. Run again trusting unpinned files to accept them as downloaded from the pinned "
            f"revision {spec.revision}; their hashes are then recorded so later verification catches "
            "any change. Or import a copy you trust with `longlens models import DIR --name "
            f"{spec.name}`.",
            settings=("trust_unpinned",),
        )


def human_size(n: int | None) -> str:
    """Bytes as a person reads them: 895.1 MB, 4.6 kB (powers of 1000, as the hub shows sizes)."""
    if n is None:
        return "unknown size"
    value = float(n)
    for unit in ("bytes", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} bytes"


def _size_summary(name: str, n_files: int, total: int | None, present: int) -> str:
    if total is None:
        return f"{name}: {n_files} files (the hub did not say how large)"
    left = f"{human_size(total - present)} to download"
    kept = f", {human_size(present)} already here from an earlier pull" if present else ""
    return f"{name}: {n_files} files, {human_size(total)}; {left}{kept}"


class _Meter:
    """Byte progress of one pull. The rate counts only bytes this pull fetched, so a pull that
    resumes 800 of 900 MB does not promise the rest in a second."""

    def __init__(self, total: int | None, present: int = 0) -> None:
        self.total = total
        self.present = present  # bytes on disk before this pull fetched any
        self.started = time.monotonic()

    def report(self, done: int, message: str) -> Progress:
        fetched = done - self.present
        elapsed = time.monotonic() - self.started
        rate = fetched / elapsed if fetched > 0 and elapsed > 0 else None
        eta = max(self.total - done, 0) / rate if (rate and self.total is not None) else None
        return Progress("download", done, self.total, message, rate, eta)


def _check_cancel(cancel: CancelToken | None) -> None:
    if cancel is not None:
        cancel.raise_if_cancelled()


def _head(spec: ModelSpec, fname: str, endpoint: str, timeout_s: float) -> _Remote:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(spec.repo_id, fname, revision=spec.revision, endpoint=endpoint)  # type: ignore[arg-type]
    try:
        meta = get_hf_file_metadata(
            url,
            token=False,  # public models only; never send a user's token anywhere
            timeout=timeout_s,
            library_name="longlens",
            library_version=_longlens_version(),
            endpoint=endpoint,
        )
    except Exception as e:
        mapped = _hub_error(e, endpoint, spec, fname)
        if mapped is e:
            raise
        raise mapped from e
    if meta.commit_hash is None:
        # A proxy or captive portal answering in the hub's place: nothing it serves can be trusted.
        raise _offline(endpoint, spec.name, f"the answer for {fname} lacks the hub's X-Repo-Commit header")
    if meta.commit_hash != spec.revision:
        raise ModelIntegrityError(
            f"the hub served {fname} from commit {meta.commit_hash}, not the pinned {spec.revision}"
        )
    return _Remote(fname, meta.location, meta.size)


def _part_path(cached: Path) -> Path:
    return cached.with_name(cached.name + ".part")


def _download(
    remote: _Remote,
    cached: Path,
    spec: ModelSpec,
    endpoint: str,
    cancel: CancelToken | None,
    done_before: int,
    meter: _Meter,
) -> Iterator[Progress]:
    """Fetch one file into `<cached>.part`, continuing a partial one; yields byte progress.

    The blocking http_get runs in a thread so this generator can keep reporting progress.
    """
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    part = _part_path(cached)
    part.parent.mkdir(parents=True, exist_ok=True)
    if part.exists() and remote.size is not None and part.stat().st_size > remote.size:
        part.unlink()  # longer than the file can be: not a prefix of it
    headers = build_hf_headers(token=False, library_name="longlens", library_version=_longlens_version())
    # Byte ranges must refer to the file itself, not a compressed transfer of it.
    headers["Accept-Encoding"] = "identity"
    sink = _ByteSink(cancel)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            with open(part, "ab") as f:
                http_get(
                    remote.url,
                    f,
                    resume_size=f.tell(),
                    headers=headers,
                    expected_size=remote.size,
                    displayed_filename=remote.filename,
                    tqdm_class=partial(_Bar, sink),  # type: ignore[arg-type]
                )
        except BaseException as e:  # handed over to the generator thread
            failure.append(e)

    thread = threading.Thread(target=work, name=f"longlens-pull-{remote.filename}", daemon=True)
    thread.start()
    last = -1
    try:
        while True:
            thread.join(timeout=0.2)
            if cancel is not None and cancel.cancelled:
                raise JobCancelled("cancelled by the user")
            done = done_before + sink.done
            if done != last:
                last = done
                yield meter.report(done, f"downloading {remote.filename}")
            if not thread.is_alive():
                break
    finally:
        # On cancel, or when the caller abandons the job: stop the thread before anyone else may
        # open the same .part file (it notices at its next chunk or network timeout).
        sink.stop.set()
        thread.join(timeout=15)

    if failure:
        e = failure[0]
        if isinstance(e, JobCancelled):
            raise e
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            size = part.stat().st_size if part.exists() else 0
            if remote.size is not None and size > remote.size:
                part.unlink(missing_ok=True)
            raise OfflineError(
                f"the download of {remote.filename} ended early ({size} of {remote.size} bytes); "
                f"run `longlens models pull {spec.name}` again to continue it"
            ) from e
        mapped = _hub_error(e, endpoint, spec, remote.filename)  # type: ignore[arg-type]
        if isinstance(mapped, OfflineError):
            size = part.stat().st_size if part.exists() else 0
            raise OfflineError(
                f"{mapped} The partial download ({size} bytes of {remote.filename}) is kept; pull "
                "again to continue it."
            ) from e
        if mapped is e:
            raise e
        raise mapped from e


def _convert_backend_checkpoint(spec: ModelSpec, cached: Path, found: FileDigests, staging: Path,
                                cancel: CancelToken | None) -> Generator[Progress, None, dict[str, dict[str, Any]]]:
    """Turn a downloaded checkpoint in the backend's own format into the model folder's files,
    inside `staging`; returns their manifest entries. The backend's converter checks the file
    against the SHA-256 it matched at download once more, on the descriptor it unpickles from."""
    from engine.models.registry import get_backend

    convert = get_backend(spec.backend).convert_checkpoint
    if convert is None:
        raise ModelError(f"{spec.name}: the {spec.backend} backend cannot convert {cached.name}")
    yield Progress("convert", 0, None, f"converting {cached.name} into a {spec.backend} model folder")
    out = staging / ".converted"
    folder = Path((yield from convert(cached, out, sha256=found.sha256, size=found.size, cancel=cancel)))
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(folder.iterdir()):
        if not p.is_file() or p.is_symlink():
            raise ModelIntegrityError(f"converting {cached.name} left {p.name}, which is not a plain file")
        os.replace(p, staging / p.name)
        files[p.name] = {"sha256": sha256_file(staging / p.name), "size": (staging / p.name).stat().st_size}
    folder.rmdir()
    return files


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link when possible (no second copy of a 1 GB file), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _prune_empty_parents(d: Path, *, stop: Path) -> None:
    while d != stop and stop in d.parents:
        try:
            d.rmdir()
        except OSError:
            return
        d = d.parent


def _convert_pickle_to_safetensors(src: Path, dst: Path) -> None:
    """Load pinned .bin weights without executing pickle code and write them as safetensors."""
    import pickle

    import torch
    from safetensors.torch import save_file

    try:
        obj = torch.load(src, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, AttributeError, TypeError) as e:
        raise ModelIntegrityError(
            f"{src.name} is not a plain weights file (torch.load with weights_only=True refused it): {e}"
        ) from None
    if not isinstance(obj, dict) or not obj:
        raise ModelIntegrityError(f"{src.name} does not hold a state dict of tensors")
    tensors: dict[str, Any] = {}
    seen_storages: set[int] = set()
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ModelIntegrityError(f"{src.name} holds a non-tensor entry {key!r}; not a plain state dict")
        t = value.detach().contiguous()
        # safetensors refuses tensors that share memory (tied weights); give each its own copy.
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen_storages:
            t = t.clone()
        seen_storages.add(t.untyped_storage().data_ptr())
        tensors[key] = t
    tmp = dst.with_name(dst.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, dst)
