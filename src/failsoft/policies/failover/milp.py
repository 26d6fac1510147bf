"""The one wrapper around HiGHS: a 0-1 / integer maximisation with a start point and a time limit.

Every MILP failsoft solves goes through :func:`maximize`, so solver options, the mapping of HiGHS
statuses and errors, and the guarantee "never return worse than the start point" live in one place.
Every HiGHS instance comes from :func:`new_highs`, which keeps the solver's banner off standard output.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import highspy
import numpy as np

from failsoft.errors import PlanningError

if TYPE_CHECKING:
    from scipy import sparse

INF = highspy.kHighsInf
_FEASIBLE = 2  # HiGHS primal_solution_status: a feasible point is known
_first_instance = threading.Lock()
_banner_silenced = False


def new_highs() -> highspy.Highs:
    """A HiGHS instance that has printed nothing.

    HiGHS (1.16 at least) writes its copyright banner to file descriptor 1, below Python, when a
    process makes its first instance: before any option can turn output off. Standard output is where
    ``failsoft plan`` prints its JSON and where the planner process answers the controller, so the
    first instance is made with descriptor 1 pointed at ``/dev/null`` (and C's buffers flushed before
    it is put back); later instances print nothing by themselves.
    """
    global _banner_silenced
    with _first_instance:
        if _banner_silenced:
            return highspy.Highs()
        sys.stdout.flush()
        saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            highs = highspy.Highs()
            _flush_c_stdio()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
        _banner_silenced = True
        return highs


def _flush_c_stdio() -> None:
    with contextlib.suppress(OSError, AttributeError):  # no C library to ask (not POSIX): nothing buffered
        ctypes.CDLL(None).fflush(None)


@dataclass(frozen=True, slots=True)
class MilpResult:
    x: np.ndarray
    objective: float
    dual_bound: float  # an upper bound on the optimum (``inf`` when unknown)
    optimal: bool
    feasible: bool

    @property
    def gap(self) -> float | None:
        """Relative gap ``(bound - objective) / |objective|``, HiGHS's definition."""
        if not self.feasible or not np.isfinite(self.dual_bound):
            return None
        if abs(self.objective) < 1e-12:
            return 0.0 if abs(self.dual_bound) < 1e-9 else None
        return max(self.dual_bound - self.objective, 0.0) / abs(self.objective)


def maximize(
    cost: np.ndarray,
    matrix: sparse.spmatrix,
    row_lower: np.ndarray,
    row_upper: np.ndarray,
    col_upper: np.ndarray,
    *,
    time_limit_s: float,
    mip_rel_gap: float,
    seed: int = 0,
    start: np.ndarray | None = None,
    presolve: bool = True,
) -> MilpResult:
    """Maximise ``cost @ x`` s.t. ``row_lower <= A x <= row_upper``, ``0 <= x <= col_upper``, x integer."""
    n = len(cost)
    from scipy import sparse  # here: agents import this module, never solve

    a = sparse.csc_matrix(matrix)
    a.eliminate_zeros()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, a.shape[0]
    lp.col_cost_ = np.asarray(cost, dtype=float)
    lp.col_lower_, lp.col_upper_ = np.zeros(n), np.asarray(col_upper, dtype=float)
    lp.row_lower_, lp.row_upper_ = np.asarray(row_lower, dtype=float), np.asarray(row_upper, dtype=float)
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n

    h = new_highs()
    for option, value in (
        ("output_flag", False),
        ("time_limit", float(max(time_limit_s, 0.05))),
        ("mip_rel_gap", float(mip_rel_gap)),
        ("random_seed", int(seed)),
        ("presolve", "on" if presolve else "off"),
    ):
        h.setOptionValue(option, value)
    if h.passModel(lp) == highspy.HighsStatus.kError:
        raise PlanningError(f"HiGHS refused a model of {n} columns and {a.shape[0]} rows")
    if start is not None:
        solution = highspy.HighsSolution()
        solution.col_value = list(np.asarray(start, dtype=float))
        solution.value_valid = True
        h.setSolution(solution)
    if h.run() == highspy.HighsStatus.kError:
        raise PlanningError(f"HiGHS failed on a model of {n} columns and {a.shape[0]} rows")
    info = h.getInfo()
    status = h.getModelStatus()
    bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else INF
    if info.primal_solution_status != _FEASIBLE:
        if start is not None:
            return MilpResult(np.asarray(start, dtype=float), float(cost @ start), bound, False, True)
        infeasible = status == highspy.HighsModelStatus.kInfeasible
        return MilpResult(np.zeros(n), 0.0, -INF if infeasible else bound, infeasible, False)
    x = np.round(np.asarray(h.getSolution().col_value))
    if start is not None and float(cost @ x) + 1e-9 < float(cost @ start):
        x = np.asarray(start, dtype=float)
    optimal = status == highspy.HighsModelStatus.kOptimal
    objective = float(cost @ x)
    if optimal:
        bound = min(bound, objective * (1 + mip_rel_gap) + 1e-9) if bound < INF else objective
    return MilpResult(x, objective, max(bound, objective), optimal, True)
