"""The paper's lambda rule: lambda = 1 for closed-form prompts, 0.5 for open ones.

"MI-Pruner: Crossmodal Mutual Information-guided Token Pruner for Efficient MLLMs" (Li, Tiulpin
and Blaschko, 2026 preprint), Sec. 4.1: "lambda = 0.5 for open-ended QA (GQA, MMVet) and lambda = 1 for closed-form
datasets (SQA multiple-choice, MME and POPE yes/no)"; Sec. 4.4: with multiple choice "the prompt
explicitly encodes the ground-truth cue". A closed-form prompt names what to look for, so
relevance alone (lambda = 1) keeps every patch of it; an open prompt ("what is ...") needs the
diversity term (lambda < 1) not to keep many near-identical patches of one thing.

    prompt_form("Is there a purple square?")              -> PromptForm("yes/no", 1.0)
    prompt_form("Which is red?\nA. cat\nB. dog")           -> PromptForm("multiple choice", 1.0)
    prompt_form("What colour is the circle?")              -> PromptForm("open", 0.5)

`LAM_RULE` is the registered parameter the MI methods declare: "auto" (the default) lets
`mipruner.select` set lambda from the encoding's prompt; "fixed" uses `lam` as given. Calling
`select` with `lam=` and no `lam_rule` means fixed. `mipruner.prune` on plain tensors has no
prompt: there `lam` is always used as given. English prompts only (the detector reads words).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ._registry import Param

LAM_CLOSED = 1.0  # paper Sec. 4.1: SQA, MME, POPE
LAM_OPEN = 0.5  # paper Sec. 4.1: GQA, MMVet (and Video-LLaVA's QA sets)
LAM_RULE = Param.choice("lam_rule", "auto", ("auto", "fixed"),
                        "auto: lam = 1 for yes/no and multiple-choice prompts, 0.5 for open ones (paper "
                        "Sec. 4.1; the lam value is then ignored); fixed: lam as set", code="lr")

# Words that open a yes/no question (auxiliaries and modals, with their negations).
_AUX = frozenset("""
is are was were am do does did have has had can could will would shall should may might must
isn't aren't wasn't weren't don't doesn't didn't haven't hasn't hadn't can't couldn't won't
wouldn't shouldn't
""".split())
_YES_NO_CUE = re.compile(r"\b(yes\s*(or|/)\s*no|no\s*(or|/)\s*yes|true\s*(or|/)\s*false)\b", re.I)
# Option labels: "A." "A)" "(A)" "A:" at a line start, or "(A)" inline; two distinct ones needed.
_OPTION = re.compile(r"(?:^|\n)\s*\(?([A-Ha-h1-8])[.):]\s+\S|\(([A-Ha-h])\)\s*\S")
_CHOICE_CUE = re.compile(r"\b(options?|choices?)\s*:|\boption'?s? letter\b|\bfrom the (given )?choices\b", re.I)


@dataclass(frozen=True)
class PromptForm:
    """What kind of question a prompt asks, and the lambda the paper uses for it."""

    kind: str  # "yes/no", "multiple choice" or "open"
    lam: float

    @property
    def closed(self) -> bool:
        return self.kind != "open"


def _sentences(prompt: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.?!])\s+|\n+", prompt) if s.strip()]


def _first_word(sentence: str) -> str:
    m = re.match(r"[^A-Za-z']*([A-Za-z']+)", sentence)
    return m.group(1).lower().replace("\u2019", "'") if m else ""


def is_multiple_choice(prompt: str) -> bool:
    """At least two option labels ("A." / "(B)" / "1)") or a cue such as "Options:": the paper's
    multiple-choice prompts, answered by one label, so the rule treats them as closed-form."""
    labels = {(a or b).upper() for a, b in _OPTION.findall(prompt)}
    return len(labels) >= 2 or bool(_CHOICE_CUE.search(prompt))


def is_yes_no(prompt: str) -> bool:
    """A question answered by yes or no: a sentence ending in "?" that opens with an auxiliary
    ("is there ...?", "does it ...?"), or an explicit "yes or no" cue."""
    if _YES_NO_CUE.search(prompt):
        return True
    return any(s.endswith("?") and _first_word(s) in _AUX and " or " not in s.lower() for s in _sentences(prompt))


def prompt_form(prompt: str) -> PromptForm:
    """The prompt's form (multiple choice, yes/no, open) and the paper's lambda for it."""
    prompt = prompt or ""
    if is_multiple_choice(prompt):
        return PromptForm("multiple choice", LAM_CLOSED)
    if is_yes_no(prompt):
        return PromptForm("yes/no", LAM_CLOSED)
    return PromptForm("open", LAM_OPEN)


def resolve_lam(kw: dict, prompt: str, default_lam: float) -> tuple[dict, str]:
    """The method's bound parameters with `lam` set by the rule, and a note saying which applied.

    kw: the parameters given (validated); no `lam_rule` means "fixed" when `lam` is given, else
    "auto". Returns a new dict (with `lam` and `lam_rule`) and e.g. "lam 1 (auto: yes/no)".
    """
    rule = kw.get("lam_rule", "fixed" if "lam" in kw else LAM_RULE.default)
    out = {**kw, "lam_rule": rule}
    if rule == "auto":
        form = prompt_form(prompt)
        out["lam"] = form.lam
        return out, f"lam {form.lam:g} (auto: {form.kind})"
    out["lam"] = kw.get("lam", default_lam)
    return out, f"lam {out['lam']:g} (fixed)"


__all__ = ["LAM_CLOSED", "LAM_OPEN", "LAM_RULE", "PromptForm", "is_multiple_choice", "is_yes_no", "prompt_form",
           "resolve_lam"]
