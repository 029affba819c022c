"""The engine-agnostic scheduling core: requests, cost functions, predictors, policies and the ledger."""

from .cost import CostFunction, LinearCost, make_cost, profiled_a10g_llama2_7b
from .factory import POLICIES, SchedulingPolicy, make_policy, parse_weights
from .fairness import jain_index, theorem_bound
from .fcfs import FCFS, RPM
from .ledger import (
    DEFAULT_TENANT,
    MAX_WEIGHT,
    MIN_WEIGHT,
    Account,
    Ledger,
    LedgerView,
    TenantView,
    Unsupported,
    check_weight,
)
from .policy import Policy, PolicyError
from .predictor import MovingAveragePredictor, NoisyOraclePredictor, OraclePredictor, Predictor, make_predictor
from .request import Request, RequestState
from .vtc import VTC

__all__ = [
    "CostFunction",
    "LinearCost",
    "make_cost",
    "profiled_a10g_llama2_7b",
    "POLICIES",
    "SchedulingPolicy",
    "make_policy",
    "parse_weights",
    "FCFS",
    "RPM",
    "VTC",
    "Policy",
    "PolicyError",
    "Predictor",
    "OraclePredictor",
    "NoisyOraclePredictor",
    "MovingAveragePredictor",
    "make_predictor",
    "Request",
    "RequestState",
    "DEFAULT_TENANT",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "Account",
    "Ledger",
    "LedgerView",
    "TenantView",
    "Unsupported",
    "check_weight",
    "jain_index",
    "theorem_bound",
]
