"""The plug-in is built against one vLLM release: fail loudly on any other."""
from importlib.metadata import entry_points

import mipruner_vllm


def test_installed_vllm_is_the_pinned_one():
    assert mipruner_vllm.version_problem() is None, mipruner_vllm.version_problem()


def test_entry_point_registers_the_architectures():
    eps = [e for e in entry_points(group="vllm.general_plugins") if e.value == "mipruner_vllm:register"]
    assert len(eps) == 1
    eps[0].load()()
    from vllm import ModelRegistry

    assert set(mipruner_vllm.ARCHITECTURES) <= set(ModelRegistry.get_supported_archs())
