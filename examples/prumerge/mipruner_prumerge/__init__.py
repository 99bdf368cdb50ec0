"""LLaVA-PruMerge as a mipruner plug-in (the method lives in `prumerge.py`)."""
