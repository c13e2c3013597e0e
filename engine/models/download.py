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

Why not huggingface_hub's downloads (`hf_hub_download`, `http_get`): they run each request inside
one blocking call that neither a cancel nor a size bound can reach, make requests a pinned pull does
not need, and keep state in the user's own hub cache; an interrupted 900 MB download restarts from
zero. The pull speaks the hub's /resolve protocol itself over httpx2 (see "pull" below): one GET per
pinned file, bounded by its pinned or announced size, with a stall limit and a cancel that stops it
mid-request; partial files stay under paths.cache, so a second pull continues where the first stopped.
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
from urllib.parse import quote

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
#
# The network side of a pull is ours, on httpx2 (the HTTP client huggingface_hub itself is built on,
# so no new dependency), not huggingface_hub's download functions. Why: those functions run a whole
# request (HEAD with its own timeouts and retries, then a GET that writes whatever body arrives and
# checks its length only at the end) inside one blocking call, so neither a body longer than
# announced, nor a server that stops sending, nor Ctrl+C could stop them; and a pull of pinned
# files needs nothing else they do (metadata requests, the user's hub cache, telemetry). Here:
#
# * one GET per file at the pinned revision (a Range GET to continue a partial file), nothing else;
# * every body is bounded before its first byte is written, by the file's pinned size where the
#   registry knows it, else by the size the hub announces (X-Linked-Size, Content-Length /
#   Content-Range); sizes that disagree, or no size at all, are refused before anything is read,
#   and a body that goes on past its bound is cut there and deleted;
# * every socket read has a deadline (`stall_s`): a server that sends nothing for that long ends
#   the pull with a clear error and the partial file kept for the next pull;
# * the requests run in a worker thread; the job's own thread only waits in short slices, so a
#   cancel (the CLI's first Ctrl+C) ends the pull within a fraction of a second even mid-request:
#   the worker's socket is shut down, and a write lock guarantees it writes nothing afterwards;
# * nothing is written outside paths.cache / paths.models (no hub client cache, no telemetry).

DEFAULT_HUB = "https://huggingface.co"
#: Seconds without a byte from the hub before a pull gives up on that request (resumable).
DEFAULT_STALL_S = 30.0
_POLL_S = 0.05  # how often the job's thread looks at the cancel token while a request runs
_MAX_REDIRECTS = 5  # the hub redirects LFS files to its CDN: one hop, sometimes two
_MAX_FRUITLESS_RESUMES = 3  # reconnects in a row that brought no byte before a pull gives up
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: The hub keeps files over 10 MB in Git LFS; a file pinned by its git blob id is git-tracked, so its
#: content is no larger than this, whatever an answer announces.
GIT_TRACKED_MAX = 10 * 1024 * 1024


@dataclass
class _Remote:
    """One file's open GET: the response (body not read yet) and what the hub said about it."""

    filename: str
    size: int  # the whole file's size: pinned, or as the hub announced it
    offset: int  # where this response's body starts in the file (a resumed .part's length)
    response: Any  # httpx2.Response, streamed


def _is_offline_env() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _offline(endpoint: str, name: str, why: str) -> OfflineError:
    return OfflineError(
        f"cannot reach the model hub at {endpoint} ({why}). Without network, copy the model folder "
        f"from another machine and use `longlens models import DIR --name {name}`."
    )


def pinned_size(spec: ModelSpec, filename: str) -> int | None:
    """The exact size the registry pins for one of spec's files, or None where it pins only a hash.
    A size belongs to its hash: it is used only when the spec pins that very SHA-256."""
    from engine.models.registry import OPENAI_LAYOUT_CHECKPOINTS

    pin = spec.pin(filename)
    if pin is None or pin.kind != "sha256":
        return None
    for checkpoint in OPENAI_LAYOUT_CHECKPOINTS.values():
        if checkpoint.filename == filename and checkpoint.sha256 == pin.digest:
            return checkpoint.size
    return None


class _Overlong(Exception):
    """A body went on past its bound (the caller deletes what was written and refuses the file)."""

    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received


class _Stalled(Exception):
    pass


class _HubConnection:
    """The HTTP side of one pull: a client, the responses it has open, and the worker thread that
    runs each blocking step while the job's thread keeps watch (see the comment above)."""

    def __init__(self, spec: ModelSpec, endpoint: str, cancel: CancelToken | None, stall_s: float) -> None:
        import httpx2

        self.spec = spec
        self.endpoint = endpoint
        self.stall_s = stall_s
        self._cancel = cancel
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # held by each write; abort() takes it to end them for good
        self._open: set[Any] = set()
        self._open_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.progress = 0  # bytes the current body read has written (read by the job's thread)
        # No token (public models only), no compression (byte ranges count file bytes), no cookies
        # kept; proxies and CA settings from the environment as any client would honour them.
        self.client = httpx2.Client(
            headers={"User-Agent": f"longlens/{_longlens_version()}", "Accept-Encoding": "identity"},
            timeout=httpx2.Timeout(stall_s),
            follow_redirects=False,
            trust_env=True,
        )

    # -- running blocking steps where a cancel can reach them --------------------------------

    def run(self, step: Any, tick: Any = None) -> Generator[Progress, None, Any]:
        """Run step() in the worker thread; yield tick() (a Progress or None) every few hundredths
        of a second meanwhile; return its result or raise its error. A cancel aborts the step and
        raises JobCancelled at once, whatever the step is blocked in."""
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = step()
            except BaseException as e:  # handed over to the job's thread
                box["error"] = e

        worker = threading.Thread(target=work, name=f"longlens-pull-{self.spec.name}", daemon=True)
        self._worker = worker
        worker.start()
        while True:
            worker.join(_POLL_S)
            if self._cancel is not None and self._cancel.cancelled:
                self.abort()
                raise JobCancelled("cancelled by the user")
            if not worker.is_alive():
                break
            report = tick() if tick is not None else None
            if report is not None:
                yield report
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def abort(self) -> None:
        """Stop the worker: after this returns it writes no byte, and a blocked read wakes up."""
        with self._write_lock:
            self._stop.set()
        with self._open_lock:
            responses = list(self._open)
        for response in responses:
            _shutdown(response)

    def close(self) -> None:
        self.abort()
        worker = self._worker
        if worker is not None and worker.is_alive():
            worker.join(0.5)  # its socket was shut down: it ends now; if not, leave it (a daemon)
            if worker.is_alive():
                return  # closing the pool under a thread still inside it could block; it cannot write
        with self._open_lock:
            responses, self._open = list(self._open), set()
        for response in responses:
            response.close()
        self.client.close()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise JobCancelled("cancelled by the user")

    # -- the steps (run in the worker) ------------------------------------------------------

    def open(self, filename: str, offset: int) -> _Remote:
        """GET one pinned file (from `offset` on with a Range), follow the hub's redirects, check
        its answer and the size it announces; the body is left unread."""
        import httpx2

        url = f"{self.endpoint}/{self.spec.repo_id}/resolve/{self.spec.revision}/{quote(filename)}"
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        hub = httpx2.URL(self.endpoint)
        commit: str | None = None
        linked: int | None = None
        for _ in range(_MAX_REDIRECTS + 1):
            self._check_stop()
            response = self.client.send(self.client.build_request("GET", url, headers=headers), stream=True)
            with self._open_lock:
                self._open.add(response)
            from_hub = (response.url.scheme, response.url.host, response.url.port) == (hub.scheme, hub.host, hub.port)
            if from_hub:  # what the hub itself says; a CDN it redirects to has no say in it
                commit = commit or response.headers.get("X-Repo-Commit")
                linked = linked if linked is not None else _int_header(response, "X-Linked-Size")
            if response.status_code in _REDIRECTS and "Location" in response.headers:
                self.discard(response)
                url = str(response.url.join(response.headers["Location"]))
                continue
            break
        else:
            self.discard(response)
            raise _offline(self.endpoint, self.spec.name, f"more than {_MAX_REDIRECTS} redirects for {filename}")
        try:
            return self._check_answer(response, filename, offset, commit, linked)
        except BaseException:
            self.discard(response)
            raise

    def _check_answer(self, response: Any, filename: str, offset: int, commit: str | None,
                      linked: int | None) -> _Remote:
        spec, status = self.spec, response.status_code
        if status == 416 and offset:
            # The part is as long as the file or longer: not something to continue.
            raise _RangeRefused()
        if status not in (200, 206):
            raise self._status_error(response, filename)
        if commit is None:
            # A proxy or captive portal answering in the hub's place: nothing it serves can be trusted.
            raise _offline(self.endpoint, spec.name, f"the answer for {filename} lacks the hub's X-Repo-Commit header")
        if commit != spec.revision:
            raise ModelIntegrityError(f"the hub served {filename} from commit {commit}, not the pinned {spec.revision}")
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise ModelIntegrityError(f"the hub sent {filename} encoded as {encoding!r} although Longlens asked for "
                                      "the bytes themselves; nothing was written")
        length = _int_header(response, "Content-Length")
        whole: int | None
        if status == 206:
            match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", response.headers.get("Content-Range", "").strip())
            if match is None or int(match[1]) != offset:
                raise ModelIntegrityError(f"the hub answered the request to continue {filename} at byte {offset} "
                                          f"with another range ({response.headers.get('Content-Range')!r})")
            whole = None if match[3] == "*" else int(match[3])
            if length is not None:
                whole = _agree(filename, whole, offset + length, "Content-Range", "Content-Length")
        else:
            offset = 0  # the whole file, whatever was asked: the part starts again
            whole = length
        whole = _agree(filename, whole, linked, "Content-Length", "X-Linked-Size")
        pinned = pinned_size(spec, filename)
        if pinned is not None and whole is not None and whole != pinned:
            raise ModelIntegrityError(
                f"the hub announces {whole} bytes for {filename} of {spec.name}, but its pin is for a file of "
                f"{pinned} bytes; nothing was downloaded")
        size = pinned if pinned is not None else whole
        if size is None:
            raise ModelIntegrityError(
                f"the hub did not say how large {filename} of {spec.name} is (no Content-Length), and its pin "
                "names no size; Longlens downloads only files whose size it knows, so that no answer can fill "
                "the disk. Nothing was downloaded")
        pin = spec.pin(filename)
        if pin is not None and pin.kind == "git-blob" and size > GIT_TRACKED_MAX:
            raise ModelIntegrityError(
                f"the hub announces {size} bytes for {filename} of {spec.name}, which is pinned by its git blob id: "
                f"a git-tracked file, which the hub keeps under {human_size(GIT_TRACKED_MAX)}; nothing was downloaded")
        if offset > size:
            raise _RangeRefused()
        return _Remote(filename, size, offset, response)

    def _status_error(self, response: Any, filename: str) -> Exception:
        spec, status = self.spec, response.status_code
        code = response.headers.get("X-Error-Code", "")
        if status in (429,) or status >= 500:
            return _offline(self.endpoint, spec.name, f"the hub answered HTTP {status}")
        if code == "RevisionNotFound":
            return ModelError(f"the hub has no revision {spec.revision} of {spec.repo_id}")
        if code == "EntryNotFound":
            return ModelError(f"the hub has no {filename} in {spec.repo_id} at {spec.revision}")
        if code in ("RepoNotFound", "GatedRepo") or status in (401, 403):
            return ModelError(f"the hub refused access to {spec.repo_id} (HTTP {status}{', ' + code if code else ''})")
        return ModelError(f"the hub refused {filename} of {spec.repo_id} (HTTP {status}{', ' + code if code else ''})")

    def read_body(self, remote: _Remote, part: Path) -> int:
        """Write remote's body into `part` from remote.offset on, never past remote.size; returns the
        part's length. Raises _Overlong when the body goes on past the file's size, _Stalled when no
        byte came for stall_s, httpx2's errors (or EOFError) when the connection ended early."""
        import httpx2

        response, written = remote.response, remote.offset
        self.progress = written
        try:
            # Unbuffered: every byte counted is in the file, so what a stop keeps is what it reports.
            with open(part, "r+b" if part.exists() else "wb", buffering=0) as f:
                f.seek(written)
                f.truncate()
                try:
                    for chunk in response.iter_raw():
                        if written + len(chunk) > remote.size:
                            raise _Overlong(written + len(chunk))
                        with self._write_lock:
                            self._check_stop()
                            f.write(chunk)
                        written += len(chunk)
                        self.progress = written
                except httpx2.TimeoutException:
                    raise _Stalled() from None
                os.fsync(f.fileno())
        finally:
            self.discard(response)
        if written < remote.size:
            raise EOFError(f"the connection ended after {written} of {remote.size} bytes")
        return written

    def discard(self, response: Any) -> None:
        with self._open_lock:
            self._open.discard(response)
        response.close()


class _RangeRefused(Exception):
    """The hub cannot continue the partial file (it is as long as the file, or longer)."""


def _shutdown(response: Any) -> None:
    """Wake a thread blocked reading `response` (shutdown, unlike close, interrupts a recv)."""
    import socket

    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


def _int_header(response: Any, name: str) -> int | None:
    value = response.headers.get(name)
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ModelIntegrityError(f"the hub sent a malformed {name} header ({value!r}); nothing was downloaded")
    return int(value)


def _agree(filename: str, a: int | None, b: int | None, a_name: str, b_name: str) -> int | None:
    if a is not None and b is not None and a != b:
        raise ModelIntegrityError(f"the hub's sizes for {filename} disagree ({a_name} says {a} bytes, {b_name} "
                                  f"{b}); nothing was downloaded")
    return a if a is not None else b


def pull_model(
    spec_or_name: ModelSpec | str,
    paths: Paths,
    *,
    cancel: CancelToken | None = None,
    trust_unpinned: bool = False,
    endpoint: str | None = None,
    stall_s: float = DEFAULT_STALL_S,
) -> Generator[Progress, None, Path]:
    """Download, verify and install a registered model. A job: yields Progress, returns the folder.

    Every file is checked against its pin (engine/models/pins.py) before anything is installed; a
    spec whose files are all pinned needs no `trust_unpinned`. Partial downloads are kept under
    paths.cache, so a pull that was interrupted continues where it stopped. Download reports carry
    the total size, the rate of this pull and the time left.

    `endpoint` defaults to $HF_ENDPOINT (read at call time) or huggingface.co. `stall_s` is how long
    a request may go without a byte from the hub (connecting, waiting for an answer, or in a body)
    before the pull stops with the partial file kept; a cancel stops it within a tenth of a second.
    The hub is asked for the spec's files at its pinned revision and for nothing else.
    """
    spec = spec_or_name if isinstance(spec_or_name, ModelSpec) else get_spec(spec_or_name)
    name = spec.name
    _check_pullable(spec)
    _check_pull_files(spec, trust_unpinned)
    if not stall_s > 0:
        raise ModelError(f"the stall limit of a pull must be a positive number of seconds, not {stall_s!r}")
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_HUB).rstrip("/")

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

    cache_dir = download_cache_dir(spec, paths)
    cache_dir.mkdir(parents=True, exist_ok=True)

    # 1. Files a previous pull finished are kept if they still match their pins (an unpinned one was
    #    renamed from its .part only once complete); partial ones resume.
    digests: dict[str, FileDigests] = {}
    for fname in spec.files:
        _check_cancel(cancel)
        cached = cache_dir.joinpath(*fname.split("/"))
        if cached.is_file():
            found = hash_file(cached)
            pin = spec.pin(fname)
            if found.matches(pin) if pin is not None else pinned_size(spec, fname) in (None, found.size):
                digests[fname] = found
            else:
                cached.unlink()
    done_before = sum(d.size for d in digests.values())

    hub = _HubConnection(spec, endpoint, cancel, stall_s)
    try:
        # 2. One GET per missing file (a Range GET for a partial one): its answer says the size; the
        #    bodies are read in step 3, smallest first, so a big file's connection waits the least.
        remotes: list[_Remote] = []
        missing = [f for f in spec.files if f not in digests]
        for i, fname in enumerate(missing):
            yield Progress("resolve", i, len(missing), f"looking up {fname}")
            part = _part_path(cache_dir.joinpath(*fname.split("/")))
            remotes.append((yield from _open_resumable(hub, fname, part, stall_s)))
        total = done_before + sum(r.size for r in remotes)
        present = done_before + sum(r.offset for r in remotes)
        free = shutil.disk_usage(cache_dir).free
        if total - present > free:
            raise ModelError(
                f"{name} needs {human_size(total - present)} more in {paths.cache}, and only {human_size(free)} "
                "is free there; nothing more was downloaded. Free some space and pull again.")
        meter = _Meter(total, present=present)
        sizes = meter.report(present, _size_summary(name, len(spec.files), total, present))
        sizes.extra["sizes"] = {"files": len(spec.files), "total": total, "present": present}
        yield sizes

        # 3. Read the bodies into the cache (continuing partial files), checking each against its pin.
        for remote in sorted(remotes, key=lambda r: r.size - r.offset):
            _check_cancel(cancel)
            fname = remote.filename
            cached = cache_dir.joinpath(*fname.split("/"))
            part = _part_path(cached)
            yield from _fetch_body(hub, remote, part, spec, meter, done_before)
            # Still the download stage: one bar (and one line in the GUI) runs from the first byte to the last check.
            yield meter.report(done_before + remote.size, f"checking {fname}")
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
    finally:
        hub.close()

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


def download_cache_dir(spec: ModelSpec, paths: Paths) -> Path:
    """Where a pull of `spec` keeps its downloads (finished files and .part files) until installed."""
    return paths.cache / "downloads" / str(spec.repo_id).replace("/", "--") / str(spec.revision)


def kept_download_bytes(name: str, paths: Paths) -> int:
    """Bytes an interrupted pull of `name` left for the next one to continue from (0: none)."""
    try:
        folder = download_cache_dir(get_spec(name), paths)
    except ModelError:
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def _part_path(cached: Path) -> Path:
    return cached.with_name(cached.name + ".part")


def _open_resumable(hub: _HubConnection, fname: str, part: Path, stall_s: float) -> Generator[Progress, None, _Remote]:
    """The open GET for one file, continuing its .part where there is one (a part the hub cannot
    continue, being as long as the file or longer, is dropped and the file asked for whole)."""
    import httpx2

    part.parent.mkdir(parents=True, exist_ok=True)
    offset = part.stat().st_size if part.is_file() else 0
    try:
        try:
            return (yield from hub.run(partial(hub.open, fname, offset)))
        except _RangeRefused:
            part.unlink(missing_ok=True)
            return (yield from hub.run(partial(hub.open, fname, 0)))
    except httpx2.TimeoutException:
        raise _stalled_error(hub, fname, part, stall_s, waiting=True) from None
    except httpx2.TransportError as e:
        raise _kept(_offline(hub.endpoint, hub.spec.name, f"{type(e).__name__}: {e}"), fname, part) from None
    except OfflineError as e:
        raise _kept(e, fname, part) from None


def _fetch_body(hub: _HubConnection, remote: _Remote, part: Path, spec: ModelSpec, meter: _Meter,
                done_before: int) -> Iterator[Progress]:
    """Read one file's body into its .part, reconnecting with a Range GET when the connection drops
    (until reconnecting brings no byte several times in a row); yields byte progress."""
    import httpx2

    fname = remote.filename
    last: list[int] = [-1]

    def tick() -> Progress | None:
        done = done_before + hub.progress
        if done == last[0]:
            return None
        last[0] = done
        return meter.report(done, f"downloading {fname}")

    fruitless = 0
    while True:
        before = remote.offset
        hub.progress = before
        try:
            yield from hub.run(partial(hub.read_body, remote, part), tick)
            return
        except _Overlong as e:
            part.unlink(missing_ok=True)
            raise ModelIntegrityError(
                f"the hub sent more than the {remote.size} bytes of {fname} ({spec.name}) that it announced "
                f"(or that its pin names): the download was stopped at {e.received} bytes received and deleted, "
                "and nothing was installed."
            ) from None
        except _Stalled:
            raise _stalled_error(hub, fname, part, hub.stall_s, waiting=False) from None
        except (httpx2.TransportError, EOFError) as e:
            got = part.stat().st_size if part.is_file() else 0
            fruitless = 0 if got > before else fruitless + 1
            if fruitless >= _MAX_FRUITLESS_RESUMES:
                why = f"the connection kept ending early ({type(e).__name__}: {e})"
                raise _kept(_offline(hub.endpoint, spec.name, why), fname, part) from None
        remote = yield from _open_resumable(hub, fname, part, hub.stall_s)


def _kept(e: OfflineError, fname: str, part: Path) -> OfflineError:
    """`e`, saying that the partial file is kept for the next pull (when there is one)."""
    size = part.stat().st_size if part.is_file() else 0
    if not size:
        return e
    return OfflineError(f"{e} The partial download ({size} bytes of {fname}) is kept; pull again to continue it.")


def _stalled_error(hub: _HubConnection, fname: str, part: Path, stall_s: float, *, waiting: bool) -> OfflineError:
    size = part.stat().st_size if part.is_file() else 0
    what = "did not answer the request for" if waiting else "stopped sending"
    kept = (f"The partial download ({size} bytes) is kept; pull again to continue it."
            if size else "Pull again to retry.")
    return OfflineError(f"the model hub at {hub.endpoint} {what} {fname} of {hub.spec.name}: no data for "
                        f"{stall_s:g} seconds. {kept}")


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
