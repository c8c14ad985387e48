"""The one thing pyproject.toml cannot say: the top-level usecases/ folder ships inside the
package as ``ddlstudy.usecases`` (use cases and study plans, read with importlib.resources),
so that an installed wheel has them."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["ddlstudy", "ddlstudy.*"]), "ddlstudy.usecases"],
    package_dir={"ddlstudy.usecases": "usecases"},
    package_data={"ddlstudy.usecases": ["*.toml", "*.md"]},
)
