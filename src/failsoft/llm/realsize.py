"""Random-weight Llama models of real sizes: what a real model's reload costs, and its KV volume.

The trained pair (:mod:`failsoft.llm.models`) is tiny, so its reload takes milliseconds; LUMEN's
recovery is about models whose reload takes seconds to minutes. Only the *shapes* of those models
matter for that (how many bytes to read and place, how many KV bytes a token holds), so they are
built here from public architecture numbers with random weights (nothing downloaded) and stored as
a Hugging Face checkpoint: ``config.json``, ``model-NNNNN.safetensors`` shards of about 1 GiB,
``model.safetensors.index.json`` and ``failsoft.json`` (shape, dtype, sizes, how it was built)::

    <root>/llm-realsize/<shape>-<dtype>/

The build never holds the model: the tensor names and shapes come from a model on the meta device
and each tensor is drawn (seeded normal, std 0.02; norms 1) only when its shard is written, so a
7B model is built within a couple of GiB of memory. :func:`load_real_size` is the reload a worker
of such a model does: a model on the meta device, the shards read with safetensors straight onto
the device, the weights assigned (no random initialisation of a full-size model first). The
analytic numbers (:meth:`Shape.parameters`, :meth:`Shape.kv_bytes_per_token`) hold for every
shape, including those too large to build on a machine (Llama-2-70B: 128 GiB in bf16).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failsoft.errors import ConfigError, CorruptModelError
from failsoft.llm.models import llama_config
from failsoft.zoo import pagecache

if TYPE_CHECKING:
    import torch

FAMILY = "llm-realsize"
FORMAT = "failsoft-llm-realsize/1"
META_FILE = "failsoft.json"
INDEX_FILE = "model.safetensors.index.json"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
GIB = 2**30


@dataclass(frozen=True)
class Shape:
    """A Llama architecture's numbers (those of its public ``config.json``)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    context: int
    source: str = ""
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        """Weights of ``LlamaForCausalLM`` with untied embeddings: embeddings and LM head, per layer
        the q/k/v/o projections, the SwiGLU MLP and two RMSNorms, and the final norm."""
        kv = self.kv_heads * self.head_dim
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        per_layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return 2 * self.vocab * self.hidden + self.layers * per_layer + self.hidden

    def weight_bytes(self, dtype: str = "bfloat16") -> int:
        return self.parameters() * dtype_bytes(dtype)

    def kv_bytes_per_token(self, dtype: str = "bfloat16") -> int:
        """K and V of every layer and KV head (review Eq. 1): 2 * layers * kv_heads * head_dim * bytes."""
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, dtype_bytes(dtype))

    def config(self, dtype: str = "bfloat16") -> Any:
        return llama_config(
            self,
            self.vocab,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            dtype=dtype,
        )

    def describe(self, dtype: str = "bfloat16") -> dict[str, Any]:
        """The analytic numbers: parameters, weight bytes and KV bytes per token in ``dtype``."""
        kv = self.kv_bytes_per_token(dtype)
        return {
            "shape": asdict(self),
            "dtype": dtype,
            "parameters": self.parameters(),
            "weight_bytes": self.weight_bytes(dtype),
            "weight_gib": round(self.weight_bytes(dtype) / GIB, 3),
            "kv_bytes_per_token": kv,
            "kv_mb_per_token": round(kv / 2**20, 6),
        }


# Public config.json numbers of each model (Hugging Face model cards), untied embeddings, 32k vocab.
SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, "TinyLlama/TinyLlama-1.1B config.json"),
        Shape("llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, "meta-llama/Llama-2-7b-hf config.json"),
        Shape("llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, "meta-llama/Llama-2-13b-hf config.json"),
        Shape("llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, "meta-llama/Llama-2-70b-hf config.json"),
    )
}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, nbytes: int) -> int:
    """KV-cache bytes one token holds: a key and a value per layer and KV head (review Eq. 1)."""
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("bytes", nbytes),
    ):
        if value < 1:
            raise ConfigError(f"kv_bytes_per_token: {name} must be >= 1; got {value!r}")
    return 2 * layers * kv_heads * head_dim * nbytes


def shape_of(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ConfigError(f"unknown real-size shape {name!r}; known: {', '.join(SHAPES)}") from None


def variant_dir(root: str | Path, shape: Shape, dtype: str) -> Path:
    return Path(root) / FAMILY / f"{shape.name}-{dtype}"


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    dtype_bytes(dtype)
    return getattr(torch, dtype)


def _meta_model(config: Any) -> Any:
    """The model's module tree on the meta device: names and shapes, no memory, no initialisation."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _random_tensor(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator
) -> torch.Tensor:
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(-1)
    step = 1 << 24  # draw in float32 blocks of 64 MiB, cast into the target dtype
    for at in range(0, flat.numel(), step):
        n = min(step, flat.numel() - at)
        flat[at : at + n] = torch.randn(n, generator=gen) * 0.02
    return out


def build_real_size(
    root: str | Path, shape: Shape, dtype: str = "bfloat16", shard_bytes: int = GIB, seed: int = 0
) -> dict[str, Any]:
    """Write ``shape`` with random weights under ``root`` (idempotent: skipped when the stored
    shards have the sizes ``failsoft.json`` records; random weights need no hash)."""
    import torch
    from safetensors.torch import save_file

    from failsoft.zoo.build import install_variant
    from failsoft.zoo.repository import ModelRepository

    where = variant_dir(root, shape, dtype)
    if is_built(where):
        return {"built": False, "path": str(where), **_read_meta(where)["build"]}
    tdtype = _torch_dtype(dtype)
    config = shape.config(dtype)
    repo = ModelRepository(root)
    repo.root.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {}

    def write(scratch: Path) -> None:
        began = time.perf_counter()
        names = [(n, tuple(t.shape)) for n, t in _meta_model(config).state_dict().items()]
        gen = torch.Generator().manual_seed(seed)
        shards: dict[str, int] = {}
        weight_map: dict[str, str] = {}
        pending: dict[str, torch.Tensor] = {}
        pending_bytes = total = 0

        def flush() -> None:
            nonlocal pending, pending_bytes, total
            total += pending_bytes
            file = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(pending, str(scratch / file), metadata={"format": "pt"})
            shards[file] = (scratch / file).stat().st_size
            weight_map.update(dict.fromkeys(pending, file))
            pending, pending_bytes = {}, 0

        for name, tshape in names:
            tensor = _random_tensor(name, tshape, tdtype, gen)
            if pending and pending_bytes + tensor.nbytes > shard_bytes:
                flush()
            pending[name] = tensor
            pending_bytes += tensor.nbytes
        if pending:
            flush()
        config.to_json_file(str(scratch / "config.json"))
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (scratch / INDEX_FILE).write_text(json.dumps(index, indent=1))
        summary.update(
            {
                "shards": shards,
                "weight_bytes": total,
                "seconds": round(time.perf_counter() - began, 2),
                "seed": seed,
            }
        )
        meta = {"format": FORMAT, **shape.describe(dtype), "build": summary}
        (scratch / META_FILE).write_text(json.dumps(meta, indent=1))

    install_variant(repo, FAMILY, where.name, write)
    return {"built": True, "path": str(where), **summary}


def _read_meta(where: Path) -> dict[str, Any]:
    try:
        meta = json.loads((where / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CorruptModelError(f"{str(where)!r}: no readable {META_FILE}: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise CorruptModelError(f"{str(where / META_FILE)!r} is not a failsoft real-size model")
    return dict(meta)


def is_built(where: Path) -> bool:
    try:
        shards = _read_meta(where)["build"]["shards"]
        return all((where / f).stat().st_size == size for f, size in shards.items())
    except (CorruptModelError, KeyError, TypeError, OSError):
        return False


def shard_files(where: Path) -> list[Path]:
    return [where / f for f in _read_meta(where)["build"]["shards"]]


def load_real_size(where: str | Path, device: str = "cpu") -> tuple[Any, dict[str, float]]:
    """A worker's reload of a stored real-size model: the module (eval mode, on ``device``) and
    the time of each phase in ms (``build``: the meta model; ``read``: safetensors onto the
    device; ``assign``: the weights into the model, the rotary tables rebuilt). On the CPU the
    weights are copied out of the file's mapping into the process's own memory: safetensors would
    otherwise map them, and a reload from the page cache would cost nothing until the first
    forward faulted every page in (a GPU worker cannot map: it copies every byte to the device)."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    where = Path(where)
    files = shard_files(where)
    t0 = time.perf_counter()
    config = LlamaConfig.from_json_file(str(where / "config.json"))
    model = _meta_model(config)
    t1 = time.perf_counter()
    state: dict[str, torch.Tensor] = {}
    for f in files:
        shard = load_file(str(f), device=device)
        if device == "cpu":  # safetensors maps the file: copy, so every byte is placed, as on a GPU
            shard = {k: v.clone() for k, v in shard.items()}
        state.update(shard)
        del shard
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    t2 = time.perf_counter()
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise CorruptModelError(f"{str(where)!r}: weights cannot be loaded: {exc}") from exc
    model.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)  # non-persistent buffers
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise CorruptModelError(f"{str(where)!r}: tensors not loaded: {left[:5]}")
    model.eval()
    t3 = time.perf_counter()
    return model, {
        "build_ms": round((t1 - t0) * 1000, 1),
        "read_ms": round((t2 - t1) * 1000, 1),
        "assign_ms": round((t3 - t2) * 1000, 1),
        "total_ms": round((t3 - t0) * 1000, 1),
    }


def cache_bytes(past: Any) -> int:
    """Bytes of the keys and values a forward left in its cache (``DynamicCache`` or tuples)."""
    layers = getattr(past, "layers", None)
    pairs = [(layer.keys, layer.values) for layer in layers] if layers is not None else list(past)
    return sum(int(k.nbytes) + int(v.nbytes) for k, v in pairs)


def forward_kv_bytes_per_token(model: Any, tokens: int = 4) -> dict[str, Any]:
    """Run one forward of ``tokens`` tokens with a cache; the bytes it holds per token, and the
    formula's, from the model's own config and weight dtype."""
    import torch

    cfg = model.config
    device = next(model.parameters()).device
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = model(input_ids=ids.to(device), use_cache=True)
    past = getattr(out, "cache", None)  # transformers >= 5.x; ``past_key_values`` before
    held = cache_bytes(past if past is not None else out.past_key_values)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    nbytes = next(model.parameters()).element_size()
    formula = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, nbytes)
    return {
        "tokens": tokens,
        "forward": held // tokens,
        "formula": formula,
        "equal": held == formula * tokens,
    }


# -- page cache -----------------------------------------------------------------------------------


def evict(files: list[Path]) -> None:
    """Drop ``files`` from the page cache: the next read is cold, from the disk, without dropping
    anyone else's cache."""
    for f in files:
        pagecache.evict(f)


def mem_available_bytes() -> int | None:
    return _proc_kib("/proc/meminfo", "MemAvailable:")


def _rss_anon_bytes() -> int | None:
    return _proc_kib("/proc/self/status", "RssAnon:")


def _proc_kib(path: str, key: str) -> int | None:
    """Bytes of a ``KEY: N kB`` line of a /proc file; None where there is none."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
