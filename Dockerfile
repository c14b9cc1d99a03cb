# The one image of the product: the control plane (`cpctl worker`, `cpctl serve`,
# `cpctl db upgrade`) and the node agent (`python -m drivers.agent`); deploy/ chooses the
# command. How to build it (docker, podman, or a local Debian base where the registry's
# Python image cannot be pulled: scripts/build-image) is in docs/install.md.
#
# BASE_IMAGE is pinned by digest: a tag can be re-pushed, a digest names exactly one
# image. Any Debian-based image with Python 3.11+ as `python3` and groupadd/useradd
# works: the official one (the default; refresh the digest with
# `skopeo inspect --raw docker://docker.io/library/python:3.11.11-slim-bookworm | sha256sum`)
# or the one scripts/make-base-image makes with debootstrap,
# BASE_IMAGE=localhost/controlplane-base@sha256:<digest> (podman finds local images by
# digest).
#
# Behind a TLS-intercepting proxy pip needs the proxy's CA: pass a bundle as the build
# secret `pip_ca` (`--secret id=pip_ca,src=/etc/ssl/certs/ca-certificates.crt`, podman 4+
# and docker with BuildKit). It is mounted only while pip runs and lands in no layer.
ARG BASE_IMAGE=python:3.11.11-slim-bookworm@sha256:081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# python3, not python: Debian's own python3 package has no `python` command.
RUN python3 -m venv /opt/venv
# Dependencies first (pinned by constraints.txt), so source edits reuse this layer.
COPY pyproject.toml constraints.txt README.md ./
COPY controlplane/__init__.py controlplane/__init__.py
COPY drivers/__init__.py drivers/__init__.py
COPY migrations/__init__.py migrations/__init__.py
RUN --mount=type=secret,id=pip_ca,required=false \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
 && /opt/venv/bin/pip install -c constraints.txt . \
 && /opt/venv/bin/pip uninstall -y controlplane
COPY controlplane controlplane
COPY drivers drivers
COPY migrations migrations
RUN --mount=type=secret,id=pip_ca,required=false \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
 && /opt/venv/bin/pip install --no-deps -c constraints.txt . \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

FROM ${BASE_IMAGE}
ARG BASE_IMAGE
LABEL org.opencontainers.image.title="checkpoint-controlplane" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
# Non-root by default (the node agent's DaemonSet asks for root + DAC_OVERRIDE itself,
# to read the kubelet's checkpoint archives).
RUN groupadd --gid 10001 controlplane \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin controlplane
# The venv's python is a symlink to the base's python3: same base in both stages.
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT []
CMD ["cpctl", "--help"]
