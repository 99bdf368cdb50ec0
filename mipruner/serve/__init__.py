"""Answering on one loaded model: the batched answers (`mipruner.answer_batch`: `batch.py`, its time
split `answer_time.py`, a broken method's one sentence `failures.py`) and, above them, the app's model
service (`service.ModelService`: one model, many visitors' sessions, their turns, caches, panels and
exports). Imports the entry modules, `viz/` and `measure/`; imported by the package's front door, testing,
eval/, bench/, lmms/ and the app (components/ reads the library through `serve.service`).

This package's own import is empty: importing `mipruner.serve.batch` does not load the service."""
