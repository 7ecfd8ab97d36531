"""minillm: a course that builds an LLM inference engine, and the engine it builds.

The public API, vLLM-style: `from minillm import LLM, SamplingParams`. Written by hand (nbdev
exports the modules; this file only re-exports their public names), and lazy: importing `minillm`
loads nothing until one of these names is used.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "minillm.llm",
    "SamplingParams": "minillm.sampling",
    "EngineConfig": "minillm.engine.llm_engine",
    "LLMEngine": "minillm.engine.llm_engine",
    "RequestOutput": "minillm.engine.llm_engine",
    "CompletionOutput": "minillm.engine.llm_engine",
}
__all__ = [
    "LLM",
    "SamplingParams",
    "EngineConfig",
    "LLMEngine",
    "RequestOutput",
    "CompletionOutput",
]

if TYPE_CHECKING:
    from minillm.engine.llm_engine import CompletionOutput, EngineConfig, LLMEngine, RequestOutput
    from minillm.llm import LLM
    from minillm.sampling import SamplingParams


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'minillm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__():
    return sorted(list(globals()) + __all__)
