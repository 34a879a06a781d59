# syntax=docker/dockerfile:1
# One image for the webhook, the extender and the CLI:
#   docker build -t model-placement:0.1.0 .
#   docker run --rm model-placement:0.1.0 report
# Stage 1 installs the dependencies, then the project, into a virtualenv made with the venv's own pip; stage 2
# copies only that virtualenv onto a clean base (no pip, no build tools, no sources). Both stages use the same base
# image, so the virtualenv's interpreter path stays valid. Any base with `python3` and its venv module serves:
# tests/image/ builds this file unchanged on a stand-in made from Debian's own packages, with the Python minor of
# the default below (Debian stable's: trixie ships 3.13).
ARG PYTHON_IMAGE=python:3.13-slim-trixie

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python3 -m venv /opt/venv
# The dependencies first, from pyproject.toml alone: a change to the sources reuses this layer.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
      > /tmp/requirements.txt \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt
# Only what the distribution is built from (.dockerignore is an allow-list too).
COPY README.md ./
COPY placement ./placement
COPY webhook ./webhook
COPY extender ./extender
COPY certs ./certs
COPY server ./server
COPY cli ./cli
# Then what the servers never import goes (tests/image/test_image.py holds the venv to that): pip itself; the
# kubernetes client's asyncio twin (kubernetes.aio, half the package) with aiohttp-retry, which only it imports;
# pycparser, which cffi needs only to compile bindings, never to load the ones cryptography ships built.
RUN /opt/venv/bin/pip install --no-deps . \
 && /opt/venv/bin/model-placement --help > /dev/null \
 && /opt/venv/bin/python -m pip uninstall -q -y aiohttp-retry pycparser pip \
 && rm -r /opt/venv/lib/python3*/site-packages/kubernetes/aio

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
