# fleetledger: one image for the coordinator, the node agent and the CLI (helm test pod).
#   docker build -t ghcr.io/fleetledger/fleetledger:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY ledger ./ledger
COPY fleetbus ./fleetbus
COPY node_agent ./node_agent
COPY coordinator ./coordinator
COPY reservations ./reservations
COPY telemetry ./telemetry
COPY fleetledger ./fleetledger
COPY fleetledger_hook ./fleetledger_hook
RUN pip install . && rm -rf /src

# The uid/gid the chart's podSecurityContext runs as; HOME in /tmp, which the chart mounts
# writable under a read-only root file system.
RUN groupadd --system --gid 10001 fleet \
    && useradd --system --uid 10001 --gid fleet --home-dir /tmp --no-create-home fleet
USER 10001:10001
ENV HOME=/tmp
WORKDIR /tmp

ENTRYPOINT ["fleetledger"]
CMD ["--help"]
