"""Hydra plugins: verl's own config folder (verl/trainer/config) on the searchpath, and the source that reads it.

`conf/config.yaml` lists `ppo_trainer` first in its defaults; VerlSearchPathPlugin is how Hydra finds it. It locates
the installed verl package without importing it (importing verl pulls in torch and takes seconds), so composing a
config and refusing a bad one stays fast. Hydra discovers this file through the `hydra_plugins` namespace package.

VerlConfigSource (scheme `grpolab-verl://`) reads verl's folder as Hydra's own file source does, except for
`ppo_trainer` itself: that one comes composed, from verl's schema (grpo_lab/verl_schema: one cached file instead of
~40). With GRPO_LAB_VERL_CACHE=0 (run.py sets it for a command line that picks an option of a verl config group) the
folder goes on the searchpath as a plain `file://` one and Hydra walks verl's defaults tree itself.
"""


from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin


class VerlSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from grpo_lab.labconf import store
        from grpo_lab.verl_schema import verl_cache

        store()  # grpo-lab's typed sections (conf/config.yaml's lab_schema, preflight_schema)
        from grpo_lab.verl_schema.verl_paths import verl_config_dir

        path = verl_config_dir()
        if path is not None:
            scheme = VerlConfigSource.scheme() if verl_cache.enabled() else "file"
            search_path.append(provider="verl", path=f"{scheme}://{path}")


class VerlConfigSource(ConfigSource):
    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)
        from grpo_lab.verl_schema.hydra_internals import file_source

        # Hydra's own file source over the same folder does everything but composing ppo_trainer
        self._files = file_source(provider, self.path)

    @staticmethod
    def scheme() -> str:
        return "grpolab-verl"

    def load_config(self, config_path: str) -> ConfigResult:
        from grpo_lab.verl_schema import build, schema
        from grpo_lab.verl_schema.hydra_internals import config_header

        if self._normalize_file_name(config_path) == f"{build.CONFIG_NAME}.yaml":
            cfg = schema(self.path).composed()
            if cfg is not None:
                try:
                    with open(f"{self.path}/{build.CONFIG_NAME}.yaml", encoding="utf-8") as f:
                        header = config_header(f.read(512))
                except OSError as e:
                    raise ConfigLoadError(f"Config not found : {e}") from e
                return ConfigResult(config=cfg, path=f"{self.scheme()}://{self.path}", provider=self.provider,
                                    header=header)
        return self._files.load_config(config_path)

    def available(self) -> bool:
        return self._files.available()

    def is_group(self, config_path: str) -> bool:
        return self._files.is_group(config_path)

    def is_config(self, config_path: str) -> bool:
        return self._files.is_config(config_path)

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        return self._files.list(config_path, results_filter)
