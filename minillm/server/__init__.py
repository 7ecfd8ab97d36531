"The OpenAI-compatible server: the engine thread, the protocol, metrics and the app (chapter 9)."
