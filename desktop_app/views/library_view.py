"""Library sidebar: the indexed folders with their status, and the indexing queue behind it."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from PySide6.QtCore import QObject, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from desktop_app.background import Job, WorkerHub
from desktop_app.dialogs import messages
from desktop_app.facade import Backend, LibraryInfo, display_text

LibraryIdRole = Qt.ItemDataRole.UserRole + 1
RootRole = Qt.ItemDataRole.UserRole + 2
# While a folder is shown offline, the app looks this often whether it is back (a drive plugged
# in, a share mounted) and then shows it as it is, without a re-scan: one stat per offline folder,
# in a worker (a hung network mount never blocks the window).
OFFLINE_LOOK_MS = 3000


class IndexQueue(QObject):
    """Index jobs, one at a time, in the order asked. Emits what the window shows."""

    # Roots travel as Python objects (a non-UTF-8 folder name would not survive a QString).
    started = Signal(object)  # root
    progress = Signal(object)  # engine Progress
    finished = Signal(object, object, str)  # root, summary (or None), error message ("" if none)
    queue_changed = Signal()

    def __init__(self, backend: Backend, hub: WorkerHub, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.backend = backend
        self.hub = hub
        self._queue: deque[str] = deque()
        self.current: Job | None = None
        self.current_root: str | None = None

    def enqueue(self, root: str) -> None:
        root = str(Path(root).expanduser().resolve())
        if root == self.current_root or root in self._queue:
            return
        self._queue.append(root)
        self.queue_changed.emit()
        self._next()

    def pending(self) -> list[str]:
        out = list(self._queue)
        if self.current_root:
            out.insert(0, self.current_root)
        return out

    def cancel(self) -> None:
        """Cancel the running job (the engine stops after its current batch) and the queue."""
        self._queue.clear()
        if self.current is not None:
            self.current.cancel()
        self.queue_changed.emit()

    @property
    def busy(self) -> bool:
        return self.current is not None

    def _next(self) -> None:
        if self.current is not None or not self._queue:
            return
        root = self._queue.popleft()
        self.current_root = root
        holder: list[Job] = []
        job = self.hub.start_job(self.backend.index_job(root), name=f"index {root}",
                                 on_progress=self.progress.emit,
                                 on_finished=lambda r=root: self._done(holder[0], r))
        holder.append(job)
        self.current = job
        self.started.emit(root)
        self.queue_changed.emit()

    def _done(self, job: Job, root: str) -> None:
        summary = None
        if job.result is not None:
            summary = job.result.extra.get("summary")
        error = job.error or ""  # a cancelled job has a summary (or none, if cancelled early), no error
        self.current = None
        self.current_root = None
        self.finished.emit(root, summary, error)
        self.queue_changed.emit()
        self._next()


def describe(info: LibraryInfo, queued: bool) -> str:
    """Second line of a library entry: its state and counts."""
    if queued:  # a folder that is back is re-scanned (the run says if it is still offline)
        state = "Indexing…"
    elif info.offline:
        state = "Offline (missing or unmounted; nothing removed)"
    elif info.partial:
        # A cancelled or interrupted run: the engine's words ("partly indexed · N pending").
        state = info.state[:1].upper() + info.state[1:]
    elif not info.scanned:
        state = "Pending: not fully indexed"
    else:
        state = "Indexed"
    parts = [f"{info.indexed} photo{'s' if info.indexed != 1 else ''}"]
    if info.unreadable:
        parts.append(f"{info.unreadable} unreadable")
    return f"{state} · {', '.join(parts)}"


class LibraryView(QWidget):
    """Folders with status (indexed / pending / unreadable / offline); add, re-scan, remove."""

    index_requested = Signal(object)  # folder path
    libraries_changed = Signal(list)  # list[LibraryInfo]

    def __init__(self, backend: Backend, hub: WorkerHub, queue: IndexQueue, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.backend = backend
        self.hub = hub
        self.queue = queue
        self.infos: list[LibraryInfo] = []
        self.setAcceptDrops(True)
        self.setMinimumWidth(240)

        title = QLabel("<b>Library</b>")
        hint = QLabel("Drop folders here to add them.")
        hint.setEnabled(False)
        hint.setWordWrap(True)
        self.list = QListWidget()
        self.list.setObjectName("library-list")
        self.list.setIconSize(QSize(20, 20))
        self.list.setWordWrap(True)
        self.list.setSpacing(2)
        self.list.setAlternatingRowColors(True)
        self.list.itemSelectionChanged.connect(self._update_buttons)
        self.list.itemDoubleClicked.connect(lambda _i: self.show_unreadable())

        self.add_button = QPushButton("Add folder…")
        self.rescan_button = QPushButton("Re-scan")
        self.remove_button = QPushButton("Remove")
        self.unreadable_button = QPushButton("Unreadable files…")
        self.add_button.clicked.connect(self.add_folder_dialog)
        self.rescan_button.clicked.connect(self.rescan_selected)
        self.remove_button.clicked.connect(self.remove_selected)
        self.unreadable_button.clicked.connect(self.show_unreadable)
        self.remove_button.setToolTip("Forget this folder in Longlens. Your photos are not touched.")
        self.rescan_button.setToolTip("Look for new, changed, moved and deleted files")

        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(title)
        lay.addWidget(self.list, 1)
        lay.addWidget(hint)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.rescan_button)
        lay.addLayout(row)
        row2 = QHBoxLayout()
        row2.addWidget(self.remove_button)
        row2.addWidget(self.unreadable_button)
        lay.addLayout(row2)

        queue.queue_changed.connect(self._render)
        queue.finished.connect(lambda *_: self.refresh())
        self.offline_look = QTimer(self)
        self.offline_look.setInterval(OFFLINE_LOOK_MS)
        self.offline_look.timeout.connect(self.look_at_offline)
        self._look_job: Job | None = None
        self._update_buttons()

    # -- data --------------------------------------------------------------------------------
    def refresh(self) -> Job:
        return self.hub.call(self.backend.libraries, on_result=self._set_infos,
                             on_error=lambda msg: messages.show_error(self, "Library", msg))

    def _set_infos(self, infos: list[LibraryInfo]) -> None:
        self.infos = infos
        self._render()
        self.libraries_changed.emit(infos)
        if any(i.offline for i in infos):
            self.offline_look.start()
        else:
            self.offline_look.stop()

    def look_at_offline(self) -> Job | None:
        """Is a folder shown offline back? Then the list is read again (the catalog clears the
        offline state as it reads it), so it shows online without a re-scan."""
        offline = [i.root for i in self.infos if i.offline]
        if not offline or (self._look_job is not None and self._look_job.running):
            return None
        self._look_job = self.hub.call(self.backend.reachable_roots, offline,
                                       on_result=lambda back: self.refresh() if back else None)
        return self._look_job

    def shutdown(self) -> None:
        self.offline_look.stop()

    def _render(self) -> None:
        selected = self.selected_root()
        pending = set(self.queue.pending())
        self.list.clear()
        style = self.style()
        shown = set()
        for info in self.infos:
            queued = info.root in pending
            shown.add(info.root)
            icon = style.standardIcon(
                QStyle.StandardPixmap.SP_DriveNetIcon if info.offline else QStyle.StandardPixmap.SP_DirIcon
            )
            name = display_text(Path(info.root).name or info.root)
            item = QListWidgetItem(icon, f"{name}\n{describe(info, queued)}")
            item.setToolTip(display_text(info.root))
            item.setData(LibraryIdRole, info.id)
            item.setData(RootRole, info.root)
            if info.offline:
                item.setForeground(self.palette().color(self.palette().ColorRole.PlaceholderText))
            self.list.addItem(item)
            if info.root == selected:
                item.setSelected(True)
        for root in pending - shown:  # added, first scan not started yet
            item = QListWidgetItem(style.standardIcon(QStyle.StandardPixmap.SP_DirIcon),
                                   f"{Path(root).name or root}\nqueued for indexing")
            item.setToolTip(root)
            item.setData(RootRole, root)
            self.list.addItem(item)
        self._update_buttons()

    def item_texts(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def selected_info(self) -> LibraryInfo | None:
        items = self.list.selectedItems()
        if not items:
            return None
        lib_id = items[0].data(LibraryIdRole)
        return next((i for i in self.infos if i.id == lib_id), None)

    def selected_root(self) -> str | None:
        items = self.list.selectedItems()
        return items[0].data(RootRole) if items else None

    def select_root(self, root: str) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(RootRole) == root:
                self.list.setCurrentRow(i)
                return

    def _update_buttons(self) -> None:
        info = self.selected_info()
        self.rescan_button.setEnabled(info is not None)
        self.remove_button.setEnabled(info is not None and info.root != self.queue.current_root)
        self.unreadable_button.setEnabled(info is not None and info.unreadable > 0)

    # -- actions -------------------------------------------------------------------------------
    def add_folder_dialog(self) -> None:
        path = messages.choose_folder(self, "Add a photo folder")
        if path:
            self.add_folder(path)

    def add_folder(self, path: str) -> bool:
        problem = self.backend.check_folder(path)
        if problem is not None:
            messages.show_error(self, "Cannot add this folder", problem)
            return False
        self.index_requested.emit(str(Path(path).expanduser().resolve()))
        return True

    def rescan_selected(self) -> None:
        info = self.selected_info()
        if info is None:
            return
        if info.offline:
            # Shown offline at the last look: look again now (the drive may be back since).
            if not self.backend.reachable_roots([info.root]):
                messages.show_error(self, "Folder offline",
                                    f"{info.root} is missing or unmounted. Connect the drive and try again; "
                                    "nothing in the catalog was removed.")
                self.refresh()
                return
        self.index_requested.emit(info.root)
        if info.offline:
            self.refresh()  # it is back: shown as it is (the run clears the offline state)

    def remove_selected(self) -> None:
        info = self.selected_info()
        if info is None:
            return
        if not messages.confirm(self, "Remove folder",
                                f"Remove {info.root} from Longlens?\n\nIts search index and review data "
                                "links are forgotten. Your photos stay exactly where they are."):
            return
        self.hub.call(self.backend.remove_library, info.id, on_result=lambda _r: self.refresh(),
                      on_error=lambda msg: messages.show_error(self, "Remove folder", msg))

    def show_unreadable(self) -> None:
        info = self.selected_info()
        if info is None or not info.unreadable:
            return

        def shown(rows: list[tuple[str, str]]) -> None:
            lines = [f"{path}: {reason}" for path, reason in rows[:200]]
            more = f"\n… and {len(rows) - 200} more" if len(rows) > 200 else ""
            messages.show_info(self, f"Unreadable files in {Path(info.root).name}",
                               f"{len(rows)} files could not be read and are not searchable:\n\n"
                               + "\n".join(lines) + more)

        self.hub.call(self.backend.unreadable, info.id, on_result=shown)

    # -- drag and drop -------------------------------------------------------------------------
    @staticmethod
    def _folders(mime) -> list[str]:
        if not mime.hasUrls():
            return []
        return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and Path(u.toLocalFile()).is_dir()]

    def dragEnterEvent(self, event) -> None:
        if self._folders(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event) -> None:
        self.dragEnterEvent(event)

    def dropEvent(self, event) -> None:
        folders = self._folders(event.mimeData())
        for f in folders:
            self.add_folder(f)
        if folders:
            event.acceptProposedAction()
