"""The ``coded`` dispatcher: ParM's coded inference (sections 3-4, 7) over a service's k + r members.

A coded service's members are k *data* apps serving the deployed model, then r *parity* apps
serving its parity models (:class:`~failsoft.services.CodedParams`). Per request:

* the request joins a coding group in arrival order (:class:`~failsoft.policies.coding.groups.
  GroupFormer`; one open group per batch shape) and is sent **at once** to a data member, exactly
  as the ``single`` dispatcher would send it (current route, retried on a newer route until the
  deadline, withdrawn when no longer needed). The data members serve one model, so which one serves
  a query does not matter to the code (its slot in the group does): as the paper's data instances
  pull from one queue (section 6.2.1), the query goes to the healthy data member with the fewest
  calls in flight, the member of its slot on a tie;
* when the group's k-th query joins, the encoder (a pure policy) makes the r parity queries, sent to
  the r parity members; a group that has waited ``fill_timeout_ms`` (on the injected clock) since
  its first query is released *uncoded*: its queries are answered by their data members alone;
* every answer of a complete group goes to its :class:`~failsoft.policies.coding.groups.
  AnswerTracker`; as soon as any k of the k + r are in, the missing data outputs are decoded, the
  requests still waiting for them are answered with the decoded output (``reconstructed: true``),
  and the stragglers (the data calls still running, or the parity calls once all k data answers
  are in) are cancelled at their agents.

**No outage during a failover** (the issue's item 5). When a data member's server dies, its calls
fail at once (the agent is gone) and the ``single`` path waits for a newer route; meanwhile the
group's parity answer and the other k - 1 answers decode its output, from the moment of the kill:
before the controller has detected it and while the member is reloaded. A query of a failing member
in a group that never fills (no parity to decode from) is sent to another data member (they serve
one model) when its group is released, so it waits at most ``fill_timeout_ms`` more. A member is
*failing* from a call that found its route dead until a newer route is published (or it answers).
The dispatcher publishes a ``coded_failover`` event at the first reconstruction of a failing member,
and a ``coded_recovered`` event (``reconstructed``: how many of its requests were decoded meanwhile)
once it is back; :meth:`CodedDispatcher.describe` counts both, and the encode and decode medians.
A killed agent's calls may also *hang* (Ray holds calls to an actor it is reaping) until the
controller publishes the member's failover route: the member is then never failing, its queries are
decoded as stragglers (their calls withdrawn), and once the dispatcher sees the member's route moved
after a detected failure (at the next request or answer) the requests decoded since its last own
answer are counted as reconstructed during that failover, with both events at once. An ordinary
episode counts the stragglers since the member's last answer too. A query whose member call went
to a server that has failed since (the gateway lost its connection, or the controller's failure
stamp of it changed) is its member's failover's whenever it is decoded: with a failure seen in
milliseconds, the route often moves before the parity answer decodes the queries sent there; the
episode ends only once none of them is still waiting.

A data member's call that ends in an error (its queue refused it as overloaded, it ran out of time,
its model failed) is one more lost answer to the group, not the request's failure: the request gets
the decoded output when the group's other answers make k; when they cannot (the group went
uncoded, or too many of its members failed) another data member serves it, and only when none can
does it get the member's error. A member whose call just failed gets no new query for
``ERRED_HOLD_S``: refusing at once, it would have the fewest calls in flight and win every choice.

A request whose shape does not match the service's input is refused (InvalidRequestError, 400)
before it joins a group, so the group it would have joined is unaffected.

Mixed variants: the decoder assumes the data answers come from the variant the parity models were
trained for. While a data member serves a failover variant (a smaller one), its answers are still
its own client's answers, but are not used to decode another member's output, and a parity answer
is used only from the parity variant its member was deployed with.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failsoft.errors import InvalidRequestError
from failsoft.policies.coding.groups import AnswerTracker, Group, GroupFormer, Progress
from failsoft.policies.coding.interface import Encoder
from failsoft.policies.registry import get_decoder, get_encoder
from failsoft.runtime.gateway.dispatch.interface import Answer, DispatchContext, Dispatcher, Request
from failsoft.runtime.gateway.dispatch.single import SingleDispatcher
from failsoft.runtime.gateway.routes import Route
from failsoft.services import CodedParams, Service, ServiceMode

log = logging.getLogger(__name__)
TIMINGS = 10_000  # encode and decode times kept (microseconds), for their median in describe()
ERRED_HOLD_S = 0.1  # a data member whose call just failed (refused, late) gets no new query this long


class _Member(SingleDispatcher):
    """One member app served like a ``single`` service, remembering when its calls fail over."""

    def __init__(self, app: str, context: DispatchContext, on_failing: Callable[[], None]) -> None:
        # no shortcut to a warm backup: a failing member's queries are decoded from parity meanwhile
        super().__init__(Service.single(app), context, shortcut=False)
        self.failed_route: Route | None = None  # the route a call found dead (server gone, route moved)
        self.on_failing = on_failing

    @property
    def failing(self) -> bool:
        """A call found this member's route dead, and no newer route has been published since."""
        if self.failed_route is None:
            return False
        now = self.context.routes.route(self.app)
        if now is None or now == self.failed_route:
            return True
        self.failed_route = None  # failed over: the member serves again (maybe a smaller variant first)
        return False

    def moved(self, route: Route) -> None:
        self.failed_route = route
        self.on_failing()


@dataclass(slots=True)
class _Query:
    """One request in a coding group: its own member call and the future its client awaits."""

    request: Request
    index: int  # its slot in the group (the code's member index)
    member: int  # the data member serving it
    result: asyncio.Future[Answer]
    own: asyncio.Task[Answer] | None = None
    fallen_back: bool = False
    error: BaseException | None = None  # its member call's error (the decode may still answer it)
    sent_to: str | None = None  # the server of its member's route when it was sent
    fence: float | None = None  # that server's failure stamp then (a newer one: it failed since)


@dataclass(slots=True)
class _Group:
    id: int
    queries: dict[int, _Query] = field(default_factory=dict)
    tracker: AnswerTracker | None = None
    parity: dict[int, asyncio.Task[Answer]] = field(default_factory=dict)
    variants: dict[int, str] = field(default_factory=dict)  # the variant each answer came from
    closed: bool = False


class CodedDispatcher(Dispatcher):
    """k data members and r parity members; decode from the first k answers, cancel the rest."""

    mode = ServiceMode.CODED

    def __init__(self, service: Service, context: DispatchContext) -> None:
        super().__init__(service, context)
        params = service.params
        assert isinstance(params, CodedParams)
        self.params = params
        self.k, self.r = params.k, params.r
        self.data = [
            _Member(app, context, functools.partial(self._member_failing, i))
            for i, app in enumerate(service.members[: self.k])
        ]
        self.parity = [_Member(app, context, lambda: None) for app in service.members[self.k :]]
        self.former = GroupFormer(self.k, params.fill_timeout_ms, params.fill)
        self.decoder = get_decoder(self.k, self.r)
        self.input_shape = context.input_shape(service.members[0])
        self._encoders: dict[tuple[int, ...], Encoder] = {}
        self._groups: dict[int, _Group] = {}
        self._timer: asyncio.Task[None] | None = None
        self._expected: dict[int, str] = {}  # member index -> the variant its first answer came from
        self._down: dict[int, int] = {}  # data member -> requests reconstructed while it fails
        self._straggled: dict[int, int] = {}  # ... while it was not failing, since its last answer
        self._seen: dict[int, Route | None] = {}  # data member -> its route at the last request
        self._in_flight = [0] * self.k  # calls of each data member not yet done
        self._erred_at = [float("-inf")] * self.k  # when each data member's last call failed
        self.counts = {"requests": 0, "coded_groups": 0, "uncoded_groups": 0, "reconstructed": 0}
        self.counts["reconstructed_during_failover"] = 0
        self.counts["served_by_another_member"] = 0  # uncoded queries of a failing member
        self.timings_us: dict[str, deque[float]] = {
            "encode": deque(maxlen=TIMINGS),
            "decode": deque(maxlen=TIMINGS),
        }

    # the contract ----------------------------------------------------------------------------------
    def ready(self) -> bool:
        return all(m.ready() for m in self.data)

    def describe(self) -> dict[str, Any]:
        members = [m.describe() for m in self.data + self.parity]
        ready = self.ready()
        down = [m.app for m in self.data if not m.ready()]
        return {
            "version": members[0]["version"],
            "state": "READY" if ready else "UNAVAILABLE",
            "reason": "" if ready else f"data members with no live server: {down}",
            "members": [{"app": m.app, **d} for m, d in zip(self.data + self.parity, members, strict=True)],
            "coding": {
                "k": self.k,
                "r": self.r,
                "encoder": self.params.encoder,
                **self.counts,
                **{f"{op}_us_p50": _median(times) for op, times in self.timings_us.items()},
            },
        }

    async def dispatch(self, request: Request) -> Answer:
        batch = self._checked(request.batch)
        self.counts["requests"] += 1
        self._watch_routes()
        for index in list(self._down):
            self._recovered(index)
        now = self.context.clock.now()
        slot, closed = self.former.join(request.request_id, now, shape=batch.shape)
        group = self._groups.get(slot.group)
        if group is None:
            group = self._groups[slot.group] = _Group(slot.group, tracker=AnswerTracker(self.decoder))
        member = self._least_busy(slot.index)
        query = _Query(request, slot.index, member, asyncio.get_running_loop().create_future())
        route = self.context.routes.route(self.data[member].app)
        if route is not None:
            query.sent_to, query.fence = route.server, self.context.routes.fence(route.server)
        query.result.add_done_callback(_retrieved)
        group.queries[slot.index] = query
        self._in_flight[member] += 1
        query.own = asyncio.ensure_future(self.data[member].dispatch(_member_request(request, "d")))
        query.own.add_done_callback(functools.partial(self._own_done, group, query))
        for done in closed:
            self._closed(done)
        self._arm_timer()
        try:
            return await asyncio.shield(query.result)
        except asyncio.CancelledError:  # the client left: withdraw its own call
            query.own.cancel()
            raise

    def _least_busy(self, index: int) -> int:
        """The healthy data member with the fewest calls in flight (member ``index`` on a tie). A
        member that refuses at once has the fewest: one whose call failed in the last
        :data:`ERRED_HOLD_S` is passed over, or one group could hold two of its queries, and a
        parity decodes only one."""
        best, best_load = index, None
        now = self.context.clock.now()
        for step in range(self.k):
            i = (index + step) % self.k
            member = self.data[i]
            if member.failing or not member.ready() or now - self._erred_at[i] < ERRED_HOLD_S:
                continue
            if best_load is None or self._in_flight[i] < best_load:
                best, best_load = i, self._in_flight[i]
        return best

    # groups ------------------------------------------------------------------------------------------
    def _checked(self, batch: Any) -> np.ndarray:
        array = np.asarray(batch)
        if array.ndim < 1 or (self.input_shape is not None and tuple(array.shape[1:]) != self.input_shape):
            raise InvalidRequestError(
                f"service {self.service.name!r} takes batches of shape [N, "
                f"{', '.join(map(str, self.input_shape or ()))}]; got {list(array.shape)}"
            )
        return array

    def _closed(self, closed: Group) -> None:
        group = self._groups.get(closed.id)
        if group is None:
            return
        group.closed = True
        if not closed.complete:  # released uncoded: its queries are answered by their members alone
            self.counts["uncoded_groups"] += 1
            group.tracker = None
            for query in group.queries.values():
                if query.error is not None:  # its member failed it; no parity comes
                    self._without_its_member(group, query)
                else:
                    self._fall_back(group, query)
            self._forget_if_done(group)
            return
        self.counts["coded_groups"] += 1
        if group.tracker is None or group.tracker.done:  # every data answer is in already
            self._forget_if_done(group)
            return
        queries = [np.asarray(group.queries[i].request.batch, dtype=np.float32) for i in range(self.k)]
        encoder = self._encoder(queries[0].shape[1:])
        started = time.perf_counter()
        parities = encoder.encode(queries)
        self.timings_us["encode"].append((time.perf_counter() - started) * 1e6)
        deadline = max(q.request.deadline for q in group.queries.values())
        first = group.queries[0].request
        for p, parity in enumerate(parities):
            request = Request(self.service.name, parity, deadline, f"{first.request_id}#p{p}")
            task = asyncio.ensure_future(self.parity[p].dispatch(request))
            task.add_done_callback(functools.partial(self._parity_done, group, self.k + p))
            group.parity[self.k + p] = task

    def _encoder(self, shape: tuple[int, ...]) -> Encoder:
        encoder = self._encoders.get(shape)
        if encoder is None:
            encoder = self._encoders[shape] = get_encoder(self.params.encoder, self.k, self.r, shape)
        return encoder

    async def close(self) -> None:
        if self._timer is not None:  # the fill timer; queries in flight are the server's to finish
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)

    def _arm_timer(self) -> None:
        if self.former.next_timeout_s() is not None and (self._timer is None or self._timer.done()):
            self._timer = asyncio.ensure_future(self._fill_timer())

    async def _fill_timer(self) -> None:
        clock = self.context.clock
        while (due := self.former.next_timeout_s()) is not None:
            await clock.sleep(max(due - clock.now(), 0.0))
            for closed in self.former.poll(clock.now()):
                self._closed(closed)

    def _member_failing(self, index: int) -> None:
        """Data member ``index`` failed a call: its queries in uncoded groups go to another member."""
        for group in list(self._groups.values()):
            if group.closed and group.tracker is None:
                for query in group.queries.values():
                    if query.member == index:
                        self._fall_back(group, query)

    def _watch_routes(self) -> None:
        for index, member in enumerate(self.data):
            now = self.context.routes.route(member.app)
            before = self._seen.get(index, now)
            self._seen[index] = now
            if now != before:
                self._failed_over_while_hung(index, before, now)

    def _failed_over_while_hung(self, index: int, before: Route | None, now: Route | None) -> None:
        """Data member ``index``'s route moved from ``before`` to ``now``. A killed agent's calls
        may hang instead of failing at once (Ray holds calls to an actor it is reaping): the member
        is then never *failing*, its requests are decoded (and its calls withdrawn) as any
        straggler's, until the controller publishes a route after a detected failure. Those decoded
        since its last own answer were reconstructed during that failover: count them so, and say
        so as an episode already over."""
        straggled = self._straggled.get(index, 0)
        if now is None or index in self._down or not straggled:
            return  # unrouted (an ordinary episode follows), or nothing was decoded for it
        if now.detected_at is None or (before is not None and now.detected_at == before.detected_at):
            return  # moved without a new failure (an upgrade, a return home): no failover
        self._straggled[index] = 0
        self.counts["reconstructed_during_failover"] += straggled
        self._event(
            "coded_failover",
            index,
            f"its calls hung until its route moved; {straggled} of its requests were reconstructed "
            "from parity answers meanwhile",
        )
        self._event(
            "coded_recovered",
            index,
            f"serves again; {straggled} of its requests were reconstructed meanwhile",
            reconstructed=straggled,
        )

    def _fall_back(self, group: _Group, query: _Query) -> None:
        """A query of an uncoded group whose member is failing or failed its call (refused it as
        overloaded): also sent to a healthy data member (every data member serves the same model);
        the first answer wins."""
        if query.fallen_back or query.result.done():
            return
        if not self.data[query.member].failing and query.error is None:
            return
        healthy = [m for i, m in enumerate(self.data) if i != query.member and not m.failing and m.ready()]
        if not healthy:
            return
        member = healthy[hash(query.request.request_id) % len(healthy)]
        query.fallen_back = True
        self.counts["served_by_another_member"] += 1
        task = asyncio.ensure_future(member.dispatch(_member_request(query.request, "f")))

        def done(task: asyncio.Task[Answer]) -> None:
            if task.cancelled() or query.result.done():
                return
            if (error := task.exception()) is None:
                query.result.set_result(task.result())
                if query.own is not None:
                    query.own.cancel()
            elif query.own is None or query.own.done():  # nothing else will answer it
                query.result.set_exception(query.error or error)
            self._forget_if_done(group)

        task.add_done_callback(done)
        query.result.add_done_callback(lambda _: task.cancel())

    def _without_its_member(self, group: _Group, query: _Query) -> None:
        """``query``'s member failed its call and no decode will answer it: another data member
        serves it, or, when none can, it gets the member's error."""
        self._fall_back(group, query)
        if not query.fallen_back and not query.result.done() and query.error is not None:
            query.result.set_exception(query.error)

    # answers -----------------------------------------------------------------------------------------
    def _own_done(self, group: _Group, query: _Query, task: asyncio.Task[Answer]) -> None:
        self._in_flight[query.member] -= 1
        self._watch_routes()  # an answer on a route that just moved may come before the next request
        if task.cancelled():
            self._forget_if_done(group)
            return
        error = task.exception()
        if error is not None:  # refused, late or failed: the group's other answers may decode it
            query.error = error
            self._erred_at[query.member] = self.context.clock.now()
            self._feed(group, query.index, None)
            tracker = group.tracker
            if tracker is None or tracker.done:  # uncoded, or too few answers: nothing to decode from
                self._without_its_member(group, query)
                self._forget_if_done(group)
            return
        answer = task.result()
        if not query.result.done():
            query.result.set_result(answer)
        self.data[query.member].failed_route = None  # it answered: not failing
        self._straggled.pop(query.member, None)
        self._recovered(query.member)
        self._feed(group, query.index, answer)

    def _parity_done(self, group: _Group, index: int, task: asyncio.Task[Answer]) -> None:
        if task.cancelled():
            self._forget_if_done(group)
            return
        answer = None if task.exception() is not None else task.result()
        self._feed(group, index, answer)

    def _feed(self, group: _Group, index: int, answer: Answer | None) -> None:
        """Member ``index`` answered (``answer``) or failed (None); apply what the tracker says."""
        tracker = group.tracker
        if tracker is None or tracker.done:
            self._forget_if_done(group)
            return
        if answer is None or not self._usable(index, answer):
            progress = tracker.failed(index)
        else:
            group.variants[index] = answer.variant
            output = np.asarray(answer.outputs)  # the transport's copy, not the decoder's work
            started = time.perf_counter()
            progress = tracker.answered(index, output)
            if progress.decoded:
                self.timings_us["decode"].append((time.perf_counter() - started) * 1e6)
        self._apply(group, progress)
        self._forget_if_done(group)

    def _usable(self, index: int, answer: Answer) -> bool:
        """An answer decodes others only from the variant its member first answered with."""
        expected = self._expected.setdefault(index, answer.variant)
        return answer.variant == expected

    def _apply(self, group: _Group, progress: Progress) -> None:
        for index, output in progress.decoded.items():
            query = group.queries.get(index)
            if query is None or query.result.done():
                continue
            query.result.set_result(self._reconstructed(group, index, output))
        for index in progress.unrecoverable:  # lost, and too few answers to decode it from
            query = group.queries.get(index)
            if query is not None and query.error is not None:
                self._without_its_member(group, query)
        for index in progress.cancel:
            task = group.queries[index].own if index < self.k else group.parity.get(index)
            if task is not None and not task.done():
                task.cancel()  # the single path withdraws the call from its server's queue

    def _reconstructed(self, group: _Group, index: int, output: np.ndarray) -> Answer:
        self.counts["reconstructed"] += 1
        query = group.queries[index]
        serving = query.member
        member = self.data[serving]
        if member.failing or not member.ready() or self._sent_to_failed_server(query):
            count = self._down.get(serving, 0)
            if count == 0:  # the episode began at its last own answer: stragglers since are its own
                count = self._straggled.pop(serving, 0)
                self.counts["reconstructed_during_failover"] += count
                self._event("coded_failover", serving, "its requests are reconstructed from parity answers")
            self.counts["reconstructed_during_failover"] += 1
            self._down[serving] = count + 1
        else:  # a straggler (or a call that hangs on a dead server)
            self._straggled[serving] = self._straggled.get(serving, 0) + 1
        used = sorted(i for i in group.variants if i >= self.k)
        parity = self.parity[used[0] - self.k] if used else self.parity[0]
        route = parity.context.routes.route(parity.app)
        return Answer(
            outputs=output,
            server=route.server if route is not None else "",
            variant=group.variants.get(used[0], "") if used else "",
            degraded=False,
            accuracy=route.accuracy if route is not None else 0.0,
            kind="reconstructed",
            attempts=1,
            reconstructed=True,
        )

    def _sent_to_failed_server(self, query: _Query) -> bool:
        """Whether ``query``'s member call went to a server that has failed since: the gateway
        lost its connection, or the controller declared it failed (a new failure stamp). Such a
        query is its member's failover's, whatever came first: its decode, or the route moving."""
        if query.sent_to is None:
            return False
        routes = self.context.routes
        return routes.lost(query.sent_to) or routes.fence(query.sent_to) != query.fence

    def _recovered(self, index: int) -> None:
        """End member ``index``'s failover episode once it answers again or has a new route, and
        none of its queries sent to the failed server is still waiting to be decoded."""
        if index not in self._down or self.data[index].failing:
            return
        for group in self._groups.values():
            for query in group.queries.values():
                if query.member == index and not query.result.done() and self._sent_to_failed_server(query):
                    return
        count = self._down.pop(index)
        self._event(
            "coded_recovered",
            index,
            f"serves again; {count} of its requests were reconstructed meanwhile",
            reconstructed=count,
        )

    def _event(self, kind: str, index: int, what: str, **extra: Any) -> None:
        app = self.data[index].app
        event = {"type": kind, "service": self.service.name, "app": app, "message": f"{app}: {what}"}
        try:
            self.context.event({**event, **extra})
        except Exception:  # an observer's failure must not fail a request
            log.exception("publishing %s", kind)

    def _forget_if_done(self, group: _Group) -> None:
        """Drop a group once every query is answered and no member call of it is running."""
        if not group.closed:
            return
        if any(not q.result.done() or (q.own and not q.own.done()) for q in group.queries.values()):
            return
        if any(not t.done() for t in group.parity.values()):
            return
        self._groups.pop(group.id, None)


def _retrieved(future: asyncio.Future[Answer]) -> None:
    """Mark an error as seen: its client may have left before it came."""
    if not future.cancelled():
        future.exception()


def _member_request(request: Request, tag: str) -> Request:
    return Request(request.service, request.batch, request.deadline, f"{request.request_id}#{tag}")


def _median(values: deque[float]) -> float | None:
    return round(float(np.median(values)), 2) if values else None
