"The engine: block manager, KV pool, attention, scheduler, model runner and `LLMEngine`."
