#!/usr/bin/env bash
# Pack Ray 2.60.0 + Ray Serve + ray.data (and fastapi/uvicorn/starlette/pydantic) for the GPU machines, which have
# no network: same approach as ../shared/vllm-reference/pack.sh.
#
# `bash scripts/pack_ray.sh` (from anywhere in the repo; ~3 min on 2 cores, mostly xz -9) downloads the wheels
# pinned in scripts/ray_wheels.txt (cp312, manylinux x86_64, --no-deps: only what the image lacks), unzips them
# into raysite/site (the '# compat' ones into raysite/compat), drops what is never loaded (ray/jars: Java, 33 MB;
# ray/dashboard/client/build: the dashboard web UI; ray/rllib; the tests of jsonschema/referencing), writes
# raysite/env.sh, packs raysite with `tar | xz -9 -T0`, splits it into 48 MB parts part.0, part.1, ... and moves
# part.i into the git-ignored folder .rp<i+1>/ at the repo root (registered in .git/info/exclude).
# With Ray 2.60.0 it makes ONE part, .rp1/part.0 (32.9 MB = 31.4 MiB; 183 MB unpacked: site 163 MB, compat 20 MB),
# so one run carries it all (unpacking it takes ~8 s on 2 cores).
#
# On the GPU machine (carry at most 64 MiB per run; /tmp survives between runs while the machine stays warm):
#   one part (today):     carry [".rp1"], then
#       mkdir -p /tmp/rp && cp .rp1/part.* /tmp/rp/ && cat /tmp/rp/part.* | xz -d -T0 | tar xf - -C /tmp && . /tmp/raysite/env.sh
#   n parts:              run k (k < n) carries .rpk and does   mkdir -p /tmp/rp && cp .rpk/part.* /tmp/rp/
#                         run n carries .rpn and does           mkdir -p /tmp/rp && cp .rpn/part.* /tmp/rp/ && cat /tmp/rp/part.* | xz -d -T0 | tar xf - -C /tmp && . /tmp/raysite/env.sh
#   later runs on the same warm machine (already unpacked):    . /tmp/raysite/env.sh
# `. /tmp/raysite/env.sh` prepends /tmp/raysite/site to PYTHONPATH (plus /tmp/raysite/compat when the image's
# grpcio/protobuf/typing-extensions are older than the pins need; it prints which). Ray's workers inherit it.
# It unpacks into /tmp/raysite, apart from the vLLM pack's /tmp/site; don't put both on one PYTHONPATH (they pin
# different fastapi/pydantic). The `ray` CLI is not on PATH: use `python3 -m ray.scripts.scripts ...` if needed.
# Smoke test there (or here, after the same unpack + env.sh): `bash scripts/pack_ray.sh check` (~40 s, CPU only):
# ray.init(include_dashboard=False, num_cpus=2), serve.start on 127.0.0.1, FastAPI ingress (2 replicas) calling a
# 2-replica deployment through a streaming DeploymentHandle with a custom RequestRouter, HTTP via urllib,
# serve.shutdown, ray.data.from_items(...).map_batches(callable class, concurrency=2), ray.shutdown.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if [ "${1:-}" = check ]; then
  exec "${PYTHON:-python3}" - <<'EOF'
import json, socket, time, urllib.request
t0 = time.time()
import ray, ray.data, ray.serve, fastapi, uvicorn, starlette, pydantic
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import RequestRouter
from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter  # noqa: F401 (needs mmh3)
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
print("versions: ray", ray.__version__, "fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__,
      "starlette", starlette.__version__, "pydantic", pydantic.__version__, "| ray from", ray.__file__)

class SortedRouter(RequestRouter):  # a custom router: always the replica with the smallest id
    async def choose_replicas(self, candidate_replicas, pending_request=None):
        return [sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)[:1]]

@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
class Streamer:
    def __call__(self, n: int):
        for i in range(n):
            yield f"tok{i} "

    def who(self):
        return serve.get_replica_context().replica_id.unique_id

app = FastAPI()

@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class Ingress:
    def __init__(self, streamer: DeploymentHandle):
        self.plain = streamer
        self.streamer = streamer.options(stream=True)

    @app.get("/who")
    async def who(self):
        return await self.plain.who.remote()

    @app.get("/gen")
    async def gen(self, n: int = 3):
        return {"text": "".join([c async for c in self.streamer.remote(n)])}

    @app.get("/stream")
    def stream(self, n: int = 3):
        async def it():
            async for c in self.streamer.remote(n):
                yield c
        return StreamingResponse(it(), media_type="text/plain")

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
ray.init(include_dashboard=False, num_cpus=2)
serve.start(http_options={"host": "127.0.0.1", "port": port})
routed = Streamer.options(request_router_config={"request_router_class": SortedRouter})
serve.run(Ingress.bind(routed.bind()), name="app", route_prefix="/")
r1 = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/gen?n=4", timeout=60).read())
r2 = urllib.request.urlopen(f"http://127.0.0.1:{port}/stream?n=5", timeout=60).read().decode()
print("HTTP /gen ->", r1, "| HTTP /stream ->", repr(r2))
assert r1 == {"text": "tok0 tok1 tok2 tok3 "} and r2 == "tok0 tok1 tok2 tok3 tok4 ", (r1, r2)
who = {json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/who", timeout=60).read()) for _ in range(8)}
print("custom router: 8 requests went to replica(s)", who)
assert len(who) == 1, who
st = serve.status().applications["app"]
print("serve status:", st.status, {k: v.replica_states for k, v in st.deployments.items()})
serve.shutdown()

class AddOne:
    def __init__(self):
        self.k = 1
    def __call__(self, batch):
        batch["x"] = batch["x"] + self.k
        return batch

rows = ray.data.from_items([{"x": i} for i in range(100)]).map_batches(AddOne, concurrency=2, batch_size=10).take_all()
assert sorted(r["x"] for r in rows) == list(range(1, 101)), rows[:5]
print("ray.data map_batches OK:", len(rows), "rows, sum", sum(r["x"] for r in rows))
ray.shutdown()
print(f"RAY PACK CHECK OK in {time.time() - t0:.1f}s")
EOF
fi

root=$(git -C "$here" rev-parse --show-toplevel); w=${RAY_PACK_WORK:-/tmp/ray-pack}
rm -rf "$w" && mkdir -p "$w/whl" "$w/raysite/site" "$w/raysite/compat"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 -d "$w/whl" -r "$here/ray_wheels.txt"
want=$(grep -cE '^[A-Za-z0-9]' "$here/ray_wheels.txt"); got=$(ls "$w"/whl/*.whl | wc -l)
[ "$want" = "$got" ] || { echo "expected $want wheels, got $got" >&2; exit 1; }
compat=" $(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*#[[:space:]]*compat.*/\1/p' "$here/ray_wheels.txt" | tr 'A-Z.-' 'a-z__' | tr '\n' ' ')"
for f in "$w"/whl/*.whl; do
  n=$(basename "$f" | cut -d- -f1 | tr 'A-Z.-' 'a-z__')
  case "$compat" in *" $n "*) d=compat ;; *) d=site ;; esac
  unzip -q -o "$f" -d "$w/raysite/$d"
done
s=$w/raysite/site
rm -rf "$s/ray/jars" "$s/ray/dashboard/client/build" "$s/ray/rllib" \
  "$s/jsonschema/tests" "$s/referencing/tests" "$s/jsonschema_specifications/tests"
cat > "$w/raysite/env.sh" <<'EOF'
# Source me (bash) after unpacking: puts Ray 2.60.0 & co. (/tmp/raysite/site) first on PYTHONPATH, plus
# /tmp/raysite/compat when the interpreter's grpcio/protobuf/typing-extensions are too old for the carried pins.
if [ -n "${BASH_VERSION:-}" ]; then _rs=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); else _rs=${RAYSITE:-/tmp/raysite}; fi
if "${PYTHON:-python3}" - <<'PY'
import sys
from importlib.metadata import version
def v(name):
    try:
        return tuple(int("".join(c for c in x if c.isdigit()) or 0) for x in version(name).split(".")[:3])
    except Exception:
        return (0,)
ok = v("grpcio") >= (1, 85, 1) and (7, 35, 1) <= v("protobuf") < (8,) and v("typing_extensions") >= (4, 14, 1)
print("raysite/env.sh: image grpcio %s protobuf %s typing_extensions %s -> %s" % (
    v("grpcio"), v("protobuf"), v("typing_extensions"), "image's copies suffice" if ok else "using raysite/compat"))
sys.exit(0 if ok else 1)
PY
then export PYTHONPATH=$_rs/site${PYTHONPATH:+:$PYTHONPATH}
else export PYTHONPATH=$_rs/site:$_rs/compat${PYTHONPATH:+:$PYTHONPATH}
fi
unset _rs
EOF
(cd "$w" && tar cf - raysite | xz -9 -T0 -q > raysite.tar.xz && split -b 48M -d -a 1 raysite.tar.xz part.)
du -sh "$w/raysite/site" "$w/raysite/compat" "$w/raysite.tar.xz"
ex="$(git -C "$root" rev-parse --path-format=absolute --git-path info/exclude)"; mkdir -p "$(dirname "$ex")"
rm -rf "$root"/.rp[0-9]*
for f in "$w"/part.*; do
  i=$(( ${f##*.} + 1 )); d="$root/.rp$i"; mkdir -p "$d"; mv "$f" "$d/"
  grep -qx "/.rp$i/" "$ex" 2>/dev/null || echo "/.rp$i/" >> "$ex"
done
ls -la "$root"/.rp*/
