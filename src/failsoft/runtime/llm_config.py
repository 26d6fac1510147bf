"""An ``llm`` service (LUMEN) in a serving config: its model, workers, standbys, policy and engine.

It is an entry of the config's ``services`` like any other, with ``mode: llm``; its members are
LLM workers (processes running :mod:`failsoft.llm`'s engine), not apps of the model repository::

    services:
      - name: bytes
        mode: llm
        model: {size: tiny}            # the byte-level pair, built on first use
        # model: {path: /models/qwen2-0.5b, draft: /models/qwen2-tiny}   # a local Hugging Face model
        workers: 3                     # w0, w1, w2, placed round-robin on the servers below
        servers: [s1, s2, s3]          # default: every server of the config
        spares: 1                      # warm standby workers (imports done, no model)
        policy: lumen                  # or fixed-checkpointing, stop-and-restart, ...
        params: {checkpoint_budget_mb: 64, draft_tokens: 3}
        engine: {kv_pages: 128, page_size: 16, max_batch: 8, torch_threads: 1}

Everything is validated here, at the edge, into a frozen :class:`LlmServing`; its
:meth:`LlmServing.group` is the service as the orchestration core places it (each worker's memory
and load times, from the model's files), the controller's
:class:`~failsoft.runtime.llm_fleet.LlmFleet` carries out the core's starts and restarts, and the
gateway's ``llm`` dispatcher serves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from failsoft.bounds import describe_validation_error
from failsoft.errors import ConfigError
from failsoft.orchestration.llm_state import LlmGroup
from failsoft.runtime.devices import DEVICE_PATTERN, MAX_GPUS, Placement, check_placement
from failsoft.services import LlmParams, Service, ServiceMode

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LlmModelModel(_Strict):
    """The byte-level pair of ``size`` (under ``root``, built on first use), or the Hugging Face
    causal LM in the directory ``path`` (its draft in ``draft``, for LUMEN's draft-first restart)."""

    size: Literal["tiny", "small"] = "tiny"
    root: str | None = None
    path: str | None = None
    draft: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = Field(default="auto", pattern=DEVICE_PATTERN)
    gpus: float = Field(default=0.0, ge=0, le=MAX_GPUS)  # each worker's (and standby's) GPU share


class LlmEngineModel(_Strict):
    kv_pages: int = Field(default=128, ge=1, le=1 << 20)
    page_size: int = Field(default=16, ge=1, le=1024)
    max_batch: int = Field(default=8, ge=1, le=1024)
    torch_threads: int = Field(default=1, ge=0, le=256)


class LlmServiceModel(_Strict):
    name: str = Field(pattern=_NAME, max_length=64)
    mode: Literal["llm"]
    model: LlmModelModel = Field(default_factory=LlmModelModel)
    workers: int = Field(default=3, ge=1, le=64)
    servers: list[str] | None = Field(default=None, min_length=1)
    spares: int = Field(default=1, ge=0, le=8)
    policy: str = "lumen"
    params: dict[str, Any] = Field(default_factory=dict)
    engine: LlmEngineModel = Field(default_factory=LlmEngineModel)
    # added to a restarted worker's target load: a larger model's reload, emulated (benchmarks)
    restart_delay_ms: float = Field(default=0.0, ge=0, le=3_600_000)


@dataclass(frozen=True, slots=True)
class LlmServing:
    """One validated ``llm`` service: who its workers are and where they run, what they serve."""

    service: Service  # members: the worker names
    servers: tuple[str, ...]  # per worker, in the members' order
    spare_servers: tuple[str, ...]  # per standby
    policy: str
    model: LlmModelModel
    engine: LlmEngineModel
    root: Path  # the byte pair's repository root, or the Hugging Face directory
    draft: Path | None  # a Hugging Face draft's directory (the byte pair's draft is under root)
    restart_delay_ms: float = 0.0

    @property
    def name(self) -> str:
        return self.service.name

    @property
    def params(self) -> LlmParams:
        assert isinstance(self.service.params, LlmParams)
        return self.service.params

    @property
    def hf(self) -> bool:
        return self.model.path is not None

    @property
    def placement(self) -> Placement:
        return Placement(self.model.device, self.model.gpus)

    @property
    def device(self) -> str | None:
        return None if self.model.device == "auto" else self.model.device

    def worker_server(self, worker: str) -> str:
        return dict(zip(self.service.members, self.servers, strict=True))[worker]

    def target_name(self) -> str:
        return self.root.name if self.hf else f"{self.model.size}-target"

    def draft_name(self) -> str | None:
        """The draft a restart loads first (None: none configured or built)."""
        if self.hf:
            return None if self.draft is None else str(self.draft)
        name = f"{self.model.size}-draft"
        return name if (self.root / "llm" / name / "config.json").is_file() else None

    def build(self) -> None:
        """Build the byte pair if it is not built yet (seconds for ``tiny``); nothing for a HF model."""
        if not self.hf:
            from failsoft.llm.models import build_pair

            build_pair(self.root, self.model.size, self.device)

    def group(self, progressive: bool) -> LlmGroup:
        """The service as the orchestration core places it (built first: :meth:`build`): each
        worker's memory is its weights (its draft's too under ``progressive`` recovery, which each
        standby then holds too) plus its KV
        budget (``kv_pages * page_size`` tokens), and the load times a restart takes (measured in the
        model's ``profile.json`` where it has one, else its weights read at :data:`READ_MB_PER_S`)."""
        draft = self.draft_name() if progressive else None
        target = _footprint(self._model_dir(self.target_name()), self.model.dtype)
        kv_mb = self.engine.kv_pages * self.engine.page_size * target.kv_bytes_per_token / 2**20
        memory = target.weights_mb + kv_mb
        draft_load_s = draft_mb = 0.0
        if draft is not None:
            d = _footprint(self._model_dir(draft), self.model.dtype)
            memory += d.weights_mb
            draft_load_s, draft_mb = d.load_s, d.weights_mb
        return LlmGroup(
            self.name,
            self.service.members,
            self.servers,
            self.spare_servers,
            round(memory, 3),
            draft_first=draft is not None,
            target_load_s=target.load_s + self.restart_delay_ms / 1000.0,
            draft_load_s=draft_load_s,
            standby_mb=round(draft_mb, 3),  # a standby preloads the draft
        )

    def _model_dir(self, name: str) -> Path:
        if self.hf:
            return Path(name) if name != self.target_name() else self.root
        return self.root / "llm" / name

    def tokenizer(self) -> Any:
        """The model's tokenizer, for the gateway (it tokenizes; workers see token ids only)."""
        if not self.hf:
            from failsoft.llm.tokens import BYTES

            return BYTES
        from transformers import AutoTokenizer

        from failsoft.llm.tokens import HfTokenizer

        return HfTokenizer(AutoTokenizer.from_pretrained(self.root, local_files_only=True), self.name)


def llm_serving(spec: LlmServiceModel, where: str, servers: tuple[str, ...], base_dir: Path) -> LlmServing:
    """Validate one ``mode: llm`` entry of a config (``where`` names it in errors)."""
    from failsoft.policies import registry

    try:
        params = TypeAdapter(LlmParams).validate_python(spec.params)
    except ValidationError as exc:
        raise ConfigError(f"{where}.params: {describe_validation_error(exc, None)}") from None
    known = registry.names("llm_recovery")
    if spec.policy not in known:
        raise ConfigError(f"{where}.policy {spec.policy!r} is unknown (known: {', '.join(known)})")
    check_placement(f"{where}.model", spec.model.device, spec.model.gpus)
    on = tuple(spec.servers or servers)
    unknown = [s for s in on if s not in servers]
    if unknown:
        raise ConfigError(f"{where}.servers: {unknown[0]!r} is not a server of the config")
    m = spec.model
    if m.path is not None and m.root is not None:
        raise ConfigError(f"{where}.model: give either path (a Hugging Face model) or root (the byte pair)")
    if m.draft is not None and m.path is None:
        raise ConfigError(f"{where}.model.draft needs model.path (the byte pair's draft is built with it)")
    if m.path is not None:
        root = _path(m.path, base_dir)
        if not (root / "config.json").is_file():
            raise ConfigError(f"{where}.model.path {str(root)!r} is not a Hugging Face model directory")
    else:
        from failsoft.llm.models import default_llm_path

        root = _path(m.root, base_dir) if m.root else default_llm_path()
    draft = _path(m.draft, base_dir) if m.draft else None
    workers = tuple(f"w{i}" for i in range(spec.workers))
    service = Service(spec.name, ServiceMode.LLM, workers, params)
    return LlmServing(
        service,
        tuple(on[i % len(on)] for i in range(spec.workers)),
        tuple(on[(spec.workers + i) % len(on)] for i in range(spec.spares)),
        spec.policy,
        m,
        spec.engine,
        root,
        draft,
        spec.restart_delay_ms,
    )


READ_MB_PER_S = 500.0  # a model's load time where it has no measured profile: its weights read


@dataclass(frozen=True, slots=True)
class _Footprint:
    weights_mb: float
    kv_bytes_per_token: int
    load_s: float


def _footprint(where: Path, dtype: str) -> _Footprint:
    """A stored model's weight bytes, KV bytes per token and load time, from its files: the byte
    pair's ``config.json`` (architecture and weights) or a Hugging Face directory's."""
    import contextlib
    import json

    from failsoft.llm.realsize import DTYPE_BYTES, kv_bytes_per_token

    try:
        config = json.loads((where / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"llm model {str(where)!r}: its config.json cannot be read: {exc}") from exc
    arch = config.get("architecture", config)  # the byte pair nests the transformers config
    try:
        heads = int(arch["num_attention_heads"])
        head_dim = int(arch.get("head_dim") or int(arch["hidden_size"]) // heads)
        kv_heads = int(arch.get("num_key_value_heads") or heads)
        layers = int(arch["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"llm model {str(where)!r}: config.json lacks the attention shape ({exc})"
        ) from None
    if "weights" in config:  # the byte pair: float32, its weights' size recorded
        nbytes, element = int(config["weights"]["bytes"]), 4
    else:
        nbytes = sum(p.stat().st_size for p in where.glob("*.safetensors"))
        element = DTYPE_BYTES.get(dtype if dtype != "auto" else str(arch.get("torch_dtype", "float32")), 4)
    weights_mb = nbytes / 2**20
    load_s = weights_mb / READ_MB_PER_S
    profile = where / "profile.json"
    if profile.is_file():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # unreadable: the estimate
            load_s = float(json.loads(profile.read_text())["load_ms"]) / 1000.0
    return _Footprint(weights_mb, kv_bytes_per_token(layers, kv_heads, head_dim, element), load_s)


def is_llm_entry(value: Any) -> bool:
    """Whether a raw ``services`` entry is an ``llm`` one (it has this module's schema)."""
    mode = value.get("mode") if isinstance(value, dict) else getattr(value, "mode", None)
    return str(getattr(mode, "value", mode)) == "llm"


def _path(value: str, base_dir: Path) -> Path:
    import os

    path = Path(os.path.expandvars(value)).expanduser()
    return path if path.is_absolute() else (base_dir / path).resolve()


__all__ = ["LlmEngineModel", "LlmModelModel", "LlmServiceModel", "LlmServing", "is_llm_entry", "llm_serving"]
