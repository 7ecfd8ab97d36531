__version__ = "0.1.0"

# The public API, vLLM-style: `from minillm import LLM, SamplingParams`. (Written by hand: nbdev
# exports the modules; this file only re-exports their public names.)
from .sampling import SamplingParams
from .engine import LLM, LLMEngine, EngineConfig, RequestOutput, CompletionOutput
