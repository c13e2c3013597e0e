"""Split a paragraph into sentences, then into grounded phrases, with character spans.

Method: rule-based shallow parsing over closed-class word lists. Why rules and not a parser:
a query box gets one paragraph at a time, the output must be deterministic and identical on
every machine, and the engine must work offline from its PyPI dependencies alone. spaCy's
English models are not distributed on PyPI (they come from a separate download), NLTK's
tagger needs a data download as well, and both are far heavier than what is needed here:
descriptions of pictures are mostly noun phrases joined by spatial prepositions and a few
verbs. Closed classes (determiners, prepositions, pronouns, auxiliaries, conjunctions) plus a
list of common verbs mark the boundaries; everything between them is a noun phrase.

What comes out, per sentence:

* noun phrases (kind "noun_phrase") with their modifiers: determiner/number, adjectives,
  the head, and attached post-modifiers ("with stripes", "of blue sea", "that is small and
  plain"). Phrases that only name a position ("the top left") or the picture itself
  ("the picture", "three objects") are not emitted: nothing in the image can support them
  on their own.
* setting phrases (kind "setting"): a noun phrase whose head names where the whole picture is
  ("a beach", "the desert with orange dunes", "a forest", "the night sky"). A setting fills the
  picture's background rather than standing in one place, so grounders give it a background
  map (BaseGrounder), not an object's.
* relation phrases (kind "relation"): spatial/relational words ("to the left of", "next to",
  "under", "holding") standing between two emitted noun phrases of the same sentence, neither
  a setting; their `query` is "<subject> <relation> <object>", the claim a model can check.
  The span is the relation's words ("on", "In"): alone they are function words, so what a
  person is shown for a relation is its claim (`Phrase.claim`), never the bare words. "A cat
  in a room" asserts nothing beyond the cat and the room: a relation to a setting is not emitted.

Spans are character offsets into the text exactly as given. The runtime is linear in the
length of the text; over-long sentences are cut at a comma, semicolon or space so that
every sentence fits a text encoder's budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.grounding.api import Phrase
from engine.text.sentences import ABBREVIATIONS as _ABBREVIATIONS
from engine.text.sentences import MAX_SENTENCE_CHARS, split_sentences

__all__ = ["Chunking", "chunk", "split_sentences", "MAX_SENTENCE_CHARS"]

# Sentences come from engine.text.sentences (the one splitter; re-exported here).

# --------------------------------------------------------------------------- word lists

DETERMINERS = frozenset(
    "a an the this that these those some any each every another no its his her their my your our "
    "both several many few much such either neither".split()
)
NUMBER_WORDS = frozenset(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty hundred dozen dozens hundreds".split()
)
PRONOUNS = frozenset(
    "i me we us you he him she it they them there here who whom whose which what everyone someone "
    "anyone nobody everybody somebody one's it's there's that's here's what's they're we're you're "
    "he's she's".split()
)
RELATIVE = frozenset({"that", "which", "who"})
BE = frozenset("is are was were be been being am 's".split())
AUXILIARIES = BE | frozenset(
    "has have had having do does did can could will would shall should may might must".split()
)
CONJUNCTIONS = frozenset(
    "and or but nor yet so while whereas although though because since if when where then whilst as than "
    "unless until".split()
)
ADVERBS = frozenset(
    "very quite rather really slightly somewhat too also just only even still almost nearly partly "
    "mostly mainly fully up down out away together altogether well not never always often sometimes "
    "all else further farther again perhaps maybe probably clearly".split()
)
PREPOSITIONS = frozenset(
    "in on at of with by near under over above below beneath behind beside besides between among "
    "amongst inside into onto across along around through from to against toward towards underneath "
    "within without upon atop past like for about outside after before beyond opposite via amid "
    "amidst throughout".split()
)
# Multi-word prepositions and relational words, longest first when matched.
RELATION_PHRASES: tuple[tuple[str, ...], ...] = tuple(
    sorted(
        (
            tuple(p.split())
            for p in (
                "to the left of|on the left of|at the left of|left of|to the right of|on the right of|"
                "at the right of|right of|in front of|on top of|at the top of|at the bottom of|"
                "in the middle of|in the centre of|in the center of|at the edge of|in the corner of|"
                "next to|close to|near to|far from|away from|higher up than|lower down than|higher than|"
                "lower than|taller than|shorter than|bigger than|smaller than|larger than|"
                "partly covering|partly hiding|partly hidden behind|partly covered by|peeks out of|"
                "sticks out of|out of|across from|on the far side of|at the foot of|together with|"
                "holding|containing|carrying|wearing|surrounded by|covered by|covered in|filled with|"
                "leaning on|leaning against|sitting on|standing on|lying on|hanging from|hanging on"
            ).split("|")
        ),
        key=lambda p: -len(p),
    )
) + tuple(
    (w,)
    for w in "above below beneath behind beside near under underneath over inside within in on at with "
    "between among against along around atop onto into by opposite outside".split()
)
_RELATION_FIRST = frozenset(p[0] for p in RELATION_PHRASES)

# Words that only say where in the frame something is; a phrase made of them alone is a
# location, not a thing to find.
POSITION_WORDS = frozenset(
    "left right top bottom middle centre center corner corners side sides edge edges upper lower far "
    "near front back foreground background distance row rows half part parts area place places "
    "top-left top-right bottom-left bottom-right upper-left upper-right lower-left lower-right "
    "midground horizon whole rest end ends".split()
)
# Heads that name the picture (or an uncountable "everything"), not a region of it.
META_NOUNS = frozenset(
    "picture pictures image images photo photos photograph photographs scene scenes view views shot "
    "frame snapshot everything something anything nothing objects object things thing items item total "
    "all kinds kind sort type lot lots".split()
)
# Heads that name where the whole picture is (its setting), not a thing in one place of it.
SETTING_HEADS = frozenset(
    "beach beaches seaside seashore shore shoreline coast coastline desert deserts dunes badlands "
    "wasteland meadow meadows field fields pasture pastures prairie lawn lawns grassland grass forest "
    "forests woods woodland grove thicket jungle park garden street streets road avenue boulevard lane "
    "city town village downtown room rooms kitchen bedroom office hallway lounge parlour parlor chamber "
    "studio sky skies heavens firmament snowfield snow tundra expanse steppe sea ocean lake countryside "
    "landscape valley savanna savannah outdoors indoors sand water".split()
)
# "a group of ...": the quantity word and its "of" belong to the noun phrase.
COLLECTIVE_HEADS = frozenset(
    "group set pair row couple bunch pile stack line flock herd cluster collection number handful "
    "crowd team family series heap bundle variety".split()
)
# Known adjectives: colours, sizes, patterns and common visual words. They keep "is big and
# plain" a predicate (not a noun phrase) and let "red and white" stay inside one phrase.
ADJECTIVES = frozenset(
    "red orange yellow green blue purple pink white black brown grey gray violet beige gold golden "
    "silver tan teal navy cyan magenta maroon turquoise crimson dark light pale bright deep vivid "
    "colourful colorful multicoloured multicolored small little large big tiny huge giant tall short "
    "long wide narrow thin thick fat round square flat tall high low heavy soft hard old new young "
    "plain striped stripy dotted spotted polka-dot checked checkered chequered patterned spotty "
    "wooden metal metallic plastic glass empty full open closed wet dry hot cold warm cool clear "
    "cloudy sunny snowy sandy grassy rocky calm quiet busy cosy cozy hazy starry shiny dull smooth "
    "rough fluffy furry hairy curly straight wavy happy sad cute pretty beautiful ugly lovely nice "
    "sleepy tiny-looking same different other single double lone empty front rear upper lower "
    "distant nearby first second third last next".split()
)
ADJ_SUFFIXES = ("ful", "ous", "able", "ible", "less", "ish", "ive")
_SUFFIX_NOUNS = frozenset(
    "radish relish parish polish jellyfish catfish goldfish starfish swordfish shellfish detective "
    "relative explosive motive locomotive olive archive table vegetable cable stable fable".split()
)

_VERB_BASES = (
    "sit stand lie rest appear show contain cover hold look see find place set fill rise meet run walk "
    "play fly float hang lean perch swim jump ride drive wear carry eat drink read watch smile grow "
    "shine glow wave face point surround cross reach pass lay park stack pile scatter spread peek stick "
    "hide overlap block touch support sleep wait talk dance sing fall climb relax pose stare gaze hover "
    "dangle sail drift roll bounce loom stretch extend border feature include depict display seem "
    "become get go come take make give keep let put use turn move open paint draw decorate cast "
    "reflect sparkle twinkle bloom blossom sprawl lounge crouch kneel squat bend hug kiss feed chase "
    "catch throw kick hit pull push lift gather own need want like love enjoy try start begin continue "
    "remain stay live work note notice spot form fill line frame stop rain snow flow pour wrap tie hover "
    "nestle tuck lurk graze nap rest shelter emerge poke occupy dominate fill mark separate divide "
    "connect join hide peer glance observe sit"
).split()
_IRREGULAR_VERBS = frozenset(
    "sat stood lay lain lying seen saw found held shown hung ran flew flown swam swum rode ridden drove "
    "driven wore worn ate eaten drank drunk read grew grown shone lit made took taken gave given kept "
    "put went gone came become became got gotten fell fallen spread set hit cast caught threw thrown "
    "hidden hid stuck laid built sent spent dying tying lying".split()
)
# Noun/verb homographs that, after a noun and before a boundary, are more often nouns
# ("a street light.", "the bus stop,").
_NOUNISH = frozenset(
    "light lights park parks stop stops show shows line lines place places set sets top tops frame "
    "frames plant plants face faces water waters stack stacks pile piles point points pass block "
    "blocks stick sticks run runs walk walks wave waves drink drinks play plays cover "
    "covers form forms border borders feature features display displays mark marks snow rain "
    "line swim ride rides kite kites book books spot spots".split()
)


def _inflections(base: str) -> set[str]:
    out = {base}
    if base.endswith("e"):
        out |= {base + "s", base + "d", base[:-1] + "ing"}
    elif base.endswith("y") and base[-2:-1] not in "aeiou":
        out |= {base[:-1] + "ies", base[:-1] + "ied", base + "ing"}
    elif base.endswith(("s", "sh", "ch", "x", "z")):
        out |= {base + "es", base + "ed", base + "ing"}
    else:
        out |= {base + "s", base + "ed", base + "ing"}
        # Short consonant-vowel-consonant verbs double their last letter: sit -> sitting.
        if len(base) <= 4 and re.fullmatch(r"[^aeiou]*[aeiou][^aeiouwxy]", base):
            out |= {base + base[-1] + "ing", base + base[-1] + "ed"}
    return out


VERBS = frozenset(set().union(*(_inflections(b) for b in _VERB_BASES)) | _IRREGULAR_VERBS)

# --------------------------------------------------------------------------- tokens

_TOKEN_RE = re.compile(
    # Initialisms ("e.g.", "U.S."), numbers ("3.5", "80th"), words with inner hyphens or
    # apostrophes, then any other single non-space character.
    r"(?:[^\W\d_]\.){2,}|\d+(?:[.,:]\d+)*(?:st|nd|rd|th|s)?|[^\W_]+(?:['’\-][^\W_]+)*|\S",
    re.UNICODE,
)


@dataclass(frozen=True)
class _Tok:
    start: int
    end: int
    text: str
    low: str
    word: bool


def _tokens(text: str, start: int, end: int) -> list[_Tok]:
    out: list[_Tok] = []
    for m in _TOKEN_RE.finditer(text, start, end):
        s = m.group(0)
        low = s.lower().replace("’", "'")
        if s == "." and out and out[-1].word and out[-1].end == m.start() and out[-1].low in _ABBREVIATIONS:
            # "Dr." / "approx.": the full stop belongs to the word, it does not end a phrase.
            prev = out.pop()
            out.append(_Tok(prev.start, m.end(), text[prev.start : m.end()], prev.low + ".", True))
            continue
        if "." in low and low[0].isalpha():
            # An initialism: "e.g." / "i.e." are function words, "U.S." is a name.
            out.append(_Tok(m.start(), m.end(), s, low, low not in ("e.g.", "i.e.", "cf.", "etc.")))
            continue
        out.append(_Tok(m.start(), m.end(), s, low, s[0].isalnum()))
    return out


# --------------------------------------------------------------------------- noun phrases


@dataclass
class _NP:
    i0: int  # token range [i0, i1)
    i1: int
    head: str
    core_position: bool
    meta: bool
    has_det: bool


def _is_content(t: _Tok) -> bool:
    low = t.low
    return t.word and not (
        low in DETERMINERS
        or low in PRONOUNS
        or low in AUXILIARIES
        or low in CONJUNCTIONS
        or low in PREPOSITIONS
        or low in RELATIVE
    )


def _is_adjective(low: str) -> bool:
    if low in ADJECTIVES or re.fullmatch(r"\d+(st|nd|rd|th)", low):
        return True
    # Suffixes only on longer words: "fish", "dish" and "hive" are nouns.
    return len(low) >= 6 and low.endswith(ADJ_SUFFIXES) and low not in _SUFFIX_NOUNS


def _boundary_after(nxt: _Tok | None) -> bool:
    return nxt is None or not nxt.word or nxt.low in PREPOSITIONS or nxt.low in CONJUNCTIONS or (
        nxt.low in ADVERBS or nxt.low in AUXILIARIES or nxt.low in VERBS
    )


def _looks_like_verb(toks: list[_Tok], k: int, has_det: bool, np_has_content: bool) -> bool:
    """Is toks[k] a verb here? Only asked for content-like words inside a candidate phrase."""
    low = toks[k].low
    known = low in VERBS
    participle = len(low) > 4 and (low.endswith("ing") or low.endswith("ed"))
    if not (known or participle):
        return False
    nxt = toks[k + 1] if k + 1 < len(toks) else None
    if not np_has_content and has_det:
        # Right after a determiner or number it modifies or heads the phrase: "a dashed line",
        # "the building", "a set of".
        return False
    if not np_has_content and known and low in _NOUNISH and _boundary_after(nxt):
        return False  # "with spots." / "with spots sits": a bare noun before a boundary
    if participle and nxt is not None and _is_content(nxt) and nxt.low not in VERBS:
        # "-ed"/"-ing" words: a modifier when a word of the phrase follows ("spotted blue
        # kite", "rolling dunes"), a verb otherwise ("a dog tied to", "a cat sleeping").
        return False
    if not known:
        return participle
    if np_has_content and low in _NOUNISH and _boundary_after(nxt):
        return False  # "a street light." / "the bus stop, ..." read as compound nouns
    return True


def _parse_core(toks: list[_Tok], i: int) -> tuple[int, bool, int] | None:
    """Determiners/numbers + modifiers + head from toks[i]; (end, has_det, last content) or None."""
    n = len(toks)
    j = i
    has_det = False
    while j < n and toks[j].word and (
        toks[j].low in DETERMINERS or toks[j].low in NUMBER_WORDS or toks[j].low[0].isdigit()
    ):
        if toks[j].low == "that" and (j + 1 >= n or not _is_content(toks[j + 1])):
            break
        has_det = True
        j += 1
    last_content = -1
    content = False
    while j < n:
        t = toks[j]
        if t.word and t.low in ADVERBS and t.low not in ("all",):
            # An adverb belongs to the phrase only when it modifies a following adjective
            # ("a very large dog"); "also two cats" starts the phrase at "two".
            if j + 1 < n and (_is_adjective(toks[j + 1].low) or toks[j + 1].low.endswith("ed")):
                j += 1
                continue
            break
        if t.word and t.low.endswith("ly") and len(t.low) > 4 and t.low not in ADJECTIVES:
            if j + 1 < n and _is_content(toks[j + 1]) and not content:
                j += 1
                continue
            break
        if j > i and _match_relation(toks, j):
            break  # "... with no markings next to": the relation starts here
        if t.word and _is_content(t):
            if t.low in NUMBER_WORDS or t.low[0].isdigit():
                has_det = True
            if _looks_like_verb(toks, j, has_det, content):
                break
            content = True
            last_content = j
            j += 1
            continue
        if t.text in ",&" or (t.word and t.low in ("and", "or")):
            # "red and white ball", "a big, fluffy dog": a coordination of adjectives stays
            # inside the phrase when a plain word follows it.
            words = [toks[k].low for k in range(i, j) if _is_content(toks[k])]
            if (
                words
                and all(_is_adjective(w) for w in words)
                and j + 1 < n
                and _is_content(toks[j + 1])
                and toks[j + 1].low not in ADVERBS
            ):
                j += 1
                continue
            break
        break
    if not content:
        return None
    return last_content + 1, has_det, last_content


def _parse_np(toks: list[_Tok], i: int, after_copula: bool) -> _NP | None:
    core = _parse_core(toks, i)
    if core is None:
        return None
    end, has_det, last = core
    words = [toks[k].low for k in range(i, end) if _is_content(toks[k])]
    if all(_is_adjective(w) for w in words):
        return None  # "big and plain": a predicate, not a thing
    if after_copula and not has_det:
        return None  # "the sky is cloudy": bare words after "is" describe, they do not name
    head = toks[last].low
    core_position = all(w in POSITION_WORDS or _is_adjective(w) for w in words)
    meta = head in META_NOUNS
    n = len(toks)
    # Post-modifiers.
    while end < n:
        t = toks[end]
        if t.low == "of" and not meta and (not core_position or head in COLLECTIVE_HEADS):
            # "a strip of blue sea", "a row of three trees"; but "the top of" stays a place.
            sub = _parse_core(toks, end + 1)
            if sub is not None:
                end = sub[0]
                core_position = False
                continue
            break
        if t.low == "with" and not core_position and not meta:
            # "with stripes", "with no markings", "with a check pattern": a property of the
            # thing. "with two boats" introduces another thing and is left as a relation.
            sub = _parse_core(toks, end + 1)
            if sub is not None:
                first = toks[end + 1].low
                sub_head = toks[sub[2]].low
                if not sub[1] or first == "no" or sub_head in ("pattern", "patterns", "markings"):
                    end = sub[0]
                    continue
            break
        if t.low in RELATIVE and not meta and end + 2 < n and toks[end + 1].low in BE:
            # "that is small and plain": adjectives only, up to a boundary.
            k = end + 2
            last_adj = -1
            while k < n:
                w = toks[k]
                if _match_relation(toks, k) > (1 if k > end + 2 else 0):
                    break  # "... that is small close to a fish"
                if w.word and w.low in ADVERBS and w.low != "all":
                    k += 1
                    continue
                if w.low in NUMBER_WORDS or w.low[0].isdigit():
                    break  # "... is big and three trees": the number starts a new phrase
                if w.word and _is_content(w) and (w.low not in VERBS or _is_adjective(w.low)) and not (
                    len(w.low) > 4 and w.low.endswith("ing")
                ):
                    last_adj = k
                    k += 1
                    continue
                if w.low in ("and", "or", ",") and last_adj == k - 1:
                    k += 1
                    continue
                break
            after = last_adj + 1
            boundary = after >= n or (
                not toks[after].word
                or toks[after].low in PREPOSITIONS
                or toks[after].low in CONJUNCTIONS
                or toks[after].low in AUXILIARIES
                or toks[after].low in VERBS
                or toks[after].low in ADVERBS
                or _match_relation(toks, after) > 0
            )
            if last_adj > end + 1 and boundary:
                end = after
                continue
            break
        break
    return _NP(i, end, head, core_position, meta, has_det)


# --------------------------------------------------------------------------- chunking


@dataclass
class Chunking:
    """Sentences (character spans) and phrases of a text; `phrase_sentence[i]` is the index of
    the sentence holding phrase i."""

    text: str
    sentences: list[tuple[int, int]]
    phrases: list[Phrase]
    phrase_sentence: list[int]


def _match_relation(toks: list[_Tok], i: int) -> int:
    if toks[i].low not in _RELATION_FIRST:
        return 0
    for p in RELATION_PHRASES:
        if i + len(p) <= len(toks) and all(toks[i + k].low == p[k] for k in range(len(p))):
            return len(p)
    return 0


def _chunk_sentence(text: str, toks: list[_Tok]) -> list[Phrase]:
    n = len(toks)
    items: list[tuple[str, int, int, _NP | None]] = []  # (kind, i0, i1, np)
    i = 0
    prev_low = ""
    subject_there = False
    while i < n:
        t = toks[i]
        m = _match_relation(toks, i)
        if m:
            np_ = _parse_np(toks, i + m, after_copula=False)
            if np_ is not None:
                items.append(("rel", i, i + m, None))
                items.append(("np", np_.i0, np_.i1, np_))
                i = np_.i1
                prev_low = toks[i - 1].low
                continue
        if t.word and (_is_content(t) or t.low in DETERMINERS or t.low in NUMBER_WORDS):
            after_copula = prev_low in BE and not subject_there
            np_ = _parse_np(toks, i, after_copula=after_copula)
            if np_ is not None:
                items.append(("np", np_.i0, np_.i1, np_))
                i = np_.i1
                prev_low = toks[i - 1].low
                continue
        if t.low in ("there", "here", "there's", "here's"):
            subject_there = True
        elif not t.word or t.low in CONJUNCTIONS:
            subject_there = False
        items.append(("other", i, i + 1, None))
        prev_low = t.low
        i += 1

    def real(item: tuple[str, int, int, _NP | None]) -> bool:
        np_ = item[3]
        return item[0] == "np" and np_ is not None and not np_.core_position and not np_.meta

    def span(item: tuple[str, int, int, _NP | None]) -> tuple[int, int]:
        return toks[item[1]].start, toks[item[2] - 1].end

    phrases: list[Phrase] = []
    np_index: dict[int, int] = {}  # item index -> phrase index
    for k, item in enumerate(items):
        if item[0] == "np" and real(item):
            s, e = span(item)
            np_index[k] = len(phrases)
            head = item[3].head if item[3] is not None else ""
            phrases.append(Phrase(text[s:e], s, e, "setting" if head in SETTING_HEADS else "noun_phrase"))
    out: list[Phrase] = []
    last_real: int | None = None
    for k, item in enumerate(items):
        if k in np_index:
            out.append(phrases[np_index[k]])
            if phrases[np_index[k]].kind != "setting":
                last_real = np_index[k]
        elif item[0] == "rel" and k + 1 in np_index and phrases[np_index[k + 1]].kind != "setting":
            s, e = span(item)
            obj = np_index[k + 1]
            subj = last_real
            if subj is None:
                # Fronted: "On the right of the box rests the heart." The subject is the
                # next thing named after the object.
                later = [np_index[j] for j in range(k + 2, len(items))
                         if j in np_index and phrases[np_index[j]].kind != "setting"]
                subj = later[0] if later else None
            if subj is not None:
                rel_words = text[s:e]
                if subj > obj and rel_words[:1].isupper() and rel_words[1:2].islower():
                    rel_words = rel_words[0].lower() + rel_words[1:]  # fronted: no capital mid-claim
                out.append(Phrase(text[s:e], s, e, "relation",
                                  query=f"{phrases[subj].text} {rel_words} {phrases[obj].text}",
                                  args=(subj, obj)))
    # args index the noun phrases; re-map them to positions in the output list.
    pos = {id(p): i for i, p in enumerate(out)}
    return [
        Phrase(p.text, p.start, p.end, p.kind, p.query, tuple(pos[id(phrases[a])] for a in p.args))
        if p.args else p
        for p in out
    ]
    return phrases


def chunk(text: str, max_sentence_chars: int = MAX_SENTENCE_CHARS,
          sentences: list[tuple[int, int]] | None = None) -> Chunking:
    """Sentences and phrases of `text` (spans into `text` as given). Deterministic.

    `sentences`: the caller's sentence spans (e.g. the ones review stores verdicts by), used
    as given so that sentence i of the result is the caller's sentence i; by default the text
    is split with engine.text.sentences.
    """
    if not isinstance(text, str):
        raise TypeError("text must be a str")
    if sentences is None:
        sentences = split_sentences(text, max_sentence_chars)
    else:
        sentences = [(int(s), int(e)) for s, e in sentences]
        if any(not 0 <= s <= e <= len(text) for s, e in sentences):
            raise ValueError("sentence spans must lie within the text")
    phrases: list[Phrase] = []
    owner: list[int] = []
    for si, (s, e) in enumerate(sentences):
        found = _chunk_sentence(text, _tokens(text, s, e))
        base = len(phrases)
        phrases += [
            Phrase(p.text, p.start, p.end, p.kind, p.query, tuple(base + a for a in p.args)) if p.args else p
            for p in found
        ]
        owner += [si] * len(found)
    return Chunking(text, sentences, phrases, owner)
