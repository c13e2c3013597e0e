"""The main views: library sidebar, search, inspector, review."""
