"""Multi-turn text environments on Gymnasium, their registry, and the conformance checker.

Importing this package registers the built-in environments (and installed plug-ins) with
Gymnasium, as Gymnasium's own environment packages do, so ``gymnasium.make("sao/Arithmetic-v0")``
works after ``import sao.envs``.
"""

from .budgets import Budgets
from .checker import EnvConformanceError, check_env
from .core import FINAL_INFO_KEYS, AssistantMessageSpace, Message, MessagesSpace, TextEnv
from .errors import DatasetError, EnvError, TaskError, UnknownEnvError
from .registry import EnvEntry, entries, make, resolve

entries()

__all__ = [
    "FINAL_INFO_KEYS", "AssistantMessageSpace", "Budgets", "DatasetError", "EnvConformanceError", "EnvEntry", "EnvError",
    "Message", "MessagesSpace", "TaskError", "TextEnv", "UnknownEnvError", "check_env", "entries", "make", "resolve",
]
