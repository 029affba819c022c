"""The engine-agnostic scheduling core: accounts and the ledger (the one way in), requests, cost functions,
predictors, the policy interface and the registered policies."""

# isort: off
# NOTE: importing a policy module registers its policies, in this order (the order --help lists them)
from .vtc import LCF, VTC
from .fcfs import FCFS, RPM
from .drr import DRR
from .lpm import LPM
from .dlpm import DLPM

# isort: on
from .account import (
    DEFAULT_TENANT,
    MAX_WEIGHT,
    MIN_WEIGHT,
    Account,
    LedgerView,
    TenantView,
    Unsupported,
    check_nodes,
    check_weight,
    parse_priorities,
    parse_weights,
)
from .cost import CostFunction, LinearCost, make_cost, profiled_a10g_llama2_7b
from .fairness import jain_index, theorem_bound
from .ledger import Ledger, Peers
from .listener import Listener, Listeners
from .policy import Capabilities, Policy, PolicyError
from .predictor import MovingAveragePredictor, NoisyOraclePredictor, OraclePredictor, Predictor, make_predictor
from .registry import PolicyEntry, check_policy, describe, make_policy, policy_names, register
from .request import Request, RequestState

__all__ = [
    "DEFAULT_TENANT",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "Account",
    "LedgerView",
    "TenantView",
    "Unsupported",
    "check_nodes",
    "check_weight",
    "parse_priorities",
    "parse_weights",
    "CostFunction",
    "LinearCost",
    "make_cost",
    "profiled_a10g_llama2_7b",
    "DRR",
    "DLPM",
    "LPM",
    "FCFS",
    "RPM",
    "LCF",
    "VTC",
    "jain_index",
    "theorem_bound",
    "Ledger",
    "Peers",
    "Listener",
    "Listeners",
    "Capabilities",
    "Policy",
    "PolicyError",
    "MovingAveragePredictor",
    "NoisyOraclePredictor",
    "OraclePredictor",
    "Predictor",
    "make_predictor",
    "PolicyEntry",
    "check_policy",
    "describe",
    "make_policy",
    "policy_names",
    "register",
    "Request",
    "RequestState",
]
