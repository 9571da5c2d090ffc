"""`run --help` and `plan --help`: embedpipe's own options on one screen, grouped.

Beam's parser would print its ~850 lines of runner options first. The options themselves are
declared once, in EmbedPipeOptions; this only sorts them into groups for reading. An option
not named here (a new one) is listed under "advanced", so none goes missing.
"""
from __future__ import annotations

import argparse
from typing import Any

from pipeline.settings.options import EmbedPipeOptions

GROUPS = {
    "input": ("input", "id_column", "text_column", "keep_columns"),
    "output": ("output", "sync", "resume", "switch_model", "known", "doc_vectors", "publish", "publish_table"),
    "model": ("model", "dimensions", "models_config"),
    "budget": ("max_spend_rub", "daily_cap_rub", "monthly_cap_rub", "allow_partial"),
    "service": ("base_url", "api_key_file", "api_key_secret", "account_segment"),
}
NOT_FOR = {"plan": ("allow_partial", "doc_vectors", "max_in_flight", "publish", "publish_table")}
METAVARS = {"input": "PATH", "output": "DIR", "known": "GLOB", "keep_columns": "A,B",
            "id_column": "NAME", "text_column": "NAME", "model": "MODEL", "base_url": "URL",
            "dimensions": "N", "max_in_flight": "N", "overlap_tokens": "N", "chunk_tokens": "N", "profile": "NAME",
            "api_key_secret": "NAME", "account_segment": "NAME", "publish": "TARGET", "publish_table": "NAME"}
SYNOPSIS = {"run": "--input PATH --output DIR --model MODEL --base-url URL [options]",
            "plan": "--input PATH --model MODEL|all|A,B --base-url URL [options]"}
BEAM_LINE = ("Any Beam pipeline option passes through (--runner, --direct_num_workers, --project,\n"
             "--s3_endpoint_url, ...): list them all with  python -m pipeline beam-options")


class _Grouped:
    """Stands in for the parser EmbedPipeOptions fills: each option goes to its group, under
    its dashed spelling only (the underscore one is Beam's convention, accepted too)."""

    def __init__(self, parser: argparse.ArgumentParser, command: str):
        self._groups = {name: parser.add_argument_group(name) for name in (*GROUPS, "advanced")}
        self._skip = NOT_FOR.get(command, ())

    def add_argument(self, *flags: str, **kwargs: Any) -> None:
        dest = kwargs.get("dest") or flags[0].lstrip("-")
        if dest in self._skip:
            return
        group = next((g for g, dests in GROUPS.items() if dest in dests), "advanced")
        if kwargs.get("action") not in ("store_true", "append") or dest == "known":
            kwargs.setdefault("metavar", METAVARS.get(dest, "RUB" if dest.endswith("_rub") else "PATH"))
        kwargs.pop("default", None)  # defaults live in configs/ and are documented there
        self._groups[group].add_argument(*([f for f in flags if "_" not in f] or flags), **kwargs)


def render(command: str) -> str:
    parser = argparse.ArgumentParser(prog=f"python -m pipeline {command}", usage=f"%(prog)s {SYNOPSIS[command]}",
                                     add_help=False, formatter_class=lambda prog: argparse.HelpFormatter(
                                         prog, max_help_position=26, width=100))
    grouped = _Grouped(parser, command)
    EmbedPipeOptions._add_argparse_args(grouped)
    grouped.add_argument("--verbose", action="store_true", help="debug logging")  # read by the CLI itself
    return parser.format_help().rstrip() + "\n\n" + BEAM_LINE
