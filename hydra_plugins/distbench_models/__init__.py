"""The config folders of the distribution models and network sources other packages register
(`harness.distributions.plugins`, `workloads.plugins`), on Hydra's search path: their
`conf/distribution/<name>.yaml` becomes an option of the `distribution` group, their
`conf/network/<name>.yaml` one of the `network` group, as a built-in model's or network's is.

Keep imports light, and no `from __future__ import annotations`: Hydra executes this module on
every start-up while scanning for plugins.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class RegisteredModelConfigs(SearchPathPlugin):
    """Appends each registered model's and network source's `conf/` to the search path (after
    distbench's own: a built-in option keeps its name)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from harness.distributions.plugins import config_dirs
        from workloads import plugins

        for folder in config_dirs():
            search_path.append(provider="distbench-registered-model", path=f"file://{folder}")
        for folder in plugins.config_dirs(plugins.NETWORK_SOURCES):
            if folder not in config_dirs():  # one package may register both
                search_path.append(
                    provider="distbench-registered-network-source", path=f"file://{folder}"
                )
