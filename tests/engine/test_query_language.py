"""engine.text.language: a query not in a language the model was trained on is recognised."""

from __future__ import annotations

import pytest

from engine.text.language import guess_language, language_warning

GERMAN = ("Ein roter Ball liegt auf dem grünen Rasen neben einer Holzbank. Dahinter steht ein hoher Baum, "
          "und zwei weiße Wolken ziehen über den Himmel.")


@pytest.mark.parametrize("text,code", [
    (GERMAN, "de"),
    ("Un ballon rouge est posé sur l'herbe à côté d'un banc en bois. Derrière le banc se trouve un arbre.", "fr"),
    ("Una pelota roja está sobre la hierba junto a un banco de madera. Detrás del banco hay un árbol.", "es"),
    ("Una palla rossa è sull'erba accanto a una panchina di legno. Dietro la panchina c'è un albero.", "it"),
    ("Een rode bal ligt op het gras naast een houten bank. Achter de bank staat een hoge boom.", "nl"),
    ("Uma bola vermelha está na grama ao lado de um banco de madeira. Atrás do banco há uma árvore.", "pt"),
    ("Die Katze sitzt auf dem Sofa.", "de"),
    ("赤いボールが木製のベンチの左にある。", "ja"),
    ("一个红色的球放在木凳旁边的草地上。", "zh"),
    ("Красный мяч лежит на траве рядом с деревянной скамейкой.", "ru"),
    ("빨간 공이 나무 벤치 옆 잔디 위에 있다.", "ko"),
    ("A red ball lies on the grass, next to a wooden bench. Behind the bench stands a tall tree.", "en"),
    # English with foreign names stays English.
    ("Schloss Neuschwanstein at dusk with a lake in front and the mountains behind it.", "en"),
    ("A red ball on the grass near the Rathaus in München, with a Biergarten behind it.", "en"),
])
def test_languages_are_told_apart(text, code):
    guess = guess_language(text)
    assert guess is not None and guess.code == code, guess


@pytest.mark.parametrize("text", ["", "   ", "!!! ... ???", "Strand", "Hund im Schnee", "a dog", "1234 5678",
                                  "\x00\x01\u200b"])
def test_too_little_to_tell_is_no_guess(text):
    assert guess_language(text) is None


def test_the_warning_names_the_language_and_what_the_model_reads():
    warning = language_warning(GERMAN, "blip-itm-base-coco")
    assert warning is not None
    assert "German" in warning and "'blip-itm-base-coco'" in warning and "English" in warning
    assert language_warning("A red ball lies on the grass next to a wooden bench.", "m") is None
    assert language_warning("Strand", "m") is None  # not enough to tell: no warning
    # A model trained on German too would not be warned about.
    assert language_warning(GERMAN, "m", ("en", "de")) is None


def test_long_queries_are_checked_quickly():
    import time

    text = GERMAN * 500  # ~10,000 words
    t0 = time.perf_counter()
    assert guess_language(text).code == "de"
    assert time.perf_counter() - t0 < 5
