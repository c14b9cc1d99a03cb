# The one image of the product: the control plane (`cpctl worker`, `cpctl serve`,
# `cpctl db upgrade`) and the node agent (`python -m drivers.agent`); deploy/ chooses the
# command. Build: docker build -t REGISTRY/checkpoint-controlplane:VERSION .
#
# The base is pinned to an exact Python and Debian release. Pin it to a digest too when
# you build for production (`docker buildx imagetools inspect python:3.11.11-slim-bookworm`
# prints it): PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
# Dependencies first (pinned by constraints.txt), so source edits reuse this layer.
COPY pyproject.toml constraints.txt README.md ./
COPY controlplane/__init__.py controlplane/__init__.py
COPY drivers/__init__.py drivers/__init__.py
COPY migrations/__init__.py migrations/__init__.py
RUN /opt/venv/bin/pip install -c constraints.txt . \
 && /opt/venv/bin/pip uninstall -y controlplane
COPY controlplane controlplane
COPY drivers drivers
COPY migrations migrations
RUN /opt/venv/bin/pip install --no-deps -c constraints.txt . \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE}
# Non-root by default (the node agent's DaemonSet asks for root + DAC_OVERRIDE itself,
# to read the kubelet's checkpoint archives).
RUN groupadd --gid 10001 controlplane \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin controlplane
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT []
CMD ["cpctl", "--help"]
