# syntax=docker/dockerfile:1
# One image for the webhook, the extender and the CLI:
#   docker build -t model-placement:0.1.0 .
#   docker run --rm model-placement:0.1.0 report
# Stage 1 builds the wheel and installs it with its dependencies into a virtualenv; stage 2 copies only that
# virtualenv onto a clean python:3.11-slim (no pip cache, no build tools, no sources). Both stages use the same base
# image, so the virtualenv's interpreter path stays valid.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
# Only what the distribution is built from (.dockerignore is an allow-list too).
COPY pyproject.toml README.md ./
COPY placement ./placement
COPY webhook ./webhook
COPY extender ./extender
COPY certs ./certs
COPY server ./server
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
 && /opt/venv/bin/pip install /dist/*.whl \
 && /opt/venv/bin/model-placement --help > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="model-placement" \
      org.opencontainers.image.description="NUMA-aware CPU placement for LLM model pods: admission webhook and kube-scheduler extender" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /opt/venv /opt/venv
# Non-root, numeric (so runAsNonRoot can verify it without an /etc/passwd lookup); matches the manifests' runAsUser.
USER 65532:65532
# webhook (HTTPS), extender (HTTPS)
EXPOSE 8443 8444
ENTRYPOINT ["model-placement"]
CMD ["--help"]
