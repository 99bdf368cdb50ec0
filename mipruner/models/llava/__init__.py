"""The LLaVA line on a CLIP tower (LLaVA-1.5, LLaVA-NeXT, Video-LLaVA): adapters, token geometry and the
random-weight builders at real shapes."""
