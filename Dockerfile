# fairserve's gateway as a container image (docs/deploy.md).
#   docker build -t fairserve:0.1.0 .
#   docker run -p 8080:8080 -v "$PWD/gateway.toml:/etc/fairserve/gateway.toml:ro" fairserve:0.1.0
# The image holds the package and its core dependencies only (no PyTorch): the gateway, the emulator, the simulator.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --system --uid 10001 --no-create-home fairserve
WORKDIR /opt/fairserve
COPY pyproject.toml README.md NOTICE ./
COPY src ./src
RUN pip install --no-cache-dir . && rm -rf src

USER fairserve
EXPOSE 8080
# /livez is the process alone: a backend outage (when /healthz is 503 and the gateway queues) is no reason to restart
HEALTHCHECK --interval=10s --timeout=3s CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/livez', timeout=2)"]
ENTRYPOINT ["fairserve"]
CMD ["gateway", "--config", "/etc/fairserve/gateway.toml", "--listen", "0.0.0.0:8080"]
