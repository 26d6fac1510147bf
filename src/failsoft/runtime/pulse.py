"""The agent's heartbeat sidecar: a tiny process that pushes the server's keep-alive every 20 ms.

FailLite's agent runs *beside* the serving container and stops heartbeating when the container is
down (4, 5.1). failsoft does the same inside each server: the agent process serves models and, in a
thread, refreshes a *liveness stamp* (8 bytes in a shared memory-mapped file); a sidecar process,
started by the agent and running only the standard library, sends a signed UDP datagram every
``interval_s`` while

* the agent process exists and has no SIGKILL pending (a crash: the sidecar goes silent within one
  interval and exits, after a signed *death notice*: :func:`datagram` with ``dead``, which the
  controller takes as proof of death, where a silence might only be heartbeats running late),
* it is not stopped (SIGSTOP shows as state ``T`` in ``/proc``: the sidecar goes silent),
* and its stamp is fresh (an interpreter wedged for more than ``wedge_s`` goes silent too).

The sidecar runs as a real-time (``SCHED_FIFO``) thread where the OS permits it (root, or an
``RLIMIT_RTPRIO``), else at nice -10 where permitted: a normal-priority sender on a busy machine waits
in the run queue long enough to miss beats (:func:`raise_to_realtime`).

Why not send from the agent's own thread? That thread competes for the interpreter with up to
dozens of inference threads; on a busy two-core machine it was measured waking 40-80 ms late, which
two missed 20 ms heartbeats call a failure. The sidecar has no such competition, so the 40 ms
threshold measures the server, not the interpreter's queue.

This file imports only the standard library and runs as a script (``python pulse.py``), reading
its settings (and the signing key, never on the command line) as one JSON line on stdin.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import mmap
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

MAC_BYTES = 16
PRIORITY_NICE = -10
REALTIME_PRIORITY = 1  # the lowest SCHED_FIFO priority: above every normal task, below the kernel's
SIGKILL = 9
_STAMP = struct.Struct("d")


def mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()[:MAC_BYTES]


DEATH_NOTICES = 3  # sent a few times: UDP may lose one
DEAD = b"dead\n"  # what a gateway watching the agent (:class:`Watchers`) reads when it died
CHECKS_PER_TICK = 4  # the agent's death is looked for this often per heartbeat interval


def datagram(key: bytes, server: str, incarnation: str, seq: int, dead: bool = False) -> bytes:
    """A heartbeat, or with ``dead`` the notice that the agent process died (the sidecar saw it)."""
    payload = f"{server}|{incarnation}|{seq}{'|dead' if dead else ''}".encode()
    return payload + b"|" + mac(key, payload).hex().encode()


def parse(key: bytes, data: bytes) -> tuple[str, str, int, bool] | None:
    """``(server, incarnation, seq, dead)`` of a well-signed datagram, else None.

    The signature proves who sent a datagram, not when: a recorded one stays valid forever. The
    receiver therefore accepts only sequence numbers newer than the last it accepted from the same
    incarnation (:class:`failsoft.runtime.heartbeat.HeartbeatReceiver`).
    """
    payload, _, tag = data.rpartition(b"|")
    try:
        if not hmac.compare_digest(bytes.fromhex(tag.decode()), mac(key, payload)):
            return None
        fields = payload.decode().split("|")
        dead = fields[3:] == ["dead"]
        server, incarnation, seq = fields[:3] if dead else fields
        number = int(seq)
    except (ValueError, UnicodeDecodeError):
        return None
    return (server, incarnation, number, dead) if number >= 0 else None


def raise_priority(tid: int = 0) -> None:
    # runtime/priority.py's set_niceness, written again: the sidecar runs as a plain script with
    # nothing of the failsoft package on its path, so it imports only the standard library
    with contextlib.suppress(OSError, AttributeError):  # not permitted, or not Linux: normal is fine
        os.setpriority(os.PRIO_PROCESS, tid, PRIORITY_NICE)


def raise_to_realtime() -> str:
    """Run this (the sidecar's only) thread under ``SCHED_FIFO`` where permitted, else at nice -10.

    Measured with two CPU hogs beside a loaded cluster on two cores: a sidecar at nice -10 still
    waited up to 24 ms in the run queue after its timer fired (the kernel's run-queue delay of the
    process, not its own work), and 20 ms late on a 20 ms interval is a missed heartbeat: two such
    waits declared a live server failed. A real-time thread is run the moment it wakes, ahead of
    every normal task; it needs the CPU ~0.1 ms per beat, and the kernel's real-time throttling caps
    it anyway. Returns the policy it got (``fifo``, ``nice`` or ``normal``), for the record.
    """
    try:
        policy = os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0)
        os.sched_setscheduler(0, policy, os.sched_param(REALTIME_PRIORITY))
        return "fifo"
    except (OSError, AttributeError):  # no CAP_SYS_NICE / RLIMIT_RTPRIO, or not Linux
        pass
    raise_priority()
    return "nice" if os.getpriority(os.PRIO_PROCESS, 0) <= PRIORITY_NICE else "normal"


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``R``, ``S``, ``T`` stopped, ...), None if gone.

    A process with a SIGKILL pending is reported as ``X`` (dead) at once: tearing down a process
    that holds gigabytes of models can take the kernel tens of milliseconds on a busy machine, and
    it will not answer anything meanwhile.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            return _state_of(fh.read())
    except FileNotFoundError:
        return None
    except OSError:
        return _exists(pid)


class StatusWatch:
    """:func:`process_state` of one process, read from its ``/proc`` status file kept open: the
    sidecar's check every few milliseconds costs one ``pread`` (about a fifth of opening the file
    anew each time)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._fd: int | None = os.open(f"/proc/{pid}/status", os.O_RDONLY)
        except OSError:
            self._fd = None

    def state(self) -> str | None:
        if self._fd is None:
            return process_state(self.pid)
        try:
            return _state_of(os.pread(self._fd, 4096, 0))
        except ProcessLookupError:  # reaped: the file outlives its process, unreadable
            return None
        except OSError:
            return process_state(self.pid)


def _state_of(status: bytes) -> str:
    pending = 0
    for key in (b"\nSigPnd:", b"\nShdPnd:"):
        at = status.find(key)
        if at >= 0:
            with contextlib.suppress(ValueError):
                pending |= int(status[at + len(key) : status.find(b"\n", at + 1)].strip(), 16)
    if pending & (1 << (SIGKILL - 1)):
        return "X"
    at = status.find(b"\nState:")
    state = status[at + 8 : at + 16].strip() if at >= 0 else b""
    return state[:1].decode() if state else "?"


def _exists(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "?"


class Stamp:
    """A monotonic timestamp shared through a memory-mapped file (written by the agent)."""

    def __init__(self, path: str, create: bool = False) -> None:
        self.path = path
        if create:
            with open(path, "wb") as fh:
                fh.write(_STAMP.pack(time.monotonic()))
        self._file = open(path, "r+b")  # noqa: SIM115 (kept open with the mapping)
        self._map = mmap.mmap(self._file.fileno(), _STAMP.size)

    def write(self, value: float) -> None:
        self._map[: _STAMP.size] = _STAMP.pack(value)

    def read(self) -> float:
        return _STAMP.unpack(self._map[: _STAMP.size])[0]

    def close(self) -> None:
        self._map.close()
        self._file.close()


def run_sidecar(settings: dict) -> int:
    """The sidecar's loop; returns when the watched process is gone."""
    raise_to_realtime()
    key = bytes.fromhex(settings["key"])
    address = (settings["host"], int(settings["port"]))
    pid, interval, wedge = int(settings["pid"]), float(settings["interval_s"]), float(settings["wedge_s"])
    stamp = Stamp(settings["stamp"])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):  # bound to the route's source address (127.0.0.1 embedded),
        sock.connect(address)  # not to all interfaces as a first sendto would, and deaf to others
    watchers = Watchers(settings.get("watch_fd"))
    check = min(float(settings.get("check_s") or interval), interval)
    status = StatusWatch(pid)
    seq, due, wedged = 0, time.monotonic(), False
    while True:
        state = status.state()
        if state is None or state in "ZX" or os.getppid() != pid:
            watchers.tell_dead()  # first: the gateways move the requests in flight on it
            for _ in range(DEATH_NOTICES):  # proof of death, not a silence that might be lateness
                with contextlib.suppress(OSError):
                    sock.sendto(
                        datagram(key, settings["server"], settings["incarnation"], seq, True), address
                    )
                seq += 1
            with contextlib.suppress(OSError):
                os.unlink(settings["stamp"])  # the agent died without cleaning up: we do
            return 0
        now = time.monotonic()
        if now >= due:  # a heartbeat's tick (between ticks, only the death check above)
            stale = now - stamp.read() >= wedge
            if stale != wedged:  # say why the heartbeats stop (or resume): a wedged agent is rare
                wedged = stale
                _say(
                    settings["server"],
                    f"liveness stamp {'stale' if stale else 'fresh again'}, process state {state}",
                )
            if state not in "Tt" and not stale:
                with contextlib.suppress(OSError):
                    sock.sendto(datagram(key, settings["server"], settings["incarnation"], seq), address)
            seq += 1  # numbers ticks, sent or not: a gap at the receiver is silence, not lateness
            due += interval
            if due - now < -interval:  # we were starved: keep the rhythm, do not burst
                due = now
        watchers.wait(max(min(due, now + check) - time.monotonic(), 0.0))


class Watchers:
    """The gateways watching the agent's life, on a TCP socket the agent listened on and gave us.

    A killed process's own sockets close only at the end of its teardown, after the kernel has
    released its address space; for an agent (torch, Ray, its models: ~500 MB mapped, ~80 threads)
    that was measured at 80 ms to 2.3 s on a busy two-core host, all that time with the death plain
    in ``/proc``. This process is small and outlives the agent: when the agent dies it writes
    :data:`DEAD` to every watcher and closes, so a gateway learns of the death within the death
    check's period (``check_s``), whatever the teardown takes. A watcher that writes is ignored; one
    that closes is forgotten. Served between ticks, by the loop's one ``select``.
    """

    def __init__(self, fd: int | None) -> None:
        self.listener = None if fd is None else socket.socket(fileno=int(fd))
        if self.listener is not None:
            self.listener.setblocking(False)
        self.conns: list[socket.socket] = []

    def wait(self, timeout_s: float) -> None:
        """Sleep ``timeout_s`` at most, accepting watchers and forgetting those that left."""
        if self.listener is None:
            time.sleep(timeout_s)
            return
        try:
            ready, _, _ = select.select([self.listener, *self.conns], [], [], timeout_s)
        except (OSError, ValueError):
            return
        for sock in ready:
            if sock is self.listener:
                self._accept()
            else:
                self._read(sock)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()  # type: ignore[union-attr]
            except OSError:  # none left (BlockingIOError), or a watcher that left at once
                return
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns.append(conn)

    def _read(self, conn: socket.socket) -> None:
        try:
            if conn.recv(256):
                return  # a watcher has nothing to say: ignored
        except BlockingIOError:
            return
        except OSError:
            pass
        self.conns.remove(conn)
        conn.close()

    def tell_dead(self) -> None:
        """Write the notice to every watcher, those still in the listener's backlog included.

        A gateway that connected just before the death may not have been accepted yet (the loop
        accepts between ticks); left in the backlog it would learn nothing until the agent's own
        connection ended, the teardown this notice exists to outrun.
        """
        if self.listener is not None:
            self._accept()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(DEAD)
            conn.close()
        self.conns.clear()


def _say(server: str, what: str) -> None:
    """One line on stderr (Ray forwards the agent's, hence ours, to the driver's console)."""
    with contextlib.suppress(OSError):
        print(
            f"failsoft pulse {server}: {what}: heartbeats {'stop' if 'stale' in what else 'resume'}",
            file=sys.stderr,
            flush=True,
        )


class Pulse:
    """The agent's side: refreshes the liveness stamp and runs the sidecar process.

    With ``watch_host``, the sidecar also serves the gateways' watch of this process (:class:`Watchers`)
    on a socket listening there (:attr:`watch`: ``host:port``; None when it could not bind)."""

    def __init__(
        self,
        host: str,
        port: int,
        key: bytes,
        server: str,
        incarnation: str,
        interval_s: float,
        wedge_s: float,
        watch_host: str | None = None,
    ) -> None:
        self.interval_s, self.wedge_s = interval_s, wedge_s
        self.watch: str | None = None
        self._listener = None if watch_host is None else _listen(watch_host)
        if self._listener is not None:
            self.watch = f"{watch_host}:{self._listener.getsockname()[1]}"
        fd, path = tempfile.mkstemp(prefix=f"failsoft-pulse-{server}-", dir=_shm_dir())
        os.close(fd)
        self.stamp = Stamp(path, create=True)
        self._settings = {
            "host": host,
            "port": port,
            "key": key.hex(),
            "server": server,
            "incarnation": incarnation,
            "interval_s": interval_s,
            "wedge_s": wedge_s,
            "pid": os.getpid(),
            "stamp": path,
            "check_s": interval_s / CHECKS_PER_TICK,
            "watch_fd": None if self._listener is None else self._listener.fileno(),
        }
        self._stop = threading.Event()
        self.sidecar: subprocess.Popen[bytes] | None = None

    def start(self) -> Pulse:
        threading.Thread(target=self._refresh, name="liveness-stamp", daemon=True).start()
        passed = () if self._listener is None else (self._listener.fileno(),)
        self.sidecar = subprocess.Popen(
            [sys.executable, "-S", os.path.abspath(__file__)], stdin=subprocess.PIPE, pass_fds=passed
        )
        if self._listener is not None:  # the sidecar's alone from now on: it accepts, it answers
            self._listener.close()
        assert self.sidecar.stdin is not None
        self.sidecar.stdin.write(json.dumps(self._settings).encode() + b"\n")
        self.sidecar.stdin.close()
        return self

    def _refresh(self) -> None:
        raise_priority(threading.get_native_id())  # where permitted: first in line for the CPU
        while not self._stop.is_set():
            self.stamp.write(time.monotonic())
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self.sidecar is not None and self.sidecar.poll() is None:
            self.sidecar.kill()
            self.sidecar.wait()
        self.stamp.close()
        with contextlib.suppress(OSError):
            os.unlink(self.stamp.path)


def _listen(host: str) -> socket.socket | None:
    """A TCP socket listening on ``host`` (a free port) for the sidecar's watchers; None if it cannot."""
    try:
        listener = socket.create_server((host, 0), backlog=64)
    except OSError as exc:
        _say_plain(f"no watch socket on {host} ({exc}): gateways see a death by the connection's end")
        return None
    listener.set_inheritable(True)
    return listener


def _say_plain(what: str) -> None:
    with contextlib.suppress(OSError):
        print(f"failsoft pulse: {what}", file=sys.stderr, flush=True)


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


if __name__ == "__main__":
    sys.exit(run_sidecar(json.loads(sys.stdin.readline())))
