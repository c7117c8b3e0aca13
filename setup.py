"""The one dynamic part of the build (the rest is pyproject.toml): which packages the wheel holds.

The code's packages, found as setuptools would, and the configs: the repository's top-level
`conf/` stays where a user looks for the grid's axes and is installed as the package
`harness.conf` (with each config group a subpackage), so that Hydra finds it as
`pkg://harness.conf` (harness.commands.compose.CONFIG_PATH) in a checkout's editable install and in
an installed wheel alike. Found, not listed, so that a new module or config group is shipped without
editing a list."""

from setuptools import find_namespace_packages, setup

CODE_PACKAGES = ["harness", "workloads", "launchers", "hydra_plugins"]
CONFIG_PACKAGE = "harness.conf"  # = harness.commands.compose.CONFIG_MODULE
CONFIG_DIR = "conf"

setup(
    packages=[
        *find_namespace_packages(
            include=[p for root in CODE_PACKAGES for p in (root, f"{root}.*")]
        ),
        *(
            f"{CONFIG_PACKAGE}{group[len(CONFIG_DIR) :]}"
            for group in find_namespace_packages(include=[CONFIG_DIR, f"{CONFIG_DIR}.*"])
        ),
    ],
    package_dir={CONFIG_PACKAGE: CONFIG_DIR},
)
