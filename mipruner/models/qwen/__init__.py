"""The Qwen VL line (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): adapters, attention capture, video rules, batched
decoding and the random-weight builder at real shapes."""
