"""Plug-ins from files and modules (`mipruner.plugins`): a good one reaches every front door; each broken
kind (import error, a taken name, a contradicting parameter, no method, each contract break) is left out
with one sentence naming it while every other method keeps working; `mipruner.testing.check_pruner` and
`python -m mipruner.check_pruner` report what a method breaks. The installed example package, the
command lines and the app: tests/test_plugin_package.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import mipruner
from mipruner import plugins as P
from mipruner.pruners import _registry
from mipruner.pruners._registry import ContractError
from mipruner.testing import check_pruner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = "import torch\nfrom mipruner import Param, Selection, register_pruner\n"
# A method keeping `budget` tokens as `order_expr` says (n: N_V, k: budget, dev: the inputs' device).
METHOD = '''
@register_pruner({name!r}, label={name!r}, params={params})
def {fn}(visual, text, budget{kw}):
    """A test method."""
    n, k, dev = visual.shape[0], budget, visual.device
    order = {order_expr}
    return Selection.from_order(order, torch.zeros(n, device=dev))
'''
FIRST_K = "torch.arange(k, device=dev)"


def method(name: str, order_expr: str = FIRST_K, params: str = "()", kw: str = "", fn: str = "") -> str:
    return METHOD.format(name=name, order_expr=order_expr, params=params, kw=kw, fn=fn or f"m_{name}")


def write(tmp_path, stem: str, body: str) -> str:
    path = tmp_path / f"{stem}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return str(path)


@pytest.fixture(autouse=True)
def registry():
    """Each test loads into the process's registry; it is restored afterwards."""
    mipruner.list_pruners()  # discovery has run: the built-ins (and any installed plug-in) are in
    saved = (_registry.METHODS.snapshot(), dict(P._LOADED), list(P._QUICK_CHECK))
    modules = set(sys.modules)
    yield
    _registry.METHODS.restore(saved[0])
    P._QUICK_CHECK[:] = saved[2]
    P._LOADED.clear()
    P._LOADED.update(saved[1])
    for m in set(sys.modules) - modules:
        if _plugin_module(sys.modules[m]):
            del sys.modules[m]


def _plugin_module(module) -> bool:
    """Whether `module` is one a test loaded as a plug-in (written to a temporary directory, or with
    no file), not a library that a plug-in's import pulled in for the first time: unloading those
    (torch._dynamo, transformers submodules) would break later tests in the same process."""
    import sysconfig

    path = getattr(module, "__file__", None)
    if not path:
        return True
    kept = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    kept.add(os.path.dirname(os.path.dirname(os.path.abspath(mipruner.__file__))) + os.sep + "mipruner")
    path = os.path.abspath(path)
    return not any(path.startswith(os.path.abspath(k) + os.sep) for k in kept)


def tensors(n=30, d=8, t=4):
    g = torch.Generator().manual_seed(0)
    return dict(visual=torch.randn(n, d, generator=g), text=torch.randn(t, d, generator=g))


def test_a_file_plugin_reaches_the_registry_and_its_parameter_the_options(tmp_path):
    path = write(tmp_path, "lastk", method("last_k", "torch.arange(n - k, n, device=dev) - shift * 0",
                                           params='(Param.integer("shift", 0, 0, 4, "a test-only shift"),)',
                                           kw=", *, shift: int = 0"))
    assert P.load_plugins(path) == []
    assert "last_k" in mipruner.list_pruners() and path in P.origin("last_k") and P.origin("mi") == ""
    assert mipruner.prune("last_k", budget=3, **tensors()).keep.tolist() == [27, 28, 29]
    assert "shift" in _registry.all_params()
    assert P.load_plugins(path) == [] and P.problems() == []  # the same file twice: loaded once, no complaint
    assert check_pruner("last_k", model=None) == []


BROKEN = {  # stem -> (source, what the one sentence says)
    "imports": ("import no_such_module_anywhere\n" + method("never"), "was not loaded: ModuleNotFoundError"),
    "raises": (method("half") + "raise RuntimeError('broken on purpose')\n", "RuntimeError: broken on purpose"),
    "builtin": (method("mi"), "it registers 'mi', the name of a built-in method"),
    "param": (method("lam_clash", params='(Param.real("lam", 0.9, 0.0, 1.0, "another lam"),)', kw=", *, lam=0.9"),
              "Param 'lam' differs"),
    "nothing": ("x = 1\n", "registered no method"),
    "duplicates": (method("dups", "torch.zeros(k, dtype=torch.long, device=dev)"), "not ascending and unique"),
    "short": (method("short", "torch.arange(max(k - 1, 1), device=dev)"), "keep has shape"),
    "outside": (method("outside", "torch.arange(n, n + k, device=dev)"), "indices outside [0, 48)"),
    "nodevice": (method("nodevice", "torch.arange(k)"), "made without device="),
    "random": (method("unseeded", "torch.randperm(n, device=dev)[:k]"), "must be deterministic"),
}


@pytest.mark.parametrize("stem", sorted(BROKEN))
def test_a_broken_plugin_is_one_sentence_naming_it_and_the_rest_works(tmp_path, stem):
    source, says = BROKEN[stem]
    before = mipruner.list_pruners()
    path = write(tmp_path, stem, source)
    problems = P.load_plugins(path)
    assert len(problems) == 1 and P.problems()[-1] == problems[0]
    msg = problems[0]
    assert msg.startswith(f"Plug-in {path!r}") and says in msg, msg
    assert "\n" not in msg and msg.endswith(".") and msg.count(". ") == 0, msg  # one plain sentence
    assert mipruner.list_pruners() == before  # nothing of it is left, the built-ins all are
    assert mipruner.prune("mi", budget=5, **tensors()).keep.numel() == 5


def test_a_name_another_plugin_took_is_refused_and_only_the_bad_method_of_a_file_leaves(tmp_path):
    first = write(tmp_path, "first", method("twin") + method("also_fine", fn="g"))
    assert P.load_plugins(first) == []
    second = write(tmp_path, "second", method("good_one") + method("twin", fn="again"))
    (msg,) = P.load_plugins(second)
    assert f"it registers 'twin', which plug-in {P.origin('twin')} registered already" in msg
    assert "good_one" not in mipruner.list_pruners()  # a file that failed to import is left out whole
    mixed = write(tmp_path, "mixed", method("fine") + method("bad", "torch.arange(k)", fn="bad"))
    (msg,) = P.load_plugins(mixed)
    assert "method 'bad' was left out" in msg
    assert "fine" in mipruner.list_pruners() and "bad" not in mipruner.list_pruners()


def test_a_selection_that_breaks_the_contract_later_names_the_plugin(tmp_path):
    # right on the load check's 48 tokens, duplicates on any other count
    path = write(tmp_path, "late", method("late", "torch.arange(k, device=dev) if n == 48 else "
                                                  "torch.zeros(k, dtype=torch.long, device=dev)"))
    assert P.load_plugins(path) == []
    assert mipruner.prune("late", budget=10, **tensors(n=48)).budget == 10
    with pytest.raises(ContractError, match=r"'late', a method of plug-in .*late\.py.*broke the selection contract"):
        mipruner.prune("late", budget=10, **tensors(n=30))
    # the tensor checks see 48 tokens, but for the per-frame option, which runs it on each 12-token frame
    tensor_checks = check_pruner("late", model=None)
    assert tensor_checks and all("per_frame=" in f for f in tensor_checks), tensor_checks
    failures = check_pruner("late")  # the embedded model's encoding has 196
    assert any(f.startswith("select with budget 5, keep is not ascending and unique") for f in failures), failures


def test_every_builtin_passes_the_tensor_checks():
    for name in mipruner.list_pruners():
        if mipruner.get_pruner(name).stage != "llm":
            assert check_pruner(name, model=None) == [], name


def test_loading_ends_with_freeze(tmp_path):
    P.freeze("the app has started")
    with pytest.raises(RuntimeError, match="the app has started"):
        P.load_plugins(write(tmp_path, "late_comer", method("late_comer")))
    assert "late_comer" not in mipruner.list_pruners()


def test_take_plugins_arg_and_split_list():
    assert P.take_plugins_arg(["--n", "2", "--plugins", "a,b", "--x"]) == (["--n", "2", "--x"], "a,b")
    assert P.take_plugins_arg(["pruners", "--plugins=c.py"]) == (["pruners"], "c.py")
    assert P.take_plugins_arg(["--n", "2"]) == (["--n", "2"], None)
    with pytest.raises(SystemExit, match="--plugins needs a value"):
        P.take_plugins_arg(["--plugins"])
    assert P.split_list(f"a, b{os.pathsep}c,,") == ["a", "b", "c"]


def test_check_pruner_command_line(tmp_path, capsys):
    from mipruner.check_pruner import main

    good = write(tmp_path, "cli_good", method("cli_good"))
    assert main(["cli_good", "--plugins", good, "--no-model"]) == 0
    assert "OK cli_good" in capsys.readouterr().out
    bad = write(tmp_path, "cli_bad", method("cli_bad", "torch.arange(max(k - 1, 1), device=dev)"))
    assert main(["cli_bad", "--plugins", bad, "--no-model"]) == 1  # the checker loads it without its own check
    out = capsys.readouterr().out.splitlines()
    assert out and all(line.startswith("FAIL cli_bad: ") for line in out)
    assert any("keep has shape (6,) for a budget of 7 tokens" in line for line in out)
    assert main(["no_such_method", "--no-model"]) == 1


def _run(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, **env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_the_environment_variable_loads_lazily_on_first_use(tmp_path):
    path = write(tmp_path, "from_env", method("from_env"))
    broken = write(tmp_path, "env_broken", "import no_such_module_anywhere\n")
    code = ("import sys, mipruner\n"
            "assert 'mipruner_plugin_from_env' not in sys.modules  # importing mipruner loads no plug-in\n"
            "print(mipruner.list_pruners())\n"
            "print(mipruner.plugins.problems())\n")
    r = _run(code, {P.ENV: f"{path},{broken}"})
    assert r.returncode == 0, r.stderr
    names, problems = r.stdout.strip().splitlines()
    assert "'from_env'" in names and "'mi'" in names
    assert "env_broken.py' (MIPRUNER_PLUGINS) was not loaded" in problems
