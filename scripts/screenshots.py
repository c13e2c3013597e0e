"""Screenshots of the real app in a real X window (under Xvfb), for docs/screenshots/.

    .venv/bin/python scripts/screenshots.py            # starts its own Xvfb if there is no $DISPLAY

Everything happens in a temporary LONGLENS_HOME: the SceneWorld demo collection is generated
(as `longlens demo` does) and indexed through the library view with the bundled sceneworld-mini,
a paragraph search runs, the top result is opened in the inspector with a phrase's real grounding
overlay, and a caption file is reviewed. Needs Xvfb (`apt-get install xvfb`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SIZE = (1440, 900)


def start_xvfb() -> subprocess.Popen | None:
    if os.environ.get("DISPLAY") and os.environ.get("LONGLENS_SCREENSHOTS_USE_DISPLAY"):
        return None
    exe = shutil.which("Xvfb")
    if exe is None:
        sys.exit("Xvfb is needed: apt-get install xvfb")
    for n in range(90, 140):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            break
    proc = subprocess.Popen([exe, f":{n}", "-screen", "0", f"{SIZE[0]}x{SIZE[1]}x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if Path(f"/tmp/.X11-unix/X{n}").exists():
            break
        time.sleep(0.05)
    os.environ["DISPLAY"] = f":{n}"
    os.environ["QT_QPA_PLATFORM"] = "xcb"
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = ap.parse_args()
    xvfb = start_xvfb()
    home = Path(tempfile.mkdtemp(prefix="longlens-shots-"))
    os.environ["LONGLENS_HOME"] = str(home)
    try:
        return run(args.out, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if xvfb is not None:
            xvfb.terminate()
            xvfb.wait(5)


def run(out: Path, home: Path) -> int:
    from PySide6.QtWidgets import QApplication

    from desktop_app import theme
    from desktop_app.background import WorkerHub
    from desktop_app.facade import Backend, resolve_paths
    from desktop_app.main_window import MainWindow
    from desktop_app.qapp import ensure_app
    from desktop_app.views.results_model import ThumbnailStateRole
    from engine.sample_collection import SCENEWORLD_DEMO_SEED, demo_setup

    out.mkdir(parents=True, exist_ok=True)
    app = ensure_app()
    theme.apply_theme(app, "light")
    paths = resolve_paths()
    model, photos, demo_query = demo_setup(paths)
    backend = Backend(paths, model=model)
    hub = WorkerHub()
    win = MainWindow(backend, hub)
    win.resize(*SIZE)
    win.move(0, 0)
    win.show()

    def pump(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)

    def until(cond, timeout: float = 60.0, what: str = "") -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise TimeoutError(what)
            app.processEvents()
            time.sleep(0.01)

    def shot(name: str, window=None) -> None:
        pump(0.4)
        screen = QApplication.primaryScreen()
        pix = screen.grabWindow((window or win).winId())  # the X server's pixels of the real window
        path = out / name
        pix.save(str(path))
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")

    def both(name: str) -> None:
        """The view at full size and in a 1024x640 window (issue 20: the app must work there)."""
        shot(f"{name}.png")
        win.resize(1024, 640)
        try:
            until(lambda: (win.width(), win.height()) == (1024, 640), 10, "resize to 1024x640")
        except TimeoutError:
            raise TimeoutError(f"{name}: the window stays {win.width()}x{win.height()} "
                               f"(minimum {win.minimumSizeHint().width()}x{win.minimumSizeHint().height()})") from None
        shot(f"{name}-1024.png")
        win.resize(*SIZE)
        until(lambda: (win.width(), win.height()) == SIZE, 10, "resize back")
        pump(0.2)

    pump(0.5)
    both("welcome")  # the first run: an empty catalog
    done = []
    win.queue.finished.connect(lambda *a: done.append(a))
    win.library_view.add_folder(str(photos))
    until(lambda: done, 120, "indexing")
    until(lambda: bool(win.library_view.infos), 10, "library refresh")
    win.library_view.list.setCurrentRow(0)

    view = win.search_view
    job = view.run_text_query(demo_query)
    until(lambda: not job.running, 60, "search")
    pump(0.3)
    view.grid.setFocus()
    view.grid.setCurrentIndex(view.model.index(0))
    visible = min(view.model.rowCount(), 15)
    until(lambda: all(view.model.index(r).data(ThumbnailStateRole) != "loading" for r in range(visible)),
          30, "thumbnails")
    both("search-results")

    # Inspector with the model's real phrase grounding: one phrase's region map overlaid.
    view.open_current()
    insp = win.inspector_view
    until(lambda: not insp.canvas.image().isNull(), 30, "inspector image")
    until(lambda: insp.grounding is not None, 60, "grounding")
    # The strongest object phrase: its map as bright as its support.
    best = max((i for i, pm in enumerate(insp.grounding.phrases) if pm.phrase.kind == "noun_phrase"),
               key=lambda i: insp.grounding.phrases[i].support)
    insp.select_phrase(best)
    insp.opacity.setValue(65)
    pump(0.3)
    both("inspector")
    # The exported overlay (legend and phrase in a band below the picture).
    (out / "overlay-export.png").unlink(missing_ok=True)  # the export never overwrites a picture
    if not insp.export_overlay(str(out / "overlay-export.png")):
        raise RuntimeError("the overlay export was refused")
    print(f"wrote {(out / 'overlay-export.png').relative_to(ROOT) if out.is_relative_to(ROOT) else out}")

    # Review mode on a small caption file.
    from engine.sceneworld import generate_scene

    pics = sorted(p for p in photos.rglob("*.jpg"))[:6]
    # True paragraphs and, every other item, a caption wrong in one detail (a hard negative).
    scenes = [generate_scene(SCENEWORLD_DEMO_SEED, i) for i in range(len(pics))]
    captions = [s.paragraph.text if i % 2 == 0 else s.negatives[0].text for i, s in enumerate(scenes)]
    cap = home / "captions.jsonl"
    cap.write_text("\n".join(json.dumps({"image": str(p), "caption": c}) for p, c in zip(pics, captions, strict=False))
                   + "\n" + '{"image": "missing.jpg", "caption": "A line whose picture is missing."}\n',
                   encoding="utf-8")
    win.tabs.setCurrentWidget(win.review_view)
    rv = win.review_view
    j = rv.open_file(str(cap))
    until(lambda: not j.running and rv.item is not None, 30, "review open")
    rv.setFocus()

    def at(index: int) -> None:
        until(lambda: rv.item is not None and rv.item.index == index, 20, f"review item {index}")

    # The same slots the keys 1/2/3, Space, Down and N call (tests drive the keys themselves).
    rv.set_verdict("faithful")
    rv.next_item()
    at(1)
    rv.set_verdict("unfaithful")
    rv.next_item()
    at(2)
    rv.move_row(1)
    rv.set_verdict("faithful")
    rv.move_row(1)
    rv.set_verdict("unsure")
    rv.rows[2].note.setText("the sky is plain blue")
    rv.rows[2]._note_done()
    until(lambda: not rv.canvas.image().isNull(), 30, "review image")
    until(lambda: hub.serial.activeThreadCount() == 0, 10, "verdicts saved")
    pump(0.3)
    both("review")

    # The dark palette (what a system set to dark mode gets).
    theme.apply_theme(app, "dark")
    win.update_model_banner()
    win.tabs.setCurrentWidget(view)
    view.grid.setFocus()
    shot("search-results-dark.png")

    theme.apply_theme(app, "light")
    win.update_model_banner()

    # A German paragraph: searched, with the warning that the model reads English only.
    job = view.run_text_query("Ein roter Ball liegt auf dem grünen Rasen neben einer Holzbank. "
                              "Dahinter steht ein hoher Baum.")
    until(lambda: not job.running, 60, "German search")
    pump(0.3)
    win.resize(1024, 640)
    until(lambda: win.width() == 1024, 10, "resize to 1024x640")
    shot("search-language-warning-1024.png")
    win.resize(*SIZE)
    until(lambda: win.width() == SIZE[0], 10, "resize back")

    # Settings: the devices this machine has, the query reader in plain words.
    dlg = win.open_settings()
    until(lambda: not dlg._devices_job.running and not dlg._models_job.running, 60, "settings")
    dlg.move(0, 0)
    shot("settings.png", dlg)
    dlg.reject()
    job = view.run_text_query(demo_query)
    until(lambda: not job.running, 60, "search")
    shoot_dates_and_duplicates(win, home, photos, shot, until, pump)

    win.close()
    backend.close()
    return 0


def shoot_dates_and_duplicates(win, home: Path, photos: Path, shot, until, pump) -> None:
    """Issue 20: results newest first with a relevance cut-off, and the duplicates dialog over a
    folder with copies, each at full size and at 1024x640."""
    from PIL import Image

    view = win.search_view
    win.tabs.setCurrentWidget(view)
    view.sort_box.setCurrentIndex(view.sort_box.findData("date-new"))
    view.cutoff_spin.setValue(0.05)
    until(lambda: not view.stale and view.cutoff_label.isVisible(), 60, "re-run with order and cut-off")
    pump(0.5)
    shot("search-date-cutoff.png")

    dups = home / "duplicates"
    dups.mkdir(exist_ok=True)
    pics = sorted(photos.rglob("*.jpg"))[:3]
    for i, p in enumerate(pics):
        shutil.copy2(p, dups / f"{p.stem}.jpg")
        if i < 2:
            shutil.copy2(p, dups / f"{p.stem} copy.jpg")
        Image.open(p).save(dups / f"{p.stem} re-saved.jpg", quality=60)
    done = []
    win.queue.finished.connect(lambda *a: done.append(a))
    win.library_view.add_folder(str(dups))
    until(lambda: done, 120, "indexing the duplicates folder")
    dlg = win.open_duplicates()
    dlg.resize(*SIZE)
    dlg.move(0, 0)
    job = dlg.start()
    until(lambda: not job.running and dlg.report is not None, 120, "duplicates")
    until(lambda: all(not dlg.tree.topLevelItem(0).child(i).icon(0).isNull()
                      for i in range(dlg.tree.topLevelItem(0).childCount())), 30, "duplicate thumbnails")
    pump(0.5)
    shot("duplicates.png", dlg)
    dlg.resize(1024, 640)
    win.resize(1024, 640)
    pump(0.5)
    shot("duplicates-1024.png", dlg)
    dlg.close()
    pump(0.3)
    shot("search-date-cutoff-1024.png")


if __name__ == "__main__":
    sys.exit(main())
