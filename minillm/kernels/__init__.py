"Attention kernels over the paged KV cache (chapter 8)."
