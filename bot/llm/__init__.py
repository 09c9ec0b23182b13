"""LLM clients behind one small interface: `LLMClient.stream(request, on_text) -> Response`."""
