"""Limits on the sizes a user controls in the caption path: text length, sentence count, line
length, line count. One module so that `check`, `ground`, review, training data and datagen
inputs refuse the same things with the same words.

Why these values:

* MAX_CAPTION_CHARS = 20,000. A paragraph caption is a few hundred to ~3,000 characters (the
  SceneWorld paragraphs are 300-900, long human descriptions rarely pass 5,000); 20,000 is
  about 3,500 words, several pages, far past any real caption. Grounding costs memory per
  sentence (measured about 214 KB per sentence with sceneworld-mini, 3.6 GB for a 720 KB
  caption), so an unbounded caption is an unbounded allocation.
* MAX_CAPTION_SENTENCES = 200. At the measured cost that is about 45 MB for one caption; it
  is ten times the longest real paragraphs seen (about 20 sentences). The grounding splitter
  cuts run-on sentences at 400 characters, so a caption at the character limit has at least
  50 sentences: the two limits are consistent.
* MAX_LINE_BYTES = 4 MiB. A line is checked before it is parsed (json.loads of a 2 GB line
  would need several times that in memory). The largest legitimate line is a training line:
  twelve texts (original, 5 positives, 5 negatives, paragraph) at the caption limit, each
  character written as a 6-byte \\uXXXX escape in the worst case, is 1.44 MB plus the path.
* MAX_FILE_LINES = 1,000,000 data lines in one file. Every reader keeps a record per line
  (review items in the catalog, a report line per caption, a training example): past a
  million lines, split the file. The lines after the limit are reported, not read.

A caption over a limit is a problem of its line (reported with the line number and the
reason); the rest of the file is still processed.

Files read whole (JSON, XML, tokenizer files), reliability checklist 33 and 43: each has a size
limit checked before a byte is read and, for JSON and XML, a nesting limit checked before it is
parsed (engine.jsonfile, engine.metadata.xmp). The reader's message names the file and the limit.

* MAX_NESTING_DEPTH = 100 levels of arrays/objects (JSON) or elements (XML). Parsers and the
  walks after them (copy.deepcopy, transformers' config classes, ElementTree's serialiser) recurse
  once or twice per level against Python's limit of 1,000 frames. The deepest real files seen:
  a transformers tokenizer.json 6 (normalizer/pre_tokenizer sequences), config.json 3, a darktable
  or Lightroom sidecar about 12 (history and masks); 100 is several times any of them.
* Per-file sizes (MODEL_FILE_LIMITS, by file name in a model or text-tower folder), several times
  the largest public files of each kind (approximate sizes as huggingface.co lists them; the files
  shipped here are far below): tokenizer.json is the only big JSON (bert 0.7 MB, CLIP 2.2 MB,
  Llama 3 9 MB, Gemma 3 33 MB): 64 MiB. vocab.json/merges.txt/vocab.txt run to a few MB (Qwen2's
  vocab.json 2.8 MB): 16 MiB. A sentencepiece tokenizer.model is at most a few MB: 64 MiB.
  config.json is a few kB; tokenizer_config.json holds chat templates and added-token tables
  (Gemma 3's about 1.2 MB): 4 MiB for both. The small ones
  (preprocessor/processor/generation configs, special_tokens_map.json, a sentence-transformers
  pooling config, Longlens's own lm_tower.json and text_tower.json): 1 MiB, a thousand times
  their real size. model.safetensors.index.json lists every tensor once: 64 MiB.
* MAX_SETTINGS_BYTES = 1 MiB (a settings file is a few hundred bytes). MAX_MANIFEST_BYTES =
  16 MiB (one line per model file: a sharded model has a few hundred). MAX_SMALL_JSON_BYTES =
  1 MiB for every other small file Longlens or a user writes (training and study metadata,
  calibrations, output-folder markers, cluster shard metadata, datagen/review state).
  MAX_REPORT_JSON_BYTES = 64 MiB for the reports Longlens writes and reads back to compare or
  merge (a benchmark run, a study), which hold a row per measurement.
* MAX_DATASET_JSON_BYTES = 1 GiB: evaluation sets are single JSON files (the Karpathy split of
  Flickr30k is 140 MB, COCO's caption annotations 90 MB); parsing needs several times the size in
  memory, so past this a set is refused, not read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.fileutil import open_user_file

MAX_CAPTION_CHARS = 20_000
MAX_CAPTION_SENTENCES = 200
MAX_LINE_BYTES = 4 * 1024 * 1024
MAX_FILE_LINES = 1_000_000

MAX_NESTING_DEPTH = 100

_KIB, _MIB = 1024, 1024 * 1024
MAX_SETTINGS_BYTES = 1 * _MIB
MAX_MANIFEST_BYTES = 16 * _MIB
MAX_SMALL_JSON_BYTES = 1 * _MIB
MAX_DATASET_JSON_BYTES = 1024 * _MIB
MAX_REPORT_JSON_BYTES = 64 * _MIB
MAX_TOKENIZER_JSON_BYTES = 64 * _MIB
MAX_MODEL_CONFIG_BYTES = 4 * _MIB
MAX_WEIGHT_INDEX_BYTES = 64 * _MIB

#: Files of a model or text-tower folder that Longlens or transformers reads whole, by name
#: (any folder level: a tower keeps its tokenizer in tokenizer/), and the most bytes each may hold.
#: Names ending in .json are depth-checked too. Weights are not here: their headers are bounded
#: by engine.models.weights and their data is memory-mapped, never parsed.
MODEL_FILE_LIMITS: dict[str, int] = {
    "config.json": MAX_MODEL_CONFIG_BYTES,
    "tokenizer_config.json": MAX_MODEL_CONFIG_BYTES,
    "added_tokens.json": MAX_MODEL_CONFIG_BYTES,
    "preprocessor_config.json": 1 * _MIB,
    "processor_config.json": 1 * _MIB,
    "generation_config.json": 1 * _MIB,
    "special_tokens_map.json": 1 * _MIB,
    "lm_tower.json": 1 * _MIB,
    "text_tower.json": 1 * _MIB,
    "sceneworld_mini.json": 1 * _MIB,
    "tokenizer.json": MAX_TOKENIZER_JSON_BYTES,
    "model.safetensors.index.json": MAX_WEIGHT_INDEX_BYTES,
    "longlens-manifest.json": MAX_MANIFEST_BYTES,
    "vocab.json": 16 * _MIB,
    "merges.txt": 16 * _MIB,
    "vocab.txt": 16 * _MIB,
    "tokenizer.model": 64 * _MIB,
    # transformers reads a chat template beside a tokenizer when there is one (a decoder LM's folder).
    "chat_template.json": 1 * _MIB,
    "chat_template.jinja": 1 * _MIB,
}


def model_file_limit(name: str) -> int | None:
    """The size limit of a model-folder file called `name` (its last path part), or None when it
    is not one read whole (weights, licences, unknown files)."""
    return MODEL_FILE_LIMITS.get(name.rsplit("/", 1)[-1])


def size_words(n: int) -> str:
    """A byte count as people read it ("1.0 GiB", "64 MiB", "512 bytes")."""
    for unit, size in (("GiB", 1 << 30), ("MiB", _MIB), ("KiB", _KIB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"

_READ_CHUNK = 1 << 20


def count_grounding_sentences(text: str) -> int:
    """Sentences as the grounder splits them (the split whose count drives grounding memory)."""
    from engine.text.sentences import split_sentences

    return len(split_sentences(text))


_SENTENCE_MARKS = ".!?…。！？\n"


def _sentence_bound(text: str) -> int:
    """An upper bound on the sentences of any splitter here: each sentence ends at a mark or a
    line break, and the grounder's cuts of run-on sentences leave pieces of over 100 characters."""
    return sum(text.count(ch) for ch in _SENTENCE_MARKS) + 1 + len(text) // 100


def caption_problem(text: str, count_sentences: Callable[[str], int] | None = None) -> str | None:
    """Why `text` is over a caption limit, or None when it is within them.

    The length is checked first, so the sentence split only ever runs on bounded text.
    `count_sentences` is the caller's splitter (review stores verdicts by its own split);
    by default the grounder's.
    """
    if len(text) > MAX_CAPTION_CHARS:
        return f"the caption is too long ({len(text):,} characters; the limit is {MAX_CAPTION_CHARS:,})"
    if _sentence_bound(text) <= MAX_CAPTION_SENTENCES:
        return None  # cannot be over: the split (about 0.5 µs a character) is not needed
    n = (count_sentences or count_grounding_sentences)(text)
    if n > MAX_CAPTION_SENTENCES:
        return f"the caption has too many sentences ({n:,}; the limit is {MAX_CAPTION_SENTENCES:,})"
    return None


def query_problem(text: str) -> str | None:
    """The same limits for a paragraph given on its own (`ground`), worded for a text."""
    problem = caption_problem(text)
    return None if problem is None else problem.replace("the caption", "the text", 1)


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def line_too_long(n_bytes: int, limit: int) -> str:
    return f"the line is too long ({_mb(n_bytes)}; the limit is {_mb(limit)})"


def too_many_lines(limit: int) -> str:
    return f"the file has more than {limit:,} lines; the lines after that were not read"


@dataclass(frozen=True)
class RawLine:
    """One physical line: its 1-based number and bytes (without the newline), or the reason it
    was not read (too long: its bytes were skipped, never held)."""

    line_no: int
    data: bytes | None
    problem: str | None = None


def iter_raw_lines(path: Path | str, *, on_bytes: Callable[[bytes], None] | None = None,
                   max_line_bytes: int | None = None, max_lines: int | None = None) -> Iterator[RawLine]:
    """The lines of a file, split on b"\\n" only, read in 1 MiB chunks: memory stays bounded by
    `max_line_bytes` whatever the file holds (a 2 GB line is skipped, reported, never held).

    Reads at most the size the file had when it was opened (a file that keeps growing ends).
    Blank lines count for numbering; lines past `max_lines` non-blank ones end the file with
    one problem. `on_bytes` sees every chunk read (e.g. to hash the file in the same pass).
    """
    max_line_bytes = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    max_lines = MAX_FILE_LINES if max_lines is None else max_lines
    # The one safe open of a user's file: a FIFO or device in the file's place raises
    # NotARegularFileError instead of blocking, and reads end at the size seen at open.
    with open_user_file(path) as fh:
        remaining = fh.size
        line_no = 1
        data_lines = 0
        buf = bytearray()
        skipping = 0  # > 0: inside an over-long line, this many bytes of it seen so far
        while True:
            chunk = fh.read(min(_READ_CHUNK, remaining)) if remaining > 0 else b""
            remaining -= len(chunk)
            if on_bytes is not None and chunk:
                on_bytes(chunk)
            pos = 0
            while True:
                nl = chunk.find(b"\n", pos)
                piece = chunk[pos:] if nl < 0 else chunk[pos:nl]
                if skipping:
                    skipping += len(piece)
                elif len(buf) + len(piece) > max_line_bytes:
                    skipping = len(buf) + len(piece)
                    buf = bytearray()
                else:
                    buf += piece
                if nl < 0 and chunk:
                    break
                # End of a line (a newline, or the end of the file).
                at_end = nl < 0
                if at_end and not buf and not skipping:
                    return  # nothing after the last newline
                if skipping or buf.strip():
                    data_lines += 1
                    if data_lines > max_lines:
                        yield RawLine(line_no, None, too_many_lines(max_lines))
                        return
                yield RawLine(line_no, None, line_too_long(skipping, max_line_bytes)) if skipping else RawLine(line_no, bytes(buf))
                buf = bytearray()
                skipping = 0
                if at_end:
                    return
                line_no += 1
                pos = nl + 1


@dataclass(frozen=True)
class TextLine:
    """One line as text with its line break ("\\n" for the last line too), or the reason it
    could not be read (too long, not UTF-8, past the line limit) with text "\\n" standing in,
    so that a CSV reader fed these lines keeps the file's numbering."""

    line_no: int
    text: str
    problem: str | None = None


def iter_text_lines(path: Path | str, *, split_cr: bool = False,
                    on_bytes: Callable[[bytes], None] | None = None) -> Iterator[TextLine]:
    """The UTF-8 lines of a file (a BOM on the first is dropped), read within the limits.

    split_cr=True also breaks at a bare carriage return and numbers the pieces as lines, as
    the csv module does with newline="" (its record line numbers then match these).
    """
    offset = 0
    for raw in iter_raw_lines(path, on_bytes=on_bytes):
        n = raw.line_no + offset
        if raw.data is None:
            yield TextLine(n, "\n", raw.problem)
            continue
        data = raw.data.removeprefix(b"\xef\xbb\xbf") if raw.line_no == 1 else raw.data
        try:
            text = data.decode("utf-8") + "\n"
        except UnicodeDecodeError as exc:
            yield TextLine(n, "\n", f"not UTF-8 text ({exc.reason} at byte {exc.start})")
            continue
        if split_cr and "\r" in text[:-2]:
            pieces = _BARE_CR.split(text)
            for i, piece in enumerate(pieces):
                yield TextLine(n + i, piece)
            offset += len(pieces) - 1
        else:
            yield TextLine(n, text)


_BARE_CR = re.compile(r"(?<=\r)(?!\n)")
