"""Issue 55 §10 against a hosted launch (SPACE_ID set, the embedded model, 127.0.0.1, `--max-sessions 4`,
`--new-sessions-per-min 20`): a flood of throw-away sessions from many addresses fills Gradio's own state store
many times over, and a visitor who encoded still sees its panels; the sessions the app keeps are bounded by
encoded sessions only (the fifth encoded session pushes out the first); one address opens at most its share of
new sessions (HTTP 429 past it) and keeps working in a session it has; the server's RSS comes back within 10%.
Addresses are told apart as on a Space, by the X-Forwarded-For its proxy appends."""
from __future__ import annotations

import time

import pytest

from components.core.kept import Kept, kept_in
from components.hosting.new_sessions import TOO_MANY_SESSIONS, NewSessions
from components.core.logic import UIState
from mipruner.serve.session import EncodingKey

from .test_bad_inputs import CTL, Raw
from .test_hosted_limits import EXAMPLE, rss, settles
from .test_space import start_space

SESSIONS = 4
NEW_PER_MIN = 20
STALE = "run the model first"


def from_address(url, address: str, session: str | None = None) -> Raw:
    """A session whose calls come from `address` (as a Space's proxy forwards it)."""
    import httpx

    raw = Raw(url, session)
    raw.http = httpx.Client(headers={"X-Forwarded-For": address})
    return raw


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    proc, url, _ = start_space(tmp_path_factory, TMPDIR=str(tmp_path_factory.mktemp("sessions-tmp")),
                               MIPRUNER_MODEL="shapes-llava", MIPRUNER_MAX_SESSIONS=str(SESSIONS),
                               MIPRUNER_NEW_SESSIONS_PER_MIN=str(NEW_PER_MIN))
    yield proc, url
    proc.terminate()
    proc.wait(30)


def encoded(url, address: str = "10.0.0.1") -> Raw:
    visitor = from_address(url, address)
    ok, out = visitor.call("encode", ["shapes-llava", "", "image", {"path": EXAMPLE["path"]}, None,
                                      EXAMPLE["prompt"], *CTL])
    assert ok and "196 visual tokens" in out[1], out
    return visitor


def view(visitor: Raw) -> tuple[bool, object, float]:
    t0 = time.perf_counter()
    ok, out = visitor.call("view", CTL)
    return ok, out, time.perf_counter() - t0


def test_throw_away_sessions_evict_no_visitor_who_encoded(space):
    proc, url = space
    visitor = encoded(url)
    ok, out, unloaded = view(visitor)
    assert ok, out
    start = rss(proc)
    refused = 0
    for i in range(12 * SESSIONS):  # 12x Gradio's store: every call a new session that reads nothing
        ok, _ = from_address(url, f"10.1.0.{i}").call("settings", ["not a settings string"])
        refused += not ok  # a sentence (the string is bad); the session took its place in Gradio's store anyway
    assert refused == 12 * SESSIONS
    ok, out, loaded = view(visitor)
    print(f"\nvisitor's view: {unloaded:.2f} s before, {loaded:.2f} s after {12 * SESSIONS} throw-away sessions")
    assert ok and STALE not in str(out), out
    assert settles(proc, start) <= start * 1.10


def test_the_kept_sessions_are_bounded_by_those_that_encoded(space):
    _, url = space
    first = encoded(url)
    for i in range(SESSIONS):  # four more encoded sessions: the first is the least recently used of five
        encoded(url, f"10.2.0.{i}")
    ok, out, _ = view(first)
    assert not ok and STALE in str(out), out


def settings(raw: Raw) -> tuple[bool, object]:
    """/settings with a bad string: (False, its sentence), or the refusal's text (HTTP 429)."""
    import httpx

    try:
        return raw.call("settings", ["x"])
    except httpx.HTTPStatusError as e:
        return False, e.response.text


def test_an_address_opens_a_bounded_number_of_new_sessions(space):
    _, url = space
    kept = from_address(url, "10.9.9.9")
    assert settings(kept)[1] != TOO_MANY_SESSIONS.format(burst=NEW_PER_MIN, rate=NEW_PER_MIN)
    got = [settings(from_address(url, "10.9.9.9"))[1] for _ in range(2 * NEW_PER_MIN)]
    refused = [g for g in got if g == TOO_MANY_SESSIONS.format(burst=NEW_PER_MIN, rate=NEW_PER_MIN)]
    # the bucket held 20 and refills by a third of a session a second while the calls run (a few seconds)
    assert NEW_PER_MIN <= len(refused) + 1 and len(got) - len(refused) <= NEW_PER_MIN + 6, (len(refused), len(got))
    ok, out = settings(kept)  # a session the address has already: passes (a sentence about the string)
    assert out != TOO_MANY_SESSIONS.format(burst=NEW_PER_MIN, rate=NEW_PER_MIN), out
    visitor = encoded(url, "10.0.0.2")  # another address opens its own
    assert view(visitor)[0]


def test_new_sessions_refill_by_the_minute_and_known_ones_pass():
    now = [0.0]
    gate = NewSessions(per_minute=6, burst=2, clock=lambda: now[0])
    assert gate.admit("a", "s1") and gate.admit("a", "s2") and not gate.admit("a", "s3")
    assert gate.admit("a", "s1") and gate.admit("b", "t1")  # a known session; another address's bucket
    assert not gate.admit("a", None)  # a call that gets a session of its own counts as new
    now[0] = 10.0  # one more a 10 s
    assert gate.admit("a", "s3") and not gate.admit("a", "s4")
    assert NewSessions(per_minute=0).admit("a", None)


def _state(n: int) -> UIState:
    return UIState(key=EncodingKey("m", f"media{n}", "p", "question", False))


def test_kept_keeps_encoded_states_by_recency_and_age():
    now = [0.0]
    kept = Kept(2, ttl_s=10, clock=lambda: now[0])
    a, b, c = _state(1), _state(2), _state(3)
    kept.keep("a", a)
    kept.keep("b", b)
    kept.keep("x", UIState())  # nothing encoded: takes no place
    kept.keep(None, c)  # no session: nothing kept
    assert len(kept) == 2 and kept.state("x", None) is None
    assert kept.state("a", None) is a  # found again, and now the most recent
    kept.keep("c", c)  # pushes out b, the least recently used
    assert kept.state("b", None) is None and kept.state("a", None) is a and kept.state("c", None) is c
    now[0] = 10.5  # a and c idle past the ttl
    assert kept.state("a", None) is None and len(kept) == 0
    assert kept.state("c", c) is c and len(kept) == 1  # a state the call brings is kept again


def test_kept_in_finds_the_encoded_state_among_outputs():
    s = _state(1)
    assert kept_in(("status", s, 3)) is s and kept_in(s) is s
    assert kept_in((UIState(), "x")) is None and kept_in("x") is None and kept_in(None) is None
    with pytest.raises(ValueError, match="at least 1"):
        Kept(0)
