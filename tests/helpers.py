"Shared by the tests: transformers' greedy generation as the reference (chapter 7c's `hf_greedy`)."

from minillm.bench.offline import hf_greedy  # noqa: F401
