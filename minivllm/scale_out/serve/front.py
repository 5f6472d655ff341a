"""The OpenAI front of the Ray Serve deployment: the server's FastAPI app on a :class:`ReplicaEngineClient`.

One front replica parses, checks and tokenizes requests (the same handlers, limits and API-key guard as
``minivllm serve`` on one engine) and streams each one from an engine replica. Its ``/metrics`` is every
replica's metrics, labelled ``replica``, and its own.
"""

from __future__ import annotations

from minivllm.config.engine import StructuredOutputsConfig
from minivllm.config.server import ServerConfig
from minivllm.entrypoints.openai.api_server import build_app
from minivllm.scale_out.serve.engine_client import ReplicaEngineClient
from minivllm.scale_out.serve.metrics import FrontMetrics, replicas_load


class OpenAIFront:
    """Serve's ingress: ``__serve_build_asgi_app__`` hands Serve the app, built in this replica."""

    async def __init__(self, engines, board, model: str, served_model_name: str, server_config: ServerConfig,
                       structured_outputs_config: StructuredOutputsConfig):
        self.board = board
        self.metrics = FrontMetrics(served_model_name)
        self.client = ReplicaEngineClient(engines, model, structured_outputs_config, self.metrics.retries.inc)
        self._app = build_app(self.client, served_model_name, server_config, metrics=self.render_metrics,
                              load_report=self.load_report)
        await self.client.load()  # the replicas are up by then: Serve reports the app running once it can serve

    async def render_metrics(self) -> bytes:
        """The replicas' metrics from the board, and the front's."""
        return self.metrics.render(await self.board.collect.remote())

    async def load_report(self) -> dict[str, float]:
        """The ORCA load report of the replicas together (the front's own engine client has no engine)."""
        return replicas_load(await self.board.collect.remote())

    def __serve_build_asgi_app__(self):
        return self._app
