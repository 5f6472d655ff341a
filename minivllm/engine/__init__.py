"""The engine: the step loop (LLMEngine), the async engine of the server, output processing."""
