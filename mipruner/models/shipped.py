"""Where the files shipped with mipruner are: the embedded model (assets/shapes-llava) inside the installed
package (mipruner/_assets/, copied there when the wheel is built: setup.py) or, in a checkout or an
editable install, the repository's top-level assets/."""
from __future__ import annotations

import os
from importlib.resources import files

_CHECKOUT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets")


def shipped(name: str) -> str:
    """The directory of a shipped asset ("shapes-llava"): the installed package's copy, else the checkout's."""
    packaged = files("mipruner").joinpath("_assets", name)
    if packaged.is_dir():
        return str(packaged)
    return os.path.join(_CHECKOUT, name)
