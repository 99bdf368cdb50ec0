"""Figures read off a model's config and a selection, with no model code: the prefill compute a selection
implies (`compute.py`) and the plain text table the command lines print (`text_table.py`). Imports nothing
of mipruner; imported by inllm/, the entry modules, serve/, eval/, bench/, lmms/ and the app's panels."""
