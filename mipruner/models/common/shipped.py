"""Where the files shipped with mipruner are: the embedded model (assets/shapes-llava) inside the installed
package (mipruner/_assets/, copied there when the wheel is built: setup.py) or, in a checkout or an
editable install, the repository's top-level assets/."""
from __future__ import annotations

import os
from importlib.resources import files

_ROOT = os.path.abspath(__file__)
for _ in range(4):  # mipruner/models/common/shipped.py -> the repository
    _ROOT = os.path.dirname(_ROOT)
_CHECKOUT = os.path.join(_ROOT, "assets")


def shipped(name: str) -> str:
    """The directory of a shipped asset ("shapes-llava"): the installed package's copy, else the checkout's."""
    packaged = files("mipruner").joinpath("_assets", name)
    if packaged.is_dir():
        return str(packaged)
    return os.path.join(_CHECKOUT, name)
