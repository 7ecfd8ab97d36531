"Routing (chapter 14): one OpenAI endpoint in front of several engines."
