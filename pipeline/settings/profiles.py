"""--profile NAME: a YAML file of flags (configs/profiles/NAME.yaml, or a path) that the
command line overrides. Profiles are how a job moves from a laptop to Dataflow or Flink."""
from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import resources
from typing import Any

from service.catalog import ConfigError, parse_yaml_mapping


def _profile_text(name: str) -> tuple[str, str]:
    if os.path.sep in name or name.endswith((".yaml", ".yml")):
        try:
            with open(name, encoding="utf-8") as fh:
                return fh.read(), name
        except OSError as exc:
            raise ConfigError(f"--profile {name}: {exc.strerror}") from None
    entry = resources.files("configs").joinpath("profiles").joinpath(f"{name}.yaml")
    if not entry.is_file():
        known = sorted(p.name[:-5] for p in resources.files("configs").joinpath("profiles").iterdir()
                       if p.name.endswith(".yaml"))
        raise ConfigError(f"--profile {name}: no such profile (known: {', '.join(known)})")
    return entry.read_text(encoding="utf-8"), f"configs/profiles/{name}.yaml"


def _flags(doc: Mapping[str, Any], where: str) -> list[str]:
    flags: list[str] = []
    for key, value in doc.items():
        flag = "--" + str(key)
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            flags += [f"{flag}={v}" for v in value]
        elif isinstance(value, (str, int, float)):
            flags.append(f"{flag}={value}")
        else:
            raise ConfigError(f"{where}: {key} must be a scalar or a list")
    return flags


def expand(argv: list[str]) -> list[str]:
    """ARGV with the profile's flags put first, so that flags given on the command line win."""
    name = None
    for i, arg in enumerate(argv):
        if arg == "--profile" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--profile="):
            name = arg.split("=", 1)[1]
    if not name:
        return argv
    text, where = _profile_text(name)
    return _flags(parse_yaml_mapping(text, where, "a mapping of flags"), where) + argv
