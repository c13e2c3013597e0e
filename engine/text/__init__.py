"""Text shared by review, grounding, datagen and training: caption files and sentences.

`captions` is the one reader of caption/list files (JSONL, CSV/TSV, plain lists) and the one
mapping of a failed open to a message; `sentences` is the one sentence splitter; `language`
tells when a query is not in a language the model was trained on. Plain Python: no model, no Qt.
"""
