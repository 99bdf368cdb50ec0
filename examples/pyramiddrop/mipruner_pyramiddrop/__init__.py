"""PyramidDrop as a mipruner plug-in (the method lives in `pyramiddrop.py`)."""
