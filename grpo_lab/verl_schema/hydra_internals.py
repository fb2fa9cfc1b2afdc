"""Hydra 1.3's private and internal APIs grpo-lab needs, in one place (why and what each wraps: docs/verl_schema.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def version_base() -> str:
    """The version_base composing follows in this process now, as "major.minor"; not set yet: own_version_base().
    (Hydra's override parser sets its compatibility base, 1.1, when it is asked before any app has set one.)"""
    from hydra import version

    base = version.getbase()
    if isinstance(base, version.Version):
        return f"{base.major}.{base.minor}"
    return own_version_base()


def own_version_base() -> str:
    """Hydra's own version as "major.minor": what version_base=None selects, as every grpo-lab entry point asks."""
    import hydra
    from packaging.version import Version

    own = Version(hydra.__version__)
    return f"{own.major}.{own.minor}"


@contextlib.contextmanager
def version_base_as(base: str) -> Iterator[None]:
    """Within: composing follows version_base `base` (what hydra.main(version_base=base) sets); after: as before,
    unset included."""
    from hydra import version

    state = version.VersionBase.instance()
    old = state.getbase()
    version.setbase(base)
    try:
        yield
    finally:
        state.version_base = old


def compose_folder(config_dir: str, config_name: str) -> Any:
    """Hydra's composition of `config_name` with `config_dir` alone on the search path (plus Hydra's own configs),
    as a DictConfig that still has its `hydra` node."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.plugins import Plugins
    from hydra.types import RunMode

    Plugins.instance()  # registers Hydra's config sources (pkg://, file://) when no Hydra app has yet
    search_path = ConfigSearchPathImpl()
    search_path.append("hydra", "pkg://hydra.conf")
    search_path.append("main", f"file://{config_dir}")
    search_path.append("schema", "structured://")
    loader = ConfigLoaderImpl(config_search_path=search_path)
    return loader.load_configuration(config_name=config_name, overrides=[], run_mode=RunMode.RUN)


def sweep_jobs(overrides: list[Any]) -> int:
    """How many jobs Hydra's basic sweeper makes of these parsed overrides (its own expansion of a sweep)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return len(BasicSweeper.split_arguments(overrides, None)[0])


def args_parser() -> Any:
    """The argparse parser @hydra.main parses its command line with (--cfg, -m, --info, overrides, ...)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def file_source(provider: str, path: str) -> Any:
    """Hydra's own ConfigSource for a `file://` folder (path without the scheme)."""
    from hydra._internal.sources_registry import SourcesRegistry

    return SourcesRegistry.instance().resolve("file")(provider=provider, path=f"file://{path}")


def config_header(text: str) -> dict[str, str]:
    """The header of a config file's text (`# @package ...`), as Hydra's config sources read it."""
    from hydra.plugins.config_source import ConfigSource

    return ConfigSource._get_header_dict(text)
