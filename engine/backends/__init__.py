"""Model backends, one package each (blip/, sceneworld_mini/), each exporting one BACKEND object.

Nothing imports a backend package by name except the registry (engine/models/registry.py), which
loads it with importlib the first time the backend is asked for; see engine/models/backend.py for
the interface a backend fills in.
"""
