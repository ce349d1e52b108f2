"""``pluto.yaml``: the gateway's own settings, parsed once into typed models.

Secrets are named by environment variable (``*_env`` fields) and read only where used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pluto.errors import ConfigError
from pluto.yamldoc import YamlDoc

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(Strict):
    """A named model: any litellm model string, or ``offline``."""

    model: str = "offline"
    api_base: str | None = None
    api_key_env: str | None = Field(default=None, pattern=ENV_NAME)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_output_tokens: int | None = Field(default=None, gt=0)
    timeout: float = Field(default=60.0, gt=0)
    retries: int = Field(default=2, ge=0, le=10)
    # which path calls it: "auto" (OpenAI-compatible prefixes such as openai/ stream directly,
    # the rest through litellm), "openai" (direct, any OpenAI-compatible api_base) or "litellm"
    client: Literal["auto", "openai", "litellm"] = "auto"
    # pictures users send (docs/images.md): false — the model gets a one-line description of
    # each instead (and the user is told once per conversation)
    vision: bool = True
    image_max_side: int = Field(default=1568, ge=64, le=8192)  # pixels, the longest side
    image_max_mb: float = Field(default=4.0, gt=0, le=20)  # one image, re-encoded
    images_per_message: int = Field(default=4, ge=1, le=20)
    images_in_context: int = Field(default=8, ge=0, le=100)  # the newest sent; older described

    @field_validator("api_base", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return v or None

    @field_validator("model")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name a model, e.g. 'offline' or 'openai/gpt-4o-mini'")
        return v.strip()

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None if self.api_key_env else None


_HOST_ENTRY = re.compile(r"^(\*|\.?[a-z0-9_]([a-z0-9_.-]{0,251}[a-z0-9_])?|\[[0-9a-f:.]+\])"
                         r"(:[0-9]{1,5})?$")


class HttpConfig(Strict):
    """The HTTP server (docs/security.md, "HTTP"): where it listens, the host names it answers
    to, and how long and how many connections it keeps."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    # names the Host header may carry (name, name:port, .domain for it and its subdomains, or
    # "*" for any); unset: localhost, 127.0.0.1 and [::1], plus http.host when it is a name.
    # A Host that is an IP address is always accepted (DNS rebinding cannot produce one).
    allowed_hosts: list[str] | None = None
    # a new connection's first request must have arrived whole (its headers) within this;
    # a kept-alive connection with no request for idle_timeout is closed; a request body
    # that receives no byte for body_timeout is answered 408 and the connection closed
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    idle_timeout_seconds: float = Field(default=60.0, gt=0, le=86_400)
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    # connections at once: in total (unset: from the open-files limit, half of it less 50)
    # and per client address (0: no such limit); at either limit the connection idle the
    # longest is closed to make room, or, when every one is busy, the new one gets a 503
    max_connections: int | None = Field(default=None, ge=1, le=10_000_000)
    max_connections_per_client: int = Field(default=500, ge=0, le=10_000_000)
    # addresses many clients may share — a reverse proxy or load balancer: loopback and the
    # private networks by default — counted in the total only, never limited per address
    per_client_exempt: list[str] = Field(default_factory=lambda: [
        "127.0.0.0/8", "::1", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"])

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        out = []
        for entry in v:
            name = str(entry).strip().lower().rstrip(".")
            if not _HOST_ENTRY.fullmatch(name):
                raise ValueError(f"'{entry}' is not a host name like chat.example.com, "
                                 "chat.example.com:8443, .example.com or *")
            out.append(name)
        if not out:
            raise ValueError("lists no host name; leave it out for the default (the loopback "
                             "names) or list the names this gateway is reached by")
        return out

    @field_validator("per_client_exempt")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        import ipaddress

        for entry in v:
            try:
                ipaddress.ip_network(str(entry).strip(), strict=False)
            except ValueError:
                raise ValueError(f"'{entry}' is not an IP address or network like "
                                 "10.0.0.0/8") from None
        return [str(e).strip() for e in v]


class ProviderConfig(BaseModel):
    """Settings of one chat platform; each provider validates its own extra fields."""

    model_config = ConfigDict(extra="allow", frozen=True)
    enabled: bool = False


class GatewayLimits(Strict):
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    max_queued_per_session: int = Field(default=50, ge=1)
    # platforms that edit: at most one edit of a streamed reply per chat this often
    stream_edit_interval_seconds: float = Field(default=1.0, ge=0, le=60)
    reload_interval_seconds: float = Field(default=0.25, ge=0, le=60)  # 0: no live reload
    # overload (gateway/pipeline/overload.py): runs at once in this process, runs waiting for
    # one of those slots, and how late the event loop may wake (0: not watched) before a new
    # message is answered with a one-line "busy" notice instead of being taken
    max_running: int = Field(default=1000, ge=1)
    max_waiting: int = Field(default=1000, ge=0)
    busy_lag_seconds: float = Field(default=2.0, ge=0)
    # a provider whose every send failed for this long is wedged: /readyz says so and its
    # client is rebuilt, again after each such window while it lasts (0: never)
    send_wedged_seconds: float = Field(default=60.0, ge=0)


class AccessConfig(Strict):
    """Who gets an answer besides what routes.yaml admits (see gateway/access.py)."""

    refusal: str | None = Field(default=None, max_length=500)  # to refused direct messages
    pairing_ttl_seconds: float = Field(default=3600.0, gt=0, le=7 * 86400)

    @field_validator("refusal", mode="before")
    @classmethod
    def _one_line(cls, v: Any) -> Any:
        if isinstance(v, str) and "\n" in v.strip():
            raise ValueError("the refusal is one line of text")
        return v.strip() or None if isinstance(v, str) else v


class AgentsPolicy(Strict):
    """What agent files (and agents put through the admin API) may ask for."""

    # the only environment variables an agent may name in api_key_env (none by default): an
    # agent's api_base + api_key_env would otherwise send any secret to any host
    api_key_envs: list[str] = Field(default_factory=list)
    # the agents' MCP servers: how many run at once, and after how long without a call one stops
    mcp_max_servers: int = Field(default=32, ge=1, le=1000)
    mcp_idle_seconds: float = Field(default=600.0, gt=0)

    @field_validator("api_key_envs")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not re.fullmatch(ENV_NAME, n)]
        if bad:
            raise ValueError(f"not an environment variable name: {bad[0]!r}")
        return v


class AdminConfig(Strict):
    api_key_env: str | None = Field(default=None, pattern=ENV_NAME)  # unset: no admin key


class OidcConfig(Strict):
    """Sign-in to the console through an OpenID Connect provider (docs/console.md)."""

    issuer: str = Field(pattern=r"^https?://")  # its discovery: <issuer>/.well-known/...
    client_id: str = Field(min_length=1)
    client_secret_env: str | None = Field(default=None, pattern=ENV_NAME)
    scopes: str = "openid email profile"
    username_claim: str = "email"
    # who gets which role (by the username claim); others get default_role, or no entry
    roles: dict[str, Literal["viewer", "operator", "admin", "owner"]] = Field(
        default_factory=dict)
    default_role: Literal["viewer", "operator", "admin"] | None = None
    label: str = "Sign in with SSO"


class ConsoleConfig(Strict):
    """The admin console at /console (docs/console.md)."""

    enabled: bool = True
    session_hours: float = Field(default=8.0, gt=0, le=24 * 30)
    oidc: OidcConfig | None = None


class DatasetFile(Strict):
    """A file (CSV, TSV, Parquet, JSON, NDJSON) or a folder of them, loaded as a dataset."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    path: Path  # relative to the config directory


class DataConfig(Strict):
    """The data tools: datasets registered here (loaded when missing or changed), limits."""

    datasets: list[DatasetFile] = Field(default_factory=list)
    demo: bool = True  # a `sales` demo dataset, made on first use
    max_upload_mb: float = Field(default=100, gt=0, le=100_000)  # files sent in a chat
    query_timeout_seconds: float = Field(default=10, gt=0, le=3600)
    query_memory_mb: int = Field(default=256, ge=16, le=1_000_000)
    # loading a file (in a child process): beyond these it is refused or stopped
    ingest_max_rows: int = Field(default=100_000_000, ge=1)
    ingest_max_columns: int = Field(default=2_000, ge=1, le=100_000)
    ingest_memory_mb: int = Field(default=1024, ge=64, le=1_000_000)
    ingest_timeout_seconds: float = Field(default=600, gt=0, le=86_400)
    # files sent in chats (uploads/) and results and charts (artifacts/): kept this long, and
    # at most this much together (the oldest go first); datasets stay until removed
    keep_files_days: float = Field(default=30, gt=0)
    keep_files_max_mb: float = Field(default=2048, gt=0)

    @field_validator("datasets")
    @classmethod
    def _unique(cls, v: list[DatasetFile]) -> list[DatasetFile]:
        names = [d.name for d in v]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"dataset names must be unique; repeated: {', '.join(dupes)}")
        return v


class TranscriptionConfig(Strict):
    """An OpenAI-compatible ``/audio/transcriptions`` endpoint (Whisper API, Groq, a local
    whisper server); without one, voice notes are transcribed offline (pocketsphinx)."""

    model: str = Field(min_length=1)  # e.g. whisper-1
    api_base: str | None = None  # e.g. https://api.groq.com/openai/v1 (default: OpenAI's)
    api_key_env: str | None = Field(default=None, pattern=ENV_NAME)

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None if self.api_key_env else None


class SpeechConfig(TranscriptionConfig):
    """An OpenAI-compatible ``/audio/speech`` endpoint; without one, espeak-ng speaks."""

    voice: str = Field(default="alloy", min_length=1)  # e.g. tts-1's alloy


class VoiceConfig(Strict):
    """Voice notes users send (docs/voice.md): transcribed and answered as text."""

    # the transcription endpoint: the name of an entry under ``models:`` (its model, api_base
    # and api_key_env), or those three here; unset: offline
    transcription: str | TranscriptionConfig | None = None
    max_seconds: int = Field(default=300, ge=1, le=3600)  # longer notes are refused
    max_mb: float = Field(default=20, gt=0, le=200)  # one note
    timeout_seconds: float = Field(default=120, gt=0, le=3600)  # decoding; transcribing
    # agents whose answers are also spoken (espeak-ng), sent as a voice note after the text
    speak_agents: list[str] = Field(default_factory=list)
    speech: SpeechConfig | None = None


class StorageConfig(Strict):
    """Where sessions, runs and the outbox are kept: SQLite in the data dir by default;
    PostgreSQL when the variable named by ``url_env`` holds a ``postgresql://`` URL (needed
    to run several instances on one database)."""

    url_env: str = Field(default="DATABASE_URL", pattern=ENV_NAME)
    lease_seconds: float = Field(default=10.0, ge=2, le=300)  # several instances: takeover time
    # several instances: charts, results, files sent and datasets kept in the database too
    files_max_mb: float = Field(default=256.0, gt=0, le=4096)  # one file
    files_max_total_mb: float = Field(default=4096.0, gt=0)  # every file together

    def url(self) -> str | None:
        return os.environ.get(self.url_env, "").strip() or None


class ModelPrice(Strict):
    """What a model costs, in USD per million tokens (for models litellm's price list lacks)."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached: float | None = Field(default=None, ge=0)  # cached input; unset: as ``input``


class Budget(Strict):
    """A limit of tokens and/or money per agent, route, user or chat, per day or month (UTC)."""

    per: Literal["agent", "route", "user", "chat"]
    period: Literal["day", "month"] = "day"
    tokens: int | None = Field(default=None, gt=0)
    cost: float | None = Field(default=None, gt=0)  # USD
    only: str | None = None  # one agent/route (its name), or user/chat as provider:id; unset:
    # each agent, route, user or chat has a budget of its own

    @model_validator(mode="after")
    def _some_limit(self) -> Budget:
        if self.tokens is None and self.cost is None:
            raise ValueError("a budget needs tokens, cost or both")
        if self.only is not None and self.per in ("user", "chat") and ":" not in self.only:
            raise ValueError(f"only: a {self.per} is named provider:id, e.g. web:42")
        return self


class UsageConfig(Strict):
    """The usage ledger's prices and the budgets read from it."""

    prices: dict[str, ModelPrice] = Field(default_factory=dict)  # by model string or name
    budgets: list[Budget] = Field(default_factory=list)


class TracingConfig(Strict):
    """OpenTelemetry traces: off unless ``otlp_endpoint`` names an OTLP/HTTP collector."""

    otlp_endpoint: str | None = Field(default=None, pattern=r"^https?://")  # …/v1/traces
    service_name: str = Field(default="pluto", min_length=1, max_length=100)
    headers_env: str | None = Field(default=None, pattern=ENV_NAME)  # "k=v,k2=v2" (a secret)

    @field_validator("otlp_endpoint", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return v or None

    def headers(self) -> dict[str, str]:
        raw = os.environ.get(self.headers_env, "") if self.headers_env else ""
        pairs = (p.partition("=") for p in raw.split(",") if "=" in p)
        return {k.strip(): v.strip() for k, _, v in pairs}


class PlutoConfig(Strict):
    data_dir: Path = Field(default=Path(".pluto"), validate_default=True)  # made absolute
    http: HttpConfig = HttpConfig()
    models: dict[str, ModelConfig] = Field(default_factory=lambda: {"default": ModelConfig()})
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    gateway: GatewayLimits = GatewayLimits()
    access: AccessConfig = AccessConfig()
    admin: AdminConfig = AdminConfig()
    console: ConsoleConfig = ConsoleConfig()
    agents: AgentsPolicy = AgentsPolicy()
    data: DataConfig = DataConfig()
    voice: VoiceConfig = VoiceConfig()
    storage: StorageConfig = StorageConfig()
    usage: UsageConfig = UsageConfig()
    tracing: TracingConfig = TracingConfig()
    log_format: Literal["text", "json"] = "text"  # json: one object a line, for log collectors
    log_level: str = Field(default="INFO", pattern=r"^(DEBUG|INFO|WARNING|ERROR)$")

    @field_validator("data_dir", mode="before")
    @classmethod
    def _default_dir(cls, v: Any) -> Any:
        return v or ".pluto"

    @model_validator(mode="after")
    def _transcription_model_is_known(self) -> PlutoConfig:
        named = self.voice.transcription
        if isinstance(named, str) and named not in self.models:
            raise ValueError(f"voice.transcription: no model named '{named}' under models "
                             f"(known: {', '.join(sorted(self.models))})")
        return self

    def voice_resolved(self) -> VoiceConfig:
        """``voice:`` with its transcription endpoint spelled out (a name under ``models:``
        replaced by that model's model, api_base and api_key_env)."""
        named = self.voice.transcription
        if not isinstance(named, str):
            return self.voice
        m = self.models[named]
        endpoint = TranscriptionConfig(model=m.model, api_base=m.api_base,
                                       api_key_env=m.api_key_env)
        return self.voice.model_copy(update={"transcription": endpoint})

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        """Decided once, here: relative to the working directory, made absolute, so no later
        step can join it to itself (``.pluto/.pluto/artifacts/…``)."""
        return absolute(v)

    def secret_names(self) -> list[str]:
        """Environment variables that hold secrets (for log redaction)."""
        names = [m.api_key_env for m in self.models.values() if m.api_key_env]
        names += [self.admin.api_key_env] if self.admin.api_key_env else []
        names += self.agents.api_key_envs
        names += [t.api_key_env for t in (self.voice_resolved().transcription, self.voice.speech)
                  if isinstance(t, TranscriptionConfig) and t.api_key_env]
        names += [self.storage.url_env]  # the database URL may carry a password
        oidc = self.console.oidc
        names += [oidc.client_secret_env] if oidc is not None and oidc.client_secret_env else []
        names += [self.tracing.headers_env] if self.tracing.headers_env else []
        for p in self.providers.values():
            names += [v for k, v in (p.model_extra or {}).items() if k.endswith("_env") and v]
        return names


def absolute(path: Path | str) -> Path:
    """A path as the process sees it now: ``~`` expanded, made absolute, symlinks resolved."""
    return Path(path).expanduser().resolve()


def data_dir_for(config: PlutoConfig, override: Path | str | None = None) -> Path:
    """The one data dir of a command: ``--data-dir`` or ``$PLUTO_DATA_DIR`` when given, else
    ``data_dir`` in pluto.yaml; always absolute."""
    chosen = override or os.environ.get("PLUTO_DATA_DIR") or config.data_dir
    return absolute(chosen)


def load_pluto_config(config_dir: Path) -> PlutoConfig:
    path = config_dir / "pluto.yaml"
    if not config_dir.is_dir():
        raise ConfigError([(str(config_dir), None, "", "config directory not found; make one with "
                           "'pluto init' (or pass --config DIR)")])
    if not path.exists():
        return PlutoConfig()
    doc = YamlDoc(path)
    if doc.data is not None and not isinstance(doc.data, dict):
        raise ConfigError([(doc.name, 1, "", "expected a mapping of settings at the top level")])
    config = doc.validate(PlutoConfig)
    _no_secret_expanded(doc, doc.data, (), frozenset(config.secret_names()))
    return config


_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def _no_secret_expanded(doc: YamlDoc, value: Any, loc: tuple[Any, ...],
                        secrets: frozenset[str]) -> None:
    """``${NAME}`` expands only what is not a secret: a variable some ``*_env`` field names is
    read where it is used, never copied into a setting (where a URL, a log line or a status
    page could carry it)."""
    if isinstance(value, str):
        for name in _REF.findall(value):
            if name in secrets:
                raise doc.problem(loc, f"${{{name}}} expands a secret (it is named by an *_env "
                                  "field); name it in an *_env field instead")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_secret_expanded(doc, item, (*loc, key), secrets)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_secret_expanded(doc, item, (*loc, i), secrets)
