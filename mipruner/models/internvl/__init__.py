"""InternVL (InternVL3 -hf): adapter, tile layout and the random-weight builder at real shapes."""
