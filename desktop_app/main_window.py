"""The main window: library sidebar, Search / Inspector / Review tabs, menus, status bar."""

from __future__ import annotations

import gc
import html
from typing import Any

from PySide6.QtCore import QByteArray, QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop_app import theme
from desktop_app.background import WorkerHub
from desktop_app.dialogs import messages
from desktop_app.dialogs.duplicates_dialog import DuplicatesDialog
from desktop_app.dialogs.models_dialog import ModelsDialog
from desktop_app.dialogs.settings_dialog import SettingsDialog
from desktop_app.facade import Backend
from desktop_app.views.inspector_view import InspectorView
from desktop_app.views.library_view import IndexQueue, LibraryView
from desktop_app.views.review_view import ReviewView
from desktop_app.views.search_view import SearchView
from desktop_app.widgets.progress_panel import ProgressPanel

DEFAULT_SIZE = (1440, 900)
SHORTCUTS_HELP = """<h3>Keyboard</h3>
<table cellspacing=4>
<tr><td><b>Ctrl+Enter</b></td><td>search (from the query or any filter)</td></tr>
<tr><td><b>Ctrl+L / Ctrl+F</b></td><td>go to the query</td></tr>
<tr><td><b>Arrows</b></td><td>move in the results</td></tr>
<tr><td><b>Enter</b></td><td>open the selected result in the inspector</td></tr>
<tr><td><b>Space</b></td><td>quick look (results) · next item (review)</td></tr>
<tr><td><b>Ctrl+Shift+F</b></td><td>find pictures similar to the selected one</td></tr>
<tr><td><b>+ / − / 0 / Ctrl+1</b></td><td>zoom in / out / fit / 100% (inspector)</td></tr>
<tr><td><b>Esc / Backspace</b></td><td>back to the results (inspector)</td></tr>
<tr><td><b>J / K, Alt+→ / Alt+←</b></td><td>next / previous result (inspector)</td></tr>
<tr><td><b>Backspace</b></td><td>previous item (review)</td></tr>
<tr><td><b>1 / 2 / 3</b></td><td>faithful / unfaithful / unsure (review)</td></tr>
<tr><td><b>↑ / ↓, N</b></td><td>pick item or sentence, write a note (review)</td></tr>
<tr><td><b>F</b></td><td>full screen (review)</td></tr>
<tr><td><b>Alt+1 / 2 / 3</b></td><td>Search / Inspector / Review</td></tr>
</table>"""


class MainWindow(QMainWindow):
    closed = Signal()

    def __init__(self, backend: Backend, hub: WorkerHub, *, initial_query: str | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.backend = backend
        self.hub = hub
        self.setWindowTitle("Longlens")
        self.setAcceptDrops(False)
        self._initial_query = initial_query
        self._search_after_index: str | None = None
        self._shut = False
        self._status_error: str | None = None  # the error the status bar shows, until something works
        self.dialogs: list[QWidget] = []

        self.queue = IndexQueue(backend, hub, self)
        self.library_view = LibraryView(backend, hub, self.queue)
        self.search_view = SearchView(backend, hub)
        self.inspector_view = InspectorView(backend, hub)
        self.review_view = ReviewView(backend, hub)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.search_view, "Search")
        self.tabs.addTab(self.inspector_view, "Inspector")
        self.tabs.addTab(self.review_view, "Review")

        self.model_label = QLabel("")
        self.model_label.setObjectName("model-banner")
        self.model_label.setWordWrap(True)
        self.model_label.setTextFormat(Qt.TextFormat.RichText)
        models_button = QPushButton("Models…")
        models_button.setObjectName("models-button")
        # Never the keyboard's resting place: after a view switch typed text and Space went here
        # (Space opened the dialog). The dialog stays one key away in File > Models….
        models_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        models_button.clicked.connect(self.open_models)
        self.models_button = models_button
        banner = QHBoxLayout()
        banner.setContentsMargins(12, 8, 12, 0)
        banner.addWidget(self.model_label, 1)
        banner.addWidget(models_button)
        self.banner = QWidget()
        self.banner.setLayout(banner)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(0)
        rl.addWidget(self.banner)
        rl.addWidget(self.tabs, 1)

        split = QSplitter()
        split.addWidget(self.library_view)
        split.addWidget(right)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([280, DEFAULT_SIZE[0] - 280])
        self.setCentralWidget(split)

        self.progress_panel = ProgressPanel()
        self.statusBar().addPermanentWidget(self.progress_panel)
        self.progress_panel.cancel_requested.connect(self.queue.cancel)

        self._build_menus()
        self._connect()
        self.resize(*DEFAULT_SIZE)
        geometry = backend.settings().get("window_geometry")
        if geometry:
            self.restoreGeometry(QByteArray.fromHex(geometry.encode("ascii")))
        # What is alive once the window is built (Qt wrappers, torch and transformers modules)
        # lives as long as the app. Freezing it keeps Python's full garbage collections from
        # rescanning it each time: on a large heap such a pass holds the GIL long enough to
        # stall the event loop (measured: a 335 ms gap while indexing, 32 ms with it frozen).
        gc.freeze()
        QTimer.singleShot(0, self.start)

    # -- set-up --------------------------------------------------------------------------------
    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.add_action = self._action(file_menu, "&Add photo folder…", "Ctrl+O", self.library_view.add_folder_dialog)
        self._action(file_menu, "Open &caption file for review…", "Ctrl+Shift+O", self.open_review_dialog)
        self._action(file_menu, "&Review the captions already in the catalogue", None, self.review_catalog_captions)
        self._action(file_menu, "Find &duplicates…", None, self.open_duplicates)
        file_menu.addSeparator()
        self._action(file_menu, "&Settings…", "Ctrl+,", self.open_settings)
        self._action(file_menu, "&Models…", None, self.open_models)
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", "Ctrl+Q", self.close)
        view = self.menuBar().addMenu("&View")
        self._action(view, "&Search", "Alt+1", lambda: self.show_view(self.search_view))
        self._action(view, "&Inspector", "Alt+2", lambda: self.show_view(self.inspector_view))
        self._action(view, "&Review", "Alt+3", lambda: self.show_view(self.review_view))
        focus = self._action(view, "Go to the &query", "Ctrl+L", self.focus_query)
        focus.setShortcuts([QKeySequence("Ctrl+L"), QKeySequence("Ctrl+F")])
        view.addSeparator()
        self._action(view, "Full screen", "F11", self.toggle_full_screen)
        help_menu = self.menuBar().addMenu("&Help")
        self._action(help_menu, "&Keyboard shortcuts", None,
                     lambda: messages.show_info(self, "Keyboard shortcuts", SHORTCUTS_HELP))
        self._action(help_menu, "&About Longlens", None, lambda: messages.show_info(
            self, "About Longlens",
            "Longlens searches your photos with paragraph-length descriptions, on this computer. "
            f"Data folder: {self.backend.paths.data}"))

    def _action(self, menu, text: str, shortcut: str | None, slot) -> QAction:
        a = QAction(text, self)
        if shortcut:
            a.setShortcut(QKeySequence(shortcut))
        a.triggered.connect(slot)
        menu.addAction(a)
        return a

    def show_view(self, view: QWidget) -> None:
        """Switch views and give the keyboard to the view's own place (query, picture, review)."""
        self.tabs.setCurrentWidget(view)
        view.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def focus_query(self) -> None:
        self.tabs.setCurrentWidget(self.search_view)
        self.search_view.focus_query()

    def _view_changed(self, _index: int) -> None:
        # However the view changed (Alt+1, a click on the tab, opening a result), the keyboard
        # must not stay with whatever Qt picked when the old page was hidden (the Models… button
        # or a filter): it goes to the new view's own place, unless the tab bar itself has it.
        if not self.tabs.tabBar().hasFocus():
            self.tabs.currentWidget().setFocus(Qt.FocusReason.OtherFocusReason)

    def _connect(self) -> None:
        self.tabs.currentChanged.connect(self._view_changed)
        self.library_view.index_requested.connect(self.queue.enqueue)
        self.library_view.libraries_changed.connect(self.search_view.set_libraries)
        self.queue.started.connect(self._index_started)
        self.queue.progress.connect(self._index_progress)
        self.queue.finished.connect(self._index_finished)
        self.search_view.open_hit.connect(self.open_in_inspector)
        self.search_view.add_folder_requested.connect(self.library_view.add_folder_dialog)
        self.search_view.demo_requested.connect(self.open_demo)
        self.inspector_view.find_similar.connect(self.find_similar)
        self.inspector_view.back_requested.connect(self.back_to_results)
        self.inspector_view.step_requested.connect(self.step_result)
        self.inspector_view.exported.connect(self._overlay_exported)
        self.inspector_view.status_message.connect(lambda text: self.statusBar().showMessage(text, 15000))
        self.search_view.results_shown.connect(lambda _n: self.action_succeeded())
        self.review_view.full_screen_changed.connect(self._review_full_screen)

    def start(self) -> None:
        self.library_view.refresh()
        self.update_model_banner()
        if self._initial_query:
            self.search_view.run_text_query(self._initial_query)
            self._initial_query = None

    # -- status line -------------------------------------------------------------------------------
    def show_status_error(self, text: str) -> None:
        """An error in the status bar stays until the next action that works (action_succeeded)."""
        self._status_error = text
        self.statusBar().showMessage(text)

    def action_succeeded(self) -> None:
        """Something worked: an error still shown in the status bar or the search view is stale."""
        if self._status_error is not None:
            if self.statusBar().currentMessage() == self._status_error:
                self.statusBar().clearMessage()
            self._status_error = None
        self.search_view.clear_error()

    # -- model banner ----------------------------------------------------------------------------
    def update_model_banner(self) -> None:
        self.hub.call(self.backend.model_state, on_result=self._show_model_state)

    def _show_model_state(self, state: Any) -> None:
        warn = theme.warning_colour()
        if state.name is None:
            self.model_label.setText(f'<span style="color:{warn}"><b>No model ready.</b> '
                                     f"{html.escape(state.problem or '')}</span>")
        elif state.notice:
            self.model_label.setText(f"Model <b>{html.escape(state.name)}</b> · "
                                     f'<span style="color:{warn}"><b>{html.escape(state.notice)}</b></span>')
        else:
            self.model_label.setText(f"Model <b>{html.escape(state.name)}</b>")
        previous = getattr(self, "model_state", None)
        self.model_state = state
        if state.name is not None and previous is not None and previous.name != state.name:
            self.search_view._update_budget()  # a model now reads the query: its errors are past

    # -- indexing ------------------------------------------------------------------------------------
    def _index_started(self, root: str) -> None:
        self.progress_panel.begin(f"Indexing {root}")

    def _index_progress(self, p: Any) -> None:
        if p.stage == "load":
            self.progress_panel.update_progress(p.stage, 0, None, "Loading the model…", None, None)
        elif p.stage == "scan":
            self.progress_panel.update_progress(p.stage, p.done, p.total, f"Scanning: {p.message}", None, None)
        elif p.stage == "index":
            self.progress_panel.update_progress(p.stage, p.done, p.total, f"Indexing {p.message}", p.rate, p.eta_s)

    def _index_finished(self, root: str, summary: Any, error: str) -> None:
        if self._shut:
            return
        if not self.queue.busy:
            self.progress_panel.end()
        if error:
            self.show_status_error(f"Indexing {root} failed: {error}")
            messages.show_error(self, "Indexing failed", error)
            return
        if summary is None:
            self.statusBar().showMessage(f"Indexing {root} was cancelled before it started.", 10000)
            return
        if summary.offline:
            text = f"{root} is offline or missing; nothing was changed."
        elif summary.cancelled:
            text = (f"Indexing cancelled: {summary.new + summary.changed} images committed are kept; "
                    "re-scan to finish.")
        else:
            text = (f"Indexed {root}: {summary.new} new, {summary.changed} changed, {summary.moved} moved, "
                    f"{summary.deleted} removed, {summary.unchanged} unchanged in {summary.elapsed_s:.1f} s")
            if summary.reembedded:
                text += (f"; {summary.reembedded} re-embedded because model {summary.model_id} changed since "
                         "they were indexed")
            if summary.unreadable:
                text += f"; {len(summary.unreadable)} unreadable (see the library panel)"
        self.action_succeeded()
        self.statusBar().showMessage(text, 20000)
        self.last_index_message = text
        if self._search_after_index and not summary.cancelled:
            query, self._search_after_index = self._search_after_index, None
            self.tabs.setCurrentWidget(self.search_view)
            self.search_view.run_text_query(query)

    # -- demo ------------------------------------------------------------------------------------------
    def open_demo(self) -> None:
        self.statusBar().showMessage("Preparing the demo collection…")

        def ready(folder: str) -> None:
            self.update_model_banner()
            self._search_after_index = self.backend.demo_query()
            self.queue.enqueue(folder)

        def failed(message: str) -> None:
            self.show_status_error(f"The demo collection could not be prepared: {message}")
            messages.show_error(self, "Demo collection", message)

        self.hub.call(self.backend.demo_setup, on_result=ready, on_error=failed)

    # -- navigation between views -------------------------------------------------------------------------
    def open_in_inspector(self, hit: Any, query: dict) -> None:
        self.inspector_view.show_hit(hit, query)
        self.tabs.setCurrentWidget(self.inspector_view)
        self.inspector_view.canvas.setFocus()

    def _overlay_exported(self, path: str) -> None:
        self.action_succeeded()
        self.statusBar().showMessage(f"Overlay saved to {path}", 15000)

    def back_to_results(self) -> None:
        self.tabs.setCurrentWidget(self.search_view)
        self.search_view.focus_results()

    def step_result(self, step: int) -> None:
        """Next / previous result in the inspector, in the order the results grid shows them."""
        hit = self.search_view.step_result(step)
        if hit is None:
            self.statusBar().showMessage("This is the last result." if step > 0 else "This is the first result.",
                                         5000)
            return
        self.inspector_view.show_hit(hit, dict(self.search_view.query))

    def find_similar(self, path: str) -> None:
        self.tabs.setCurrentWidget(self.search_view)
        self.search_view.search_image(path)

    def open_review_dialog(self) -> None:
        self.tabs.setCurrentWidget(self.review_view)
        self.review_view.open_dialog()

    def review_catalog_captions(self) -> None:
        self.tabs.setCurrentWidget(self.review_view)
        self.review_view.open_catalog_captions()

    def toggle_full_screen(self) -> None:
        self.showNormal() if self.isFullScreen() else self.showFullScreen()

    def _review_full_screen(self, on: bool) -> None:
        """Review's full screen (F) is for the picture and its caption: no library panel, no banner."""
        self.library_view.setVisible(not on)
        self.banner.setVisible(not on)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        # However full screen ends (F, Esc, F11, the window manager), the panels come back.
        if event.type() == QEvent.Type.WindowStateChange and not self.isFullScreen():
            self._review_full_screen(False)

    # -- dialogs ----------------------------------------------------------------------------------------
    def open_settings(self) -> SettingsDialog:
        dlg = SettingsDialog(self.backend, self.hub, self)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
        dlg.saved.connect(self._settings_saved)
        dlg.open()
        return dlg

    def _settings_saved(self, values: dict) -> None:
        from PySide6.QtWidgets import QApplication

        theme.apply_theme(QApplication.instance(), values.get("theme") or "system")
        self.action_succeeded()
        self.search_view.top_spin.setValue(int(values.get("top_k") or 200))
        self.update_model_banner()
        self.search_view._update_budget()

    def open_duplicates(self) -> DuplicatesDialog:
        dlg = DuplicatesDialog(self.backend, self.hub, self)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
        dlg.open()
        return dlg

    def open_models(self) -> ModelsDialog:
        dlg = ModelsDialog(self.backend, self.hub, self)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
        dlg.models_changed.connect(self.update_model_banner)
        dlg.open()
        return dlg

    # -- shutdown ------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Cancel indexing and every background call, and wait for the threads (called on close)."""
        if self._shut:
            return
        self._shut = True
        self.queue.cancel()
        self.library_view.shutdown()
        self.search_view.shutdown()
        self.hub.shutdown()
        try:
            self.backend.save_settings({"window_geometry": bytes(self.saveGeometry().toHex()).decode("ascii")})
        except OSError:
            pass  # a read-only config folder must not block quitting

    def closeEvent(self, event) -> None:
        self.shutdown()
        self.closed.emit()
        super().closeEvent(event)
