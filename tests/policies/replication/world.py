"""A reference world for the replication protocols: a gateway, replicas and a sequential reference.

The world carries out the protocol's commands the way the runtime will (the gateway walks the graph,
logs released outputs by request, delivers a node's inputs in request order; primaries compute,
snapshot and ship states; backups buffer and apply them), and it lets a test choose *what happens
next*: which node computes, which state transfer lands, when a node crashes. Models are integer
recurrences, ``state' = f(state, input, nonce)``: with ``nondeterministic`` the nonce of every
computation is chosen by the test (a GPU kernel's whim), otherwise it is 0.

:meth:`World.consistent` checks the protocol's promise: the answers clients got are exactly those of
a failure-free run, namely the sequential run in which each (node, request) uses the nonce of the
*last* computation of it that happened. (That run is a witness: if the answers match it, a
failure-free run giving them exists.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from failsoft.policies.replication.interface import (
    ApplyState,
    BackupPlaced,
    Command,
    Compute,
    Crashed,
    Event,
    OutputComputed,
    PlaceBackup,
    Promote,
    ReleaseOutput,
    ReleaseToClient,
    Replay,
    ReplicationProtocol,
    RequestArrived,
    Restore,
    Role,
    Rollback,
    SendState,
    StateApplied,
    StateShipped,
    Topology,
)

MOD = 10_007


def mix(value: int | tuple[int, ...]) -> int:
    if isinstance(value, int):
        return value % MOD
    h = 1
    for v in value:
        h = (h * 131 + v) % MOD
    return h


def step(index: int, stateful: bool, state: int, value: int | tuple[int, ...], nonce: int) -> tuple[int, int]:
    """Node ``index``'s model: (state, input, nonce) -> (state, output); stateless ones keep state 0."""
    if not stateful:
        return 0, (mix(value) * 17 + index + 5 * nonce) % MOD
    new = (state * 31 + mix(value) + 7 * nonce + index) % MOD
    return new, (new * 3 + index) % MOD


@dataclass
class Primary:
    state: int = 0
    last: int = 0
    snapshots: dict[int, int] = field(default_factory=lambda: {0: 0})
    queue: list[tuple[int, int | tuple[int, ...]]] = field(default_factory=list)
    fresh: bool = False  # restarted with the initial state: it takes the request number it is given


@dataclass
class Backup:
    state: int | None = 0
    seq: int | None = 0
    buffer: dict[tuple[int, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Transfer:
    node: str
    seq: int
    epoch: int
    state: int


class World:
    def __init__(self, protocol: ReplicationProtocol, *, backups: bool = True) -> None:
        self.protocol = protocol
        self.topo: Topology = protocol.topology
        self.index = {n: i + 1 for i, n in enumerate(self.topo.nodes)}
        self.requests: dict[int, int] = {}
        self.out: dict[str, dict[int, int]] = {n: {} for n in self.topo.nodes}
        self.pending: dict[str, dict[int, int]] = {n: {} for n in self.topo.nodes}
        self.delivered = dict.fromkeys(self.topo.nodes, 0)
        self.primaries: dict[str, Primary | None] = {n: Primary() for n in self.topo.nodes}
        has = backups and bool(getattr(protocol, "_keeps_backups", lambda: True)())
        self.backups: dict[str, Backup | None] = {n: Backup() if has else None for n in self.topo.stateful}
        self.transfers: list[Transfer] = []
        self.to_place: set[str] = set()
        self.client: dict[int, tuple[int, ...]] = {}
        self.attempts: dict[tuple[str, int], int] = {}
        self.crashes = 0

    # -- what the test chooses -------------------------------------------------------------------

    def request(self, value: int) -> None:
        seq = len(self.requests) + 1
        self.requests[seq] = value
        for entry in self.topo.entries:
            self._deliver(entry)

    def computable(self) -> list[str]:
        return [n for n in self.topo.nodes if (p := self.primaries[n]) is not None and p.queue]

    def compute(self, node: str, nonce: int = 0) -> None:
        primary = self.primaries[node]
        assert primary is not None and primary.queue
        seq, value = primary.queue.pop(0)
        assert seq == primary.last + 1, f"{node} asked to compute {seq} after {primary.last}"
        stateful = node in self.topo.stateful
        primary.state, output = step(self.index[node], stateful, primary.state, value, nonce)
        primary.last = seq
        primary.snapshots[seq] = primary.state
        self.attempts[(node, seq)] = nonce
        self.pending[node][seq] = output
        self._run(OutputComputed(node, seq))

    def land(self, i: int) -> None:
        """State transfer ``i`` (of ``self.transfers``) reaches its backup."""
        t = self.transfers.pop(i)
        backup = self.backups.get(t.node)
        if backup is None:
            return
        backup.buffer[(t.epoch, t.seq)] = t.state
        self._run(StateShipped(t.node, t.seq, t.epoch))

    def place(self, node: str) -> None:
        self.to_place.discard(node)
        self.backups[node] = Backup(state=None, seq=None)
        self._run(BackupPlaced(node))

    def crash(self, node: str, role: Role) -> None:
        self.crashes += 1
        self.transfers = [t for t in self.transfers if t.node != node]
        if role is Role.PRIMARY:
            self.primaries[node] = None
        else:
            self.backups[node] = None
        self._run(Crashed(node, role))

    def drain(self, nonce: Callable[[], int] = lambda: 0) -> None:
        """Let everything that is under way finish (no more crashes)."""
        while True:
            if self.to_place:
                self.place(sorted(self.to_place)[0])
            elif self.transfers:
                self.land(0)
            elif nodes := self.computable():
                self.compute(nodes[0], nonce())
            else:
                return

    # -- the check -------------------------------------------------------------------------------

    def reference(self) -> dict[int, tuple[int, ...]]:
        """The sinks' outputs of the failure-free run that uses each computation's last nonce."""
        states = dict.fromkeys(self.topo.nodes, 0)
        answers: dict[int, tuple[int, ...]] = {}
        for seq in sorted(self.requests):
            outs: dict[str, int] = {}
            for node in self.topo.order:
                value = self._input(node, seq, outs)
                assert value is not None
                nonce = self.attempts.get((node, seq), 0)
                states[node], outs[node] = step(
                    self.index[node], node in self.topo.stateful, states[node], value, nonce
                )
            answers[seq] = tuple(outs[s] for s in self.topo.sinks)
        return answers

    def consistent(self) -> bool:
        reference = self.reference()
        return all(reference[seq] == answer for seq, answer in self.client.items())

    # -- carrying out commands -------------------------------------------------------------------

    def _run(self, event: Event) -> None:
        for command in self.protocol.handle(event):
            self._do(command)

    def _do(self, c: Command) -> None:
        match c:
            case Compute(node, seq):
                primary = self.primaries[node]
                assert primary is not None, f"compute on dead {node}"
                value = self._input(node, seq, {n: self.out[n].get(seq) for n in self.topo.nodes})
                assert value is not None
                primary.queue.append((seq, value))
            case ReleaseOutput(node, seq):
                self.out[node][seq] = self.pending[node].pop(seq)
                for down in self.topo.outputs[node]:
                    self._deliver(down)
            case ReleaseToClient(seq):
                answer = tuple(self.out[s][seq] for s in self.topo.sinks)
                assert self.client.setdefault(seq, answer) == answer, f"request {seq} answered twice"
            case SendState(node, seq, epoch):
                primary = self.primaries[node]
                assert primary is not None
                self.transfers.append(Transfer(node, seq, epoch, primary.snapshots[seq]))
            case ApplyState(node, seq, epoch):
                backup = self.backups[node]
                assert backup is not None
                backup.state = backup.buffer.pop((epoch, seq))
                backup.seq = seq
                self._run(StateApplied(node, seq, epoch))
            case Promote(node, seq):
                backup = self.backups[node]
                assert backup is not None and backup.seq == seq and backup.state is not None
                self.primaries[node] = Primary(backup.state, seq, {seq: backup.state})
                self.backups[node] = None
            case Rollback(node, seq):
                backup, primary = self.backups[node], self.primaries[node]
                assert backup is not None and primary is not None and backup.seq == seq
                assert backup.state is not None
                self.primaries[node] = Primary(backup.state, seq, {seq: backup.state})
                backup.buffer.clear()
            case Restore(node, seq):
                state = 0
                if seq:
                    backup = self.backups[node]
                    assert backup is not None and backup.seq == seq and backup.state is not None
                    state = backup.state
                self.primaries[node] = Primary(state, seq, {seq: state}, fresh=not seq)
            case Replay(node, from_seq):
                self._replay(node, from_seq)
            case PlaceBackup(node):
                self.to_place.add(node)
            case _:
                raise AssertionError(f"unknown command {c!r}")

    def _replay(self, node: str, from_seq: int) -> None:
        for log in (self.out[node], self.pending[node]):
            for seq in [s for s in log if s >= from_seq]:
                del log[seq]
        primary = self.primaries[node]
        assert primary is not None
        primary.queue = [(s, v) for s, v in primary.queue if s < from_seq]
        if primary.fresh or node not in self.topo.stateful:
            primary.last, primary.fresh = from_seq - 1, False
            primary.snapshots = {primary.last: primary.state}
        assert primary.last == from_seq - 1, f"{node} replays from {from_seq}, state after {primary.last}"
        self.delivered[node] = from_seq - 1
        self._deliver(node)

    def _deliver(self, node: str) -> None:
        """The gateway delivers ``node``'s next requests whose inputs are all logged, in order."""
        while True:
            seq = self.delivered[node] + 1
            if self._input(node, seq, {n: self.out[n].get(seq) for n in self.topo.nodes}) is None:
                return
            self.delivered[node] = seq
            self._run(RequestArrived(node, seq))

    def _input(self, node: str, seq: int, outs: dict[str, int | None]) -> int | tuple[int, ...] | None:
        ups = self.topo.inputs[node]
        if not ups:
            return self.requests.get(seq)
        values = tuple(outs.get(u) for u in sorted(ups))
        if any(v is None for v in values):
            return None
        return values[0] if len(values) == 1 else tuple(v for v in values if v is not None)
