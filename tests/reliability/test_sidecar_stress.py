"""Issue 27 stress targets for `longlens xmp export` (make stress; rounds from
LONGLENS_STRESS_ITERATIONS, default 20), each also run for a few rounds in the default suite:

(a) export rounds while another real process keeps rewriting the same sidecars (taking the lock
    Longlens' writers take, as the app or a cluster import does; the export reads and merges
    without it, so every rewrite landing in between must be merged again): nothing lost, every
    sidecar ends with every change of the other writer and every round's review;
(b) kill -9 rounds of an export at random moments: every sidecar is whole (its old bytes, or a
    packet that parses and holds the round's review), the next export completes, and no temporary
    file is left in the photo folder.

Figures (rounds, losses, conflicts merged again, strays left by kills and removed, time) are
printed and written to $LONGLENS_STRESS_REPORT when set."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.metadata.xmp import parse_xmp
from tests.reliability.sidecar_fixtures import (
    ROOT,
    Export,
    make_library,
    reviewed_captions,
    reviews_in,
    run_export,
)

REWRITER = r"""
import os, re, select, sys, json, time
from pathlib import Path
from engine.fileutil import folder_write_lock

folder = Path(sys.argv[1])
names = sys.argv[2:]
last = {n: 0 for n in names}
k = 0
sys.stdout.write("started\n"); sys.stdout.flush()
while not select.select([sys.stdin], [], [], 0)[0]:
    for n in names:
        k += 1
        path = folder / n
        with folder_write_lock(folder):
            text = path.read_text(encoding="utf-8")
            m = re.search(r"<dc:subject>\s*<rdf:Bag>", text)
            text = text[:m.end()] + f"\n     <rdf:li>other-{k}</rdf:li>" + text[m.end():]
            if k % 2:
                tmp = folder / (n + ".other-tool")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, path)  # a new inode, as darktable and exiv2 write
            else:
                path.write_text(text, encoding="utf-8")  # in place
        last[n] = k
        time.sleep(0.005)  # a busy editor, not a lock hog: others get the lock between its writes
print(json.dumps(last))
"""


def _report(name: str, figures: dict) -> None:
    line = json.dumps({"test": name, **figures})
    print(line)
    out = os.environ.get("LONGLENS_STRESS_REPORT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def export_while_another_process_rewrites(tmp_path: Path, rounds: int, pictures: int = 5) -> dict:
    started = time.monotonic()
    lib = make_library(tmp_path, pictures)
    names = [p.name + ".xmp" for p in lib.pictures]
    rewriter = subprocess.Popen([sys.executable, "-c", REWRITER, str(lib.folder), *names], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert rewriter.stdout.readline().strip() == "started"
    merged_again = 0
    failures = []
    try:
        for r in range(rounds):
            captions = reviewed_captions(lib, f"round{r}", "Round " + str(r) + " caption of {pic}.", note=f"n{r}")
            rc, out, err = run_export(lib, captions)
            if rc != 0:
                failures.append((r, rc, out + err))
            merged_again += out.count("merged again")
    finally:
        last_words, _ = rewriter.communicate("stop\n", timeout=120)
    last = json.loads(last_words)
    losses = 0
    for i, name in enumerate(names):
        data = (lib.folder / name).read_bytes()
        # Read from the text: the reader keeps at most 5,000 keywords, and the rewriter writes more.
        subjects = set(re.findall(r"<rdf:li>(other-\d+)</rdf:li>", data.decode("utf-8")))
        # The rewriter's k-th change went to names[(k - 1) % len(names)]: every one must be there.
        written_here = {f"other-{k}" for k in range(1, last[name] + 1) if (k - 1) % len(names) == i}
        losses += len(written_here - subjects)
        assert last[name] > 0 and f"other-{last[name]}" in subjects, name  # the other writer's last change
        reviews = reviews_in(data)
        for r in range(rounds):
            if reviews.get(f"Round {r} caption of {name[:-4]}.") != ("faithful", f"n{r}"):
                losses += 1
    assert lib.strays() == []
    figures = {"rounds": rounds, "sidecars": pictures, "other_writer_changes": max(last.values()),
               "conflicts_merged_again": merged_again, "failed_runs": len(failures), "losses": losses,
               "seconds": round(time.monotonic() - started, 1)}
    assert failures == [] and losses == 0, (failures, figures)
    return figures


def kill_9_rounds(tmp_path: Path, rounds: int, pictures: int = 30, seed: int = 27) -> dict:
    started = time.monotonic()
    rng = random.Random(seed)
    lib = make_library(tmp_path, pictures)
    t0 = time.monotonic()
    rc, out, err = run_export(lib, reviewed_captions(lib, "warmup", "Warm-up caption of {pic}."))
    assert rc == 0, out + err
    full_run = time.monotonic() - t0
    killed = strays_seen = old_kept = new_written = 0
    for r in range(rounds):
        before = lib.sidecars()
        captions = reviewed_captions(lib, f"kill{r}", "Kill round " + str(r) + " caption of {pic}.", note=f"k{r}")
        export = Export(lib, captions)
        # A random moment of a run: from just after the start to its usual end.
        try:
            export.proc.wait(timeout=rng.uniform(0.0, full_run))
        except subprocess.TimeoutExpired:
            export.proc.kill()
            killed += 1
        export.finish()
        strays_seen += len(lib.strays())
        for name, data in lib.sidecars().items():  # whole: the old bytes, or a complete new packet
            if data == before[name]:
                old_kept += 1
                continue
            parse_xmp(data, name)
            assert reviews_in(data)[f"Kill round {r} caption of {name[:-4]}."] == ("faithful", f"k{r}"), name
            new_written += 1
        rc, out, err = run_export(lib, captions)  # the next export completes
        assert rc == 0, out + err
        assert lib.strays() == [], lib.strays()
        for name, data in lib.sidecars().items():
            got = reviews_in(data)
            assert all(got[f"Kill round {q} caption of {name[:-4]}."] == ("faithful", f"k{q}") for q in range(r + 1))
    return {"rounds": rounds, "sidecars": pictures, "killed_mid_run": killed, "full_run_seconds": round(full_run, 2),
            "sidecars_whole_old": old_kept, "sidecars_whole_new": new_written, "strays_left_by_kills": strays_seen,
            "strays_after_next_run": 0, "seconds": round(time.monotonic() - started, 1)}


# --------------------------------------------------------------------------- make stress


@pytest.mark.stress
def test_stress_export_while_another_process_rewrites_the_sidecars(tmp_path, stress_iterations):
    _report("export while another process rewrites", export_while_another_process_rewrites(tmp_path, stress_iterations))


@pytest.mark.stress
def test_stress_kill_9_during_export(tmp_path, stress_iterations):
    _report("kill -9 during export", kill_9_rounds(tmp_path, stress_iterations))


# --------------------------------------------------------------------------- the default run: a few rounds


def test_a_few_exports_while_another_process_rewrites_the_sidecars(tmp_path):
    export_while_another_process_rewrites(tmp_path, 2, pictures=2)


def test_a_few_kill_9_rounds_during_export(tmp_path):
    kill_9_rounds(tmp_path, 2, pictures=4)
