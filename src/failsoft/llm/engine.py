"""A continuous-batching LLM engine with a paged KV cache, KV checkpoints and speculative calls.

The engine serves one :class:`~failsoft.llm.models.LoadedLm`: a ``transformers`` causal LM with the
standard KV layout (the byte-level pair trained here, or a Hugging Face model directory loaded by
:func:`failsoft.llm.hf.load_hf`) and its tokenizer (a text prompt is encoded with it; token ids
are taken as they are, bounded by the model's vocabulary; the model's EOS ids end a request). It
is single-threaded: a runtime worker calls :meth:`Engine.step` in its loop and the other methods
between steps.

**Paged KV cache.** The KV of every request lives in fixed-size pages (``page_size`` tokens) of one
preallocated pool per engine, ``(layers, pages, page_size, kv_heads, head_dim)`` for K and for V,
in the model's own dtype.
A request is admitted only when the pool has the pages it can ever need
(``ceil((prompt + max_tokens - 1) / page_size)``: the last token's KV is never computed), so a
running request never waits for memory and no preemption is needed; its pages return to the pool
when it finishes, is cancelled or is closed. Before a forward pass the requests' pages are
gathered into a contiguous cache (one indexing of the pool for every layer and request: each
request knows the pool row of each of its positions), the model runs with ``transformers``' own
attention (a fused paged kernel is what vLLM adds), and the new KV is scattered back into the
pages in one indexing too, so the pages are the only KV state.

**Continuous batching.** Requests wait FIFO and join between steps as pages free up. A step first
runs the forward of each restored request's uncovered tail, then the prefill of the newcomers
together (left-padded to the longest, in groups of at most ``PREFILL_BATCH_TOKENS`` padded
tokens), then one batched decode forward over every request that had one token to feed (its
cache left-padded and masked when the lengths differ, explicit positions). Each request gains one
token per step; requests leave as soon as they finish.

**Sampling.** Greedy (``temperature = 0``) or temperature sampling from a per-request seeded
generator, optionally nucleus (``top_p < 1``: only the most likely tokens whose probabilities sum
to ``top_p`` are drawn from, Holtzman et al., 2020). Each new token goes to the request's callback
and its stream; TTFT (submit to first token) and time per output token are measured with
``time.perf_counter``.

**KV checkpoints.** :meth:`Engine.export_kv` returns the full pages filled since the last export
as bytes (:mod:`failsoft.llm.checkpoint`); :meth:`Engine.restore` rebuilds a request on another
engine from a :class:`~failsoft.llm.checkpoint.CheckpointBuffer`, recomputing only the tokens its
pages do not cover, and continues it.

**Speculative decoding, as separate calls** (so that draft and target can run on two workers, as
LUMEN's Alg. 3 needs): on the draft's engine :meth:`open` a request and :meth:`propose` ``k``
tokens; on the target's engine :meth:`verify` them in one forward pass (greedy: the longest prefix
equal to the target's own choices, plus the target's next token, is committed and streamed); back
on the draft's engine :meth:`accept` what was committed (the draft's KV of rejected tokens is
dropped). :func:`failsoft.llm.speculative.speculative_generate` composes them on one machine.
"""

from __future__ import annotations

import inspect
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from failsoft.errors import ConfigError, InvalidRequestError
from failsoft.llm.checkpoint import CheckpointBuffer, KvChunk
from failsoft.llm.tokens import BYTES

if TYPE_CHECKING:
    import torch

    from failsoft.llm.models import LoadedLm
    from failsoft.llm.tokens import Tokenizer

MAX_TOKENS_BOUND = 4096
MAX_TEMPERATURE = 10.0
PREFILL_BATCH_TOKENS = 4096  # newcomers prefilled in one forward, padded prompt tokens at most
TokenCallback = Callable[["Request", int], None]


@dataclass(frozen=True)
class SamplingParams:
    """``max_tokens`` in [1, 4096]; ``temperature`` 0 (greedy) to 10; ``top_p`` in (0, 1] (1: the
    whole distribution); ``seed`` for sampling (what a torch generator takes)."""

    max_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    stop_at_eos: bool = True
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequestError(f"max_tokens must be an integer; got {self.max_tokens!r}")
        if not 1 <= self.max_tokens <= MAX_TOKENS_BOUND:
            raise InvalidRequestError(
                f"max_tokens must be in [1, {MAX_TOKENS_BOUND}]; got {self.max_tokens!r}"
            )
        if not (isinstance(self.temperature, int | float) and 0 <= self.temperature <= MAX_TEMPERATURE):
            raise InvalidRequestError(
                f"temperature must be in [0, {MAX_TEMPERATURE}]; got {self.temperature!r}"
            )
        if isinstance(self.top_p, bool) or not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise InvalidRequestError(f"top_p must be in (0, 1]; got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not -(2**63) <= self.seed < 2**64:
            raise InvalidRequestError(f"seed must be an integer in [-2**63, 2**64); got {self.seed!r}")


class PagePool:
    """Fixed-size KV pages by index; allocation is all-or-nothing."""

    def __init__(self, pages: int) -> None:
        if pages < 1:
            raise ConfigError(f"kv_pages must be >= 1; got {pages!r}")
        self.total = pages
        self._free = list(range(pages - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def release(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


@dataclass
class Request:
    """One request's state; ``output`` grows as tokens are generated."""

    id: str
    prompt_len: int
    tokens: list[int]
    params: SamplingParams
    on_token: TokenCallback | None = None
    scheduled: bool = True
    pages: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose KV is in the pages (always <= len(tokens) - 1)
    exported_pages: int = 0
    settled: int = 0  # tokens not tentative (speculative drafts after them await accept)
    state: Literal["waiting", "running", "finished"] = "waiting"
    finish_reason: str | None = None
    submitted_at: float = 0.0
    token_times: list[float] = field(default_factory=list)
    generator: Any = None
    slots: Any = field(default=None, repr=False)  # the pool row of each position it may fill
    detokenize: Callable[[Sequence[int]], str] = field(default=BYTES.decode, repr=False)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def text(self) -> str:
        return self.detokenize(self.output)

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    @property
    def ttft_ms(self) -> float | None:
        return (self.token_times[0] - self.submitted_at) * 1000 if self.token_times else None

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) * 1000 / (n - 1) if n > 1 else None


@dataclass(frozen=True)
class Verdict:
    """What :meth:`Engine.verify` committed: ``accepted`` of ``proposed`` drafts, then ``tokens``
    (the accepted drafts and the target's own next token, cut at max_tokens or EOS)."""

    proposed: int
    accepted: int
    tokens: tuple[int, ...]


class Engine:
    """Serve one model with ``kv_pages`` pages of ``page_size`` tokens, ``max_batch`` running."""

    def __init__(self, lm: LoadedLm, kv_pages: int = 256, page_size: int = 16, max_batch: int = 16) -> None:
        import torch

        if page_size < 1:
            raise ConfigError(f"page_size must be >= 1; got {page_size!r}")
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1; got {max_batch!r}")
        self.lm = lm
        self.page_size = page_size
        self.max_batch = max_batch
        self.pool = PagePool(kv_pages)
        shape = (lm.layers, kv_pages, page_size, lm.kv_heads, lm.head_dim)
        dtype = next(lm.module.parameters()).dtype  # the KV the model computes, kept as it is
        self._k = torch.zeros(shape, dtype=dtype, device=lm.device)
        self._v = torch.zeros(shape, dtype=dtype, device=lm.device)
        flat = (lm.layers, kv_pages * page_size, lm.kv_heads, lm.head_dim)
        self._kf, self._vf = self._k.view(flat), self._v.view(flat)  # a row per (page, slot)
        forward = inspect.signature(type(lm.module).forward).parameters
        self._cache_kw = "cache" if "cache" in forward else "past_key_values"
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()

    # ------------------------------------------------------------------ requests
    @property
    def context(self) -> int:
        return self.lm.context

    @property
    def kv_mb_per_token(self) -> float:
        return self.lm.kv_mb_per_token

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer: ``encode``, ``decode`` and ``chat`` (its chat template)."""
        return self.lm.tokenizer

    def _tokens(self, prompt: str | bytes | Sequence[int]) -> list[int]:
        tokens = (
            self.lm.tokenizer.encode(prompt) if isinstance(prompt, str | bytes) else [int(t) for t in prompt]
        )
        if not tokens:
            raise InvalidRequestError("the prompt is empty")
        bad = [t for t in tokens if not 0 <= t < self.lm.vocab_size]
        if bad:
            raise InvalidRequestError(f"token {bad[0]} is outside the vocabulary [0, {self.lm.vocab_size})")
        return tokens

    def _check_fits(self, prompt_len: int, params: SamplingParams) -> None:
        if prompt_len > self.context:
            raise InvalidRequestError(
                f"the prompt has {prompt_len} tokens, longer than the model's context of {self.context}"
            )
        if prompt_len + params.max_tokens > self.context:
            raise InvalidRequestError(
                f"prompt of {prompt_len} tokens + max_tokens {params.max_tokens} exceeds the model's "
                f"context of {self.context}"
            )

    def _pages_for(self, req: Request) -> int:
        return math.ceil((req.prompt_len + req.params.max_tokens - 1) / self.page_size)

    def _new(
        self,
        tokens: list[int],
        prompt_len: int,
        params: SamplingParams,
        request_id: str | None,
        on_token: TokenCallback | None,
        scheduled: bool,
    ) -> Request:
        import torch

        rid = request_id if request_id is not None else f"r{next(self._ids)}"
        if rid in self._requests:
            raise InvalidRequestError(f"request id {rid!r} is already in use")
        req = Request(rid, prompt_len, tokens, params, on_token, scheduled, submitted_at=time.perf_counter())
        req.detokenize = self.lm.tokenizer.decode
        req.settled = len(tokens)
        if self._pages_for(req) > self.pool.total:
            raise InvalidRequestError(
                f"request {rid!r} needs {self._pages_for(req)} KV pages; the engine has {self.pool.total}"
            )
        if params.temperature > 0:
            req.generator = torch.Generator(device=self.lm.device).manual_seed(params.seed)
        self._requests[rid] = req
        return req

    def submit(
        self,
        prompt: str | bytes | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        on_token: TokenCallback | None = None,
        prompt_len: int | None = None,
    ) -> Request:
        """Queue a request; it joins the running batch at a step when its pages are free.

        ``prompt_len`` shorter than the tokens given: the tokens after it are output generated
        elsewhere already (a request recomputed after its worker failed); they count against
        ``max_tokens`` and the request continues after them."""
        params = params or SamplingParams()
        tokens = self._tokens(prompt)
        plen = len(tokens) if prompt_len is None else prompt_len
        if not 1 <= plen <= len(tokens):
            raise InvalidRequestError(f"prompt_len must be in [1, {len(tokens)}]; got {prompt_len!r}")
        if len(tokens) - plen >= params.max_tokens:
            raise InvalidRequestError(
                f"the {len(tokens) - plen} tokens already generated reach max_tokens {params.max_tokens}"
            )
        self._check_fits(plen, params)
        req = self._new(tokens, plen, params, request_id, on_token, scheduled=True)
        self._waiting.append(req)
        return req

    def open(
        self,
        prompt: str | bytes | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> Request:
        """A request driven only by :meth:`propose` / :meth:`verify` / :meth:`accept` (never by
        :meth:`step`); its pages are taken now (an error when the pool has too few)."""
        params = params or SamplingParams()
        tokens = self._tokens(prompt)
        self._check_fits(len(tokens), params)
        req = self._new(tokens, len(tokens), params, request_id, None, scheduled=False)
        self._admit(req)
        return req

    def _admit(self, req: Request) -> None:
        pages = self.pool.alloc(self._pages_for(req))
        if pages is None:
            del self._requests[req.id]
            raise InvalidRequestError(
                f"request {req.id!r} needs {self._pages_for(req)} KV pages; {self.pool.free} are free"
            )
        import torch

        req.pages, req.state = pages, "running"
        page_rows = torch.tensor(pages, dtype=torch.long) * self.page_size
        req.slots = (page_rows[:, None] + torch.arange(self.page_size)).flatten().to(self._k.device)
        self._running.append(req)

    def get(self, request_id: str) -> Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise InvalidRequestError(f"no request {request_id!r}") from None

    def cancel(self, request_id: str) -> bool:
        """Stop a request (a client gone, or a request moved elsewhere); its pages are freed.
        False when it is not here (finished already, or never was)."""
        req = self._requests.get(request_id)
        if req is None:
            return False
        if req.state == "waiting":
            self._waiting.remove(req)
        self._finish(req, "cancelled")
        return True

    close = cancel

    def _finish(self, req: Request, reason: str) -> None:
        if req.finished:
            return
        if req in self._running:
            self._running.remove(req)
        self.pool.release(req.pages)
        req.pages = []
        self._requests.pop(req.id, None)  # a finished request is the caller's; the engine forgets it
        req.state, req.finish_reason = "finished", reason

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def idle(self) -> bool:
        return not self._waiting and not any(r.scheduled for r in self._running)

    # ------------------------------------------------------------------ stepping
    def step(self) -> int:
        """Admit what fits, prefill the newcomers, decode the rest in one batch; tokens emitted."""
        while self._waiting and sum(r.scheduled for r in self._running) < self.max_batch:
            head = self._waiting[0]
            if self.pool.free < self._pages_for(head):
                break
            self._waiting.popleft()
            self._admit(head)
        active = [r for r in self._running if r.scheduled]
        singles = [r for r in active if len(r.tokens) - r.cached == 1]  # before prefills add more
        emitted = 0
        for req in [r for r in active if r.cached > 0 and len(r.tokens) - r.cached > 1]:
            logits = self._extend(req, req.tokens[req.cached :], keep=len(req.tokens) - req.cached)
            emitted += self._emit(req, [self._sample(req, logits[-1])])
        fresh = [r for r in active if r.cached == 0 and len(r.tokens) > 1]
        for group in _prefill_groups(fresh, PREFILL_BATCH_TOKENS):
            emitted += self._emit_rows(group, self._prefill_batch(group))
        if singles:
            emitted += self._emit_rows(singles, self._decode_batch(singles))
        return emitted

    def _emit_rows(self, reqs: list[Request], logits: torch.Tensor) -> int:
        """Sample and emit one token per request from (batch, vocab) logits."""
        greedy = logits.argmax(-1).tolist()  # one call for the whole batch
        emitted = 0
        for i, req in enumerate(reqs):
            token = greedy[i] if req.params.temperature == 0 else self._sample(req, logits[i])
            emitted += self._emit(req, [token])
        return emitted

    def run(self) -> None:
        """Step until no scheduled request is waiting or running."""
        while not self.idle():
            self.step()

    def generate(self, prompt: str | bytes | Sequence[int], params: SamplingParams | None = None) -> Request:
        """Submit and step until this request is done (others progress meanwhile)."""
        req = self.submit(prompt, params)
        while not req.finished:
            self.step()
        return req

    def stream(self, req: Request) -> Iterator[int]:
        """The request's tokens as they come, stepping the engine as needed. Closing the iterator
        before the end (a client that disconnected) cancels the request and frees its pages."""
        sent = 0
        try:
            while True:
                while sent < len(req.output):
                    sent += 1
                    yield req.output[sent - 1]
                if req.finished:
                    return
                self.step()
        finally:
            if not req.finished:
                self.cancel(req.id)

    # ------------------------------------------------------------------ model calls
    def _past(self, rows: torch.Tensor) -> Any:
        """A ``transformers`` cache holding the pool rows ``rows`` ((batch, n) pool row indices)
        of every layer, as (batch, kv_heads, n, head_dim): one gather per K and V for all layers."""
        from transformers import DynamicCache

        if rows.shape[1] == 0:
            return DynamicCache()
        k = self._kf[:, rows].transpose(2, 3)  # (layers, batch, kv_heads, n, head_dim)
        v = self._vf[:, rows].transpose(2, 3)
        return DynamicCache(list(zip(k.unbind(0), v.unbind(0), strict=True)))

    def _scatter(self, rows: torch.Tensor, past: Any, start: int, keep: int, row: int | None = None) -> None:
        """Write the cache's positions ``[start, start + keep)`` of every layer and batch row (of
        batch row ``row`` only, when given) into the pool rows ``rows`` ((batch, keep))."""
        import torch

        if keep <= 0:
            return
        layers = past.layers
        b = slice(None) if row is None else slice(row, row + 1)
        k = torch.stack([layer.keys[b, :, start : start + keep] for layer in layers])
        v = torch.stack([layer.values[b, :, start : start + keep] for layer in layers])
        self._kf[:, rows] = k.transpose(2, 3)  # (layers, batch, keep, kv_heads, head_dim)
        self._vf[:, rows] = v.transpose(2, 3)

    def _extend(self, req: Request, feed: list[int], keep: int, last_only: bool = True) -> torch.Tensor:
        """One forward of ``feed`` after the request's cached tokens; keeps the first ``keep`` new
        KV entries; returns the logits of every fed position."""
        logits, past = self._forward(req, feed, last_only)
        self._keep(req, past, keep)
        return logits

    def _keep(self, req: Request, past: Any, keep: int) -> None:
        """Store the first ``keep`` positions a forward added after the request's cached tokens."""
        self._scatter(req.slots[None, req.cached : req.cached + keep], past, req.cached, keep)
        req.cached += max(keep, 0)

    def _forward(self, req: Request, feed: list[int], last_only: bool = False) -> tuple[torch.Tensor, Any]:
        """One forward of ``feed`` after the request's cached tokens: the logits of every fed
        position (of the last only, when that is all the caller reads: a prefill's vocabulary
        projection is then one row) and the cache (cached tokens, then the fed ones)."""
        import torch

        dev = self.lm.device
        cache = self._past(req.slots[None, : req.cached])
        ids = torch.tensor([feed], dtype=torch.long, device=dev)
        positions = torch.arange(req.cached, req.cached + len(feed), device=dev)[None]
        logits, past = self._call(ids, cache, positions, None, 1 if last_only else 0)
        return logits[0], past

    def _prefill_batch(self, reqs: list[Request]) -> torch.Tensor:
        """One forward of the prompts of requests with nothing cached, left-padded to the longest
        (masked when they differ); their KV goes to their pages; returns (batch, vocab) logits."""
        import torch
        from transformers import DynamicCache

        dev = self.lm.device
        lengths = [len(r.tokens) for r in reqs]
        longest = max(lengths)
        ids = torch.tensor([[0] * (longest - len(r.tokens)) + r.tokens for r in reqs], device=dev)
        offsets = torch.tensor([longest - n for n in lengths], device=dev)[:, None]
        cols = torch.arange(longest, device=dev)[None]
        valid = cols >= offsets  # (batch, longest): the real tokens
        mask = None if min(lengths) == longest else valid.long()
        logits, past = self._call(ids, DynamicCache(), (cols - offsets).clamp(min=0), mask, 1)
        dest = torch.cat([r.slots[:n] for r, n in zip(reqs, lengths, strict=True)])
        for pool, kind in ((self._kf, "keys"), (self._vf, "values")):
            kv = torch.stack([getattr(layer, kind) for layer in past.layers])  # (layers, b, h, n, d)
            pool[:, dest] = kv.transpose(2, 3)[:, valid]
        for r, n in zip(reqs, lengths, strict=True):
            r.cached = n
        return logits[:, -1]

    def _decode_batch(self, reqs: list[Request]) -> torch.Tensor:
        """One batched forward of each request's last token, its cache left-padded to the longest
        (masked); returns (batch, vocab) logits."""
        import torch

        dev = self.lm.device
        longest = max(r.cached for r in reqs)
        lengths = torch.tensor([r.cached for r in reqs], device=dev)
        if all(r.cached == longest for r in reqs):  # no padding: no mask to build (nor to apply)
            rows = torch.stack([r.slots[:longest] for r in reqs])
            mask = None
        else:
            pad = torch.zeros(longest, dtype=torch.long, device=dev)  # any row: masked out
            rows = torch.stack([torch.cat((pad[: longest - r.cached], r.slots[: r.cached])) for r in reqs])
            mask = (torch.arange(longest + 1, device=dev)[None] >= (longest - lengths)[:, None]).long()
        ids = torch.tensor([[r.tokens[-1]] for r in reqs], dtype=torch.long, device=dev)
        logits, past = self._call(ids, self._past(rows), lengths[:, None], mask, 1)
        new_rows = torch.stack([r.slots[r.cached : r.cached + 1] for r in reqs])
        self._scatter(new_rows, past, longest, 1)
        for r in reqs:
            r.cached += 1
        return logits[:, -1]

    def _call(
        self, ids: torch.Tensor, cache: Any, positions: torch.Tensor, mask: Any, keep: int
    ) -> tuple[Any, Any]:
        """The model's forward; (batch, fed or ``keep`` last, vocab) logits and the cache it filled.
        ``transformers`` renamed ``past_key_values`` to ``cache`` (5.x); both are served."""
        import torch

        kwargs = {self._cache_kw: cache, "logits_to_keep": keep}
        with torch.inference_mode():
            out = self.lm.module(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs
            )
        past = getattr(out, "cache", None)
        return out.logits, past if past is not None else out.past_key_values

    def _sample(self, req: Request, logits: torch.Tensor) -> int:
        import torch

        if req.params.temperature == 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / req.params.temperature, dim=-1)
        if req.params.top_p < 1:
            # the nucleus: the most likely tokens until their mass reaches top_p (the first always)
            ranked, order = probs.sort(descending=True)
            outside = ranked.cumsum(-1) - ranked >= req.params.top_p
            probs = torch.zeros_like(probs).scatter_(-1, order, ranked.masked_fill(outside, 0.0))
        return int(torch.multinomial(probs, 1, generator=req.generator))

    def _emit(self, req: Request, tokens: Sequence[int]) -> int:
        """Append generated tokens, notify, and finish the request at EOS or max_tokens."""
        n = 0
        for token in tokens:
            req.tokens.append(token)
            req.token_times.append(time.perf_counter())
            n += 1
            if req.on_token is not None:
                req.on_token(req, token)
            if len(req.output) >= req.params.max_tokens:
                self._finish(req, "length")
                break
            if req.params.stop_at_eos and token in self.lm.eos_ids:
                self._finish(req, "eos")
                break
        return n

    # ------------------------------------------------------------------ checkpoints
    def cached_tokens(self, request_id: str) -> int:
        return self.get(request_id).cached

    def export_kv(self, request_id: str, upto_tokens: int | None = None) -> bytes | None:
        """The full pages filled since the last export (at most ``upto_tokens`` tokens covered in
        all: what the checkpoint ledger allows), as bytes; None when there is no new full page."""
        req = self.get(request_id)
        if req.state != "running":
            raise InvalidRequestError(
                f"request {request_id!r} is {req.state}; only a running request exports KV"
            )
        full = req.cached // self.page_size
        if upto_tokens is not None:
            full = min(full, upto_tokens // self.page_size)
        if full <= req.exported_pages:
            return None
        idx = req.pages[req.exported_pages : full]
        chunk = KvChunk(
            req.id,
            self.lm.fingerprint,
            self.page_size,
            req.exported_pages,
            req.prompt_len,
            _numpy(req.tokens),
            _to_numpy(self._k[:, idx]),
            _to_numpy(self._v[:, idx]),
            _dtype_name(self._k.dtype),
        )
        req.exported_pages = full
        return chunk.to_bytes()

    def restore(
        self,
        checkpoint: CheckpointBuffer,
        params: SamplingParams,
        tokens: Sequence[int] | None = None,
        on_token: TokenCallback | None = None,
        scheduled: bool = True,
    ) -> Request:
        """Rebuild a request from its checkpoint and run it here: its pages are copied in, the
        tokens they do not cover are recomputed, then it continues. ``tokens`` (the request's
        tokens so far, as its stream delivered them) defaults to those of the newest chunk."""
        if checkpoint.request_id is None:
            raise InvalidRequestError("the checkpoint holds no page")
        if checkpoint.model != self.lm.fingerprint:
            raise InvalidRequestError(
                f"the checkpoint is of model {checkpoint.model!r}; this engine serves {self.lm.fingerprint!r}"
            )
        if checkpoint.kv_dtype != _dtype_name(self._k.dtype):
            raise InvalidRequestError(
                f"the checkpoint's KV is {checkpoint.kv_dtype}; this engine's {_dtype_name(self._k.dtype)}"
            )
        if checkpoint.page_size != self.page_size:
            raise InvalidRequestError(
                f"the checkpoint has pages of {checkpoint.page_size} tokens; this engine {self.page_size}"
            )
        toks = [int(t) for t in (tokens if tokens is not None else checkpoint.tokens)]
        covered = checkpoint.covered_tokens
        if len(toks) <= covered or toks[:covered] != checkpoint.tokens[:covered]:
            raise InvalidRequestError(
                f"the {len(toks)} tokens given do not extend the {covered} tokens the checkpoint covers"
            )
        self._check_fits(checkpoint.prompt_len, params)
        req = self._new(toks, checkpoint.prompt_len, params, checkpoint.request_id, on_token, scheduled)
        self._admit(req)
        import torch

        k, v = checkpoint.arrays()
        idx = req.pages[: checkpoint.pages]
        self._k[:, idx] = torch.from_numpy(k).view(self._k.dtype).to(self._k.device)
        self._v[:, idx] = torch.from_numpy(v).view(self._v.dtype).to(self._v.device)
        req.cached = covered
        req.exported_pages = 0
        if len(req.output) >= params.max_tokens:
            self._finish(req, "length")
        return req

    # ------------------------------------------------------------------ speculative calls
    def _driveable(self, request_id: str) -> Request:
        req = self.get(request_id)
        if req.state != "running":
            raise InvalidRequestError(f"request {request_id!r} is {req.state}")
        if req.params.temperature != 0:
            raise InvalidRequestError(
                f"request {request_id!r}: speculative decoding here is greedy only; temperature is "
                f"{req.params.temperature}"
            )
        return req

    def propose(self, request_id: str, k: int) -> list[int]:
        """Draft up to ``k`` greedy tokens (fewer near max_tokens); they stay tentative until
        :meth:`accept`."""
        if k < 1:
            raise InvalidRequestError(f"draft length must be >= 1; got {k!r}")
        req = self._driveable(request_id)
        k = min(k, req.params.max_tokens - len(req.output))
        drafted: list[int] = []
        for _ in range(k):
            logits = self._extend(req, req.tokens[req.cached :], keep=len(req.tokens) - req.cached)
            token = int(logits[-1].argmax())
            req.tokens.append(token)
            drafted.append(token)
        return drafted

    def accept(self, request_id: str, committed: Sequence[int]) -> None:
        """Replace the draft's tentative tokens by what the target committed; the KV of rejected
        tokens is dropped (overwritten later)."""
        req = self.get(request_id)
        new = req.tokens[: req.settled] + [int(t) for t in committed]
        common = req.settled
        while common < min(len(req.tokens), len(new)) and req.tokens[common] == new[common]:
            common += 1
        req.tokens = new
        req.cached = min(req.cached, common, len(new) - 1)
        req.settled = len(new)

    def verify(self, request_id: str, drafts: Sequence[int]) -> Verdict:
        """Check ``drafts`` against this (target) model in one forward pass; commit the accepted
        prefix and the target's next token (streamed like generated tokens)."""
        return self.verify_batch([(request_id, drafts)])[0]

    def verify_batch(self, items: Sequence[tuple[str, Sequence[int]]]) -> list[Verdict]:
        """:meth:`verify` for several requests, one batched forward per length of what is fed
        (the tokens not cached yet plus the drafts: all alike when the drafts are, the usual
        case), as a decode step batches; one :class:`Verdict` per item, in order. A drafting peer's
        round thus costs the verifying worker one pass, not one per request."""
        fed: list[tuple[int, Request, list[int], list[int]]] = []
        for i, (request_id, drafts) in enumerate(items):
            req = self._driveable(request_id)
            ids = [int(t) for t in drafts]
            # a draft whose vocabulary is padded wider may propose ids this model has not: never accepted
            usable = next((j for j, t in enumerate(ids) if not 0 <= t < self.lm.vocab_size), len(ids))
            fed.append((i, req, req.tokens[req.cached :], ids[:usable]))
        out: list[Verdict | None] = [None] * len(items)
        by_len: dict[int, list[tuple[int, Request, list[int], list[int]]]] = {}
        for entry in fed:
            by_len.setdefault(len(entry[2]) + len(entry[3]), []).append(entry)
        for group in by_len.values():
            logits, past = self._forward_batch([r for _, r, _, _ in group], [p + d for _, _, p, d in group])
            start = max(r.cached for _, r, _, _ in group)
            for row, (i, req, pending, drafts) in enumerate(group):
                choice = logits[row, len(pending) - 1 :].argmax(-1).tolist()
                accepted = 0
                while accepted < len(drafts) and drafts[accepted] == choice[accepted]:
                    accepted += 1
                committed = [*drafts[:accepted], choice[accepted]][: req.params.max_tokens - len(req.output)]
                if req.params.stop_at_eos:
                    ends = [j for j, t in enumerate(committed) if t in self.lm.eos_ids]
                    committed = committed[: ends[0] + 1] if ends else committed
                # keep the KV of the pending tokens and of the committed tokens but the newest
                keep = len(pending) + len(committed) - 1
                self._scatter(req.slots[None, req.cached : req.cached + keep], past, start, keep, row)
                req.cached += max(keep, 0)
                self._emit(req, committed)
                req.settled = len(req.tokens)
                out[i] = Verdict(len(items[i][1]), accepted, tuple(committed))
        return [v for v in out if v is not None]

    def _forward_batch(self, reqs: list[Request], feeds: list[list[int]]) -> tuple[torch.Tensor, Any]:
        """One batched forward of equally long ``feeds``, each after its request's cached tokens
        (the caches left-padded to the longest, masked): (batch, fed, vocab) logits and the cache
        (padded cached tokens, then the fed ones)."""
        import torch

        if len(reqs) == 1:
            logits, past = self._forward(reqs[0], feeds[0])
            return logits[None], past
        dev = self.lm.device
        longest = max(r.cached for r in reqs)
        lengths = torch.tensor([r.cached for r in reqs], device=dev)
        pad = torch.zeros(longest, dtype=torch.long, device=dev)  # any row: masked out
        rows = torch.stack([torch.cat((pad[: longest - r.cached], r.slots[: r.cached])) for r in reqs])
        n = len(feeds[0])
        mask = (torch.arange(longest + n, device=dev)[None] >= (longest - lengths)[:, None]).long()
        ids = torch.tensor(feeds, dtype=torch.long, device=dev)
        positions = lengths[:, None] + torch.arange(n, device=dev)[None]
        same = all(r.cached == longest for r in reqs)
        return self._call(ids, self._past(rows), positions, None if same else mask, 0)


def _prefill_groups(reqs: list[Request], budget: int) -> Iterator[list[Request]]:
    """Newcomers in arrival order, in groups whose padded prompts (batch x longest) fit ``budget``
    tokens (a prompt longer than the budget goes alone)."""
    group: list[Request] = []
    longest = 0
    for req in reqs:
        n = len(req.tokens)
        if group and (len(group) + 1) * max(longest, n) > budget:
            yield group
            group, longest = [], 0
        group.append(req)
        longest = max(longest, n)
    if group:
        yield group


def _numpy(tokens: list[int]) -> Any:
    import numpy as np

    return np.asarray(tokens, dtype=np.int64)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _to_numpy(kv: torch.Tensor) -> Any:
    """KV pages as numpy; bfloat16 (which numpy lacks) as its int16 bit pattern."""
    import torch

    kv = kv.cpu()
    return (kv.view(torch.int16) if kv.dtype == torch.bfloat16 else kv).numpy()
