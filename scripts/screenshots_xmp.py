"""Screenshots of the XMP views (issue 20 items 2 and 4) in a real X window under Xvfb, at full size
and at 1024x640, for docs/screenshots/:

    .venv/bin/python scripts/screenshots_xmp.py

A temporary LONGLENS_HOME gets the SceneWorld demo pictures (the first 24) with the hand-written
Lightroom, darktable and digiKam sidecars of tests/data/xmp beside three of them, indexed with the
bundled sceneworld-mini; then the search view filtered by a keyword and the inspector of a picture
with its XMP, Review of the captions already in the catalogue and the XMP export dialog's dry run
are captured. Needs Xvfb (`apt-get install xvfb`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data" / "xmp"
SIZES = {"": (1440, 900), "-1024": (1024, 640)}


def _screenshots_module():
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts" / "screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def library_with_sidecars(demo: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    pictures = sorted(demo.rglob("*.jpg"))[:24]
    for p in pictures:
        shutil.copy2(p, dest / p.name)
    first, second, third = (dest / p.name for p in pictures[:3])
    lightroom = (DATA / "lightroom-classic.xmp").read_text(encoding="utf-8")
    first.with_suffix(".xmp").write_text(lightroom.replace('SidecarForExtension="NEF"', 'SidecarForExtension="JPG"'),
                                         encoding="utf-8")
    shutil.copy(DATA / "darktable.xmp", second.with_name(second.name + ".xmp"))
    shutil.copy(DATA / "digikam.xmp", third.with_name(third.name + ".xmp"))


def run(out: Path, home: Path) -> int:
    from PySide6.QtWidgets import QApplication

    from desktop_app import theme
    from desktop_app.background import WorkerHub
    from desktop_app.facade import Backend, resolve_paths
    from desktop_app.main_window import MainWindow
    from desktop_app.qapp import ensure_app
    from desktop_app.views.results_model import ThumbnailStateRole
    from engine.sample_collection import demo_setup

    out.mkdir(parents=True, exist_ok=True)
    app = ensure_app()
    theme.apply_theme(app, "light")
    paths = resolve_paths()
    model, demo, demo_query = demo_setup(paths)
    library = home / "xmp-library"
    library_with_sidecars(demo, library)
    backend = Backend(paths, model=model)
    hub = WorkerHub()
    win = MainWindow(backend, hub)
    win.resize(*SIZES[""])
    win.move(0, 0)
    win.show()

    def until(cond, timeout: float = 60.0, what: str = "") -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise TimeoutError(what)
            app.processEvents()
            time.sleep(0.01)

    def pump(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)

    def shots(name: str) -> None:
        for suffix, size in SIZES.items():
            win.resize(*size)
            pump(0.6)
            pix = QApplication.primaryScreen().grabWindow(win.winId())
            path = out / f"{name}{suffix}.png"
            pix.save(str(path))
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
                  f"({pix.width()}x{pix.height()})")
        win.resize(*SIZES[""])

    done = []
    win.queue.finished.connect(lambda *a: done.append(a))
    win.library_view.add_folder(str(library))
    until(lambda: done, 300, "indexing")
    until(lambda: bool(win.library_view.infos), 10, "library refresh")

    view = win.search_view
    view.keyword_edit.setText("Places|Norway")
    view.rating_box.setCurrentIndex(view.rating_box.findData(3))
    job = view.run_text_query(demo_query)
    until(lambda: not job.running, 60, "search")
    view.grid.setFocus()
    view.grid.setCurrentIndex(view.model.index(0))
    until(lambda: all(view.model.index(r).data(ThumbnailStateRole) != "loading"
                      for r in range(view.model.rowCount())), 30, "thumbnails")
    shots("xmp-search-filters")

    names = [Path(view.model.hit(r).path).name for r in range(view.model.rowCount())]
    first = min(range(len(names)), key=lambda r: names[r])  # the picture with Lightroom's sidecar
    view.grid.setCurrentIndex(view.model.index(first))
    view.open_current()
    insp = win.inspector_view
    until(lambda: not insp.canvas.image().isNull(), 30, "inspector image")
    until(lambda: not insp.metadata_job.running, 30, "metadata")
    until(lambda: insp.ground_job is None or not insp.ground_job.running, 60, "grounding")
    shots("xmp-inspector")

    # Review of the captions already in the catalogue (the sidecars' descriptions), a verdict on
    # each, and the XMP export dialog showing its dry run (nothing is written).
    review = win.review_view
    win.tabs.setCurrentWidget(review)
    review.open_catalog_captions()
    until(lambda: review.session is not None and review.item is not None, 60, "catalogue captions")
    for i in range(len(review.session)):
        review.go_to(i)
        until(lambda i=i: review.item is not None and review.item.index == i, 30, "review item")
        review.set_verdict("faithful" if i else "unsure")
    review.go_to(0)
    until(lambda: review.item is not None and review.item.index == 0, 30, "first review item")
    until(lambda: review.hub.serial.activeThreadCount() == 0 and not review.canvas.image().isNull(), 60,
          "review saved and shown")
    pump(1.0)  # the grounding tints
    shots("xmp-review-catalogue")
    review.xmp_export_dialog()
    until(lambda: review.xmp_dialog is not None, 30, "xmp export dialog")
    dlg = review.xmp_dialog
    dlg.set_convention("darktable")
    dlg.keywords_edit.setText("Longlens|checked")
    dlg.description_box.setChecked(True)  # issue 28: the accepted captions as descriptions
    job = dlg.preview()
    until(lambda: not job.running, 60, "dry run")
    pump(0.6)
    pix = dlg.grab()  # the dialog itself (window-modal over the main window)
    path = out / "xmp-export-dialog.png"
    pix.save(str(path))
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({pix.width()}x{pix.height()})")
    dlg.close()
    win.close()
    backend.close()
    return 0


def main() -> int:
    shots = _screenshots_module()
    xvfb = shots.start_xvfb()
    home = Path(tempfile.mkdtemp(prefix="longlens-xmp-shots-"))
    os.environ["LONGLENS_HOME"] = str(home)
    try:
        return run(ROOT / "docs" / "screenshots", home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if xvfb is not None:
            xvfb.terminate()
            xvfb.wait(5)


if __name__ == "__main__":
    sys.exit(main())
