"""Is a query in a language the model was trained on? A light check, no model and no download.

Every model Longlens runs was trained on English descriptions; a German paragraph still gets
results, confident and unrelated (each word becomes sub-word pieces the model never learned to
combine). This module says when a query is clearly not English so the user can be told.

Method: the script of the letters (Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, Hangul,
kana, Han) names the language group at once; for Latin script, the share of each language's
most common function words (articles, prepositions, pronouns, conjunctions, auxiliaries). Why
not a language identifier (py3langid, lingua, fastText): the question is only "English or not"
for descriptions of a few words to a few paragraphs, where function words decide it reliably,
and the answer must be the same on every machine, cost microseconds and add no dependency.
Words two lists share with English ("in", "a", "die", "an") are left out of the other lists, so
an English query with a foreign name ("Schloss Neuschwanstein at dusk with a lake") stays English.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# The languages the models were trained on when an embedder does not say (`query_languages`).
DEFAULT_MODEL_LANGUAGES: tuple[str, ...] = ("en",)

LANGUAGE_NAMES = {
    "en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "nl": "Dutch",
    "pt": "Portuguese", "sv": "Swedish", "da": "Danish", "pl": "Polish", "tr": "Turkish",
    "ru": "Russian or another Cyrillic-script language", "el": "Greek", "ar": "Arabic", "he": "Hebrew",
    "hi": "Hindi or another Devanagari-script language", "th": "Thai", "ko": "Korean", "ja": "Japanese",
    "zh": "Chinese",
}

_EN = frozenset(
    "a an the and or but of in on at to from with without by for into onto over under above below behind "
    "beside between near next is are was were be been it its this that these those there here his her their "
    "they he she we you i my your our who which what where while as than then some two three very also not "
    "no has have had can one all each both small large left right front back up down out off".split()
)
_STOP_WORDS: dict[str, frozenset[str]] = {
    "de": frozenset(
        "der die das den dem des ein eine einer einem einen eines und oder aber mit ohne auf im ist sind "
        "war waren wird werden zu zum zur von vom bei neben unter über vor hinter zwischen nicht auch sich "
        "es er sie wir ich du ihr sein seine ihre dieser diese dieses sehr noch schon nur liegt steht sitzt "
        "hängt gibt links rechts oben unten daneben dahinter davor darauf kein keine einem".split()
    ),
    "fr": frozenset(
        "le la les un une des du de et ou mais avec sans sur sous dans est sont était il elle ils elles nous "
        "vous je ce cette ces son sa ses leur leurs très aussi ne pas qui que au aux entre devant derrière "
        "près côté gauche droite se trouve il y".split()
    ),
    "es": frozenset(
        "el la los las un una unos unas y o pero con sin sobre bajo en es son está están hay del al de que "
        "se su sus este esta estos estas muy también no entre delante detrás junto lado izquierda derecha "
        "encima debajo".split()
    ),
    "it": frozenset(
        "il lo la gli le un una uno e o ma con senza su sotto nel nella nei sulle sul è sono c'è ci del della "
        "dei di da che si suo sua suoi questo questa molto anche non tra fra davanti dietro accanto sinistra "
        "destra sopra".split()
    ),
    "nl": frozenset(
        "de het een en of maar met zonder op onder boven naast achter voor tussen is zijn was waren er "
        "niet ook zich hij zij wij ik dit deze dat die van bij aan ligt staat zit hangt links rechts erg "
        "heel geen".split()
    ),
    "pt": frozenset(
        "o os a as um uma uns umas e ou mas com sem sobre sob em no na nos nas é são está estão há do da "
        "dos das de que se seu sua muito também não entre frente atrás junto lado esquerda direita".split()
    ),
    "sv": frozenset(
        "en ett och eller men med utan på under över bakom framför mellan är var det den de som inte också "
        "sig han hon vi jag av till från vid ligger står sitter vänster höger".split()
    ),
    "da": frozenset(
        "en et og eller men med uden på under over bag foran mellem er var det den de som ikke også sig "
        "han hun vi jeg af til fra ved ligger står sidder venstre højre".split()
    ),
    "pl": frozenset(
        "i w na z ze do od po pod nad przed za między jest są był była to ten ta te nie się jak oraz lub "
        "ale bardzo obok lewej prawej".split()
    ),
    "tr": frozenset(
        "bir ve ile bu şu o da de ama için gibi çok daha en üstünde altında yanında önünde arkasında "
        "var yok değil ise".split()
    ),
}
# Only the words that tell a language from English.
_FOREIGN: dict[str, frozenset[str]] = {code: words - _EN for code, words in _STOP_WORDS.items()}

_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")
# Script prefixes of unicodedata names -> the language (group) the script says.
_SCRIPTS = (("HIRAGANA", "ja"), ("KATAKANA", "ja"), ("HANGUL", "ko"), ("CJK", "zh"), ("CYRILLIC", "ru"),
            ("GREEK", "el"), ("ARABIC", "ar"), ("HEBREW", "he"), ("DEVANAGARI", "hi"), ("THAI", "th"))
# Fewer Latin words than this and a guess is not made ("Strand", "Hund im Schnee" say too little).
MIN_WORDS = 5
# A language's function words must be at least this share of the words, and more than twice
# as many as English ones.
MIN_SHARE = 0.15


@dataclass(frozen=True)
class LanguageGuess:
    code: str  # ISO 639-1, "en" for English
    name: str
    #: Function words of the guessed language (Latin script), or letters of its script.
    evidence: int
    words: int


def _script_of(ch: str) -> str | None:
    name = unicodedata.name(ch, "")
    for prefix, code in _SCRIPTS:
        if name.startswith(prefix):
            return code
    return None


def guess_language(text: str) -> LanguageGuess | None:
    """The language `text` is clearly written in, or None when it cannot tell (too short, mixed,
    no letters). English comes out as code "en"."""
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return None
    scripts: dict[str, int] = {}
    for ch in letters:
        code = _script_of(ch)
        if code is not None:
            scripts[code] = scripts.get(code, 0) + 1
    non_latin = sum(scripts.values())
    if non_latin * 2 > len(letters):
        # Kana anywhere means Japanese (its text mixes kana with Han characters).
        code = "ja" if scripts.get("ja") else max(scripts, key=scripts.__getitem__)
        return LanguageGuess(code, LANGUAGE_NAMES[code], non_latin, len(letters))
    words = [w.lower().replace("’", "'") for w in _WORD.findall(text)]
    if len(words) < MIN_WORDS:
        return None
    english = sum(w in _EN for w in words)
    counts = {code: sum(w in vocab for w in words) for code, vocab in _FOREIGN.items()}
    best = max(counts, key=counts.__getitem__)
    if counts[best] >= 2 and counts[best] >= MIN_SHARE * len(words) and counts[best] > 2 * english:
        return LanguageGuess(best, LANGUAGE_NAMES[best], counts[best], len(words))
    if english >= 2 and english >= MIN_SHARE * len(words):
        return LanguageGuess("en", LANGUAGE_NAMES["en"], english, len(words))
    return None


def language_warning(text: str, model_id: str, model_languages: tuple[str, ...] = DEFAULT_MODEL_LANGUAGES
                     ) -> str | None:
    """What to tell the user when the query is clearly in a language the model was not trained
    on (None when it is, or when the query says too little to tell)."""
    guess = guess_language(text)
    if guess is None or guess.code in model_languages:
        return None
    trained = " and ".join(LANGUAGE_NAMES.get(c, c) for c in model_languages)
    return (f"the query looks {guess.name}, but the model {model_id!r} was trained on {trained} descriptions "
            f"only: its results for this query may be unrelated. Describe the picture in {trained}.")
