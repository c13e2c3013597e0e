"""Parsing of real-world model answers: lists, paragraphs and scores."""

from __future__ import annotations

import pytest

from engine.datagen.parsing import parse_list, parse_paragraph, parse_score

FIVE = ["A dog runs on the beach.", "A brown dog chases a ball.", "Waves roll in behind a running dog.",
        "A dog plays near the water.", "Sand flies up as a dog sprints."]


@pytest.mark.parametrize("answer", [
    "\n".join(f"{i + 1}. {t}" for i, t in enumerate(FIVE)),
    "\n".join(f"{i + 1}) {t}" for i, t in enumerate(FIVE)),
    "\n".join(f"({i + 1}) {t}" for i, t in enumerate(FIVE)),
    "\n".join(f"**{i + 1}.** {t}" for i, t in enumerate(FIVE)),
    "\n".join(f"- {t}" for t in FIVE),
    "\n".join(f"• \"{t}\"" for t in FIVE),
    "\n".join(f"Caption {i + 1}: {t}" for i, t in enumerate(FIVE)),
    "\n".join(f"{i + 1}: *{t}*" for i, t in enumerate(FIVE)),
    "Sure! Here are five captions for the image:\n\n" + "\n".join(f"{i + 1}. {t}" for i, t in enumerate(FIVE))
    + "\n\nThese captions vary in focus and wording. Let me know if you need more!",
    "```\n" + "\n".join(f"{i + 1}. {t}" for i, t in enumerate(FIVE)) + "\n```",
    "### Captions\n" + "\n".join(f"{i + 1}. {t}" for i, t in enumerate(FIVE)),
])
def test_list_styles_give_the_same_five_items(answer):
    got = parse_list(answer, 5)
    assert got.ok, got.problem
    assert got.value == FIVE


def test_more_items_keep_the_first_five_and_say_so():
    answer = "\n".join(f"{i + 1}. {t}" for i, t in enumerate([*FIVE, "A sixth caption here.", "A seventh."]))
    got = parse_list(answer, 5)
    assert got.value == FIVE and "2 extra item(s) dropped" in got.notes


def test_too_few_items_is_a_problem_with_the_count():
    got = parse_list("1. One dog.\n2. Two dogs.\n3. A beach.\n4. Waves.", 5)
    assert not got.ok and got.value is None and got.problem == "4 usable item(s), expected 5"


def test_duplicates_do_not_count_twice():
    answer = "\n".join(f"{i + 1}. {t}" for i, t in enumerate([FIVE[0], FIVE[0].upper(), *FIVE[1:4]]))
    got = parse_list(answer, 5)
    assert not got.ok and got.problem.startswith("4 usable")


def test_wrapped_items_are_joined_and_trailing_chatter_is_not():
    answer = ("1. A dog runs along the wet sand\n   while the tide comes in.\n2. A brown dog chases a ball\n"
              "near the water.\n3. Waves roll in.\n4. A dog plays.\n5. Sand flies up.\nI hope these help.")
    got = parse_list(answer, 5)
    assert got.value[0] == "A dog runs along the wet sand while the tide comes in."
    assert got.value[1] == "A brown dog chases a ball near the water."
    assert got.value[4] == "Sand flies up."


def test_change_annotations_on_negatives_are_removed():
    answer = "\n".join([
        "1. A red car parks beside a tree. (changed: the car is blue in the image)",
        "2. Two cats sit on a bench [wrong detail: there is one cat]",
        "3. A man holds a green umbrella (colour changed)",
        "4. A dog sleeps under the table.",
        "5. A woman walks left of the bus (instead of right).",
    ])
    got = parse_list(answer, 5)
    assert got.value == ["A red car parks beside a tree.", "Two cats sit on a bench", "A man holds a green umbrella",
                         "A dog sleeps under the table.", "A woman walks left of the bus"]


def test_plain_lines_without_markers():
    got = parse_list("Here are the captions:\n" + "\n".join(FIVE), 5)
    assert got.value == FIVE and "no list markers; one item per line" in got.notes


@pytest.mark.parametrize("answer", ["I'm sorry, but I can't help with that request.",
                                    "I cannot see the image you are referring to.",
                                    "Unfortunately, I am unable to describe this picture."])
def test_refusals_are_reported_as_refusals(answer):
    got = parse_list(answer, 5)
    assert not got.ok and got.problem.startswith("the model refused")
    assert parse_paragraph(answer).problem.startswith("the model refused")


def test_empty_answers():
    assert parse_list("", 5).problem == "empty answer"
    assert parse_paragraph("  \n").problem == "empty answer"
    assert parse_score("").problem == "empty answer"


PARA = ("A brown dog runs along a wide beach. The sea behind it is calm and grey. A red ball lies in the sand "
        "to the left. Two people walk near the water in the distance.")


def test_paragraph_intro_outro_markdown_and_quotes_removed():
    answer = f'Here is a detailed paragraph describing the image:\n\n"**{PARA}**"\n\nLet me know if you want changes.'
    got = parse_paragraph(answer)
    assert got.value == PARA
    assert "introduction dropped" in got.notes and "closing remark dropped" in got.notes


def test_paragraph_split_over_lines_is_joined():
    got = parse_paragraph(PARA.replace(". ", ".\n"))
    assert got.value == PARA


def test_paragraph_sentence_bounds():
    short = parse_paragraph("A dog runs on a beach. The sky is grey.")
    assert not short.ok and short.problem == "2 sentence(s), expected 3 to 6"
    long = parse_paragraph(" ".join(f"Sentence number {i} is here." for i in range(1, 9)))
    assert long.ok and long.value.count(".") == 6 and long.value.endswith("Sentence number 6 is here.")
    assert "cut from 8 to 6 sentences" in long.notes


def test_a_one_sentence_answer_starting_with_sure_is_not_dropped_as_chatter():
    got = parse_paragraph("Sure enough, a dog runs on the beach. The sea is calm. A ball lies in the sand.")
    assert got.value.startswith("Sure enough, a dog runs")


@pytest.mark.parametrize(("answer", "score"), [
    ("7", 7.0), ("7.5", 7.5), ("Score: 8/10", 8.0), ("I'd rate it 6 out of 10.", 6.0),
    ("Score (0 to 10): 9", 9.0), ("**4**", 4.0), ("Eight.", 8.0), ("0", 0.0), ("10", 10.0),
    ("The paragraph is mostly accurate. 7", 7.0), ("It names 3 dogs but there are 2. Score: 4", 4.0),
    ("Rating = 6.5", 6.5), ("The paragraph gets 2 colours wrong: 3/10", 3.0),
])
def test_scores(answer, score):
    got = parse_score(answer)
    assert got.ok and got.value == score


@pytest.mark.parametrize(("answer", "problem"), [
    ("11", "outside 0..10"), ("-1", "outside 0..10"), ("I'm sorry, I can't rate this.", "refused"),
    ("Quite accurate overall.", "no score"),
])
def test_bad_scores(answer, problem):
    got = parse_score(answer)
    assert not got.ok and problem in got.problem
