"""Benchmark commands (not tests): `python -m mipruner.bench {pruners,prefill,...} --help`.

Every figure is measured in one run and reported with the ratio it is judged by, never asserted
inside unit tests.
"""
