"""The architectures: the decoder skeleton (Llama, Qwen2, Qwen3), layers that differ (Gemma 3,
SmolLM3), recurrent layers (Qwen3.5) and mixtures of experts (Qwen3-MoE, Mixtral), each named in
`loader.ARCHITECTURES`."""
