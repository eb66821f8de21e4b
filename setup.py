"""Package map: the component folders at the repository's top are subpackages of `dsv41c`.

pyproject.toml carries the metadata; this file only computes the package list, because
setuptools' automatic discovery cannot follow a package-dir map onto sibling folders.
"""
import os

from setuptools import setup

COMPONENTS = ["frontend", "ir", "passes", "codegen", "runtime"]


def _packages():
    package_dir = {"dsv41c": "dsv41c"}
    packages = ["dsv41c"] + ["dsv41c." + d for d in sorted(os.listdir("dsv41c"))
                             if os.path.isfile(os.path.join("dsv41c", d, "__init__.py"))]
    for comp in COMPONENTS:
        package_dir[f"dsv41c.{comp}"] = comp
        for root, dirs, files in os.walk(comp):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            if "__init__.py" in files:
                packages.append("dsv41c." + root.replace(os.sep, "."))
    return packages, package_dir


_pk, _pd = _packages()
setup(packages=_pk, package_dir=_pd)
