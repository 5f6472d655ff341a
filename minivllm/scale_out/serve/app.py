"""``minivllm serve MODEL --data-parallel-size N``: N engine replicas behind one OpenAI endpoint, on Ray Serve.

Three deployments make the application (``build_serve_app``):

- ``EngineReplica`` x N: one engine each, in a ``STRICT_PACK`` placement group of its ``gpus_per_replica`` GPUs
  (its tensor-parallel workers are its own processes on them); Serve's autoscaler adds replicas up to
  ``autoscale_max_replicas`` while the requests in flight per replica exceed ``autoscale_target_ongoing_requests``,
  and Serve replaces a replica that dies or fails its health check;
- ``OpenAIFront``: the HTTP app; it routes each request with :class:`PrefixAwareRouter`;
- ``MetricsBoard``: the replicas' latest metrics for the front's ``/metrics``.

``app_builder`` builds the same application from a Serve config file (``serve run`` / KubeRay's RayService).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from minivllm.config import Config
from minivllm.config.server import ServerConfig
from minivllm.envs import plain_ray_log_prefixes

logger = logging.getLogger("minivllm.server")

APP_NAME = "minivllm"


def build_serve_app(model: str, engine_kwargs: dict, server: ServerConfig):
    """The Serve application of ``engine_kwargs['data_parallel_size']`` replicas (validated here, before Ray)."""
    if server.uds is not None:
        raise ValueError("uds: with --data-parallel-size the replicas are served by Ray Serve's HTTP proxy, which "
                         "listens on --host/--port; --uds serves one engine")
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from minivllm.scale_out.serve.front import OpenAIFront
    from minivllm.scale_out.serve.metrics import MetricsBoard
    from minivllm.scale_out.serve.replica import EngineReplica
    from minivllm.scale_out.serve.router import PrefixAwareRouter

    config = Config.create(model, **engine_kwargs)  # ValueError naming the field
    pc, sc = config.parallel_config, config.scheduler_config
    replicas = pc.data_parallel_size
    if server.autoscale_max_replicas is not None and server.autoscale_max_replicas < replicas:
        raise ValueError(f"autoscale_max_replicas ({server.autoscale_max_replicas}) must be >= data_parallel_size "
                         f"({replicas})")
    if server.autoscale_max_replicas is None:
        scaling = dict(num_replicas=replicas)
    else:
        scaling = dict(autoscaling_config=dict(
            min_replicas=replicas, initial_replicas=replicas, max_replicas=server.autoscale_max_replicas,
            target_ongoing_requests=server.autoscale_target_ongoing_requests, upscale_delay_s=5.0,
            downscale_delay_s=60.0))
    gpus = pc.replica_gpus if config.device_config.device != "cpu" else 0
    placement = dict(placement_group_bundles=[{"GPU": gpus}], placement_group_strategy="STRICT_PACK") if gpus else {}
    # NOTE: no CPU is reserved for any deployment (the engine's threads are its own): a machine with fewer cores
    # than replicas would otherwise leave some pending forever. max_ongoing_requests lets a replica hold a full
    # batch and its waiting queue, so the engine's own 429 (max_num_waiting) answers an overload.
    quiet = dict(enable_access_log=False, log_level=server.log_level.upper())
    engine = serve.deployment(
        EngineReplica, name="EngineReplica", ray_actor_options=dict(num_cpus=0, num_gpus=gpus), **placement,
        logging_config=quiet,
        max_ongoing_requests=sc.max_num_seqs + server.max_num_waiting, health_check_period_s=5.0,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAwareRouter,
            request_router_kwargs=dict(block_size=config.cache_config.kvcache_block_size)),
        **scaling)
    board = serve.deployment(MetricsBoard, name="MetricsBoard", num_replicas=1,
                             ray_actor_options=dict(num_cpus=0), max_ongoing_requests=1000,
                             logging_config=quiet).bind()
    front = serve.deployment(serve.ingress()(OpenAIFront), name="OpenAIFront", num_replicas=1,
                             ray_actor_options=dict(num_cpus=0), max_ongoing_requests=100_000,
                             logging_config={**quiet, "enable_access_log": server.log_level == "debug"})
    name = server.served_model_name or model
    replica_kwargs = {**engine_kwargs, "data_parallel_size": 1}
    engines = engine.bind(model, replica_kwargs, name, server.max_num_waiting, board)
    front_config = ServerConfig(**{**vars(server), "root_path": None})  # Serve's route_prefix mounts it
    return front.bind(engines, board, model, name, front_config, config.structured_outputs_config)


def builder_argv(args: dict) -> list[str]:
    """The ``minivllm serve`` arguments (what follows ``serve``) of a builder's ``args``: ``model`` and flags by
    field name, typed or strings."""
    args = dict(args)
    if "model" not in args:
        raise ValueError("app_builder needs `model`, the checkpoint folder")
    from minivllm.entrypoints.args import engine_flags, flags_of

    off_by_default = {name: meta["default"] for _, name, typ, meta in engine_flags() + flags_of(ServerConfig)
                      if typ is None}
    argv = [str(args.pop("model"))]
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool) or str(value).lower() in ("true", "false"):
            on = value if isinstance(value, bool) else str(value).lower() == "true"
            if on or off_by_default.get(name) is not False:  # a switch off by default has no --no- form
                argv.append(flag if on else "--no-" + flag[2:])
        else:
            for v in value if isinstance(value, list) else [value]:
                argv += [flag, str(v)]
    return argv


def app_builder(args: dict):
    """A Serve application builder (``import_path: minivllm.scale_out.serve.app:app_builder``): ``args``
    holds ``model`` and any ``minivllm serve`` flag by field name (``data_parallel_size: 2``), typed (a config
    file) or as strings (``serve run ... data_parallel_size=2``); ValueError for an unknown or bad one."""
    from minivllm.entrypoints.args import engine_kwargs, serve_parser

    try:
        ns = serve_parser().parse_args(builder_argv(args))
    except SystemExit:  # argparse printed which argument, to stderr
        raise ValueError(f"app_builder: bad arguments {sorted(args)} (see the message above)") from None
    return build_serve_app(ns.model, engine_kwargs(ns), ServerConfig.from_args(ns))


def run_ray_server(model: str, engine_kwargs: dict, server: ServerConfig) -> int:
    """Serve the replicas on Ray (a local runtime, or the cluster ``RAY_ADDRESS`` names) until SIGINT/SIGTERM."""
    import ray  # without the ray extra: ModuleNotFoundError, which the CLI turns into one line naming the extra
    from ray import serve

    app = build_serve_app(model, engine_kwargs, server)
    owns_ray = not ray.is_initialized()
    if owns_ray:
        plain_ray_log_prefixes(sys.stdout.isatty() and sys.stderr.isatty())
        ray.init(include_dashboard=False, configure_logging=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    started = False
    try:
        serve.start(http_options=dict(host=server.host, port=server.port,
                                      keep_alive_timeout_s=server.timeout_keep_alive))
        started = True
        serve.run(app, name=APP_NAME, route_prefix=server.root_path or "/")
        logger.info("serving %s on http://%s:%d through Ray Serve", server.served_model_name or model,
                    server.host, server.port)
        stop.wait()
    except RuntimeError as exc:  # Serve gave up deploying (a replica's engine could not be built)
        logger.error("the replicas could not start: %s", exc)
        return 1
    finally:
        _stop_serving(ray, serve, started, owns_ray and _started_local_ray(ray))
    return 0


def _started_local_ray(ray) -> bool:
    """Whether ``ray.init`` here started a Ray runtime (a head node) rather than joined a cluster (``RAY_ADDRESS``,
    or one ``ray start`` began on this machine)."""
    node = getattr(ray._private.worker, "_global_node", None)  # NOTE: Ray has no public call that says it
    return bool(getattr(node, "head", False))


def _stop_serving(ray, serve, started: bool, local: bool) -> None:
    """Stop the application's replicas gracefully, then Serve and Ray. On a runtime of its own the process deletes
    the application and shuts Ray down, which ends Serve's controller and proxy with it: ``serve.shutdown()``
    would make the controller end itself while the call waits on it, which Ray reports as a failed task
    ("ServeController.graceful_shutdown failed ... will be retried") at every clean exit. On a cluster Serve is
    shut down, so that its proxy no longer holds the port."""
    if not local:
        serve.shutdown()
        if ray.is_initialized():
            ray.shutdown()
        return
    if started:
        serve.delete(APP_NAME)
    ray.shutdown()
