"Quantization (chapter 13): weights in fewer bits, and GGUF files served in their own blocks."
