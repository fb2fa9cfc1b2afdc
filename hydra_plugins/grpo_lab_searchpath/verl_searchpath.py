"""Hydra SearchPathPlugin: puts verl's own config folder (verl/trainer/config) on the searchpath.

`conf/config.yaml` lists `ppo_trainer` first in its defaults; this plugin is how Hydra finds it. It locates the
installed verl package without importing it (importing verl pulls in torch and takes seconds), so composing a
config and refusing a bad one stays fast. Hydra discovers this file through the `hydra_plugins` namespace package.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class VerlSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from grpo_lab.verl_paths import verl_config_dir

        path = verl_config_dir()
        if path is not None:
            search_path.append(provider="verl", path=f"file://{path}")
