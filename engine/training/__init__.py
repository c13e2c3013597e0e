"""The paragraph-supervision recipe: data, losses, configs C1–C10, trainer. Only the CLI imports it."""
