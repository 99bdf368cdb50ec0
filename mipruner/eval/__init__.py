"""Evaluation: `python -m mipruner.eval --help`. Paper-style tables for pruners x budgets."""
from .metrics import answer_matches, parse_yes_no, pope_metrics, query_recall, token_object_cover

__all__ = ["answer_matches", "parse_yes_no", "pope_metrics", "query_recall", "token_object_cover"]
