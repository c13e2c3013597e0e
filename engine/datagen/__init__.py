"""Synthetic training data from an OpenAI-compatible vision-language endpoint (docs/datagen.md).

client.py   chat-completions client: retries with backoff + jitter, Retry-After, token counts
prompts.py  editable prompt templates (prompts/*.txt, overridable with --prompts DIR)
parsing.py  numbered lists, paragraphs and scores out of free-form model answers
inputs.py   image folders and list files; images as downscaled data URLs
output.py   the resumable, line-at-a-time training JSONL
pipeline.py the per-image pipeline (datagen_job) and the SceneWorld mode (sceneworld_job)
cli.py      `longlens datagen`
fake_server.py  a scripted OpenAI-compatible server for tests and demos
"""
