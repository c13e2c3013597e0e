"""Dialogs: settings, models, and the small helpers every view uses to ask and to tell."""
