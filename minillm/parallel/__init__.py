"Tensor parallelism (chapter 11): the split layers, and the engine across processes."
