# Pluto gateway: `docker build -t pluto . && docker run -p 8000:8000 -v pluto-data:/data pluto`
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PLUTO_DATA_DIR=/data PLUTO_HTTP_HOST=0.0.0.0 PLUTO_HTTP_PORT=8000 \
    LITELLM_LOCAL_MODEL_COST_MAP=True

WORKDIR /app
# bubblewrap: the sandbox of MCP stdio servers and of run_python (docs/security.md,
# docs/python.md); Docker's default seccomp profile still refuses it the user namespace it
# needs, so those stay off (pluto doctor says why) until the container is allowed one.
# ffmpeg and espeak-ng: voice notes in (decoded) and out (spoken, encoded as OGG/Opus)
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap ffmpeg espeak-ng \
    && rm -rf /var/lib/apt/lists/*
# Exact versions from the hashed locks (`bash scripts/lock.sh` regenerates them): the runtime
# dependencies and the build backend, in a layer that a code change does not rebuild.
COPY requirements/runtime.txt requirements/build.txt ./requirements/
RUN pip install --no-cache-dir --require-hashes -r requirements/runtime.txt -r requirements/build.txt
# Pluto itself (the layers install under the one import name `pluto`), resolving nothing more.
COPY pyproject.toml README.md ./
COPY pluto ./pluto
COPY gateway ./gateway
COPY providers ./providers
COPY agents ./agents
COPY runtime ./runtime
COPY storage ./storage
COPY config ./config
RUN pip install --no-cache-dir --no-deps --no-build-isolation . \
    && useradd --create-home --uid 10001 pluto && mkdir -p /data && chown pluto:pluto /data

USER pluto
VOLUME ["/data"]
EXPOSE 8000
CMD ["pluto", "serve", "--config", "/app/config"]
