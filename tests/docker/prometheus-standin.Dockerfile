# A stand-in for the prom/prometheus image, for build machines that cannot reach Docker Hub:
# Debian's prometheus package on the debian:bookworm-slim stand-in, with the official image's
# entry point, user and data folder. tests/docker/test_compose_e2e.py builds it only when the
# image named in docker-compose.yml can neither be found nor pulled.
FROM debian:bookworm-slim
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus /etc/prometheus \
    && chown nobody:nogroup /prometheus
LABEL org.opencontainers.image.description="patchserve test stand-in for prom/prometheus (Debian's package)"
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
