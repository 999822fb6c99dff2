# syntax=docker/dockerfile:1
# Image of agentrun-operator: `docker build -t agentrun-operator:dev .`
#
# Two stages: the builder turns the project and its dependencies into wheels and installs them into
# a virtual environment; the final image gets only that environment, on the same Python base (the
# venv's interpreter links to it): no compilers or build tools, no pip in the venv, UID 65532.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore): metadata first, then the package.
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip wheel --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/agentrun \
 && pip --python /opt/agentrun/bin/python install --no-index --find-links /wheels agentrun-operator \
 && /opt/agentrun/bin/agentrun --help >/dev/null

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="agentrun-operator" \
      org.opencontainers.image.description="Kubernetes operator that runs LLM agent loops declared as AgentRun custom resources" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/agentrun-dev/agentrun-operator" \
      org.opencontainers.image.documentation="https://github.com/agentrun-dev/agentrun-operator#readme" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=builder /opt/agentrun /opt/agentrun
# HOME and TMPDIR point at /tmp, the only writable path when the root filesystem is read-only
# (the chart mounts an emptyDir there).
ENV PATH=/opt/agentrun/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    TMPDIR=/tmp
# A numeric, non-root user and group, so Kubernetes can verify runAsNonRoot.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 8081
ENTRYPOINT ["agentrun", "operator"]
