"""Prompt templates for the caption pipeline: plain text files with `{slot}` placeholders.

The defaults live in engine/datagen/prompts/*.txt (shipped as package data). `--prompts DIR`
replaces any of them: a file of the same name in DIR wins, the others keep their default, so a
user can change one prompt without copying all of them.

Only the slots listed in SLOTS are filled; any other brace text is left alone, so a template may
contain JSON examples or literal braces without escaping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from engine.errors import LonglensError

TEMPLATE_NAMES = ("system", "caption_section", "positives", "negatives", "paragraph", "score")
SLOTS: dict[str, frozenset[str]] = {
    "system": frozenset({"caption_section"}),
    "caption_section": frozenset({"original_caption"}),
    "positives": frozenset({"count"}),
    "negatives": frozenset({"count"}),
    "paragraph": frozenset({"min_sentences", "max_sentences"}),
    "score": frozenset({"paragraph"}),
}
# A scoring prompt without the paragraph would score nothing; the rest degrade gracefully.
REQUIRED_SLOTS: dict[str, frozenset[str]] = {"score": frozenset({"paragraph"})}
_SLOT = re.compile(r"\{([a-z_]+)\}")


class PromptError(LonglensError):
    """A prompt template file is unreadable or lacks a slot it needs."""


def _fill(template: str, values: dict[str, str]) -> str:
    return _SLOT.sub(lambda m: values.get(m.group(1), m.group(0)), template)


@dataclass(frozen=True)
class Prompts:
    templates: dict[str, str]
    sources: dict[str, str]  # template name -> file it came from, for messages

    def system(self, original_caption: str | None) -> str:
        section = ""
        if original_caption:
            section = _fill(self.templates["caption_section"], {"original_caption": original_caption}).strip()
        text = _fill(self.templates["system"], {"caption_section": section})
        # An empty caption section would leave a blank line in the middle of the prompt.
        return re.sub(r"\n{3,}", "\n\n", text).strip()

    def positives(self, count: int) -> str:
        return _fill(self.templates["positives"], {"count": str(count)}).strip()

    def negatives(self, count: int) -> str:
        return _fill(self.templates["negatives"], {"count": str(count)}).strip()

    def paragraph(self, min_sentences: int, max_sentences: int) -> str:
        return _fill(self.templates["paragraph"],
                     {"min_sentences": str(min_sentences), "max_sentences": str(max_sentences)}).strip()

    def score(self, paragraph: str) -> str:
        return _fill(self.templates["score"], {"paragraph": paragraph}).strip()


def default_prompt_dir() -> Path:
    return Path(str(resources.files("engine.datagen") / "prompts"))


def _read(path: Path) -> str:
    from engine.fileutil import FileTooLargeError, read_user_text
    from engine.limits import MAX_SMALL_JSON_BYTES

    try:
        # Never blocks on a FIFO or device; a template is a few kB (bounded like the small JSON files).
        return read_user_text(path, encoding="utf-8-sig", max_bytes=MAX_SMALL_JSON_BYTES)
    except FileTooLargeError as exc:
        raise PromptError(f"prompt template {path} is too large ({exc.size:,} bytes; the limit is {exc.limit:,})") from None
    except UnicodeDecodeError as exc:
        raise PromptError(f"prompt template {path} is not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise PromptError(f"cannot read prompt template {path}: {exc.strerror or exc}") from None


def load_prompts(override_dir: Path | str | None = None) -> Prompts:
    """The default templates, each replaced by `override_dir/NAME.txt` when that file exists."""
    templates: dict[str, str] = {}
    sources: dict[str, str] = {}
    if override_dir is not None:
        override_dir = Path(override_dir)
        if not override_dir.is_dir():
            raise PromptError(f"the prompts folder {override_dir} is not a folder", settings=("prompts_dir",))
        known = {f"{n}.txt" for n in TEMPLATE_NAMES}
        strays = sorted(p.name for p in override_dir.glob("*.txt") if p.name not in known)
        if strays:
            raise PromptError(f"{override_dir}: unknown prompt file(s) {', '.join(strays)}; "
                              f"the templates are {', '.join(sorted(known))}")
    for name in TEMPLATE_NAMES:
        path = default_prompt_dir() / f"{name}.txt"
        if override_dir is not None and (override_dir / f"{name}.txt").is_file():
            path = override_dir / f"{name}.txt"
        text = _read(path)
        if name != "caption_section" and not text.strip():
            raise PromptError(f"prompt template {path} is empty")
        used = set(_SLOT.findall(text))
        missing = REQUIRED_SLOTS.get(name, frozenset()) - used
        if missing:
            raise PromptError(f"prompt template {path} must contain {', '.join('{' + m + '}' for m in sorted(missing))}")
        templates[name] = text
        sources[name] = str(path)
    return Prompts(templates, sources)
