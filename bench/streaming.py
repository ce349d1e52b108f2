"""Streaming at wire speed: N concurrent answers streamed by a model, through the gateway, beside
a bare aiohttp relay doing the same WebSocket → HTTP → WebSocket hop, in the same run.

The model is a lean fake OpenAI-compatible server in its own process: 100 tokens, 20 ms apart
(the model takes 2 s), each an SSE chunk written as it comes. ``pluto serve`` reaches it through
its model path (``openai/…`` with ``api_base``: the direct path), the relay with aiohttp and
``json`` (no model objects, no storage). Each of N WebSocket clients sends one question at once;
reported per N: total time ÷ the model's time, the first token's latency added to the model's,
how long each question takes to reach the model as a request (the fake model notes when each
tagged question came whole, on the same monotonic clock as the clients), the server's CPU per
answer and its RSS afterwards. The 1,000-answer burst runs three rounds, the relay and Pluto
taking turns; each side is reported by its median round (by the slowest request's reach), with
every round's reach ratio in the note. The instant-answer rate (a one-token model: the hop's
own cost) runs three rounds in turns too, reported by the round of the middle ratio.
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.common import ROOT, Figure, Report, percentile, pluto_exe
from bench.servers import Server

TOKENS = 100
GAP = 0.02
MODEL_TIME = (TOKENS - 1) * GAP  # first token at once, the last 99 gaps later
QUESTION = "Tell me a long story."
BURST_ROUNDS = 3  # rounds of the 1,000-answer burst
RATE_ROUNDS = 3  # rounds of the instant-answer rate (the relay and Pluto taking turns)

MODEL_SERVER = r"""
import asyncio, json, re, sys, time

PORT, TOKENS, GAP = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

def sse(obj):
    data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)

def chunk(delta, finish=None):
    return {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
            "model": "fake", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
ROLE = sse(chunk({"role": "assistant", "content": ""}))
TOKEN = sse(chunk({"content": " word"}))
END = (sse(chunk({}, "stop")) + sse({"id": "chatcmpl-bench", "object": "chat.completion.chunk",
       "created": 0, "model": "fake", "choices": [],
       "usage": {"prompt_tokens": 50, "completion_tokens": TOKENS, "total_tokens": 50 + TOKENS}})
       + sse(b"[DONE]") + b"0\r\n\r\n")
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
streams = {}  # transport -> tokens still to send
arrivals = {}  # a question's tag -> when its request had come whole (CLOCK_MONOTONIC)
TAG = re.compile(rb"long story\. #(\d+)")

class Conn(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""

    def connection_lost(self, exc):
        streams.pop(self.transport, None)

    def data_received(self, data):
        self.buf += data
        while (i := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:i].decode("latin-1").lower()
            length = 0
            for line in head.split("\r\n")[1:]:
                if line.startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            if len(self.buf) < i + 4 + length:
                return
            body, self.buf = self.buf[i + 4:i + 4 + length], self.buf[i + 4 + length:]
            if head.startswith("get /arrivals"):
                data = json.dumps(arrivals).encode()
                arrivals.clear()
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
                continue
            if head.startswith("get"):
                self.transport.write(OK)
                continue
            tags = TAG.findall(body)
            if tags:
                arrivals[tags[-1].decode()] = time.monotonic()
            self.transport.write(HEAD + ROLE + TOKEN)
            n = 1 if json.loads(body)["messages"][-1]["content"] == "warm up" else TOKENS
            if n == 1:
                self.transport.write(END)
            else:
                streams[self.transport] = n - 1

async def tick():
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        next_at += GAP
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        for transport, left in list(streams.items()):
            if transport.is_closing():
                streams.pop(transport, None)
                continue
            if left == 1:
                transport.write(TOKEN + END)
                del streams[transport]
            else:
                transport.write(TOKEN)
                streams[transport] = left - 1

async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Conn, "127.0.0.1", PORT, backlog=4096)
    asyncio.create_task(tick())
    await server.serve_forever()

asyncio.run(main())
"""

RELAY_SERVER = r"""
import json, sys
import aiohttp
from aiohttp import web, WSMsgType

MODEL = sys.argv[2]

async def ws(request):
    sock = web.WebSocketResponse(max_msg_size=1 << 20)
    await sock.prepare(request)
    session = request.app["session"]
    async for msg in sock:
        if msg.type != WSMsgType.TEXT:
            continue
        frame = json.loads(msg.data)
        if frame.get("type") == "hello":
            await sock.send_str(json.dumps({"type": "ready", "token": "t"}))
        elif frame.get("type") == "message":
            body = {"model": "fake", "stream": True,
                    "messages": [{"role": "user", "content": frame.get("text")}]}
            text = []
            async with session.post(MODEL + "/chat/completions", json=body) as r:
                async for line in r.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    chunk = json.loads(line[6:])
                    choices = chunk.get("choices") or [{}]
                    piece = (choices[0].get("delta") or {}).get("content")
                    if piece:
                        text.append(piece)
                        await sock.send_str(json.dumps({"type": "message.delta", "text": piece}))
            await sock.send_str(json.dumps({"type": "message.final", "text": "".join(text)}))
    return sock

async def ok(request):
    return web.json_response({"status": "ready"})

async def session(app):
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app["session"].close()

app = web.Application()
app.cleanup_ctx.append(session)
app.router.add_get("/ws", ws)
app.router.add_get("/readyz", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""

PLUTO_YAML = """\
data_dir: {data}
http: {{host: 127.0.0.1, port: {port}}}
models:
  default: {{model: openai/fake, api_base: "{model}", timeout: 60, retries: 0}}
providers:
  web:
    enabled: true
    rate_messages: 10000          # the benchmark floods on purpose
    rate_seconds: 1
    max_message_chars: 4000
log_level: WARNING
"""


class Process(Server):
    """The fake model, the relay, or the gateway pointed at the fake model."""

    def __init__(self, kind: str, model_url: str = ""):
        super().__init__(kind)
        self.model_url = model_url

    def _command(self) -> list[str]:
        tmp = Path(self._tmp.name)
        if self.kind in ("model", "relay"):
            script = tmp / f"{self.kind}.py"
            script.write_text(MODEL_SERVER if self.kind == "model" else RELAY_SERVER)
            args = [str(TOKENS), str(GAP)] if self.kind == "model" else [self.model_url]
            return [sys.executable, str(script), str(self.port), *args]
        config = tmp / "config"
        shutil.copytree(ROOT / "config" / "agents", config / "agents")
        shutil.copy(ROOT / "config" / "routes.yaml", config / "routes.yaml")
        (config / "pluto.yaml").write_text(PLUTO_YAML.format(data=tmp / "data", port=self.port,
                                                             model=self.model_url))
        return [*pluto_exe(), "serve", "--config", str(config)]


@dataclass
class Round:
    first: list[float]  # seconds from sending to the first token, per answer
    reached: list[float]  # seconds from sending to the model having the whole request
    total: list[float]  # seconds from sending to the final answer, per answer
    wall: float  # from the first question sent to the last answer received
    errors: int
    cpu: float  # the server's CPU seconds for the round
    rss: float  # the server's RSS afterwards, MB


async def _client(session: aiohttp.ClientSession, url: str, start: asyncio.Event,
                  ready: list[int], warm: bool, tag: int) -> tuple[float, float, float]:
    async with session.ws_connect(url, max_msg_size=1 << 22, heartbeat=None,
                                  origin=url.replace("ws://", "http://").rsplit("/", 1)[0]) as ws:
        await ws.send_str(json.dumps({"type": "hello", "token": None}))
        await _until(ws, "ready")
        if warm:
            await ws.send_str(json.dumps({"type": "message", "text": "warm up"}))
            await _until(ws, "message.final")
        ready[0] += 1
        await start.wait()
        t0, sent = time.perf_counter(), time.monotonic()
        await ws.send_str(json.dumps({"type": "message", "text": f"{QUESTION} #{tag}"}))
        first = None
        while True:
            frame = await _frame(ws)
            kind = frame.get("type")
            if kind == "message.delta" and first is None:
                first = time.perf_counter() - t0
            elif kind == "message.final":
                total = time.perf_counter() - t0
                return (first if first is not None else total), total, sent
            elif kind == "error":
                raise RuntimeError(f"server error: {frame}")


async def _frame(ws: aiohttp.ClientWebSocketResponse) -> dict:
    msg = await ws.receive()
    if msg.type != aiohttp.WSMsgType.TEXT:
        raise ConnectionError(f"socket closed: {msg.type!r}")
    return json.loads(msg.data)


async def _until(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict:
    while True:
        frame = await _frame(ws)
        if frame.get("type") == kind:
            return frame
        if frame.get("type") == "error":
            raise RuntimeError(f"server error: {frame}")


async def _arrivals(session: aiohttp.ClientSession, model_url: str) -> dict[str, float]:
    """When each tagged question reached the model (and the model forgets them)."""
    async with session.get(model_url.removesuffix("/v1") + "/arrivals") as r:
        return {k: float(v) for k, v in (await r.json(content_type=None)).items()}


async def _round(server: Process, n: int) -> Round:
    start = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        ready = [0]
        gate = asyncio.Semaphore(100)  # connect in waves: no SYN flood on a backlog

        async def client(i: int) -> tuple[float, float, float]:
            async with gate:
                pass
            return await _client(session, server.ws_url, start, ready, warm=i < 20, tag=i)

        tasks = [asyncio.create_task(client(i)) for i in range(n)]
        while ready[0] < n and not any(t.done() for t in tasks):
            await asyncio.sleep(0.05)  # every socket open (and 20 warmed up) first
        await asyncio.sleep(0.5)
        await _arrivals(session, server.model_url)  # (the warm-ups are not counted)
        cpu0 = server.cpu_seconds()
        t0 = time.perf_counter()
        start.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - t0
        cpu = server.cpu_seconds() - cpu0
        arrived = await _arrivals(session, server.model_url)
    ok = [r for r in results if isinstance(r, tuple)]
    reached = [arrived[str(i)] - r[2] for i, r in enumerate(results)
               if isinstance(r, tuple) and str(i) in arrived]
    for r in results:
        if not isinstance(r, tuple):
            print(f"    a client failed: {r!r}", flush=True)
            break
    return Round([r[0] for r in ok], reached, [r[1] for r in ok], wall,
                 len(results) - len(ok), cpu, server.rss_mb())


def measure(kind: str, model_url: str, n: int) -> Round:
    with Process(kind, model_url) as server:
        return asyncio.run(_round(server, n))


async def _rate(server: Process, sessions: int, per: int) -> tuple[float, float]:
    """Messages per second: ``sessions`` clients each asking ``per`` one-token questions in
    turn (the model answers at once: what is measured is the hop itself); and the server's CPU
    seconds per message."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def client() -> None:
            async with session.ws_connect(server.ws_url, heartbeat=None,
                                          origin=server.url) as ws:
                await ws.send_str(json.dumps({"type": "hello", "token": None}))
                await _until(ws, "ready")
                await start.wait()
                for _ in range(per):
                    await ws.send_str(json.dumps({"type": "message", "text": "warm up"}))
                    await _until(ws, "message.final")

        start = asyncio.Event()
        tasks = [asyncio.create_task(client()) for _ in range(sessions)]
        await asyncio.sleep(1.0)
        cpu0 = server.cpu_seconds()
        t0 = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        elapsed, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
        return sessions * per / elapsed, cpu / (sessions * per)


def rate(kind: str, model_url: str, sessions: int, per: int) -> tuple[float, float]:
    with Process(kind, model_url) as server:
        return asyncio.run(_rate(server, sessions, per))


def run(report: Report, quick: bool = False) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,000 sockets here too
    levels = (50, 200) if quick else (50, 200, 1000)
    with Process("model") as model:
        model_url = f"{model.url}/v1"
        for n in levels:
            # the 1,000-answer burst: three rounds, the relay and Pluto taking turns (one
            # round's ratio moves by a third from noise alone); each side's figures are those
            # of its median round by the reach's max, and every round's ratio is printed
            pairs = [(measure("relay", model_url, n), measure("pluto", model_url, n))
                     for _ in range(BURST_ROUNDS if n >= 1000 else 1)]
            relay, pluto = (_median([pair[i] for pair in pairs]) for i in (0, 1))
            _report(report, n, pluto, relay,
                    [max(p.reached or [0]) / max(r.reached or [1e-9]) for r, p in pairs])
        per = 5 if quick else 20
        # the relay's own rate moved by half between rounds minutes apart on a shared
        # machine: rounds taking turns, the round of the middle ratio reported, every
        # round's ratio printed
        turns = [(rate("pluto", model_url, 100, per), rate("relay", model_url, 100, per))
                 for _ in range(1 if quick else RATE_ROUNDS)]
        turns.sort(key=lambda t: t[0][0] / t[1][0])
        (pluto_rate, pluto_cpu), (relay_rate, relay_cpu) = turns[len(turns) // 2]
        rounds = ", ".join(f"{p[0] / r[0]:.2f}" for p, r in turns)
        report.add(Figure("streaming", "instant model: messages/s, 100 sessions", pluto_rate,
                          "msg/s", "bare relay", relay_rate, target="ratio >= 0.5",
                          met=pluto_rate >= 0.5 * relay_rate,
                          note=f"through the model path over HTTP (a one-token answer); "
                               f"{'at least' if pluto_rate >= 1000 else 'under'} 1,000 msg/s; "
                               f"server CPU {pluto_cpu * 1000:.2f} ms per answer (relay "
                               f"{relay_cpu * 1000:.2f} ms)"
                               + (f"; the middle of {len(turns)} rounds, each round's ratio "
                                  f"{rounds}" if len(turns) > 1 else "")))


def _median(rounds: list[Round]) -> Round:
    """The round whose slowest request reached the model in the middle of the rounds'."""
    return sorted(rounds, key=lambda r: max(r.reached or [0]))[len(rounds) // 2]


def _report(report: Report, n: int, pluto: Round, relay: Round, ratios: list[float]) -> None:
    ratio, relay_ratio = pluto.wall / MODEL_TIME, relay.wall / MODEL_TIME
    target = 1.3 if n <= 200 else 2.5
    report.add(Figure("streaming", f"total ÷ model time, {n} answers", ratio, "x",
                      "bare relay", relay_ratio, target=f"<= {target}" if n >= 200 else None,
                      met=ratio <= target if n >= 200 else None,
                      note=f"errors {pluto.errors} (relay {relay.errors}); p50 answer "
                           f"{statistics.median(pluto.total or [0]):.2f} s"))
    first, relay_first = percentile(pluto.first or [0], 50), percentile(relay.first or [0], 50)
    report.add(Figure("streaming", f"first token p50, {n} answers", first, "s", "bare relay",
                      relay_first, target="<= 50 ms added" if n == 200 else None,
                      met=first - relay_first <= 0.05 if n == 200 else None,  # (added)
                      note=f"{(first - relay_first) * 1000:+.0f} ms over the relay's; p99 "
                           f"{percentile(pluto.first or [0], 99) * 1000:.0f} ms (relay "
                           f"{percentile(relay.first or [0], 99) * 1000:.0f} ms); the model's "
                           "own first token comes at once"))
    reach, relay_reach = max(pluto.reached or [0]), max(relay.reached or [0])
    report.add(Figure("streaming", f"request reaches model, max, {n} answers", reach, "s",
                      "bare relay", relay_reach, target="ratio <= 2" if n >= 1000 else None,
                      met=reach <= 2 * relay_reach if n >= 1000 else None,
                      note=f"from the question sent to the model having its request, each "
                           f"answer: p50 {percentile(pluto.reached or [0], 50) * 1000:.0f} ms, "
                           f"p99 {percentile(pluto.reached or [0], 99) * 1000:.0f} ms (relay "
                           f"{percentile(relay.reached or [0], 50) * 1000:.0f} / "
                           f"{percentile(relay.reached or [0], 99) * 1000:.0f} ms); "
                           f"{sum(r > 2 * relay_reach for r in pluto.reached)} over twice the "
                           f"relay's max; {len(pluto.reached)} of {n} seen (relay "
                           f"{len(relay.reached)})"
                           + (f"; the median of {len(ratios)} rounds, each round's ratio "
                              + ", ".join(f"{r:.2f}" for r in ratios) if len(ratios) > 1
                              else "")))
    per, relay_per = pluto.cpu / n, relay.cpu / n
    report.add(Figure("streaming", f"CPU per answer, {n} answers", per, "s", "bare relay",
                      relay_per, target="ratio <= 3", met=per <= 3 * relay_per))
    report.add(Figure("streaming", f"RSS after, {n} answers", pluto.rss, "MB", "bare relay",
                      relay.rss, target="<= 300 MB" if n >= 1000 else None,
                      met=pluto.rss <= 300 if n >= 1000 else None))
