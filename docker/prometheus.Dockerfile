# Prometheus from Debian's package, for machines that cannot pull prom/prometheus (make images).
#   docker build --network host --build-arg BASE_IMAGE=pyrsia-base:bookworm \
#       -t pyrsia-prometheus:bookworm - < docker/prometheus.Dockerfile
# The entry point is the prometheus binary, as in prom/prometheus, so docker-compose.yml's
# command (its flags) works with either image.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
