"""Everything a run needs, resolved once in the driver from options, configs and the account."""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
import secrets

from pipeline.exits import UsageError
from pipeline.settings import steps
from pipeline.settings.config import RunSettings
from pipeline.settings.options import EmbedPipeOptions
from service.catalog import ModelSpec, get_model
from service.client import RetryPolicy, check_base_url
from service.credentials import KeySource
from service.tokenizer import ENCODING_NAME
from transforms import schemas
from transforms.embed.config import ServiceConfig
from transforms.money.caps import Caps
from transforms.publish.columns import count_refusal, name_refusal
from transforms.read import changes
from transforms.read.split import MIN_MAX_TOKENS, SplitConfig
from transforms.write.transform import Codec

# What a run may do to an output directory that holds results (docs/scheduled-runs.md).
FRESH, RESUME, SYNC = "fresh", "resume", "sync"


@dataclasses.dataclass(frozen=True)
class Job:
    opts: EmbedPipeOptions
    model: ModelSpec
    settings: RunSettings
    run_id: str
    keep_columns: tuple[str, ...]
    asked_dimensions: int | None = None   # --dimensions: sent to the service; None: the model's own

    @property
    def dimensions(self) -> int:
        return self.asked_dimensions or self.model.dimensions

    @property
    def switching(self) -> bool:
        return bool(self.opts.switch_model)

    def for_view(self, model: ModelSpec, dimensions: int, chunking: changes.Chunking) -> Job:
        """The same run for another model, length and chunking (a switch's served view)."""
        settings = self.settings.replace("split", chunk_tokens=chunking.chunk_tokens,
                                         overlap_tokens=chunking.overlap_tokens,
                                         boundary_window=chunking.boundary_window)
        return dataclasses.replace(self, model=model, settings=settings,
                                   asked_dimensions=None if dimensions == model.dimensions else dimensions)

    def next_run(self) -> Job:
        """The same job as a run of its own, after this one (a switch's target)."""
        return dataclasses.replace(self, run_id=new_run_id())

    @property
    def mode(self) -> str:
        return SYNC if self.opts.sync else RESUME if self.opts.resume else FRESH

    @property
    def again(self) -> str:
        """What to run to continue this run (advice that must work when followed verbatim)."""
        return "the same command again" + (" with --resume" if self.mode == FRESH else "")

    @property
    def chunking(self) -> changes.Chunking:
        s = self.settings.split
        return changes.Chunking(s.chunk_tokens or self.model.chunk_tokens, s.overlap_tokens, s.boundary_window)

    @property
    def chunk_text(self) -> bool:
        """Whether the embeddings rows carry their chunks' text."""
        return self.settings.output.chunk_text

    @property
    def signature(self) -> bytes:
        """What shapes a document's chunks and rows (transforms/read/changes.py)."""
        return changes.signature(ENCODING_NAME, self.chunking, self.keep_columns, self.chunk_text)

    @property
    def other_signature(self) -> bytes:
        """The signature of the same chunks with the other text setting."""
        return changes.signature(ENCODING_NAME, self.chunking, self.keep_columns, not self.chunk_text)

    @property
    def codec(self) -> Codec:
        return Codec(self.settings.write.codec, self.settings.write.vector_codec)

    def initial_margin(self, price_learned: bool) -> float:
        """Worst case per token over the price: before responses show the price, a wrong
        estimate and the client's token count may both be off; a learned price leaves only
        the token count (1 / safety factor). Preflight, plan and guard all use this."""
        return (1.0 if price_learned else self.settings.budget.price_margin) / self.model.safety_factor

    @property
    def caps(self) -> Caps:
        return Caps(self.settings.budget.daily_cap_rub, self.settings.budget.monthly_cap_rub)

    @property
    def key_source(self) -> KeySource:
        return KeySource(file=self.opts.api_key_file, secret=self.opts.api_key_secret)

    @property
    def retry(self) -> RetryPolicy:
        return steps.retry_policy(self.settings)

    @property
    def service(self) -> ServiceConfig:
        """How the Embed step reaches the service and how hard it presses it."""
        return steps.service_config(self.settings, self.model, self.opts.base_url, self.opts.account_segment,
                                    self.key_source, self.asked_dimensions)

    @property
    def split(self) -> SplitConfig:
        return steps.split_config(self.settings, self.model)


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def catalogue(opts: EmbedPipeOptions) -> dict[str, ModelSpec]:
    return steps.catalogue(opts.models_config)


def model_names(opts: EmbedPipeOptions) -> list[str] | None:
    """`--model all` or `--model a,b` (plan compares them): the names, each checked; None for one model."""
    if opts.model != "all" and "," not in (opts.model or ""):
        return None
    models = catalogue(opts)
    names = list(models) if opts.model == "all" else [n.strip() for n in opts.model.split(",") if n.strip()]
    for name in names:
        get_model(models, name)
    return names


def chunk_tokens_refusal(chunk_tokens: int, model: ModelSpec) -> str | None:
    """Why MODEL cannot take chunks of CHUNK_TOKENS, or None."""
    if MIN_MAX_TOKENS <= chunk_tokens <= model.chunk_tokens:
        return None
    return (f"--chunk-tokens must be between {MIN_MAX_TOKENS} and {model.chunk_tokens} for {model.name} (its "
            f"max_input_tokens x safety_factor), got {chunk_tokens}")


def resolve(opts: EmbedPipeOptions, *, need_output: bool, model_name: str | None = None) -> Job:
    missing = [flag for flag, value in (("--model", opts.model), ("--base-url", opts.base_url)) if not value]
    if not opts.input and not (need_output and opts.resume):  # run --resume can take DIR's pending rows
        missing.insert(0, "--input")
    if opts.sync and opts.resume:
        raise UsageError("--sync and --resume are two ways of one run: --sync when the input is the whole "
                         "corpus (documents it no longer has leave DIR), --resume when it is a part")
    if need_output and not opts.output:
        missing.append("--output")
    if missing:
        raise UsageError(f"missing {', '.join(missing)}")
    model = get_model(catalogue(opts), model_name or opts.model)
    settings = steps.run_settings(opts.run_config)
    if opts.max_in_flight is not None:
        if opts.max_in_flight < 1:
            raise UsageError("--max-in-flight must be at least 1")
        settings = settings.replace("embed", max_in_flight=opts.max_in_flight)
    if opts.overlap_tokens is not None:
        settings = settings.replace("split", overlap_tokens=opts.overlap_tokens)
    if opts.chunk_tokens is not None:
        if (refused := chunk_tokens_refusal(opts.chunk_tokens, model)) is not None:
            raise UsageError(refused)
        settings = settings.replace("split", chunk_tokens=opts.chunk_tokens)
    if opts.no_chunk_text:
        settings = settings.replace("output", chunk_text=False)
    if opts.dimensions is not None:
        if not model.supports_dimensions:
            raise UsageError(f"--dimensions is not supported by {model.name}")
        if not 1 <= opts.dimensions <= model.dimensions:
            raise UsageError(f"--dimensions must be between 1 and {model.dimensions} for {model.name}")
    for flag, value in (("--max-spend-rub", opts.max_spend_rub), ("--daily-cap-rub", opts.daily_cap_rub),
                        ("--monthly-cap-rub", opts.monthly_cap_rub)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} must be a finite amount >= 0")
    caps = {name: value for name, value in (("daily_cap_rub", opts.daily_cap_rub),
                                            ("monthly_cap_rub", opts.monthly_cap_rub)) if value is not None}
    settings = settings.replace("budget", **caps)
    try:  # the steps' own checks, made here so that a bad number is a usage error, not a crash
        steps.split_config(settings, model)
    except ValueError as exc:
        message = str(exc)
        if opts.overlap_tokens is not None and message.startswith("overlap_tokens "):   # the flag, not the key
            raise UsageError("--overlap-tokens " + message.removeprefix("overlap_tokens ")) from None
        raise UsageError(f"split settings: {message}") from None
    try:
        check_base_url(opts.base_url)
    except ValueError as exc:
        raise UsageError(f"--base-url: {exc}") from None
    keep = tuple(c.strip() for c in opts.keep_columns.split(",") if c.strip())
    if clash := schemas.OUTPUT_COLUMNS.intersection(keep):
        raise UsageError(f"--keep-columns {sorted(clash)} would clash with output columns of the same name")
    if len(set(keep)) != len(keep):
        raise UsageError("--keep-columns names a column twice")
    _check_kept_names(keep)
    return Job(opts, model, settings, new_run_id(), keep, opts.dimensions)


def _check_kept_names(keep: tuple[str, ...]) -> None:
    """Kept columns every reader of the view tells apart (DuckDB, Spark and unquoted SQL fold
    case), and that the published table can hold (transforms/publish/columns.py)."""
    seen = {name.casefold(): name for name in schemas.OUTPUT_COLUMNS}
    for name in keep:
        if (other := seen.setdefault(name.casefold(), name)) != name:
            raise UsageError(f"--keep-columns: kept column {name} differs from the column {other} only by case, which "
                             "readers that fold case (DuckDB, Spark, SQL without quotes) cannot tell apart: rename "
                             "one of them in the input")
    if (refusal := count_refusal(len(keep))) is not None:
        raise UsageError(f"--keep-columns: {refusal}: keep fewer")
    for refusal in filter(None, map(name_refusal, keep)):
        raise UsageError(f"--keep-columns: {refusal}: rename it in the input, or leave it out")
