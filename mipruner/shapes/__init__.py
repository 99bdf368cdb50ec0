"""The embedded toy model, shapes-llava: synthetic scenes and clips (`scenes`), its vocabulary and
processor (`vocab`), architecture (`model`), training data (`data`), recipe (`train`, run as
`python -m mipruner.shapes.train`) and held-out evaluation (`evaluate`). The library does not need
it; the app ships the trained model under assets/ so that it runs offline."""
