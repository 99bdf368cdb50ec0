"""LLaVA-OneVision: adapter, AnyRes-max layout and the random-weight builder at real shapes."""
