"""The paragraph-supervision recipe: data, losses, configs C1–C10, trainer, the study, matching-head
training. Imported by commands and jobs (engine/cli/, datagen), never by a run-time module: an
import-linter contract in pyproject.toml says so."""
