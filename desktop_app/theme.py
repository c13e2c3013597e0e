"""Light and dark palettes; by default the app follows the system's colour scheme."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

THEMES = ("system", "light", "dark")

# Colours shared by views (scores, warnings) that must read well on both palettes.
WARNING_LIGHT = "#8a5a00"
WARNING_DARK = "#f0b44c"


def resolve(mode: str) -> str:
    """'light' or 'dark' for a setting of system / light / dark."""
    if mode in ("light", "dark"):
        return mode
    scheme = QGuiApplication.styleHints().colorScheme()
    return "dark" if scheme == Qt.ColorScheme.Dark else "light"


def _dark_palette() -> QPalette:
    p = QPalette()
    base, window, text = QColor(30, 31, 34), QColor(43, 45, 48), QColor(223, 225, 229)
    roles = {
        QPalette.ColorRole.Window: window,
        QPalette.ColorRole.WindowText: text,
        QPalette.ColorRole.Base: base,
        QPalette.ColorRole.AlternateBase: QColor(38, 40, 43),
        QPalette.ColorRole.ToolTipBase: QColor(55, 57, 61),
        QPalette.ColorRole.ToolTipText: text,
        QPalette.ColorRole.PlaceholderText: QColor(130, 134, 140),
        QPalette.ColorRole.Text: text,
        QPalette.ColorRole.Button: QColor(52, 54, 58),
        QPalette.ColorRole.ButtonText: text,
        QPalette.ColorRole.BrightText: QColor(255, 110, 110),
        QPalette.ColorRole.Highlight: QColor(53, 116, 240),
        QPalette.ColorRole.HighlightedText: QColor(255, 255, 255),
        QPalette.ColorRole.Link: QColor(110, 160, 255),
        QPalette.ColorRole.Mid: QColor(70, 72, 76),
        QPalette.ColorRole.Dark: QColor(20, 21, 23),
        QPalette.ColorRole.Light: QColor(80, 82, 86),
    }
    for role, colour in roles.items():
        p.setColor(role, colour)
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText, QPalette.ColorRole.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(120, 123, 128))
    return p


def _light_palette() -> QPalette:
    p = QPalette()
    roles = {
        QPalette.ColorRole.Window: QColor(242, 243, 245),
        QPalette.ColorRole.WindowText: QColor(28, 30, 33),
        QPalette.ColorRole.Base: QColor(255, 255, 255),
        QPalette.ColorRole.AlternateBase: QColor(246, 247, 249),
        QPalette.ColorRole.Text: QColor(28, 30, 33),
        QPalette.ColorRole.Button: QColor(233, 235, 238),
        QPalette.ColorRole.ButtonText: QColor(28, 30, 33),
        QPalette.ColorRole.Highlight: QColor(38, 103, 224),
        QPalette.ColorRole.HighlightedText: QColor(255, 255, 255),
        QPalette.ColorRole.PlaceholderText: QColor(128, 132, 138),
        QPalette.ColorRole.ToolTipBase: QColor(255, 255, 240),
        QPalette.ColorRole.ToolTipText: QColor(28, 30, 33),
        QPalette.ColorRole.Link: QColor(30, 90, 200),
    }
    for role, colour in roles.items():
        p.setColor(role, colour)
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText, QPalette.ColorRole.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(150, 153, 158))
    return p


def is_dark(app: QApplication | None = None) -> bool:
    app = app or QApplication.instance()
    return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def warning_colour() -> str:
    return WARNING_DARK if is_dark() else WARNING_LIGHT


def apply_theme(app: QApplication, mode: str = "system") -> str:
    """Apply Fusion with a light or dark palette; returns the scheme used."""
    app.setStyle("Fusion")
    scheme = resolve(mode)
    app.setPalette(_dark_palette() if scheme == "dark" else _light_palette())
    font = app.font()
    if font.pointSizeF() < 10:
        font.setPointSizeF(10)
        app.setFont(font)
    app.setProperty("longlens_theme_mode", mode)
    return scheme


def follow_system(app: QApplication) -> None:
    """Re-apply the palette when the system switches light/dark (only while set to 'system')."""

    def changed(_scheme: Qt.ColorScheme) -> None:
        if (app.property("longlens_theme_mode") or "system") == "system":
            apply_theme(app, "system")

    QGuiApplication.styleHints().colorSchemeChanged.connect(changed)


def monospace_font() -> QFont:
    f = QFont("monospace")
    f.setStyleHint(QFont.StyleHint.Monospace)
    return f
