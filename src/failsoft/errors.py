"""Every error failsoft raises, in one place.

Foreign errors (pydantic, HiGHS, Ray, httpx, safetensors, OS) are mapped once, at the wrapper that
calls the foreign code, to the most specific failsoft error below, with ``raise ... from exc`` so the
cause is kept. Callers catch failsoft errors only; the CLI turns any of them into one line on stderr
and a non-zero exit code, never a traceback. The gateway maps each class to one HTTP status
(:func:`http_status`), never by reading messages.

    FailsoftError
    ├── ConfigError              a scenario, config or argument is invalid (names the bad entry)    400
    │   └── UnknownNameError     it names a server, site, app or policy that does not exist           404
    ├── PlanningError            a policy could not produce a plan (solver failure, bad request)
    ├── RepositoryError          the on-disk model repository
    │   ├── ModelNotFoundError   no such family/variant, or a name that escapes the repository
    │   └── CorruptModelError    a weight file or config that cannot be read back
    ├── InvalidRequestError      a client request the gateway refuses: names what is wrong       4xx (own)
    └── ServingError             the runtime failed to do what was asked                               500
        ├── ServerUnavailableError   the server holding a model is failed or unreachable              503
        ├── NoRouteError             no live route for an app before the request's deadline          503
        ├── OverloadedError          a serving queue cannot start the request in time                503
        ├── StoreError               the state store (SQLite, Redis) failed                          500
        ├── CapacityError            a load would exceed a server's memory capacity                  500
        ├── ModelNotLoadedError      a server was asked to serve a variant it does not hold          503
        └── DeadlineExceededError    a routed request got no answer before its deadline              504
            └── DroppedError         the serving queue dropped it unrun: it could not make its deadline  504

Client mistakes (:class:`InvalidRequestError`) are not serving errors: a retrying router must never
retry them, and metrics count them apart.
"""

from __future__ import annotations


class FailsoftError(Exception):
    """Base of every failsoft error; its message is meant for the user as it is."""


class ConfigError(FailsoftError, ValueError):
    """Invalid scenario, config or argument. The message names the offending entry and value."""


class UnknownNameError(ConfigError):
    """A name (server, site, app, service, policy) that the cluster or scenario does not have."""


class PlanningError(FailsoftError):
    """A policy could not produce a plan."""


class RepositoryError(FailsoftError):
    """The on-disk model repository could not serve a request."""


class ModelNotFoundError(RepositoryError, KeyError):
    """No such family or variant in the repository, or a name that would resolve outside it."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class CorruptModelError(RepositoryError):
    """A weight file, config or profile exists but cannot be read back."""


class StateMismatchError(RepositoryError, ValueError):
    """A stateful model's state was applied to another model, or has other arrays or shapes."""


class InvalidRequestError(FailsoftError):
    """A client request the gateway refuses with a 4xx; ``status`` is the HTTP status code,
    ``param`` the request field at fault when one is (OpenAI's error object names it)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class ServingError(FailsoftError):
    """The serving runtime failed to do what was asked."""


class ServerUnavailableError(ServingError):
    """The server holding a model is failed, hung or unreachable."""


class NoRouteError(ServingError):
    """No live route exists for an app before the request's deadline."""


class OverloadedError(ServingError):
    """A bounded serving queue refused a request it could not start before its deadline.

    ``retry_after_s`` is the queue's own estimate of when it could take the request (the gateway's
    ``Retry-After``), never a wait the client is made to sit through.
    """

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[type, tuple[str, float]]:  # crosses Ray's process boundary intact
        return (type(self), (str(self), self.retry_after_s))


class StoreError(ServingError):
    """The state store (SQLite or Redis) failed."""


class CapacityError(ServingError):
    """A load would take a server past its configured memory capacity."""


class ModelNotLoadedError(ServingError):
    """A server was asked to serve (or unload) a variant it does not hold."""


class DeadlineExceededError(ServingError):
    """A request had a route but no answer came back before its deadline."""


class DroppedError(DeadlineExceededError):
    """A serving queue dropped a request without running it: it could not be answered before its
    deadline (it arrived with no time left, or a lazy discipline judged it could not make it).

    The queue's own verdict, like :class:`OverloadedError`'s refusal: the server is alive and
    deciding, so app-level health does not count it against the server (a timeout with no verdict
    does). Still a 504 to the client: its deadline was not met.
    """


def http_status(exc: FailsoftError) -> int:
    """The HTTP status the gateway answers for ``exc``: by class, never by message."""
    if isinstance(exc, InvalidRequestError):
        return exc.status
    if isinstance(exc, UnknownNameError):
        return 404
    if isinstance(exc, ConfigError):
        return 400
    if isinstance(exc, (NoRouteError, ServerUnavailableError, OverloadedError, ModelNotLoadedError)):
        return 503
    if isinstance(exc, DeadlineExceededError):
        return 504
    return 500
