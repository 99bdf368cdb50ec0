"""What every model family's decoding shares (no family code here): the rows of a batch grouped by
length and prefilled as padded batches (`rows.py`), the greedy loop and the compiled path."""
