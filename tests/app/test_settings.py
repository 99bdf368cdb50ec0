"""The settings string, generated from the registry's specs: round trips, defaults, errors."""
import pytest

from components.core.settings import Settings
from mipruner.pruners import all_params


def test_settings_roundtrip_and_errors():
    st = Settings(methods=("mi", "random"), budget=64, lam=0.5, tau=0.1)
    s = st.to_string()
    assert s.startswith("m=mi,random&b=64&tm=question&ht=-1&lam=0.5&tau=0.1&agg=max&norm=softmax&mw=all&lr=auto&seed=0")
    # every registered parameter is a field, under its code, with its default
    fields = dict(part.split("=") for part in s.split("&"))
    for p in all_params().values():
        assert p.code in fields
    assert fields["theta"] == "1.0" and fields["dom"] == "0.84375" and fields["K"] == "2"
    assert Settings.parse(s) == st
    st2 = Settings(methods=("similarity",), budget=0.25, lam=1.0, tau=0.01, aggregation="mean",
                   normalization="minmax", text_mode="nostop", seed=3)
    assert Settings.parse(st2.to_string()) == st2 and isinstance(Settings.parse(st2.to_string()).budget, float)
    assert Settings.parse("?m=mi&b=32").budget == 32 and Settings.parse("").methods == Settings().methods
    assert st.params == {p.name: p.default for p in all_params().values()} | {"lam": 0.5, "tau": 0.1}
    st3 = Settings(methods=("cdpruner", "visionzip", "fastv"), theta=0.25, dominant_ratio=0.5, ratio=0.75, split=0.3,
                   layer=1, heat=2, use_cls=False)
    assert Settings.parse(st3.to_string()) == st3 and Settings.parse(st3.to_string()).params["use_cls"] is False
    assert st3.replace(budget=8).budget == 8 and st3.replace(budget=8).params == st3.params
    for bad, field in [("m=mii", "'m'"), ("b=0", "'b'"), ("b=1.5", "'b'"), ("b=abc", "'b'"),
                       ("lam=2", "'lam'"), ("tau=0", "'tau'"), ("agg=sum", "'agg'"), ("norm=l2", "'norm'"),
                       ("tm=all", "'tm'"), ("seed=-1", "'seed'"), ("zz=1", "'zz'"), ("lam", "'lam'"),
                       ("b=3&b=4", "'b'"), ("m=", "'m'"), ("m=mi,mi", "'m'"), ("theta=1.5", "'theta'"),
                       ("dom=-0.1", "'dom'"), ("vr=x", "'vr'"), ("split=2", "'split'"), ("ht=-2", "'ht'"),
                       ("ht=0.5", "'ht'"), ("K=0", "'K'"), ("K=1.5", "'K'"), ("use_cls=maybe", "'use_cls'"),
                       ("lam=nan", "'lam'")]:
        with pytest.raises(ValueError, match=field):
            Settings.parse(bad)


def test_settings_are_immutable():
    s = Settings()
    with pytest.raises(AttributeError):
        s.budget = 3
    p = s.params
    p["lam"] = 0.0
    assert s.params["lam"] == 0.5
