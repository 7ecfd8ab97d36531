"Attention over the paged KV cache: the metadata and flat batch a step builds, the backends."
