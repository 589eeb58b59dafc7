# vllm-sidecar: the daemon in a container beside vLLM.
#
#   docker build --build-arg VERSION=0.1.0 -t vllm-sidecar:0.1.0 .
#   docker run --read-only -v vllm-sidecar-state:/var/lib/vllm-sidecar -p 9468:9468 \
#       vllm-sidecar:0.1.0 run --vllm-url http://vllm:8000
#
# The image also carries /opt/vllm-sidecar-probe: this distribution installed with `pip install --no-deps
# --target`, for vLLM's PYTHONPATH (the allocator probe plugin, without rebuilding vLLM's image). It holds the
# packages and their .dist-info (the entry point vLLM looks up) and no dependency, so nothing in it shadows a
# package of vLLM's; Kubernetes copies it into vLLM's pod with an init container (deploy/kubernetes/add-probe).
#
# Run it with a read-only root filesystem: the sidecar writes only to --state-dir (/var/lib/vllm-sidecar,
# the restart ledger), so mount a volume there. A new volume takes the directory's owner (10001) from the
# image; in Kubernetes use an emptyDir (world-writable, and it outlives container restarts within the pod,
# which is what the ledger needs) with readOnlyRootFilesystem: true. The one exception: a --kubeconfig with
# an embedded client certificate is written briefly to $TMPDIR (/tmp), which then needs a tmpfs/emptyDir too.
# Podman and buildah keep HEALTHCHECK only in the docker image format: build with `--format docker` there.

# The single place that names the base; tests build against a local Debian image with the same layout.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS builder
ARG VERSION=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml ./
COPY sidecar/__init__.py sidecar/
# VERSION labels the image, so a VERSION that is not the package's (what setuptools reads) fails the build,
# here, before anything is downloaded.
RUN python3 -c "import runpy, sys; v = runpy.run_path('sidecar/__init__.py')['__version__']; \
sys.exit(None if sys.argv[1] in ('', v) else f'VERSION={sys.argv[1]} but the package is {v}')" "${VERSION}"
# Dependencies get their own layer, keyed only on pyproject.toml and the version, so a code change does not
# download them again. The stub README keeps README edits from invalidating it. The incidents extra is py-spy
# (a static binary), which reads vLLM's stacks where the deployment allows it (deploy/kubernetes/add-incidents).
RUN python3 -m venv /opt/vllm-sidecar \
    && touch README.md \
    && /opt/vllm-sidecar/bin/python -m pip install '.[incidents]' \
    && /opt/vllm-sidecar/bin/python -m pip uninstall --yes vllm-sidecar \
    && rm -rf build ./*.egg-info
COPY README.md ./
COPY sidecar/ sidecar/
COPY vllm_sidecar_probe/ vllm_sidecar_probe/
# One wheel of the context, installed twice: into the venv, and as the plugin folder for vLLM (no
# dependencies, no console script: bin/ would only hold a script for this builder's Python). Then the build
# tools leave the venv so none of them reach the final stage.
# Bytecode is recompiled hash-based: layer tarballs round mtimes to the second, which makes pip's
# timestamp-based .pyc files stale, and on a read-only root every start would compile them again. In the
# plugin folder only the plugin is compiled (vLLM never imports the sidecar); a vLLM on another Python
# version than this image's compiles it in memory, as the folder is mounted read-only.
RUN /opt/vllm-sidecar/bin/python -m pip wheel --no-deps --wheel-dir /src/dist . \
    && /opt/vllm-sidecar/bin/python -m pip install --no-deps /src/dist/vllm_sidecar-*.whl \
    && /opt/vllm-sidecar/bin/python -m pip install --no-deps --no-compile --target /opt/vllm-sidecar-probe \
       /src/dist/vllm_sidecar-*.whl \
    && rm -rf /opt/vllm-sidecar-probe/bin \
    && /opt/vllm-sidecar/bin/python -m pip check \
    && /opt/vllm-sidecar/bin/python -m pip uninstall --yes pip setuptools wheel \
    && /opt/vllm-sidecar/bin/python -m compileall -q -f -j 0 --invalidation-mode unchecked-hash /opt/vllm-sidecar/lib \
       /opt/vllm-sidecar-probe/vllm_sidecar_probe \
    && /opt/vllm-sidecar/bin/vllm-sidecar --version \
    && /opt/vllm-sidecar/bin/py-spy --version

FROM ${BASE_IMAGE}
ARG VERSION=""
ARG SOURCE_URL=https://github.com/vllm-sidecar/vllm-sidecar
LABEL org.opencontainers.image.title="vllm-sidecar" \
      org.opencontainers.image.description="A sidecar for vLLM that watches KV cache and GPU memory, forecasts OOM and keeps the server up" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/vllm-sidecar/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A fixed UID/GID so volume ownership and Kubernetes' runAsUser/fsGroup can name it; no home, no login shell.
# --no-log-init: a high UID would otherwise grow the sparse /var/log/lastlog and faillog into the layer.
RUN groupadd --system --gid 10001 sidecar \
    && useradd --system --no-log-init --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin sidecar \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/vllm-sidecar
# Owned by root and not writable by the sidecar's user: the code it runs cannot be changed by it.
COPY --from=builder /opt/vllm-sidecar /opt/vllm-sidecar
COPY --from=builder /opt/vllm-sidecar-probe /opt/vllm-sidecar-probe
USER 10001:10001
EXPOSE 9468
# An anonymous volume when nothing is mounted there, so even a bare `docker run --read-only` can keep the
# ledger; Kubernetes ignores VOLUME and needs the emptyDir named above.
VOLUME ["/var/lib/vllm-sidecar"]
# The venv's own Python, so the image needs no curl or wget; http.client ignores *_proxy variables, which
# must not reroute a loopback probe. The port follows VLLM_SIDECAR_LISTEN: move the port with that variable,
# not with --listen or a --config file, which the probe cannot see. With VLLM_SIDECAR_TLS_CERT_FILE set it
# speaks HTTPS without verifying: the certificate names the Service, not 127.0.0.1, and it is our own process.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/opt/vllm-sidecar/bin/python", "-c", "import http.client, os, ssl; port = int(os.environ.get('VLLM_SIDECAR_LISTEN', ':9468').rpartition(':')[2]); tls = os.environ.get('VLLM_SIDECAR_TLS_CERT_FILE'); c = http.client.HTTPSConnection('127.0.0.1', port, timeout=4, context=ssl._create_unverified_context()) if tls else http.client.HTTPConnection('127.0.0.1', port, timeout=4); c.request('GET', '/healthz'); raise SystemExit(c.getresponse().status != 200)"]
ENTRYPOINT ["vllm-sidecar"]
CMD ["run"]
