"""An LLM worker of an ``llm`` service (LUMEN): :mod:`failsoft.llm`'s engine in a loop of its own.

One worker serves one model (a target LM built by ``failsoft llm build``) with continuous batching
and KV-bounded admission (the engine admits a request only when its pages are free). The engine is
single-threaded, so every call takes one lock; the loop thread steps the engine while it has work
and sleeps on a condition otherwise. The gateway drives it through these calls (a Ray actor, see
:func:`failsoft.runtime.cluster.spawn_llm_worker`):

* :meth:`LlmWorker.submit` queues a request (its tokens, sampling parameters; bad input raises
  :class:`~failsoft.errors.InvalidRequestError` at once, naming the value); with ``prompt_len``
  shorter than the tokens it continues a request whose first tokens were generated elsewhere (a
  recompute after a failure);
* :meth:`LlmWorker.poll` long-polls its output from an offset (the gateway streams what it gets);
* :meth:`LlmWorker.cancel` stops it and frees its KV pages (a stream client that left);
* KV checkpoints: :meth:`LlmWorker.export_kv` returns the pages filled since the last export,
  :meth:`LlmWorker.hold` keeps a peer's chunks in host memory, :meth:`LlmWorker.restore` resumes a
  request from the checkpoint it holds, :meth:`LlmWorker.drop_checkpoint` frees one;
* :meth:`LlmWorker.load` reports the queue and the KV pages (join-shortest-queue routing, tests that
  count pages);
* a worker started without a spec is a *standby*: its process is up and its imports done, no model
  loaded; :meth:`LlmWorker.adopt` turns it into a named worker (a restart without the process start
  and the imports, which are most of a small model's restart). Under progressive recovery a standby
  holds the draft already (:meth:`LlmWorker.preload_draft`, its memory counted by the core), so a
  draft-first restart drafts at once and loads only the target, behind it, at a lower CPU priority
  than the draft's serving.

Each finished request's TTFT and time per output token are kept for :meth:`LlmWorker.stats`;
:meth:`LlmWorker.metrics` renders them, tokens, KV pages and checkpoint bytes as Prometheus text
(:mod:`failsoft.runtime.llm_metrics`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from failsoft.errors import InvalidRequestError
from failsoft.runtime.llm_metrics import LlmWorkerMetrics

POLL_MAX_S = 30.0
KEEP_FINISHED = 1024  # finished streams kept for late polls
KEEP_METRICS = 4096
ASSIST_LEASE_S = 0.3  # a request verified for a drafting peer is decoded here again after this
# a draft step's share of a target step under injected slowness (set_slow): Llama-2-7B at TP 1
# over Llama-2-70B at TP 4, the ratio the simulator uses (docs/lumen.md)
DRAFT_STEP_SHARE = 0.386


@dataclass(frozen=True, slots=True)
class LlmWorkerSpec:
    """Which model a worker serves and how: ``model`` (e.g. ``tiny-target``) under ``root``, or,
    with ``hf``, the Hugging Face model directory ``root`` (``model`` is then its label)."""

    name: str
    root: Path
    model: str
    device: str | None = None
    kv_pages: int = 256
    page_size: int = 16
    max_batch: int = 16
    torch_threads: int = 1
    hf: bool = False
    dtype: str = "auto"

    def load(self, which: str | None = None) -> Any:
        """The target (``which`` None) or the named draft (a built pair's name, or a Hugging Face
        directory), loaded onto this process's device."""
        if self.hf:
            from failsoft.llm.hf import load_hf

            path = self.root if which is None else Path(which)
            return load_hf(path, _local(self.device), self.dtype, name=None if which else self.model)
        from failsoft.llm.models import load_lm

        return load_lm(self.root, which or self.model, _local(self.device))


@dataclass(slots=True)
class _Stream:
    output: list[int] = field(default_factory=list)
    finished: bool = False
    reason: str | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None


def _recorded_acceptance(root: Path, model: str) -> float | None:
    """The acceptance rate ``failsoft llm build`` recorded for a draft (None when it has none)."""
    import json

    try:
        value = json.loads((Path(root) / "llm" / model / "config.json").read_text()).get("acceptance")
    except (OSError, ValueError):
        return None
    if isinstance(value, dict):
        value = value.get("acceptance")
    return float(value) if isinstance(value, (int, float)) else None


def sampling_params(sampling: dict[str, Any]) -> Any:
    """:class:`failsoft.llm.SamplingParams` from a request's JSON fields; unknown fields refused."""
    import dataclasses

    from failsoft.llm import SamplingParams

    known = {f.name for f in dataclasses.fields(SamplingParams)}
    extra = sorted(set(sampling) - known)
    if extra:
        raise InvalidRequestError(
            f"unknown sampling parameter {extra[0]!r} (known: {', '.join(sorted(known))})"
        )
    return SamplingParams(**sampling)


class LlmWorker:
    """One LLM worker. Thread-safe: Ray runs its methods on a pool of threads."""

    spec: LlmWorkerSpec  # set once it serves (at once, or when a standby adopts a worker's name)

    def __init__(self, spec: LlmWorkerSpec | None, torch_threads: int = 1) -> None:
        """Serve ``spec``'s model; with ``spec`` None, a *standby*: the process is up and torch,
        transformers and the engine are imported (seconds, most of a restart), but no model is
        loaded until :meth:`adopt` names the worker it replaces."""
        import torch
        from transformers import LlamaForCausalLM  # noqa: F401  (the lazy module's real import)

        from failsoft.llm import Engine  # noqa: F401
        from failsoft.llm.models import load_lm  # noqa: F401

        threads = spec.torch_threads if spec is not None else torch_threads
        if threads > 0:
            torch.set_num_threads(threads)
        self._cond = threading.Condition()
        self._serving = False
        self._adopted = False
        self._target_ready = threading.Event()
        self._dlock = threading.Lock()  # the draft engine (progressive restart), separate from the loop
        self.drafter: Any = None
        self._drafting: set[str] = set()
        self.draft_ms: float | None = None
        self.draft_acceptance: float | None = None
        self._proposed = self._accepted = 0
        self._step_ms: float | None = None  # a busy step, moving average (a drafting peer's gain)
        self._assisted: dict[str, float] = {}  # request id -> last verification of a peer's drafts
        self._slow_s = 0.0  # injected per step (set_slow); kept when a standby adopts a name
        self._plock = threading.Lock()  # a standby's draft preload, which a restart's adopt waits for
        self._preloaded: tuple[str, Any] | None = None  # (draft, its LM) loaded while a standby
        self.preload_ms: float | None = None
        if spec is not None:
            self._serve(spec)
            self._target_ready.set()

    def preload_draft(self, spec: LlmWorkerSpec, draft: str) -> dict[str, Any]:
        """A standby loads ``draft`` now (``spec`` says how: root, device, dtype; its name is not
        the worker's yet), so that a draft-first :meth:`adopt` of it drafts at once; :meth:`info`."""
        with self._plock:
            if self._adopted or self._serving:
                raise InvalidRequestError("only a standby preloads a draft")
            if self._preloaded is None or self._preloaded[0] != draft:
                started = time.perf_counter()
                lm = spec.load(draft)
                self.preload_ms = (time.perf_counter() - started) * 1000.0
                self._preloaded = (draft, lm)
        return self.info()

    def adopt(
        self, spec: LlmWorkerSpec, draft: str | None = None, target_delay_ms: float = 0.0
    ) -> dict[str, Any]:
        """A standby becomes worker ``spec.name``; its :meth:`info`. Without ``draft`` it loads the
        target and serves. With ``draft`` (a draft model's name, LUMEN's progressive restart) it
        drafts for peers (:meth:`draft_for`, phase ``draft``) as soon as the draft is up and returns
        then, the target loading behind it (:meth:`wait_target`): a draft this standby preloaded
        (:meth:`preload_draft`) costs no load (``draft_ms`` 0) and the target's load starts once
        the draft serves; a draft not preloaded loads beside the target (the restart is then the
        longer of the two loads, not their sum). The target's load runs at a lower CPU priority
        than the draft's serving, which it must not starve on a host with few cores.
        ``target_delay_ms`` delays the target's load (a larger model's reload, emulated). Refused
        (InvalidRequestError) on a worker that already serves or adopted."""
        with self._cond:
            if self._serving or self._adopted:
                raise InvalidRequestError(f"worker {self.spec.name!r} already serves; it cannot adopt")
            self._adopted = True
            self.spec = spec
        if draft is None:
            if target_delay_ms > 0:
                time.sleep(target_delay_ms / 1000.0)
            with self._cond:
                self._serve(spec)
            self._target_ready.set()
            return self.info()
        from failsoft.llm import Engine

        loader = threading.Thread(
            target=self._load_target, args=(spec, target_delay_ms), name=f"load-{spec.name}", daemon=True
        )
        with self._plock:  # a preload still under way finishes first
            preloaded = self._preloaded if self._preloaded and self._preloaded[0] == draft else None
            self._preloaded = None
        if preloaded is None:
            loader.start()
            started = time.perf_counter()
            lm = spec.load(draft)
            self.draft_ms = (time.perf_counter() - started) * 1000.0
        else:
            lm, self.draft_ms = preloaded[1], 0.0
        with self._dlock:
            if not self._target_ready.is_set():  # a target already back needs no draft
                self.drafter = Engine(lm, spec.kv_pages, spec.page_size, spec.max_batch)
        if preloaded is not None:
            loader.start()
        self.draft_acceptance = None if spec.hf else _recorded_acceptance(spec.root, draft)
        return self.info()

    def _load_target(self, spec: LlmWorkerSpec, delay_ms: float) -> None:
        """The target's load (in a thread of lower priority: :func:`_niced_load`), then its serving
        (in this thread: the engine's loop thread must not inherit the lower priority)."""
        loaded: dict[str, Any] = {}
        thread = threading.Thread(
            target=_niced_load, args=(spec, delay_ms, loaded), name=f"load-target-{spec.name}", daemon=True
        )
        thread.start()
        thread.join()
        with self._cond:
            self._serve(spec, loaded.get("lm"), loaded.get("ms"))
        with self._dlock:  # plain decoding once the target is back: the draft is evicted
            self._target_ready.set()
            self.drafter = None
            self._drafting.clear()

    def wait_target(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Block until the target model serves; :meth:`info`."""
        if not self._target_ready.wait(timeout_s):
            raise InvalidRequestError(f"worker {self.spec.name!r}: target not loaded in {timeout_s} s")
        return self.info()

    def _serve(self, spec: LlmWorkerSpec, lm: Any = None, load_ms: float | None = None) -> None:
        """Serve ``spec``'s target: ``lm`` when it is loaded already (and took ``load_ms``), else
        loaded here."""
        import torch

        from failsoft.llm import Engine

        if spec.torch_threads > 0:
            torch.set_num_threads(spec.torch_threads)
        self.spec = spec
        if lm is None:
            started = time.perf_counter()
            lm = spec.load()
            load_ms = (time.perf_counter() - started) * 1000.0
        self.lm, self.load_ms = lm, float(load_ms or 0.0)
        self.engine = Engine(self.lm, spec.kv_pages, spec.page_size, spec.max_batch)
        self._streams: dict[str, _Stream] = {}
        self._done: list[str] = []
        self._tracked: dict[str, Any] = {}  # request id -> the engine's Request, until it finishes
        self._held: dict[str, Any] = {}  # request id -> CheckpointBuffer (peers' checkpoints)
        self._ttft: list[float] = []
        self._tpot: list[float] = []
        self._stopped = False
        self._cancelled = 0
        self._metrics = LlmWorkerMetrics(spec.name, spec.model, self._metrics_snapshot)
        self._serving = True
        self._thread = threading.Thread(target=self._loop, name=f"llm-{spec.name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            with self._cond:
                self._expire_assisted()
                while not self._stopped and self.engine.idle():
                    self._cond.wait(ASSIST_LEASE_S if self._assisted else 0.5)
                    self._expire_assisted()
                if self._stopped:
                    return
                started = time.perf_counter()
                self.engine.step()
                self._note_finished()
                self._cond.notify_all()
            if self._slow_s > 0:  # injected (chaos slow): every step takes this much longer
                time.sleep(self._slow_s)
            ms = (time.perf_counter() - started) * 1000.0
            self._step_ms = ms if self._step_ms is None else 0.8 * self._step_ms + 0.2 * ms

    def _expire_assisted(self) -> None:
        """Decode again, in this loop, the requests no drafting peer has verified for a lease."""
        now = time.monotonic()
        for rid, last in list(self._assisted.items()):
            if now - last > ASSIST_LEASE_S:
                del self._assisted[rid]
                req = self._tracked.get(rid)
                if req is not None:
                    req.scheduled = True

    def _on_token(self, req: Any, token: int) -> None:
        stream = self._streams.get(req.id)
        if stream is not None:
            stream.output.append(token)
        self._metrics.tokens.inc()

    def _note_finished(self) -> None:
        for rid, stream in self._streams.items():
            if stream.finished:
                continue
            req = self._tracked.get(rid)
            if req is not None and req.finished:
                stream.finished, stream.reason = True, req.finish_reason
                stream.ttft_ms, stream.tpot_ms = req.ttft_ms, req.tpot_ms
                self._tracked.pop(rid, None)
                self._metrics.finished(req.finish_reason, req.ttft_ms, req.tpot_ms)
                if req.finish_reason != "cancelled":
                    if req.ttft_ms is not None:
                        self._ttft.append(req.ttft_ms)
                    if req.tpot_ms is not None:
                        self._tpot.append(req.tpot_ms)
                    del self._ttft[:-KEEP_METRICS], self._tpot[:-KEEP_METRICS]
                self._done.append(rid)
        while len(self._done) > KEEP_FINISHED:
            self._streams.pop(self._done.pop(0), None)

    def _start(self, req: Any, already: list[int]) -> dict[str, Any]:
        self._streams[req.id] = _Stream(output=list(already))
        self._tracked[req.id] = req
        self._note_finished()
        self._cond.notify_all()
        return {"worker": self.spec.name, "request_id": req.id, "prompt_len": req.prompt_len}

    # ------------------------------------------------------------------ requests
    def submit(
        self, request_id: str, tokens: list[int], sampling: dict[str, Any], prompt_len: int | None = None
    ) -> dict[str, Any]:
        params = sampling_params(sampling)
        with self._cond:
            self._forget(request_id)
            req = self.engine.submit(
                tokens, params, request_id=request_id, on_token=self._on_token, prompt_len=prompt_len
            )
            return self._start(req, req.output)

    def restore(self, request_id: str, tokens: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        """Resume ``request_id`` from the checkpoint held here (InvalidRequestError when none):
        ``tokens`` are the prompt and the output its client already received."""
        params = sampling_params(sampling)
        with self._cond:
            buffer = self._held.pop(request_id, None)
            if buffer is None:
                raise InvalidRequestError(f"worker {self.spec.name!r} holds no checkpoint of {request_id!r}")
            self._forget(request_id)
            req = self.engine.restore(buffer, params, tokens=tokens, on_token=self._on_token)
            out = self._start(req, req.output)
            out["restored_tokens"] = buffer.covered_tokens
            return out

    def _forget(self, request_id: str) -> None:
        if request_id in self._streams:
            self._streams.pop(request_id)
            self._tracked.pop(request_id, None)
            if request_id in self._done:
                self._done.remove(request_id)

    def poll(self, request_id: str, since: int, wait_s: float) -> dict[str, Any]:
        """Output tokens from ``since`` on, waiting up to ``wait_s`` for one when there is none yet."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), POLL_MAX_S)
        with self._cond:
            while True:
                stream = self._streams.get(request_id)
                if stream is None:
                    raise InvalidRequestError(f"worker {self.spec.name!r} has no request {request_id!r}")
                left = deadline - time.monotonic()
                if len(stream.output) > since or stream.finished or left <= 0:
                    return {
                        "tokens": stream.output[since:],
                        "finished": stream.finished,
                        "reason": stream.reason,
                        "ttft_ms": stream.ttft_ms,
                        "tpot_ms": stream.tpot_ms,
                    }
                self._cond.wait(left)

    def cancel(self, request_id: str) -> bool:
        """Stop a request and free its KV pages; False when it is not running here."""
        with self._cond:
            cancelled = self.engine.cancel(request_id)
            self._cancelled += cancelled
            self._note_finished()
            return cancelled

    # ------------------------------------------------------------------ KV checkpoints
    def export_kv(self, request_id: str, upto_tokens: int | None, from_start: bool = False) -> bytes | None:
        """The full pages filled since the last export (None: none new, or the request is done);
        ``from_start``: every full page again (a new holder, the previous one lost them)."""
        with self._cond:
            req = self._tracked.get(request_id)
            if req is None or req.finished or req.state != "running":
                return None
            if from_start:
                req.exported_pages = 0
            chunk = self.engine.export_kv(request_id, upto_tokens)
            if chunk is not None:
                self._metrics.exported.inc(len(chunk))
            return chunk

    def hold(self, chunk: bytes) -> int:
        """Keep a peer's checkpoint chunk (host memory); returns the bytes held for its request."""
        from failsoft.llm import CheckpointBuffer, KvChunk

        c = KvChunk.from_bytes(chunk)
        with self._cond:
            buffer = self._held.setdefault(c.request_id, CheckpointBuffer())
            buffer.add(c)
            return int(buffer.nbytes)

    def drop_checkpoint(self, request_id: str) -> bool:
        with self._cond:
            return self._held.pop(request_id, None) is not None

    # ------------------------------------------------------------------ progressive restart (Alg. 3)
    def draft_for(self, items: list[tuple[str, list[int], int]], k: int) -> dict[str, list[int]]:
        """Draft ``k`` greedy tokens for each ``(request_id, tokens, max_new)`` of a peer's requests
        (``tokens``: its prompt and output as the peer last reported them; ``max_new``: output it
        may still produce). The draft's copy of each request is kept between calls (only the tokens
        it has not seen are prefilled) and dropped when a call no longer names it. InvalidRequestError
        once no draft model is loaded (the target is back)."""
        from failsoft.llm import SamplingParams

        with self._dlock:
            drafter = self.drafter
            if drafter is None:
                raise InvalidRequestError(f"worker {self.spec.name!r} has no draft model loaded")
            wanted = {rid for rid, _, _ in items}
            for rid in [r for r in self._drafting if r not in wanted]:
                drafter.close(rid)
                self._drafting.discard(rid)
            out: dict[str, list[int]] = {}
            for rid, tokens, max_new in items:
                tokens = [int(t) for t in tokens]
                req = drafter.get(rid) if rid in self._drafting else None
                if req is not None and req.tokens[: req.settled] == tokens[: req.settled]:
                    drafter.accept(rid, tokens[req.settled :])
                    left = req.params.max_tokens - len(req.output)
                else:
                    if req is not None:
                        drafter.close(rid)
                        self._drafting.discard(rid)
                    if max_new < 1 or len(tokens) + max_new > drafter.context:
                        continue
                    drafter.open(tokens, SamplingParams(max_tokens=max_new), request_id=rid)
                    self._drafting.add(rid)
                    left = max_new
                if left >= 1:
                    out[rid] = drafter.propose(rid, k)
        if self._slow_s > 0 and out:  # injected slowness: k draft steps, each a share of a step
            time.sleep(k * DRAFT_STEP_SHARE * self._slow_s)
        return out

    def verify_drafts(self, items: list[tuple[str, int, list[int]]]) -> dict[str, dict[str, Any]]:
        """Verify a drafting peer's ``(request_id, base, drafts)``: ``drafts`` continue the first
        ``base`` tokens of the request, which this worker keeps decoding in its own loop meanwhile,
        so the drafts its loop has already produced are skipped (a mismatch skips the request). One
        batched forward pass for all the requests (``Engine.verify_batch``) commits each one's
        accepted drafts and the target's next token (greedy: the output is the target's own).
        Returns per request its tokens now, the counts, whether it finished and this worker's
        decode step (``step_ms``, as :meth:`load` has it); a request already finished or gone is
        left out."""
        out: dict[str, dict[str, Any]] = {}
        with self._cond:
            if not self._serving:
                raise InvalidRequestError(f"worker {self.spec.name!r} does not serve yet")
            taken: list[tuple[str, Any]] = []
            batch: list[tuple[str, list[int]]] = []
            for rid, base, drafts in items:
                req = self._tracked.get(rid)
                if req is None or req.finished or req.state != "running" or req.params.temperature != 0:
                    continue
                taken.append((rid, req))
                ahead = len(req.tokens) - base
                if 0 <= ahead < len(drafts) and req.tokens[base:] == list(drafts[:ahead]):
                    batch.append((rid, list(drafts[ahead:])))
            verdicts = dict(zip((r for r, _ in batch), self.engine.verify_batch(batch), strict=True))
            for rid, req in taken:
                proposed = accepted = 0
                if (verdict := verdicts.get(rid)) is not None:
                    proposed, accepted = verdict.proposed, verdict.accepted
                    self._proposed += proposed
                    self._accepted += accepted
                if not req.finished:
                    # verified only, as in Alg. 3: this loop stops decoding it (its drafts would
                    # be stale by the next round) until the peer stops verifying for a lease
                    req.scheduled = False
                    self._assisted[rid] = time.monotonic()
                out[rid] = {
                    "tokens": list(req.tokens),
                    "proposed": proposed,
                    "accepted": accepted,
                    "finished": req.finished,
                    "step_ms": self._step_ms,  # the drafting peer's cost model, without a load call
                }
            self._note_finished()
            self._cond.notify_all()
            if self._slow_s > 0 and items:  # a verification pass is a step of this worker
                time.sleep(self._slow_s)
        return out

    # ------------------------------------------------------------------ reports
    def load(self) -> dict[str, Any]:
        with self._cond:
            e = self.engine
            return {
                "worker": self.spec.name,
                "waiting": e.waiting,
                "running": e.running,
                "pages_used": e.pool.used,
                "pages_total": e.pool.total,
                "cancelled": self._cancelled,
                "checkpoints": len(self._held),
                "held_kv_mb": sum(b.nbytes for b in self._held.values()) / 2**20,
                "step_ms": self._step_ms,
                "verified_drafts": self._proposed,
                "accepted_drafts": self._accepted,
            }

    def info(self) -> dict[str, Any]:
        import os

        if not self._serving:
            if self._adopted:
                return {
                    "worker": self.spec.name,
                    "standby": False,
                    "phase": "draft",
                    "draft_ms": self.draft_ms,
                    "acceptance": self.draft_acceptance,
                    "pid": os.getpid(),
                }
            preloaded = self._preloaded
            return {
                "worker": None,
                "standby": True,
                "phase": "standby",
                "pid": os.getpid(),
                "draft": None if preloaded is None else preloaded[0],
                "preload_ms": self.preload_ms,
            }
        return {
            "worker": self.spec.name,
            "model": self.spec.model,
            "fingerprint": self.lm.fingerprint,
            "context": self.lm.context,
            "kv_mb_per_token": self.lm.kv_mb_per_token,
            "page_size": self.engine.page_size,
            "device": self.lm.device,
            "load_ms": self.load_ms,
            "pid": os.getpid(),
            "standby": False,
            "phase": "full",
            "draft_ms": self.draft_ms,
        }

    def metrics(self) -> bytes:
        """Prometheus text: TTFT, TPOT, tokens, KV pages, checkpoint bytes (empty before it serves)."""
        return self._metrics.render() if self._serving else b""

    def _metrics_snapshot(self) -> dict[str, Any]:
        load = self.load()
        held = load["held_kv_mb"] * 2**20
        return {**load, "held_kv_bytes": held, "load_s": self.load_ms / 1000.0}

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"worker": self.spec.name, "ttft_ms": list(self._ttft), "tpot_ms": list(self._tpot)}

    def set_slow(self, ms: float) -> None:
        """Add ``ms`` milliseconds to every engine step (a slow or overloaded worker); 0 restores."""
        self._slow_s = max(float(ms), 0.0) / 1000.0

    def shutdown(self) -> None:
        if not self._serving:
            return
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)


LOADER_NICE = 10  # the target's load under a drafting worker: below its serving threads


def _niced_load(spec: LlmWorkerSpec, delay_ms: float, out: dict[str, Any]) -> None:
    """Load ``spec``'s target into ``out`` (``lm``, ``ms``; nothing when it fails: the serving
    thread then loads it and reports the error) after ``delay_ms`` (an emulated reload), this thread
    niced by :data:`LOADER_NICE` (Linux sets priority per thread): on a host with few cores the load
    then takes the CPU the draft's serving leaves, not the other way round."""
    from failsoft.runtime.priority import set_niceness

    set_niceness(LOADER_NICE)
    if delay_ms > 0:
        time.sleep(delay_ms / 1000.0)
    try:
        started = time.perf_counter()
        out["lm"] = spec.load()
        out["ms"] = (time.perf_counter() - started) * 1000.0
    except Exception:  # loaded again by the caller, whose error the restart reports
        out.clear()


def _local(device: str | None) -> str | None:
    """The configured device in this process (``cuda:N`` of the machine among the visible GPUs)."""
    from failsoft.runtime.devices import local_device

    return None if device is None else local_device(device)
