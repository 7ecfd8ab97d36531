"The engine: its configuration, the model runner, workers and executors, and `LLMEngine`."
