"""The OpenAI-compatible HTTP server: protocol models, handlers, streams, errors, metrics."""
