"""Everything about the package is declared in pyproject.toml; this file only adds the embedded model.

The repository keeps the trained toy model at top level, assets/shapes-llava (the app, the docs and the
training command use that path). A wheel built from the checkout copies it into the package as
mipruner/_assets/shapes-llava, so that `mipruner.load("shapes-llava")` and `mipruner-eval` work from an
installed package outside the repository (mipruner.models.common.shipped finds it there, and falls back to the
checkout's assets/ in a source tree or an editable install).
"""
import os
import warnings

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("shapes-llava",)  # folders of assets/ that the library itself needs
HERE = os.path.dirname(os.path.abspath(__file__))


class build_py_with_assets(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's assets/
        for name in SHIPPED:
            src = os.path.join(HERE, "assets", name)
            if not os.path.isdir(src):
                warnings.warn(f"assets/{name} is missing: the wheel will not hold the embedded model")
                continue
            self.copy_tree(src, os.path.join(self.build_lib, "mipruner", "_assets", name))


setup(cmdclass={"build_py": build_py_with_assets})
