"""The server's own settings (the engine's are ``Config``'s): where it listens, who may call it, how much one
request may ask for, and how long a client may take to send one. Each field is a ``minivllm serve`` flag. (How
many logprobs a request may ask for is the engine's ``max_logprobs``, as in vLLM: the engine checks it.)

Plain data like the rest of ``config``: importing it needs neither fastapi nor Ray."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field, fields

from minivllm.config.fields import arg, at_least, check_types
from minivllm.config.lora_modules import LoRAModulePath, parse_lora_modules

_VERSION = re.compile(r"v?\d+(\.\d+)+")


@dataclass
class ServerConfig:
    """Validated server settings; the defaults are OpenAI's limits where it has one."""

    host: str = arg("127.0.0.1", "address to listen on")
    port: int = arg(8000, "port to listen on")
    uds: str | None = arg(None, "serve on this Unix domain socket instead of --host/--port (one engine: Ray Serve's "
                                "proxy, with --data-parallel-size, listens on --host/--port)")
    served_model_name: str | None = arg(None, "the model name clients use (default: MODEL as given)")
    api_key: list[str] = field(default_factory=list, metadata={
        "help": "require 'Authorization: Bearer KEY' on /v1/*, /invocations, /tokenize and /detokenize (repeat for "
                "several keys; MINIVLLM_API_KEY adds comma-separated ones); /health, /ping, /load and /metrics stay "
                "open"})
    max_num_waiting: int = arg(1024, "sequences that may wait for the engine (queued, not yet generating); "
                                     "a request beyond them gets 429 with Retry-After")
    max_n: int = arg(128, "largest n (and best_of) of one request")
    max_stop_strings: int = arg(16, "most stop strings of one request")
    max_stop_string_chars: int = arg(256, "longest stop string, in characters")
    max_body_bytes: int = arg(2 << 20, "largest request body (250k token ids, or a text far beyond any context; "
                                       "JSON is parsed in one go, holding Python's lock for the whole body); a "
                                       "larger one gets 413 without being read")
    request_timeout_s: float = arg(30.0, "seconds a client may take to send a request's headers and body; a "
                                         "slower connection is closed (408)")
    timeout_keep_alive: int = arg(5, "seconds an idle keep-alive connection stays open")
    log_level: str = arg("info", "log level", choices=("debug", "info", "warning", "error"))
    trust_request_chat_template: bool = arg(False, "accept a chat_template in requests (a template is code the "
                                                   "server runs: off by default, as in vLLM)")
    root_path: str | None = arg(None, "the path prefix under which a proxy serves the app (FastAPI's root_path)")
    enable_request_id_headers: bool = arg(False, "echo a request's X-Request-Id header in its response (a new "
                                                 "id when it has none)")
    enable_auto_tool_choice: bool = arg(False, "let the model decide whether to call the tools it is given "
                                               "(tool_choice auto, the default with tools); needs --tool-call-parser")
    tool_call_parser: str | None = arg(None, "how the model writes tool calls: hermes (<tool_call> blocks, "
                                             "Qwen2.5 / Qwen3), llama3_json (Llama 3.x) or openai (gpt-oss's "
                                             "harmony format: chat outputs are read as harmony)",
                                       choices=("hermes", "llama3_json", "openai"))
    return_tokens_as_token_ids: bool = arg(False, "name the tokens of logprobs 'token_id:N' unless a request says "
                                                  "otherwise (return_tokens_as_token_ids), as vLLM's flag")
    reasoning_parser: str | None = arg(None, "move the model's reasoning into the message's reasoning: qwen3 "
                                             "(<think>...</think>) or openai_gptoss (gpt-oss's harmony analysis "
                                             "channel; gpt_oss is the same)",
                                       choices=("qwen3", "openai_gptoss", "gpt_oss"))
    enable_force_include_usage: bool = arg(False, "usage in every chunk of every stream, and a last chunk with "
                                                  "it, whether or not the request asked (stream_options)")
    enable_prompt_tokens_details: bool = arg(False, "report usage.prompt_tokens_details.cached_tokens, the prompt "
                                                    "tokens read from the prefix cache (0 without a hit; without the "
                                                    "flag prompt_tokens_details is null, as in vLLM)")
    enable_server_load_tracking: bool = arg(False, "count the completion and chat requests in flight, for GET "
                                                   "/load ({\"server_load\": N}; 0 without it)")
    enable_tokenizer_info_endpoint: bool = arg(False, "serve GET /tokenizer_info (the tokenizer's settings and "
                                                      "chat template, as vLLM's; off by default: it shows them to "
                                                      "every client)")
    enable_per_request_metrics: bool = arg(False, "add a request's timings (metrics: time_to_first_token_ms, "
                                                  "generation_time_ms, queue_time_ms, mean_itl_ms, "
                                                  "tokens_per_second) to its response, and to a stream's usage "
                                                  "chunk, for requests of one completion (n=1), as vLLM")
    show_hidden_metrics_for_version: str | None = arg(None, "show the Prometheus metrics deprecated and hidden "
                                                            "since this version (MAJOR.MINOR, vLLM's flag); none "
                                                            "is hidden in this release, so it shows nothing more")
    lora_modules: list[LoRAModulePath] = field(default_factory=list, metadata={
        "help": "LoRA adapters to serve from the start, each as name=path or as JSON {\"name\": .., \"path\": .., "
                "\"base_model_name\": ..} (several after one flag, or the flag repeated); a request's model names "
                "one; needs --enable-lora", "nargs": "+"})
    enable_lora_runtime_updates: bool = arg(False, "open POST /v1/load_lora_adapter and /v1/unload_lora_adapter, "
                                                   "which load and unload adapters while the server runs (any "
                                                   "client may then read a folder of the server's disk as an "
                                                   "adapter: off by default); needs --enable-lora")
    autoscale_max_replicas: int | None = arg(None, "with --data-parallel-size N: let Ray Serve add engine replicas, "
                                                   "up to this many, while their queues are long (and remove them "
                                                   "down to N when idle)")
    autoscale_target_ongoing_requests: int = arg(32, "requests in flight per replica that autoscaling aims at "
                                                     "(running and waiting)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        """The ServerConfig of parsed ``minivllm serve`` flags: the ones given, defaults for the rest (ValueError
        naming a bad one)."""
        given = vars(args)
        return cls(**{f.name: given[f.name] for f in fields(cls) if given.get(f.name) is not None})

    def __post_init__(self) -> None:
        check_types(self)
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65536), got {self.port}")
        for name in ("max_num_waiting", "max_n", "max_stop_string_chars", "max_body_bytes", "timeout_keep_alive"):
            at_least(name, getattr(self, name), 1)
        at_least("max_stop_strings", self.max_stop_strings, 0)
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.max_num_waiting < self.max_n:
            raise ValueError(f"max_num_waiting ({self.max_num_waiting}) must be >= max_n ({self.max_n}): a request "
                             f"of n sequences must be able to wait")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (hermes, llama3_json or openai)")
        at_least("autoscale_target_ongoing_requests", self.autoscale_target_ongoing_requests, 1)
        if self.autoscale_max_replicas is not None:
            at_least("autoscale_max_replicas", self.autoscale_max_replicas, 1)
        if self.uds is not None and not self.uds:
            raise ValueError("uds must be a socket path, got ''")
        if self.show_hidden_metrics_for_version is not None:
            check_version("show_hidden_metrics_for_version", self.show_hidden_metrics_for_version)
        if any(not isinstance(k, str) or not k for k in self.api_key):
            raise ValueError("api_key must be non-empty strings")
        self.lora_modules = parse_lora_modules(self.lora_modules)


def check_version(name: str, value: str) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is a release number (``0.32``, ``0.7.1``)."""
    if not _VERSION.fullmatch(value):
        raise ValueError(f"{name} must be a version such as 0.32, got {value!r}")
