"""LoRA adapters over HTTP, with the ``openai`` client against ``minivllm serve`` of the demo model and its shipped
adapter (``models/minivllm-demo-py-lora-google-docstrings``): ``--lora-modules`` (``name=path`` and JSON),
``/v1/models`` listing adapters with their ``parent``, an adapter chosen by a request's ``model`` (completions
and chat, streamed or not), ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` behind
``--enable-lora-runtime-updates``, and every error in OpenAI's shape: an unknown model 404, a bad adapter folder
400 naming what is wrong, a name loaded twice 400, an unknown adapter unloaded 404. The name registry and the
flags are also checked in-process, and README.md's example is run as written."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import shutil
import subprocess
import sys

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from minivllm.config.lora_modules import LoRAModulePath, parse_lora_modules
from minivllm.config.server import ServerConfig
from minivllm.entrypoints.cli import check_lora_flags
from minivllm.entrypoints.openai.api_server import build_app
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.serving_models import ServedModels
from tests.helpers.server_utils import ROOT, running_server, stream_events

DEMO = str(ROOT / "models" / "minivllm-demo-py")
ADAPTER = ROOT / "models" / "minivllm-demo-py-lora-google-docstrings"
NAME = "demo"
GOOGLE = "google-docstrings"  # the adapter's name in README.md and docs/lora.md
# the prompt and the beginnings of the two greedy answers that the adapter's README, docs/lora.md and README.md show
PROMPT = 'def read_config(path, encoding="utf-8"):\n    """'
BASE_DOCSTRING = "Read-only helper function to return a string that is sent as a string.\n"
ADAPTER_DOCSTRING = ("Return the file system interface to the system's release.\n\n    Args:\n        path: The path.\n\n"
                     '    Returns:\n        The result.\n    """\n')
ENGINE = ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "512",
          "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16"]


def test_the_shipped_adapter_is_a_peft_folder():
    config = json.loads((ADAPTER / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"}
    assert (ADAPTER / "adapter_model.safetensors").stat().st_size < 2 << 20


# ------------------------------------------------------------------ in-process: flags and the name registry
def test_lora_modules_parse_both_forms_and_name_what_is_wrong():
    assert parse_lora_modules(["a=/x", '{"name": "b", "path": "/y", "base_model_name": "m"}']) == [
        LoRAModulePath("a", "/x"), LoRAModulePath("b", "/y", "m")]
    for bad, words in (("a", "name=path"), ('{"name": "b"}', "needs path"), ('{"name": "b", "path": "p", "x": 1}',
                       "unknown key(s) x"), ("{bad", "JSON object"), ("=p", "name must be"), ("a=", "path must be")):
        with pytest.raises(ValueError, match="lora_modules") as err:
            parse_lora_modules([bad])
        assert words in str(err.value)
    with pytest.raises(ValueError, match="'a' is given twice"):
        ServerConfig(lora_modules=["a=/x", "a=/y"])


def test_lora_server_flags_need_enable_lora_and_one_engine():
    config = ServerConfig(lora_modules=["a=/x"], enable_lora_runtime_updates=True)
    check_lora_flags(config, {"enable_lora": True}, on_ray=False)
    with pytest.raises(ValueError, match=r"lora_modules needs enable_lora \(--enable-lora\)"):
        check_lora_flags(config, {}, on_ray=False)
    with pytest.raises(ValueError, match=r"enable_lora_runtime_updates needs enable_lora"):
        check_lora_flags(ServerConfig(enable_lora_runtime_updates=True), {}, on_ray=False)
    with pytest.raises(ValueError, match="data-parallel-size"):
        check_lora_flags(config, {"enable_lora": True}, on_ray=True)


def test_serve_refuses_lora_modules_without_enable_lora_in_one_line():
    r = subprocess.run([sys.executable, "-m", "minivllm.entrypoints.cli", "serve", DEMO, "--device", "cpu",
                        "--lora-modules", f"{GOOGLE}={ADAPTER}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == "minivllm: lora_modules needs enable_lora (--enable-lora)"


class AdapterEngine:
    """The adapter calls of an ``EngineClient``: refuses folders named ``bad*``, records the rest."""

    def __init__(self):
        self.loaded: dict[int, str] = {}

    def add_stat_logger(self, stat_logger) -> None:
        pass

    async def add_lora(self, lora_request) -> bool:
        if lora_request.lora_path.startswith("bad"):
            raise ValueError(f"no adapter_config.json in {lora_request.lora_path}")
        self.loaded[lora_request.lora_int_id] = lora_request.lora_name
        return True

    async def remove_lora(self, lora_int_id: int) -> bool:
        return self.loaded.pop(lora_int_id, None) is not None


def test_served_models_resolve_load_and_unload_by_name():
    asyncio.run(_resolve_load_and_unload())


async def _resolve_load_and_unload():
    engine = AdapterEngine()
    models = ServedModels(engine, NAME, [LoRAModulePath("a", "/x"), LoRAModulePath("b", "/y", "other")],
                          lora_enabled=True)
    assert not models.ready
    await models.load_static()
    assert models.ready and engine.loaded == {1: "a", 2: "b"}
    assert models.lora_request_of(None) is None and models.lora_request_of(NAME) is None
    assert models.lora_request_of("a").lora_path == "/x"
    cards = models.cards(created=0, max_model_len=512)
    assert [(c["id"], c["parent"], c["root"]) for c in cards] == [(NAME, None, NAME), ("a", NAME, "/x"),
                                                                  ("b", "other", "/y")]
    assert cards[0]["max_model_len"] == 512
    req = await models.load("c", "/z")
    assert req.lora_int_id == 3 and models.lora_request_of("c") == req
    await models.unload("a")
    assert engine.loaded == {2: "b", 3: "c"}
    for call, status, param in ((models.load("c", "/w"), 400, "lora_name"), (models.load(NAME, "/w"), 400, "lora_name"),
                                (models.load("d", "bad/dir"), 400, "lora_path"), (models.unload("a"), 404, "lora_name")):
        with pytest.raises(APIError) as err:
            await call
        assert (err.value.status, err.value.param) == (status, param)
    with pytest.raises(APIError) as err:
        models.lora_request_of("a")
    assert (err.value.status, err.value.code) == (404, "model_not_found")
    # a failed load takes no name, and an id is never reused
    assert (await models.load("d", "/ok")).lora_int_id == 5


def test_served_models_refuse_what_cannot_be_served():
    with pytest.raises(ValueError, match="'demo' is taken"):
        ServedModels(AdapterEngine(), NAME, [LoRAModulePath(NAME, "/x")])
    models = ServedModels(AdapterEngine(), NAME)  # no --enable-lora
    with pytest.raises(APIError, match="--enable-lora"):
        asyncio.run(models.load("a", "/x"))
    with pytest.raises(ValueError, match=r"^lora_modules: no adapter_config.json in bad$"):
        asyncio.run(ServedModels(AdapterEngine(), NAME, [LoRAModulePath("a", "bad")], True).load_static())


def test_load_routes_are_closed_without_the_flag():
    for config, status in ((ServerConfig(), 404), (ServerConfig(enable_lora_runtime_updates=True), 400)):
        client = TestClient(build_app(AdapterEngine(), NAME, config, lora_enabled=True))  # no lifespan: not started
        r = client.post("/v1/load_lora_adapter", json={"lora_name": "a"})
        assert r.status_code == status and "error" in r.json()


# ------------------------------------------------------------------ over HTTP
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    modules = ["--lora-modules", f"{GOOGLE}={ADAPTER}",
               json.dumps({"name": "google-json", "path": str(ADAPTER), "base_model_name": NAME})]
    with running_server(DEMO, [*ENGINE, *modules, "--enable-lora-runtime-updates"],
                        tmp_path_factory.mktemp("lora")) as srv:
        yield srv


def complete(server, model: str, prompt: str = PROMPT, **kw) -> str:
    r = server.client.completions.create(model=model, prompt=prompt, max_tokens=64, temperature=0, **kw)
    assert r.model == model
    return r.choices[0].text


@pytest.mark.server
def test_models_lists_the_adapters_with_their_parent(server):
    cards = {m.id: m for m in server.client.models.list().data}
    assert set(cards) == {NAME, GOOGLE, "google-json"}
    assert cards[NAME].parent is None and cards[NAME].max_model_len == 512
    assert cards[GOOGLE].parent == NAME and cards[GOOGLE].root == str(ADAPTER)


@pytest.mark.server
def test_the_adapter_writes_google_style_docstrings_where_the_base_model_does_not(server):
    base, adapter = complete(server, NAME), complete(server, GOOGLE)
    assert base.startswith(BASE_DOCSTRING) and "Args:" not in base
    assert adapter.startswith(ADAPTER_DOCSTRING)
    assert complete(server, "google-json") == adapter
    # the request's model, not a leftover of the one before: alternating gives the same answers
    assert complete(server, NAME) == base and complete(server, GOOGLE) == adapter


@pytest.mark.server
def test_a_stream_under_an_adapter_equals_its_answer(server):
    kw = {"prompt": PROMPT, "max_tokens": 64, "temperature": 0}
    whole = complete(server, GOOGLE)
    events = stream_events(server.url, "/v1/completions", {"model": GOOGLE, **kw})
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == whole
    assert {e["model"] for e in events} == {GOOGLE}


@pytest.mark.server
def test_beam_search_runs_under_the_adapter(server):
    # a beam of width 1 keeps the most likely token at every step: the greedy answer, with the adapter
    for model in (NAME, GOOGLE):
        r = post(server, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                              "use_beam_search": True, "n": 1})
        assert r.status_code == 200, r.text
        assert complete(server, model).startswith(r.json()["choices"][0]["text"])


@pytest.mark.server
def test_chat_selects_the_adapter_too(server):
    messages = [{"role": "user", "content": "What does `os.path.join` do?"}]
    logprobs = {}
    for model in (NAME, GOOGLE):
        kw = dict(model=model, messages=messages, max_tokens=24, temperature=0)
        r = server.client.chat.completions.create(logprobs=True, **kw)
        assert r.model == model
        chunks = list(server.client.chat.completions.create(stream=True, **kw))
        assert {c.model for c in chunks} == {model}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
        logprobs[model] = [t.logprob for t in r.choices[0].logprobs.content]
    # the adapter was trained on code, not on chat: its answer may read the same, but its probabilities differ
    assert logprobs[NAME] != logprobs[GOOGLE]
    # vLLM's batch of conversations under the adapter: each answer as the chat route gives it alone (up to the
    # rounding of a batch of two rows)
    r = post(server, "/v1/chat/completions/batch", {"model": GOOGLE, "messages": [messages, messages],
                                                    "max_tokens": 24, "temperature": 0, "logprobs": True})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == GOOGLE
    for choice in r.json()["choices"]:
        batched = [t["logprob"] for t in choice["logprobs"]["content"]]
        assert batched == pytest.approx(logprobs[GOOGLE], abs=1e-4)
        assert batched != pytest.approx(logprobs[NAME], abs=1e-2)


@pytest.mark.server
def test_an_unknown_model_is_a_404_in_openais_shape(server):
    for call in (lambda: complete(server, "nope"),
                 lambda: server.client.chat.completions.create(model="nope", messages=[{"role": "user",
                                                                                        "content": "hi"}])):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["code"] == "model_not_found" and "`nope`" in err.value.body["message"]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


@pytest.mark.server
def test_load_then_unload_an_adapter_at_runtime(server):
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "runtime", "lora_path": str(ADAPTER)})
    assert r.status_code == 200, r.text
    assert "runtime" in {m.id for m in server.client.models.list().data}
    assert complete(server, "runtime") == complete(server, GOOGLE)
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "runtime", "lora_path": str(ADAPTER)})
    assert r.status_code == 400 and "already been loaded" in r.json()["error"]["message"]
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "runtime"}).status_code == 200
    assert "runtime" not in {m.id for m in server.client.models.list().data}
    with pytest.raises(openai.NotFoundError):
        complete(server, "runtime")
    r = post(server, "/v1/unload_lora_adapter", {"lora_name": "runtime"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name"
    # the name is free again
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "runtime", "lora_path": str(ADAPTER)}).status_code == 200
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "runtime"}).status_code == 200


@pytest.mark.server
def test_a_bad_adapter_folder_is_a_400_naming_what_is_wrong(server, tmp_path):
    missing = tmp_path / "missing"
    empty = tmp_path / "empty"
    empty.mkdir()
    big = tmp_path / "rank-32"
    shutil.copytree(ADAPTER, big)
    config = json.loads((big / "adapter_config.json").read_text())
    (big / "adapter_config.json").write_text(json.dumps({**config, "r": 32}))
    odd = tmp_path / "lm-head"
    shutil.copytree(ADAPTER, odd)
    (odd / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["lm_head"]}))
    for folder, words in ((missing, "is not a folder"), (empty, "adapter_config.json is missing"),
                          (big, "r=32 exceeds max_lora_rank=16"), (odd, "unsupported target module(s) lm_head")):
        r = post(server, "/v1/load_lora_adapter", {"lora_name": folder.name, "lora_path": str(folder)})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "lora_path" and words in error["message"], error
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "x"}).status_code == 400  # no lora_path
    names = {m.id for m in server.client.models.list().data}
    assert names == {NAME, GOOGLE, "google-json"}


@pytest.mark.server
def test_a_bad_adapter_of_lora_modules_stops_the_server_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "minivllm.entrypoints.cli", "serve", DEMO, *ENGINE, "--port", "0",
                        "--lora-modules", f"broken={tmp_path / 'nowhere'}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1
    assert f"lora_modules: LoRA adapter 'broken' ({tmp_path / 'nowhere'}): lora_path is not a folder" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.server
def test_the_readme_lora_example_prints_what_the_readme_shows(server):
    text = (ROOT / "README.md").read_text()
    block = next(m for m in re.finditer(r"```python\n(.*?)```", text, re.S) if GOOGLE in m[1])
    shown = re.compile(r"```text\n(.*?)```", re.S).search(text, block.end())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(block[1].replace("http://127.0.0.1:8000", server.url), {"__name__": "readme"})  # noqa: S102
    assert out.getvalue().strip() == shown[1].strip()
    assert ADAPTER_DOCSTRING in shown[1] and BASE_DOCSTRING in shown[1]
